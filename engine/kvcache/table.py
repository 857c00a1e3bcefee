"""Request slots, the page table and the token pool: per-slot rows the device reads every step.

page_table[slot, pos] is the KV location of token `pos` of the request in `slot`;
token_pool[slot, pos] is its token id. Sampled tokens are written to token_pool on the device, so
the next step reads its inputs there without waiting for the host.
"""

from __future__ import annotations

from typing import Iterable, Literal, NamedTuple, Sequence

import numpy as np
import torch
from radixserve.engine.upload import Upload


class RowWrite(NamedTuple):
    """A queued write of positions [start, start + len(values)) of one slot's row."""

    target: Literal["page_table", "token_pool"]
    slot: int
    start: int
    values: torch.Tensor  # (n,) int64, host


class TableManager:
    def __init__(self, max_slots: int, max_context: int, page_size: int,
                 device: torch.device) -> None:
        self.max_slots, self.page_size = max_slots, page_size
        self.width = -(-max_context // page_size) * page_size  # whole pages per row
        self.page_table = torch.zeros(max_slots, self.width, dtype=torch.int64, device=device)
        self.page_table_cpu = torch.zeros(max_slots, self.width, dtype=torch.int64)  # host mirror
        self._page_table_np = self.page_table_cpu.numpy()  # the same memory, for numpy writes
        self.token_pool = torch.zeros(max_slots, self.width, dtype=torch.int64, device=device)
        self._free_slots = list(range(max_slots - 1, -1, -1))
        # (target tensor, rows, cols, values), and (slot, start) when the write is one run of a
        # row: pending_writes then need not look for the runs
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                  tuple[int, int] | None]] = []

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def alloc_slot(self) -> int:
        return self._free_slots.pop()

    def free_slot(self, slot: int) -> None:
        assert slot not in self._free_slots, f"double free of slot {slot}"
        self._free_slots.append(slot)

    def set_locations(self, slot: int, start: int, locs: torch.Tensor) -> None:
        """Write KV locations for positions [start, start + len(locs)) of a slot.

        The host copy is written now, the device copy at flush."""
        self.page_table_cpu[slot, start : start + len(locs)] = locs
        self._queue(self.page_table, slot, start, locs)

    def set_tokens(self, slot: int, start: int, tokens: Sequence[int] | np.ndarray) -> None:
        # through numpy: about 1 µs for a prompt's 128 int32 ids, against 16 through a list
        self._queue(self.token_pool, slot, start,
                    torch.from_numpy(np.array(tokens, dtype=np.int64)))

    def alloc_pages(self, slot: int, first_page: int, pages: list[int]) -> None:
        """Map logical pages [first_page, first_page + len(pages)) of a slot to physical `pages`."""
        if not pages:
            return
        P = self.page_size
        # numpy, not torch: a handful of ops on a few values, where torch's per-op cost dominates
        locs = (np.array(pages, dtype=np.int64)[:, None] * P + np.arange(P)).ravel()
        self.set_locations(slot, first_page * P, torch.from_numpy(locs))

    def map_pages(self, slots: list[int], page_indices: list[int], pages: list[int]) -> None:
        """Map logical page page_indices[i] of slots[i] to physical page pages[i], for many slots
        in one write (a decode step's new pages)."""
        P = self.page_size
        # numpy, as in alloc_pages: every decode step that crosses a page runs this, and torch's
        # per-op cost made it 2.5-4x slower (65 against 26 us for 128 slots on a CPU)
        offsets = np.arange(P)
        rows = np.repeat(np.array(slots, dtype=np.int64), P)
        cols = (np.array(page_indices, dtype=np.int64)[:, None] * P + offsets).ravel()
        locs = (np.array(pages, dtype=np.int64)[:, None] * P + offsets).ravel()
        self._page_table_np[rows, cols] = locs
        self._pending.append((self.page_table, torch.from_numpy(rows), torch.from_numpy(cols),
                              torch.from_numpy(locs), None))

    def pending_writes(self) -> list[RowWrite]:
        """Writes queued since the last flush, in order: what tensor-parallel followers replay.
        A write that spans several rows (map_pages) becomes one RowWrite per run of consecutive
        positions in one row."""
        out: list[RowWrite] = []
        for t, r, c, v, run in self._pending:
            if not len(v):
                continue
            target: Literal["page_table", "token_pool"] = (
                "page_table" if t is self.page_table else "token_pool")
            if run is not None:
                out.append(RowWrite(target, *run, v))
                continue
            cuts = ((r[1:] != r[:-1]) | (c[1:] != c[:-1] + 1)).nonzero().flatten() + 1
            starts = torch.cat([cuts.new_zeros(1), cuts])  # first cell of each run
            # one conversion per tensor, not per run: a decode step maps a page for many slots
            for slot, start, values in zip(r[starts].tolist(), c[starts].tolist(),
                                           v.tensor_split(cuts)):
                out.append(RowWrite(target, slot, start, values))
        return out

    def replay(self, writes: Iterable[RowWrite]) -> None:
        """Queue another table's `pending_writes` here (host mirror included): one entry per
        table, however many rows the writes touch.

            writes:  (slot 2, start 4, 3 values) (slot 0, start 12, 2 values)
            rows:    2  2  2  0  0             flat cell axis of 5
            cols:    4  5  6  12 13            = (start - first flat index) + flat index
        """
        by_target: dict[str, list[RowWrite]] = {}
        for w in writes:
            by_target.setdefault(w.target, []).append(w)
        for target, ws in by_target.items():
            values = torch.cat([w.values for w in ws])
            lens = torch.tensor([len(w.values) for w in ws])
            rows = torch.tensor([w.slot for w in ws]).repeat_interleave(lens)
            first = torch.tensor([w.start for w in ws]) - (lens.cumsum(0) - lens)
            cols = first.repeat_interleave(lens) + torch.arange(len(values))
            if target == "page_table":
                self.page_table_cpu[rows, cols] = values
            self._pending.append((self.page_table if target == "page_table" else self.token_pool,
                                  rows, cols, values, None))

    def _queue(self, target: torch.Tensor, slot: int, start: int, values: torch.Tensor) -> None:
        cols = torch.arange(start, start + len(values))
        self._pending.append((target, torch.full_like(cols, slot), cols, values, (slot, start)))

    def flush(self) -> None:
        """Apply queued row writes to the device tensors: one copy, one index_put per tensor."""
        upload = Upload(self.page_table.device)
        staged = self.stage_flush(upload)
        upload.send()
        self.apply_flush(staged, upload)

    def stage_flush(self, upload: Upload) -> list[tuple[torch.Tensor, slice]]:
        """Add the queued writes' rows, columns and values to `upload` (one set per written
        tensor) and forget them; `apply_flush` writes them once it is sent."""
        staged = []
        for target in (self.page_table, self.token_pool):
            parts = [p for p in self._pending if p[0] is target]
            if parts:
                # a decode step's only write, its new pages, needs no concatenation
                staged.append((target, upload.add([
                    (parts[0][k] if len(parts) == 1 else torch.cat([p[k] for p in parts]),
                     torch.int64) for k in (1, 2, 3)])))
        self._pending.clear()
        return staged

    @staticmethod
    def apply_flush(staged: list[tuple[torch.Tensor, slice]], upload: Upload) -> None:
        for target, part in staged:
            rows, positions, values = upload.views(part)
            target[rows, positions] = values
