"""Steps that carry decodes and prefill together: the decode rows run the decode kernel.

The scheduler adds a step's decodes before its prefill chunks (`Scheduler.schedule`), so a mixed
step's flat token axis holds D one-token rows first, then the chunks. One prefill kernel over the
whole step does the decode rows' work badly: on an H200, Qwen3-0.6B, a step of 256 decode rows
that also carries one 128-token prompt took 12.6 ms against 5.7 ms for the 256 rows alone
(docs/benchmarks.md, "Mixed steps"). Split, each part is planned by the backend that runs it
(the same backend for both, or a hybrid's two) and writes its own rows of the output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from radixserve.engine.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    StepCall,
    StepLayout,
)

if TYPE_CHECKING:
    from radixserve.engine.kvcache.pool import KVCachePool


@dataclass
class MixedMetadata(AttentionMetadata):
    rows: int  # D: the step's first D tokens are its decode rows, one per request
    decode_backend: AttentionBackend
    decode: AttentionMetadata  # planned for the first D requests
    prefill_backend: AttentionBackend
    prefill: AttentionMetadata  # planned for the rest


def leading_decode_rows(layout: StepLayout) -> int:
    """How many of the step's rows, from the first, add one token each (its decode rows)."""
    ext = layout.extend_lens
    return next((i for i, e in enumerate(ext) if e != 1), len(ext))


def split_layout(layout: StepLayout,
                 d: int | None = None) -> tuple[StepLayout, StepLayout] | None:
    """(the first d rows, the rest), by default d the leading one-token rows; None where either
    part would be empty."""
    d = leading_decode_rows(layout) if d is None else d
    if d == 0 or d == len(layout.seq_lens):
        return None
    slots = layout.slot_list

    def part(a: int, b: int | None, t0: int, t1: int | None) -> StepLayout:
        return StepLayout(layout.slots[a:b], layout.prefix_lens[a:b], layout.seq_lens[a:b],
                          layout.out_loc[t0:t1], layout.page_table, layout.page_size,
                          None if slots is None else slots[a:b])

    return part(0, d, 0, d), part(d, None, d, None)


def prepare_mixed(layout: StepLayout, decode: AttentionBackend,
                  prefill: AttentionBackend) -> MixedMetadata | None:
    """Plan a step with decode rows and prefill as two parts; None where it is not both."""
    parts = split_layout(layout)
    if parts is None:
        return None
    d, p = parts
    return MixedMetadata(layout.out_loc, len(d.seq_lens), decode, decode.prepare(d), prefill,
                         prefill.prepare(p))


def attend_mixed(q: torch.Tensor, layer_id: int, meta: MixedMetadata, kv_pool: KVCachePool,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """`AttentionBackend.attend` of a split step: q (T, nh, hd) -> (T, nh, hd), each part written
    into its rows of `out` (contiguous, so both row ranges are too)."""
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    d = meta.rows
    meta.decode_backend.attend(q[:d], layer_id, meta.decode, kv_pool, out[:d])
    meta.prefill_backend.attend(q[d:], layer_id, meta.prefill, kv_pool, out[d:])
    return out


def bind_mixed(q: torch.Tensor, out: torch.Tensor, meta: MixedMetadata,
               kv_pool: KVCachePool) -> StepCall:
    """`AttentionBackend.bind_layers` of a split step: each part bound to its rows once."""
    d = meta.rows
    decode = meta.decode_backend.bind_layers(q[:d], out[:d], meta.decode, kv_pool)
    prefill = meta.prefill_backend.bind_layers(q[d:], out[d:], meta.prefill, kv_pool)

    def call(layer_id: int) -> None:
        decode(layer_id)
        prefill(layer_id)

    return call
