"""Linear layers that shard themselves over the TP group (rank slices chosen at load time).

A weight loader receives the checkpoint tensor as a `WeightSource`: a torch.Tensor or a lazy
safetensors slice. It indexes only its own rank's rows or columns, so each rank reads its shard
and nothing more from disk.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from radixserve.engine.distributed import get_comm
from radixserve.engine.layers import gemv
from radixserve.engine.layers.norm import RMSNorm
from torch import nn


class WeightSource(Protocol):
    """Basic indexing (`src[a:b]`, `src[:, a:b]`, `src[:]`) returns just that part as a tensor."""

    def __getitem__(self, index: Any) -> torch.Tensor: ...


def _divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise ValueError(f"{what} ({n}) is not divisible by the TP size ({d})")
    return n // d


def copy_checked(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst.shape != src.shape:
        raise ValueError(f"shape mismatch: parameter (shard) {tuple(dst.shape)}, checkpoint "
                         f"{tuple(src.shape)}")
    dst.copy_(src)


class LinearBase(nn.Module):
    """`weight` is this rank's shard: (out_features_shard, in_features_shard). The communicator
    is captured here, so a built model keeps talking to its own group."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.comm = get_comm()
        self.tp_rank, self.tp_size = self.comm.rank, self.comm.world_size
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: WeightSource) -> None:
        copy_checked(param.data, loaded[:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemv.linear(x, self.weight, self.bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Splits the output dim; no communication (the next row-parallel layer reduces)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        tp = get_comm().world_size
        super().__init__(in_features, _divide(out_features, tp, "output features"), bias)

    def normed_gemv_usable(self, x: torch.Tensor, residual: torch.Tensor | None) -> bool:
        """Whether `normed` runs as one GEMV kernel (a batch of 1-2 rows)."""
        return gemv.normed_usable(x, self.weight) and (residual is None or residual.is_contiguous())

    def normed(self, x: torch.Tensor, residual: torch.Tensor | None, norm: RMSNorm,
               swiglu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """self(norm(x + residual)) and the residual stream x + residual (x alone when residual is
        None): one GEMV kernel at a batch of 1-2 rows, the fused add+norm and a matmul otherwise.
        swiglu (GEMV only): the output is silu(gate) * up of a [gate | up] projection."""
        if self.normed_gemv_usable(x, residual):
            return gemv.normed_gemv(x, residual, norm.weight, norm.eps, self.weight, self.bias,
                                    swiglu=swiglu)
        assert not swiglu, "SiLU-mul folds into the normed projection on the GEMV path only"
        h, residual = (norm(x), x) if residual is None else norm(x, residual)
        return self(h), residual

    def weight_loader(self, param: nn.Parameter, loaded: WeightSource) -> None:
        shard = param.data.size(0)
        copy_checked(param.data, loaded[self.tp_rank * shard : (self.tp_rank + 1) * shard])


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stored as one matrix (e.g. gate and up projections).

    Rank r holds [part0 shard r | part1 shard r | ...]: each part is split on its own.
    """

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False) -> None:
        tp = get_comm().world_size
        for i, size in enumerate(output_sizes):
            _divide(size, tp, f"output features of merged part {i}")
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: WeightSource,  # type: ignore[override]
                      shard_id: int = 0) -> None:
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        start = self.tp_rank * size
        copy_checked(param.data.narrow(0, offset, size), loaded[start : start + size])


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection. With more ranks than KV heads, KV heads are replicated: each KV
    head serves tp / num_kv_heads consecutive ranks, whose query heads are exactly its group."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool) -> None:
        tp = get_comm().world_size
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp, "attention heads")
        if num_kv_heads >= tp:
            self.num_kv_heads = _divide(num_kv_heads, tp, "KV heads")
        elif tp % num_kv_heads:
            raise ValueError(f"the TP size ({tp}) exceeds the KV heads ({num_kv_heads}) "
                             "so it must be a multiple of them")
        else:
            self.num_kv_heads = 1
        self.total_kv_heads = num_kv_heads
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden, out, bias)

    def weight_loader(self, param: nn.Parameter, loaded: WeightSource,  # type: ignore[override]
                      shard_id: str = "q") -> None:
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, size, start = 0, q_size, self.tp_rank * q_size
        else:
            offset = q_size if shard_id == "k" else q_size + kv_size
            if self.total_kv_heads >= self.tp_size:
                kv_head = self.tp_rank * self.num_kv_heads
            else:  # replicated: rank r serves KV head r * kv / tp
                kv_head = self.tp_rank * self.total_kv_heads // self.tp_size
            size, start = kv_size, kv_head * self.head_dim
        copy_checked(param.data.narrow(0, offset, size), loaded[start : start + size])


class RowParallelLinear(LinearBase):
    """Splits the input dim; sums partial products over ranks. Bias is added once, after the sum."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        tp = get_comm().world_size
        super().__init__(_divide(in_features, tp, "input features"), out_features, bias)

    def weight_loader(self, param: nn.Parameter, loaded: WeightSource) -> None:
        if param.dim() == 1:  # bias: replicated
            copy_checked(param.data, loaded[:])
            return
        shard = param.data.size(1)
        copy_checked(param.data, loaded[:, self.tp_rank * shard : (self.tp_rank + 1) * shard])

    def forward(self, x: torch.Tensor, gated: bool = False) -> torch.Tensor:
        """gated: x is [gate | up] (T, 2 * in_features) and the input is silu(gate) * up.

        The gated form is for the GEMV path only."""
        y = gemv.gated_gemv(x, self.weight) if gated else gemv.linear(x, self.weight)
        if self.tp_size > 1:
            y = self.comm.all_reduce(y)
        return y if self.bias is None else y + self.bias
