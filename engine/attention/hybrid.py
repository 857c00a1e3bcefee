"""Compose two backends: one for steps with prefill tokens, another for pure decode steps. A step
with both gives its leading decode rows to the decode backend (mixed.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from radixserve.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    LayerCall,
    StepCall,
    StepLayout,
)
from radixserve.engine.attention.mixed import (
    MixedMetadata,
    attend_mixed,
    bind_mixed,
    prepare_mixed,
)

if TYPE_CHECKING:
    from radixserve.engine.kvcache.pool import KVCachePool


@dataclass
class HybridMetadata(AttentionMetadata):
    backend: AttentionBackend
    inner: AttentionMetadata


class HybridBackend(AttentionBackend):
    split_mixed = True

    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend) -> None:
        super().__init__(prefill.num_heads, prefill.num_kv_heads, prefill.head_dim, prefill.device,
                         prefill.dtype)
        self.prefill, self.decode = prefill, decode

    def keep_split_mixed(self, keep: bool) -> None:
        for backend in (self, self.prefill, self.decode):
            backend.split_mixed = backend.split_mixed and keep

    def check_page_size(self, page_size: int) -> str:
        notes = (self.prefill.check_page_size(page_size), self.decode.check_page_size(page_size))
        return "; ".join(n for n in dict.fromkeys(notes) if n)  # one backend twice: its note once

    def supports_cuda_graph(self, page_size: int) -> bool:
        return self.decode.supports_cuda_graph(page_size)  # graphs only ever run decode steps

    def prepare(self, layout: StepLayout) -> AttentionMetadata:
        mixed = prepare_mixed(layout, self.decode, self.prefill) if self.split_mixed else None
        if mixed is not None:
            return mixed
        backend = self.decode if layout.is_decode else self.prefill
        inner = backend.prepare(layout)
        return HybridMetadata(inner.out_loc, backend, inner)

    def attend(self, q: torch.Tensor, layer_id: int, meta: AttentionMetadata,
               kv_pool: KVCachePool, out: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(meta, MixedMetadata):
            return attend_mixed(q, layer_id, meta, kv_pool, out)
        assert isinstance(meta, HybridMetadata)
        return meta.backend.attend(q, layer_id, meta.inner, kv_pool, out)

    def bind_layers(self, q: torch.Tensor, out: torch.Tensor, meta: AttentionMetadata,
                    kv_pool: KVCachePool) -> StepCall:
        if isinstance(meta, MixedMetadata):
            return bind_mixed(q, out, meta, kv_pool)
        assert isinstance(meta, HybridMetadata)
        return meta.backend.bind_layers(q, out, meta.inner, kv_pool)

    def piece_decode(self, tokens: int) -> tuple[int, LayerCall] | None:
        # a mixed step's decode rows are the decode backend's, in the pieces too
        return self.decode.piece_decode(tokens) if self.split_mixed else None

    def plan_piece_decode(self, width: int, decode: StepLayout) -> None:
        self.decode.plan_piece_decode(width, decode)

    def piece_prefill(self, tokens: int) -> LayerCall | None:
        # the call of the pieces that hold the decode backend's decode call
        return self.decode.piece_prefill(tokens) if self.split_mixed else None

    def plan_piece_prefill(self, tokens: int, first_row: int, prefill: StepLayout) -> bool:
        return self.decode.plan_piece_prefill(tokens, first_row, prefill)

    def init_cuda_graph(self, max_batch: int, max_pages_per_req: int, page_size: int,
                        dummy_page: int, page_table: torch.Tensor | None = None,
                        small_decode_rows: int = 0, piece_prefill_keys: int = 0) -> None:
        self.decode.init_cuda_graph(max_batch, max_pages_per_req, page_size, dummy_page,
                                    page_table, small_decode_rows, piece_prefill_keys)

    def graph_metadata(self, batch_size: int, out_loc: torch.Tensor) -> HybridMetadata:
        return HybridMetadata(out_loc, self.decode, self.decode.graph_metadata(batch_size, out_loc))

    def plan_graph(self, batch_size: int, layout: StepLayout) -> None:
        self.decode.plan_graph(batch_size, layout)
