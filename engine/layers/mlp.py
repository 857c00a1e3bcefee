"""SwiGLU feed-forward: down(silu(gate(x)) * up(x)), gate and up fused."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from radixserve.engine.layers import fused, gemv
from radixserve.engine.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from radixserve.engine.layers.norm import RMSNorm
from torch import nn


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate],
                                                       bias=bias)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate_up_proj(x))

    def normed(self, x: torch.Tensor, residual: torch.Tensor,
               norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), the residual stream x + residual), x and residual (T, hidden).
        At a batch of 1-2 rows the add, the norm, gate_up and SiLU-mul are one GEMV kernel (each
        block of outputs holds gate and up rows of the same features) and down_proj another."""
        gate_up = self.gate_up_proj
        if gate_up.normed_gemv_usable(x, residual):
            h, residual = gate_up.normed(x, residual, norm, swiglu=True)
            return self.down_proj(h), residual
        h, residual = gate_up.normed(x, residual, norm)
        return self.down(h), residual

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: (T, 2 * inter. shard) = [gate | up] -> down(silu(gate) * up), (T, hidden)."""
        if gemv.gated_usable(gate_up, self.down_proj.weight):  # SiLU-mul folded into the GEMV
            return self.down_proj(gate_up, gated=True)
        if fused.usable(gate_up):
            return self.down_proj(fused.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
