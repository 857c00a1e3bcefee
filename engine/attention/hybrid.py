"""Compose two backends: one for steps with prefill tokens, another for pure decode steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixserve.engine.attention.base import AttentionBackend, AttentionMetadata, StepLayout

if TYPE_CHECKING:
    from radixserve.engine.kvcache.pool import KVCachePool


@dataclass
class HybridMetadata(AttentionMetadata):
    backend: AttentionBackend
    inner: AttentionMetadata


class HybridBackend(AttentionBackend):
    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend) -> None:
        super().__init__(prefill.num_heads, prefill.num_kv_heads, prefill.head_dim, prefill.device)
        self.prefill, self.decode = prefill, decode

    def prepare(self, layout: StepLayout) -> HybridMetadata:
        backend = self.decode if layout.is_decode else self.prefill
        return HybridMetadata(backend, backend.prepare(layout))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                meta: AttentionMetadata, kv_pool: KVCachePool) -> torch.Tensor:
        assert isinstance(meta, HybridMetadata)
        return meta.backend.forward(q, k, v, layer_id, meta.inner, kv_pool)
