"""The attention backend interface: plan once per step, then run for every layer."""

from __future__ import annotations

import functools
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from radixserve.engine.causal import attended_keys
from radixserve.engine.host_buffers import HostBuffers
from radixserve.engine.upload import upload_columns

if TYPE_CHECKING:
    from radixserve.engine.kvcache.pool import KVCachePool


# (q, k_pages, v_pages, out) -> None: one layer's attention, written into out; a kernel call with
# its step's arguments bound (flashinfer_direct.py, small_decode.py)
LayerCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
# layer_id -> None: a step's attention with its query and output buffers bound (`bind_layers`)
StepCall = Callable[[int], None]


@dataclass
class StepLayout:
    """Where a step's tokens sit. Requests are laid out back to back in the flat token axis.

    For request i: its new tokens are positions [prefix_lens[i], seq_lens[i]) of its sequence, and
    its KV locations for positions [0, seq_lens[i]) are page_table[slots[i], :seq_lens[i]].
    """

    slots: torch.Tensor  # (B,) int64, device
    prefix_lens: list[int]  # host
    seq_lens: list[int]  # host
    out_loc: torch.Tensor  # (T,) int64 KV locations of the new tokens, device
    page_table: torch.Tensor  # (max_slots, width) int64, device
    page_size: int
    # the slots on the host, where the caller has them: backends then find page ids with less
    # device work (`page_cells`)
    slot_list: list[int] | None = None

    # Read by the runner, the graphs and the backend in one step: computed once a layout (the
    # lists are the step's and never change).
    @functools.cached_property
    def extend_lens(self) -> list[int]:
        return [s - p for s, p in zip(self.seq_lens, self.prefix_lens)]

    @functools.cached_property
    def is_decode(self) -> bool:
        return all(e == 1 for e in self.extend_lens)

    @property
    def prefill_keys(self) -> int:
        """Keys that the new tokens of the step's prefill rows (those adding more than one token)
        attend to, summed."""
        return sum(attended_keys(p, s) for p, s in zip(self.prefix_lens, self.seq_lens)
                   if s - p > 1)

    def as_decode_rows(self, row_slots: torch.Tensor) -> StepLayout:
        """The same attention as a decode layout: every new token a row of its own, whose context
        is its sequence up to and including itself. Exact because `forward` stores every new
        token's K/V before any row attends. row_slots: (T,) int64 on the device, each token's slot.

            request at slot 5, positions [3, 6)  ->  rows (slot 5, prefix 3, seq 4),
                                                         (slot 5, prefix 4, seq 5),
                                                         (slot 5, prefix 5, seq 6)
        """
        assert self.slot_list is not None, "decode rows need the slots on the host"
        slots: list[int] = []
        prefix: list[int] = []
        for slot, p, s in zip(self.slot_list, self.prefix_lens, self.seq_lens):
            slots += [slot] * (s - p)
            prefix += range(p, s)
        return StepLayout(row_slots, prefix, [p + 1 for p in prefix], self.out_loc,
                          self.page_table, self.page_size, slots)


@dataclass
class AttentionMetadata:
    """Backend-specific per-step state built by `prepare`; subclasses add their fields."""

    out_loc: torch.Tensor  # (T,) int64 KV locations of the step's new tokens


class AttentionBackend(ABC):
    name = ""  # the registry name (`create_backend`), used in start-up messages
    # Whether `prepare` plans a step of decode rows and prefill as two parts, the decode rows for
    # the decode kernel (attention/mixed.py). Backends that can set it (`keep_split_mixed`).
    split_mixed = False

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device,
                 dtype: torch.dtype = torch.float32) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.device, self.dtype = device, dtype

    def keep_split_mixed(self, keep: bool) -> None:
        """keep=False: mixed steps run as one part (EngineConfig.split_mixed_attention)."""
        self.split_mixed = self.split_mixed and keep

    @abstractmethod
    def prepare(self, layout: StepLayout) -> AttentionMetadata:
        """Build per-step metadata once; every layer reuses it."""

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                layer_id: int, meta: AttentionMetadata, kv_pool: KVCachePool,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """Store k/v at meta.out_loc, then causal attention of q over each request's whole context.

        Shapes: q (T, nh, hd), k and v (T, nkv, hd) -> (T, nh, hd). k and v are None when the caller
        has already written them (the fused rotary kernel stores them as it goes). `out`: as in
        `attend`.
        """
        if k is not None and v is not None:
            kv_pool.store(layer_id, meta.out_loc, k, v)
        return self.attend(q, layer_id, meta, kv_pool, out)

    @abstractmethod
    def attend(self, q: torch.Tensor, layer_id: int, meta: AttentionMetadata,
               kv_pool: KVCachePool, out: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention of q (T, nh, hd) over each request's context, new tokens included.
        Returns (T, nh, hd): `out` when given (a contiguous (T, nh, hd) tensor of q's dtype, which
        receives the result: the piecewise graphs' static buffer), else a new tensor."""

    def bind_layers(self, q: torch.Tensor, out: torch.Tensor, meta: AttentionMetadata,
                    kv_pool: KVCachePool) -> StepCall:
        """`attend(q, layer_id, meta, kv_pool, out)` for every layer of a step whose layers all
        read q and write out, the same buffers (the piecewise graphs' static ones): what can be
        worked out once a step (views of the buffers, the kernel's bound arguments) is, so each
        layer pays only its kernel launches."""
        attend = self.attend

        def call(layer_id: int) -> None:
            attend(q, layer_id, meta, kv_pool, out)

        return call

    # -- piecewise graphs -------------------------------------------------------------------------
    def piece_decode(self, tokens: int) -> tuple[int, LayerCall] | None:
        """For piecewise graphs of `tokens` rows: (width, call), a decode attention call over the
        first `width` rows, captured inside each piece after its KV store, so a step's one-token
        rows need no call between the pieces (`plan_piece_decode` plans them); None where the
        backend has none. Planned for padding only, so the capture can run."""
        return None

    def plan_piece_decode(self, width: int, decode: StepLayout) -> None:
        """Plan the call `piece_decode` returned for `width` rows for a step's leading one-token
        rows (`decode`: their layout, 1 to `width` rows; the rows past them are padding); the
        step's other rows are `prepare`d apart (`PiecewiseGraphRunner.prepare`)."""
        raise NotImplementedError(f"{type(self).__name__} captures no decode call in the pieces")

    def piece_prefill(self, tokens: int) -> LayerCall | None:
        """For piecewise graphs of `tokens` rows that capture a decode call: a prefill attention
        call over their rows, planned on the device (`plan_piece_prefill`), so that a step's
        prefill rows need no call between the pieces either; None where the backend has none.
        Planned for no rows, so the capture can run."""
        return None

    def plan_piece_prefill(self, tokens: int, first_row: int, prefill: StepLayout) -> bool:
        """Plan the call `piece_prefill` returned for `tokens` rows for a step's prefill rows
        (`prefill`: their layout; its first new token is row `first_row`), after its decode rows.
        False where the call does not take them: they then run between the pieces."""
        raise NotImplementedError(f"{type(self).__name__} captures no prefill call in the pieces")

    # -- page sizes -------------------------------------------------------------------------------
    def check_page_size(self, page_size: int) -> str:
        """Called once at engine start with the pool's page size.

        Raises ValueError, naming the backend, the page size and what to use instead, when the
        backend cannot serve `page_size` at all. Otherwise returns "" or a warning for the log:
        what this page size costs the backend and which page size avoids it.
        """
        return ""

    def supports_cuda_graph(self, page_size: int) -> bool:
        """Whether a padded decode batch at `page_size` can run inside a CUDA graph; backends that
        return True implement the three graph methods below for that page size."""
        return False

    # -- CUDA graphs (decode only) ----------------------------------------------------------------
    def init_cuda_graph(self, max_batch: int, max_pages_per_req: int, page_size: int,
                        dummy_page: int, page_table: torch.Tensor | None = None,
                        small_decode_rows: int = 0, piece_prefill_keys: int = 0) -> None:
        """Allocate the static buffers that captured decode graphs read.

        `dummy_page` is a KV page no request owns: padded rows attend to it and write into it.
        `page_table` (slots, width) int64 maps a request's positions to KV locations (the
        `StepLayout` page table, the same tensor every step): graphs of up to `small_decode_rows`
        rows may read it directly, where the backend has such a kernel (EngineConfig.
        small_decode_rows), and so may the pieces' prefill call, for steps whose requests attend
        to at most `piece_prefill_keys` keys (EngineConfig.piece_prefill_keys; 0: none).
        """
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def graph_metadata(self, batch_size: int, out_loc: torch.Tensor) -> AttentionMetadata:
        """Metadata captured into the graph for a padded decode batch of `batch_size` rows.

        out_loc: (batch_size,) static buffer that holds the KV locations of the new tokens.
        Planned for a placeholder batch, so the capture itself can run.
        """
        raise NotImplementedError

    def plan_graph(self, batch_size: int, layout: StepLayout) -> None:
        """Re-plan the captured metadata of `batch_size` for a real decode layout of B <= batch_size
        rows (rows past B are padding). Runs outside the graph, before each replay."""
        raise NotImplementedError


def into(result: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """`attend`'s return for a backend whose kernel allocates its own output."""
    if out is None:
        return result
    return out.copy_(result)


def pages_per_request(seq_lens: list[int], page_size: int) -> list[int]:
    return [-(-s // page_size) for s in seq_lens]


def last_page_lens(seq_lens: list[int], num_pages: list[int], page_size: int) -> list[int]:
    """Tokens in each request's last page (FlashInfer's paged_kv_last_page_len)."""
    return [s - (n - 1) * page_size for s, n in zip(seq_lens, num_pages)]


def prefix_sums(values: list[int]) -> list[int]:
    """[0, v0, v0 + v1, ...]: an indptr over `values`."""
    return [0, *itertools.accumulate(values)]


def page_indices(page_table: torch.Tensor, slots: torch.Tensor, num_pages: list[int],
                 page_size: int) -> torch.Tensor:
    """Physical page ids of each request's pages, concatenated: (sum(num_pages),) int32, device.

    Valid because locations are page-granular: location(pos) = page(pos // P) * P + pos % P, so a
    page's id is its first slot's location // P. Built on the device without a host sync.
    """
    dev = page_table.device
    counts = torch.tensor(num_pages, dtype=torch.int64)
    n = int(counts.sum())
    starts = torch.cumsum(counts, 0) - counts
    counts_d = counts.to(dev, non_blocking=True)
    rows = torch.repeat_interleave(slots, counts_d, output_size=n)  # (n,) slot of each page
    first = torch.repeat_interleave(starts.to(dev, non_blocking=True), counts_d, output_size=n)
    cols = (torch.arange(n, device=dev) - first) * page_size  # (n,) first position of each page
    return (page_table[rows, cols] // page_size).to(torch.int32)


def page_cells(slot_list: list[int], num_pages: list[int], width: int,
               page_size: int) -> np.ndarray:
    """Host side of `page_indices` where the slots are known on the host: the flat index into
    page_table.view(-1) of each page's first slot, request after request ((sum(num_pages),) int64).
    `pages_at` reads the page ids there on the device, in one gather."""
    counts = np.asarray(num_pages, dtype=np.int64)
    starts = np.cumsum(counts) - counts  # first page of each request in the flat page axis
    base = np.asarray(slot_list, dtype=np.int64) * width - starts * page_size
    return np.repeat(base, counts) + np.arange(int(counts.sum()), dtype=np.int64) * page_size


def pages_at(page_table: torch.Tensor, cells: torch.Tensor, page_size: int) -> torch.Tensor:
    """Page ids (int32, device) at `page_cells` positions of the page table (uploaded)."""
    return (page_table.view(-1)[cells] // page_size).to(torch.int32)


def layout_page_ids(layout: StepLayout, num_pages: list[int],
                    buffers: HostBuffers | None = None) -> torch.Tensor:
    """`page_indices` of the layout's requests: where the layout has its slots on the host, from
    their page cells in one upload and one gather (3 kernels instead of 10, each one's launch
    paid in host time every step). `buffers`: where a caller that plans once a step stages the
    upload (`upload_columns`)."""
    P = layout.page_size
    if layout.slot_list is None:
        return page_indices(layout.page_table, layout.slots, num_pages, P)
    cells = page_cells(layout.slot_list, num_pages, layout.page_table.size(1), P)
    (cells_d,) = upload_columns([(cells, torch.int64)], layout.page_table.device, buffers)
    return pages_at(layout.page_table, cells_d, P)
