"""RMSNorm computed in float32, as the reference implementation does."""

from __future__ import annotations

from typing import Any

import torch
from radixserve.engine.layers import fused
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        """norm(x); or, given the residual stream, (norm(x + residual), x + residual)."""
        if residual is not None:
            if fused.usable(x) and x.dim() == 2 and x.stride(-1) == 1 and residual.is_contiguous():
                # updates residual in place
                return fused.add_rms_norm(x, residual, self.weight, self.eps)
            residual = x + residual
            return self.forward(residual), residual
        if fused.usable(x) and x.stride(-1) == 1:  # one kernel instead of ~7 on CUDA
            return fused.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)
