"""FlashInfer paged attention: one wrapper planned per step, reused by every layer.

KVCachePool keeps k and v as (layers, pages * P, nkv, hd); one layer's slice reshapes without a copy
to FlashInfer's NHD paged layout (pages, P, nkv, hd). Page ids come from the token-level page table
(`page_indices`). Steps whose rows all add one token plan the decode kernel; any other step plans
the causal paged prefill kernel, which also serves chunked prefill over cached prefixes (queries sit
at the end of their request's KV, as our StepLayout defines them). A step with both plans its
leading decode rows for the decode kernel and the rest for the prefill kernel (mixed.py).

Prefill steps call the planned kernel directly (flashinfer_direct.py: one plan from host lists, one
bare call per layer into the caller's buffer) once the first prefill plan has shown, through the
wrapper, that this FlashInfer matches what that module mirrors; otherwise, or with direct=False,
they go through the wrapper's plan and run. Which one is logged once. Eager decode steps and the
decode rows of mixed steps are planned by the wrapper and run through `DecodeCall` (the kernel
call, bound once per plan) where it fits this FlashInfer, else through the wrapper's run.
Decode graphs of up to `small_decode_rows` rows run small_decode.py's kernel instead, which reads
the page table in the graph and needs no plan beyond each row's slot and length (and, in wide
graphs, the shares of rows past 2,048 keys).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from radixserve.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    LayerCall,
    StepCall,
    StepLayout,
    last_page_lens,
    layout_page_ids,
    pages_per_request,
    prefix_sums,
)
from radixserve.engine.attention.mixed import (
    MixedMetadata,
    attend_mixed,
    bind_mixed,
    prepare_mixed,
)
from radixserve.engine.attention.paged_prefill import PagedPrefill
from radixserve.engine.attention.small_decode import SmallBatchDecode
from radixserve.engine.host_buffers import HostBuffers

if TYPE_CHECKING:
    from radixserve.engine.attention.flashinfer_direct import DecodeCall, DirectPrefill
    from radixserve.engine.kvcache.pool import KVCachePool

log = logging.getLogger(__name__)

WORKSPACE_BYTES = 128 << 20  # FlashInfer's split-KV scratch, shared by every wrapper (one stream)


def _indptr(lengths: list[int]) -> torch.Tensor:
    """(n + 1,) int32 host prefix sums; host tensors keep FlashInfer's planning free of syncs."""
    return torch.tensor(prefix_sums(lengths), dtype=torch.int32)


def _last_page_lens(seq_lens: list[int], num_pages: list[int], page_size: int) -> torch.Tensor:
    return torch.tensor(last_page_lens(seq_lens, num_pages, page_size), dtype=torch.int32)


class _Planner:
    """A wrapper whose plan() alternates two pinned host buffers.

    FlashInfer writes its schedule into a pinned buffer and copies it to the device on the stream.
    With one step in flight, the next step is planned before that copy may have run; a second
    buffer keeps the pending copy's source intact (host_buffers.py: a plan a step, so the buffer
    of two steps back is free).
    """

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper
        own = wrapper._pin_memory_int_workspace_buffer  # what FlashInfer allocated: its size
        self._shape, self._dtype = own.shape, own.dtype
        self._nbytes = own.numel() * own.element_size()
        pin = own.is_pinned()  # as FlashInfer's own (always, on CUDA)
        self._pinned = HostBuffers(pin)
        self.page_ids = HostBuffers(pin)  # the host side of the plan's page ids' upload

    def next_pinned(self) -> torch.Tensor:
        """The buffer for the next plan to stage its schedule in."""
        return self._pinned.take(self._nbytes).view(self._dtype).view(self._shape)

    def plan(self, *args: Any, **kwargs: Any) -> None:
        self.wrapper._pin_memory_int_workspace_buffer = self.next_pinned()
        self.wrapper.plan(*args, **kwargs)


@dataclass
class FlashInferMetadata(AttentionMetadata):
    wrapper: Any  # the planned BatchPrefill/BatchDecode wrapper (None: `call` needs no plan)
    call: LayerCall | None = None  # the per-layer kernel call, where bound (else wrapper.run)


class FlashInferBackend(AttentionBackend):
    split_mixed = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device,
                 dtype: torch.dtype = torch.bfloat16, direct: bool = True) -> None:
        """direct=False keeps prefill on the wrapper's plan and run, and eager decode on its run."""
        import flashinfer

        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"flashinfer attention needs bfloat16 or float16, not {dtype}")
        super().__init__(num_heads, num_kv_heads, head_dim, device, dtype)
        self._fi = flashinfer
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._prefill = _Planner(
            flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD"))
        self._decode = _Planner(
            flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._workspace, "NHD"))
        self._graphs: dict[int, _Planner] = {}
        self._small: SmallBatchDecode | None = None  # the decode graphs' kernel, where set
        self._paged: PagedPrefill | None = None  # the pieces' prefill call's kernel, where set
        self._dummy_page = -1
        # Prefill kernels called directly: decided at the first prefill plan (_form_direct).
        self._direct: DirectPrefill | None = None
        self._direct_decided = not direct
        self._decode_call: DecodeCall | None = self._form_decode_call() if direct else None

    @property
    def prefill_path(self) -> str:
        """How prefill steps run: "direct", "wrapper", or "undecided" before the first."""
        if self._direct is not None:
            return "direct"
        return "wrapper" if self._direct_decided else "undecided"

    def _heads(self) -> dict[str, Any]:
        return dict(q_data_type=self.dtype, kv_data_type=self.dtype, sm_scale=self.scale)

    def prepare(self, layout: StepLayout) -> AttentionMetadata:
        mixed = prepare_mixed(layout, self, self) if self.split_mixed else None
        return mixed if mixed is not None else self._prepare(layout)

    def _prepare(self, layout: StepLayout) -> FlashInferMetadata:
        if self._direct is not None and not layout.is_decode:
            call = self._direct.plan(layout, self._prefill.next_pinned())
            return FlashInferMetadata(layout.out_loc, self._prefill.wrapper, call)
        P, seq = layout.page_size, layout.seq_lens
        npages = pages_per_request(seq, P)
        kv_indptr, last = _indptr(npages), _last_page_lens(seq, npages, P)
        planner = self._decode if layout.is_decode else self._prefill
        indices = layout_page_ids(layout, npages, planner.page_ids)
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        if layout.is_decode:
            planner.plan(kv_indptr, indices, last, nh, nkv, hd, P, **self._heads())
            return FlashInferMetadata(layout.out_loc, planner.wrapper, self._bind_decode())
        planner.plan(_indptr(layout.extend_lens), kv_indptr, indices, last, nh, nkv, hd, P,
                     causal=True, **self._heads())
        if not self._direct_decided:
            self._direct_decided = True
            self._direct = self._form_direct(layout)
        return FlashInferMetadata(layout.out_loc, planner.wrapper)

    def _form_decode_call(self) -> DecodeCall | None:
        from radixserve.engine.attention.flashinfer_direct import DecodeCall, Unsupported

        try:
            return DecodeCall(self._decode.wrapper, self.num_heads, self.scale)
        except Unsupported as e:
            self._decode_unsupported(e)
            return None

    def _bind_decode(self) -> LayerCall | None:
        from radixserve.engine.attention.flashinfer_direct import Unsupported

        if self._decode_call is None:
            return None
        try:
            return self._decode_call.bind()
        except Unsupported as e:
            self._decode_call = None
            self._decode_unsupported(e)
            return None

    def _decode_unsupported(self, e: Exception) -> None:
        log.warning("flashinfer %s: eager decode runs through the wrapper's run, the direct "
                    "kernel call does not fit it: %s", getattr(self._fi, "__version__", "?"), e)

    def _form_direct(self, layout: StepLayout) -> DirectPrefill | None:
        """The direct prefill path, checked against the wrapper's plan of `layout` just made; None
        (logged) where this FlashInfer differs from what it mirrors."""
        from radixserve.engine.attention.flashinfer_direct import DirectPrefill, Unsupported

        version = getattr(self._fi, "__version__", "?")
        wrapper = self._prefill.wrapper
        try:
            direct = DirectPrefill(wrapper, self.num_heads, self.num_kv_heads, self.head_dim,
                                   self.scale)
            direct.verify(wrapper, layout)
        except Unsupported as e:
            log.warning("flashinfer %s: prefill runs through the wrapper's plan and run, the "
                        "direct kernel calls do not fit it: %s", version, e)
            return None
        log.info("flashinfer %s: prefill calls its %s kernels directly", version, direct.backend)
        return direct

    def attend(self, q: torch.Tensor, layer_id: int, meta: AttentionMetadata,
               kv_pool: KVCachePool, out: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(meta, MixedMetadata):
            return attend_mixed(q, layer_id, meta, kv_pool, out)
        assert isinstance(meta, FlashInferMetadata)
        pages = kv_pool.pages[layer_id]  # (k, v), each (pages, P, nkv, hd)
        call = meta.call
        if call is None:
            return meta.wrapper.run(q.contiguous(), pages, out=out)  # (T, nh, hd)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        call(q if q.is_contiguous() else q.contiguous(), pages[0], pages[1], out)
        return out

    def bind_layers(self, q: torch.Tensor, out: torch.Tensor, meta: AttentionMetadata,
                    kv_pool: KVCachePool) -> StepCall:
        if isinstance(meta, MixedMetadata):
            return bind_mixed(q, out, meta, kv_pool)
        assert isinstance(meta, FlashInferMetadata)
        bound = meta.call
        if bound is None or not q.is_contiguous():  # q's contents change from layer to layer
            return super().bind_layers(q, out, meta, kv_pool)
        pages = kv_pool.pages

        def call(layer_id: int) -> None:
            k, v = pages[layer_id]
            bound(q, k, v, out)

        return call

    # -- CUDA graphs ----------------------------------------------------------------------------
    def supports_cuda_graph(self, page_size: int) -> bool:
        return True  # paged decode at any page size

    def init_cuda_graph(self, max_batch: int, max_pages_per_req: int, page_size: int,
                        dummy_page: int, page_table: torch.Tensor | None = None,
                        small_decode_rows: int = 0, piece_prefill_keys: int = 0) -> None:
        dev = self.device
        rows = min(small_decode_rows, max_batch)
        if page_table is not None and rows > 0 and SmallBatchDecode.usable(dev, self.head_dim):
            # graphs up to `rows` rows: no FlashInfer plan, and no KV split that one row cannot fill
            self._small = SmallBatchDecode(self.num_heads, self.num_kv_heads, self.head_dim,
                                           self.scale, rows, page_table)
            if piece_prefill_keys > 0 and PagedPrefill.usable(dev, self.head_dim):
                # beside the small decode call in the pieces only: one graph, no eager call
                self._paged = PagedPrefill(self.num_heads, self.num_kv_heads, self.head_dim,
                                           self.scale, page_table, piece_prefill_keys)
        self._dummy_page, self._page_size = dummy_page, page_size
        # Shared by every captured batch size: replays run one at a time on one stream.
        self._g_indptr = torch.zeros(max_batch + 1, dtype=torch.int32, device=dev)
        self._g_last = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self._g_indices = torch.full((max_batch * max_pages_per_req,), dummy_page,
                                     dtype=torch.int32, device=dev)

    def piece_decode(self, tokens: int) -> tuple[int, LayerCall] | None:
        """The small decode kernel over the first min(tokens, its rows) rows of the pieces (where
        it is set and mixed steps are split)."""
        small = self._small
        if small is None or not self.split_mixed:
            return None
        width = min(tokens, small.max_rows)
        small.plan(width, [], [])  # placeholder for the capture: every row is padding
        return width, small.bind(width)

    def plan_piece_decode(self, width: int, decode: StepLayout) -> None:
        small = self._small_rows(width)
        assert small is not None, "no decode call was captured in the pieces"
        assert decode.page_table is small.page_table and decode.slot_list is not None
        small.plan(width, decode.slot_list, decode.seq_lens)

    def piece_prefill(self, tokens: int) -> LayerCall | None:
        """The paged prefill kernel over the pieces' rows (where it is set beside the small
        decode kernel)."""
        paged = self._paged
        if paged is None or not self.split_mixed:  # (set only beside the small decode kernel)
            return None
        paged.plan(tokens, 0, None)  # placeholder for the capture: no tile has work
        return paged.bind(tokens)

    def plan_piece_prefill(self, tokens: int, first_row: int, prefill: StepLayout) -> bool:
        paged = self._paged
        assert paged is not None, "no prefill call was captured in the pieces"
        assert prefill.page_table is paged.page_table
        return paged.plan(tokens, first_row, prefill)

    def _small_rows(self, batch_size: int) -> SmallBatchDecode | None:
        small = self._small
        return small if small is not None and batch_size <= small.max_rows else None

    def graph_metadata(self, batch_size: int, out_loc: torch.Tensor) -> FlashInferMetadata:
        small = self._small_rows(batch_size)
        if small is not None:
            small.plan(batch_size, [], [])  # placeholder: every row is padding
            return FlashInferMetadata(out_loc, None, small.bind(batch_size))
        wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_cuda_graph=True,
            paged_kv_indptr_buffer=self._g_indptr[: batch_size + 1],
            paged_kv_indices_buffer=self._g_indices,
            paged_kv_last_page_len_buffer=self._g_last[:batch_size])
        planner = _Planner(wrapper)
        self._graphs[batch_size] = planner
        self._plan_padded(planner, batch_size, [], [], None)  # placeholder: every row is padding
        return FlashInferMetadata(out_loc, wrapper)

    def plan_graph(self, batch_size: int, layout: StepLayout) -> None:
        small = self._small_rows(batch_size)
        if small is not None:
            assert layout.page_table is small.page_table and layout.slot_list is not None
            small.plan(batch_size, layout.slot_list, layout.seq_lens)
            return
        P = layout.page_size
        assert P == self._page_size, "graphs were captured for another page size"
        npages = pages_per_request(layout.seq_lens, P)
        planner = self._graphs[batch_size]
        self._plan_padded(planner, batch_size, layout.seq_lens, npages,
                          layout_page_ids(layout, npages, planner.page_ids))

    def _plan_padded(self, planner: _Planner, batch_size: int, seq_lens: list[int],
                     npages: list[int], real: torch.Tensor | None) -> None:
        page_size = self._page_size
        # Rows past the real batch attend to one token of the dummy page (written by nobody else).
        pad = batch_size - len(seq_lens)
        fill = torch.full((pad,), self._dummy_page, dtype=torch.int32, device=self.device)
        indices = fill if real is None else torch.cat([real, fill]) if pad else real
        last = torch.cat([_last_page_lens(seq_lens, npages, page_size),
                          torch.ones(pad, dtype=torch.int32)])
        planner.plan(_indptr(npages + [1] * pad), indices, last, self.num_heads, self.num_kv_heads,
                     self.head_dim, page_size, **self._heads())
