"""Linear layers that shard themselves over the TP group (rank slices chosen at load time)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.engine.distributed import get_comm


def _divide(n: int, d: int, what: str) -> int:
    if n % d:
        raise ValueError(f"{what} ({n}) is not divisible by the TP size ({d})")
    return n // d


class LinearBase(nn.Module):
    """`weight` is this rank's shard: (out_features_shard, in_features_shard)."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_comm().rank, get_comm().world_size
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Splits the output dim; no communication (the next row-parallel layer reduces)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        tp = get_comm().world_size
        super().__init__(in_features, _divide(out_features, tp, "output features"), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        shard = param.data.size(0)
        param.data.copy_(loaded.narrow(0, self.tp_rank * shard, shard))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs stored as one matrix (e.g. gate and up projections)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int = 0) -> None:  # type: ignore[override]
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection. With more ranks than KV heads, KV heads are replicated."""

    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool) -> None:
        tp = get_comm().world_size
        self.head_dim = head_dim
        self.num_heads = _divide(num_heads, tp, "attention heads")
        if num_kv_heads >= tp:
            self.num_kv_heads = _divide(num_kv_heads, tp, "KV heads")
        else:
            _divide(tp, num_kv_heads, "TP size over KV heads")  # each KV head serves tp/kv ranks
            self.num_kv_heads = 1
        self.total_kv_heads = num_kv_heads
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden, out, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str = "q") -> None:  # type: ignore[override]
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
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, start, size))


class RowParallelLinear(LinearBase):
    """Splits the input dim; sums partial products over ranks. Bias is added once, after the sum."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        tp = get_comm().world_size
        super().__init__(_divide(in_features, tp, "input features"), out_features, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        if param.dim() == 1:  # bias: replicated
            param.data.copy_(loaded)
            return
        shard = param.data.size(1)
        param.data.copy_(loaded.narrow(1, self.tp_rank * shard, shard))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.tp_size > 1:
            y = get_comm().all_reduce(y)
        return y if self.bias is None else y + self.bias
