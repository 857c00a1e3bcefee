"""Scheduling policy: who runs next step, and the page bookkeeping that makes it safe.

Admission reserves pages for a request's whole remaining output, so a running request never
stalls for lack of KV; cached (evictable) pages count as available because they can be evicted.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from radixserve.engine.config import EngineConfig
from radixserve.engine.kvcache.allocator import PageAllocator
from radixserve.engine.kvcache.base import PrefixCache
from radixserve.engine.kvcache.table import TableManager
from radixserve.engine.request import FinishReason, Req, ReqStatus
from radixserve.engine.scheduler.batch import Batch

LPM_WINDOW = 128  # waiting requests scored per step under the longest-prefix-match policy


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    def __init__(self, config: EngineConfig, table: TableManager, allocator: PageAllocator,
                 cache: PrefixCache) -> None:
        self.config = config
        self.page_size = config.page_size
        self.table, self.allocator, self.cache = table, allocator, cache
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []

    # -- accounting -----------------------------------------------------------------------------
    def lifetime_pages(self, prompt_len: int, max_new_tokens: int) -> int:
        return _ceil_div(prompt_len + max_new_tokens, self.page_size)

    def _pages_still_needed(self, req: Req) -> int:
        held = _ceil_div(req.cached_len, self.page_size)
        return self.lifetime_pages(req.prompt_len, req.max_new_tokens) - held

    def reserved_pages(self) -> int:
        return sum(self._pages_still_needed(r) for r in self.running)

    def available_pages(self) -> int:
        return self.allocator.num_free + self.cache.sizes().evictable_pages - self.reserved_pages()

    def _alloc(self, n: int) -> list[int]:
        short = n - self.allocator.num_free
        if short > 0:
            self.allocator.free(self.cache.evict(short))
        return self.allocator.alloc(n)

    # -- one step -------------------------------------------------------------------------------
    def schedule(self) -> Batch | None:
        batch = Batch()
        P = self.page_size
        for req in self.running:
            if req.can_decode:
                pos = req.cached_len
                if pos % P == 0:
                    self.table.alloc_pages(req.slot, pos // P, self._alloc(1))
                batch.add(req, pos, pos + 1, sample=True)
                req.cached_len += 1
                req.device_len += 1
        budget = self.config.max_prefill_tokens
        for req in self.running:  # a chunked prompt continues before anyone new is admitted
            if budget > 0 and not req.prefill_done:
                budget -= self._prefill_chunk(req, batch, budget)
        while budget > 0 and self.waiting and self.table.num_free_slots > 0:
            req = self._next_waiting()
            if not self._admit(req):
                break
            budget -= self._prefill_chunk(req, batch, budget)
        return batch if len(batch) else None

    def _next_waiting(self) -> Req:
        if self.config.schedule_policy == "fcfs":
            return self.waiting[0]
        window = list(self.waiting)[:LPM_WINDOW]
        return max(window, key=lambda r: self.cache.match(r.prompt_array[: r.prompt_len - 1]).length)

    def _admit(self, req: Req) -> bool:
        # Match all but the last prompt token: a fully cached prompt still prefills one token.
        match = self.cache.match(req.prompt_array[: req.prompt_len - 1])
        self.cache.lock(match.handle)
        need = self.lifetime_pages(req.prompt_len, req.max_new_tokens) - match.length // self.page_size
        if need > self.available_pages():
            self.cache.unlock(match.handle)
            return False
        self.waiting.remove(req)
        req.slot = self.table.alloc_slot()
        req.status = ReqStatus.RUNNING
        req.matched_len = req.cached_len = req.device_len = match.length
        req.cache_handle = match.handle
        self.table.set_locations(req.slot, 0, match.locations)
        self.table.set_tokens(req.slot, 0, req.prompt_ids)
        self.running.append(req)
        return True

    def _prefill_chunk(self, req: Req, batch: Batch, budget: int) -> int:
        start = req.cached_len
        end = min(req.prompt_len, start + budget)
        first_page = _ceil_div(start, self.page_size)
        self.table.alloc_pages(req.slot, first_page, self._alloc(_ceil_div(end, self.page_size) - first_page))
        last = end == req.prompt_len
        batch.add(req, start, end, sample=last)
        req.cached_len = end
        req.device_len = end + 1 if last else end
        return end - start

    # -- leaving --------------------------------------------------------------------------------
    def finish(self, req: Req, reason: FinishReason) -> None:
        """Mark finished and give back the slot; computed full pages go to the prefix cache."""
        if req.status is ReqStatus.WAITING:
            self.waiting.remove(req)
        elif req.status is ReqStatus.RUNNING:
            self._release(req)
            self.running.remove(req)
        req.status, req.finish_reason = ReqStatus.FINISHED, reason

    def _release(self, req: Req) -> None:
        P, L = self.page_size, req.cached_len
        aligned, held_end = L // P * P, _ceil_div(L, P) * P
        row = self.table.page_table_cpu[req.slot]
        if aligned > 0:
            tokens = np.asarray(req.token_ids(aligned), dtype=np.int32)
            already = self.cache.insert(tokens, row[:aligned].clone())
            # Our own copies of pages the cache already had are duplicates: free them.
            self.allocator.free(row[req.matched_len : already : P] // P)
        self.allocator.free(row[aligned:held_end:P] // P)
        self.cache.unlock(req.cache_handle)
        self.table.free_slot(req.slot)
        req.slot = -1
