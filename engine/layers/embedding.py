"""Vocabulary-parallel embedding and LM head (vocab padded to a multiple of the TP size).

    vocab ids:  [ rank 0: 0 .. shard ) [ rank 1: shard .. 2*shard ) ... [ last: .. V | zero pad ]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from radixserve.engine.distributed import get_comm
from radixserve.engine.layers import gemv
from radixserve.engine.layers.linear import WeightSource, copy_checked
from torch import nn


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.comm = get_comm()
        self.tp_rank, self.tp_size = self.comm.rank, self.comm.world_size
        self.vocab_size = vocab_size
        self.shard = -(-vocab_size // self.tp_size)  # ceil: the last shard is padded
        self.start = self.tp_rank * self.shard
        self.weight = nn.Parameter(torch.zeros(self.shard, hidden), requires_grad=False)
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(self, param: nn.Parameter, loaded: WeightSource) -> None:
        n = max(0, min(self.shard, self.vocab_size - self.start))  # real (unpadded) rows here
        if n:
            copy_checked(param.data[:n], loaded[self.start : self.start + n])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mask = (local >= 0) & (local < self.shard)
        y = F.embedding(local.clamp(0, self.shard - 1), self.weight) * mask.unsqueeze(-1)
        return self.comm.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (B, H) -> logits (B, vocab_size), gathered over ranks."""
        logits = gemv.linear(hidden, self.weight)
        if self.tp_size > 1:
            logits = self.comm.all_gather(logits, dim=-1)
        return logits[:, : self.vocab_size]
