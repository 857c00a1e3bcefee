"""flash-attn backend (FA3 Hopper build, sgl-kernel's FA3, or flash-attn 2).

FA3's `flash_attn_with_kvcache` reads the paged pool through a page table at any page size, for
prefill (ragged queries via cu_seqlens_q) and decode alike; decode runs in CUDA graphs.

flash-attn 2 reads a paged pool only in pages of a multiple of 256 tokens. At such page sizes
(`--page-size 256`) prefill is `flash_attn_varlen_func` with a block table, decode
`flash_attn_with_kvcache` with one, and decode runs in CUDA graphs. At any other page size it still
serves every step, but copies each request's K/V out of the pool into one contiguous run per layer
(`flash_attn_varlen_func` for prefill and decode alike) and decodes eagerly; the engine logs a
warning at start naming page size 256. It serves rather than refuses because the results are the
same and `fa,flashinfer` (FA2 prefill, FlashInfer decode in CUDA graphs) is sound at any page size:
the copy of each request's context per layer costs prefill little and decode most.

Causal masks align queries with the end of their request's keys, as StepLayout does.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from radixserve.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    StepLayout,
    into,
)

if TYPE_CHECKING:
    from radixserve.engine.kvcache.pool import KVCachePool


FA2_PAGE = 256  # flash-attn 2 takes a block table only for pages of a multiple of this many tokens


class FlashAttnAPI(NamedTuple):
    version: int  # 3: page_table at any page size; 2: block_table only when P % FA2_PAGE == 0
    varlen: Callable[..., Any]  # flash_attn_varlen_func
    with_kvcache: Callable[..., Any]  # flash_attn_with_kvcache


@functools.cache
def load_flash_attn() -> FlashAttnAPI:
    for module, version in (("flash_attn_interface", 3), ("sgl_kernel.flash_attn", 3),
                            ("flash_attn", 2)):
        try:
            m = importlib.import_module(module)
        except ImportError:
            continue
        return FlashAttnAPI(version, m.flash_attn_varlen_func, m.flash_attn_with_kvcache)
    raise ImportError("no flash-attn found (flash_attn_interface, sgl_kernel.flash_attn or "
                      "flash_attn)")


def _cu(lengths: list[int], device: torch.device) -> torch.Tensor:
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return out.to(device, non_blocking=True)


@dataclass
class FAMetadata(AttentionMetadata):
    cu_q: torch.Tensor  # (B + 1,) int32
    max_q: int
    seqlens: torch.Tensor  # (B,) int32 keys per request
    max_k: int
    block_table: torch.Tensor | None  # (B, max_pages) int32 page ids (paged path)
    kv_loc: torch.Tensor | None  # (sum seq_lens,) KV locations, request after request (gather path)
    cu_k: torch.Tensor | None  # (B + 1,) int32 cumulative keys per request (varlen calls)
    decode: bool


class FlashAttentionBackend(AttentionBackend):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim, device, dtype)
        self.api = load_flash_attn()
        self._graph: dict[str, torch.Tensor] = {}
        self._dummy_page = -1

    def _paged(self, page_size: int) -> bool:
        return self.api.version == 3 or page_size % FA2_PAGE == 0

    def check_page_size(self, page_size: int) -> str:
        if self._paged(page_size):
            return ""
        return (f"flash-attn 2 reads the paged KV pool only in pages of a multiple of {FA2_PAGE} "
                f"tokens: at page size {page_size} it copies each request's K/V out of the pool in "
                f"every layer and cannot decode in CUDA graphs; --page-size {FA2_PAGE} enables its "
                "paged kernels and CUDA graphs")

    def supports_cuda_graph(self, page_size: int) -> bool:
        return self._paged(page_size)

    def prepare(self, layout: StepLayout) -> FAMetadata:
        dev, P, seq = self.device, layout.page_size, layout.seq_lens
        ext = layout.extend_lens
        decode = layout.is_decode
        seqlens = torch.tensor(seq, dtype=torch.int32).to(dev, non_blocking=True)
        block_table = kv_loc = None
        if self._paged(P):
            max_pages = -(-max(seq) // P)
            pages = layout.page_table[layout.slots, : max_pages * P : P]
            block_table = (pages // P).to(torch.int32)
        else:
            n = sum(seq)
            lens = torch.tensor(seq, dtype=torch.int64)
            lens_d = lens.to(dev, non_blocking=True)
            rows = torch.repeat_interleave(layout.slots, lens_d, output_size=n)
            starts = (torch.cumsum(lens, 0) - lens).to(dev, non_blocking=True)
            first = torch.repeat_interleave(starts, lens_d, output_size=n)
            kv_loc = layout.page_table[rows, torch.arange(n, device=dev) - first]
        varlen = kv_loc is not None or (self.api.version == 2 and not decode)
        cu_k = _cu(seq, dev) if varlen else None
        return FAMetadata(layout.out_loc, _cu(ext, dev), max(ext), seqlens, max(seq), block_table,
                          kv_loc, cu_k, decode)

    def attend(self, q: torch.Tensor, layer_id: int, meta: AttentionMetadata,
               kv_pool: KVCachePool, out: torch.Tensor | None = None) -> torch.Tensor:
        return into(self._attend(q, layer_id, meta, kv_pool), out)  # the kernels allocate theirs

    def _attend(self, q: torch.Tensor, layer_id: int, meta: AttentionMetadata,
                kv_pool: KVCachePool) -> torch.Tensor:
        assert isinstance(meta, FAMetadata)
        k_all, v_all = kv_pool.k[layer_id], kv_pool.v[layer_id]  # (locations, nkv, hd)
        if meta.block_table is None:  # gathered contiguous K/V, one run per request
            assert meta.kv_loc is not None and meta.cu_k is not None
            return self.api.varlen(q, k_all[meta.kv_loc], v_all[meta.kv_loc], meta.cu_q, meta.cu_k,
                                   meta.max_q, meta.max_k, softmax_scale=self.scale, causal=True)
        k_pages, v_pages = kv_pool.pages[layer_id]  # (pages, P, nkv, hd)
        if self.api.version == 3:
            out = self.api.with_kvcache(q, k_pages, v_pages, cache_seqlens=meta.seqlens,
                                        page_table=meta.block_table, cu_seqlens_q=meta.cu_q,
                                        max_seqlen_q=meta.max_q, softmax_scale=self.scale,
                                        causal=True)
            return out[0] if isinstance(out, tuple) else out
        if meta.decode:
            out = self.api.with_kvcache(q.unsqueeze(1), k_pages, v_pages,
                                        cache_seqlens=meta.seqlens, block_table=meta.block_table,
                                        softmax_scale=self.scale, causal=True)
            return out.squeeze(1)  # (B, 1, nh, hd) -> (B, nh, hd)
        # Ragged queries over each request's pages: with a block table, cu_k counts keys only;
        # request i's key j sits at page block_table[i, j // P], slot j % P.
        assert meta.cu_k is not None
        return self.api.varlen(q, k_pages, v_pages, meta.cu_q, meta.cu_k, meta.max_q, meta.max_k,
                               softmax_scale=self.scale, causal=True, block_table=meta.block_table)

    # -- CUDA graphs: static block table and lengths, rewritten before each replay --------------
    def init_cuda_graph(self, max_batch: int, max_pages_per_req: int, page_size: int,
                        dummy_page: int, page_table: torch.Tensor | None = None,
                        small_decode_rows: int = 0, piece_prefill_keys: int = 0) -> None:
        if not self._paged(page_size):
            raise NotImplementedError("flash-attn 2 decodes from the paged pool only when "
                                     f"page_size % {FA2_PAGE} == 0")
        dev = self.device
        self._dummy_page = dummy_page
        self._graph = {
            "block_table": torch.full((max_batch, max_pages_per_req), dummy_page, dtype=torch.int32,
                                      device=dev),
            "seqlens": torch.ones(max_batch, dtype=torch.int32, device=dev),
            "cu_q": torch.arange(max_batch + 1, dtype=torch.int32, device=dev),
        }

    def graph_metadata(self, batch_size: int, out_loc: torch.Tensor) -> FAMetadata:
        g = self._graph
        # max_k is unused on the paged path (the kernels read cache_seqlens)
        return FAMetadata(out_loc, g["cu_q"][: batch_size + 1], 1, g["seqlens"][:batch_size], 1,
                          g["block_table"][:batch_size], None, None, True)

    def plan_graph(self, batch_size: int, layout: StepLayout) -> None:
        g, P, B = self._graph, layout.page_size, len(layout.seq_lens)
        width = g["block_table"].size(1)
        pages = layout.page_table[layout.slots, : width * P : P]
        g["block_table"][:B] = (pages // P).to(torch.int32)
        g["block_table"][B:batch_size, 0] = self._dummy_page
        lens = torch.ones(batch_size, dtype=torch.int32)
        lens[:B] = torch.tensor(layout.seq_lens, dtype=torch.int32)
        g["seqlens"][:batch_size].copy_(lens, non_blocking=True)
