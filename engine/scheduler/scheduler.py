"""Scheduling policy: who runs next step, and the page bookkeeping that makes it safe.

Admission plans pages for a request's prefill plus a share of its remaining output (admission.py):
all of it under "reserve", so a running request never stalls for lack of KV; an estimate under
"optimistic", where a step that cannot get pages retracts the most recently admitted requests.
Cached (evictable) pages count as available because they can be evicted.

A retracted request gives its computed full pages to the prefix cache and goes back to the front
of the waiting queue with its outputs; admitted again, it prefills prompt + outputs (mostly a cache
hit) and continues. Draws are counter-based on (seed, output index), so its tokens do not change.
With overlap, a retracted request may still have a sampled token in flight: that token was drawn
from a complete context, so the core appends it as usual. Admission therefore pauses for the rest of
a step that retracted, so no request is admitted again before its in-flight token is known.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Iterable, NamedTuple

from radixserve.engine.config import EngineConfig
from radixserve.engine.kvcache.allocator import PageAllocator
from radixserve.engine.kvcache.base import PrefixCache
from radixserve.engine.kvcache.table import TableManager
from radixserve.engine.request import Req, ReqStatus, split_running
from radixserve.engine.sampling.params import FinishReason
from radixserve.engine.scheduler.admission import OutputEstimate
from radixserve.engine.scheduler.batch import Batch
from radixserve.engine.scheduler.prefill_budget import PrefillBudget
from radixserve.engine.scheduler.step_cost import StepCost
from radixserve.engine.scheduler.waiting import WaitingQueue

LPM_WINDOW = 128  # waiting requests scored per step under the longest-prefix-match policy


class RunningSplit(NamedTuple):
    """The running requests of one step, in running order."""

    decodes: list[Req]  # decode a token this step
    prefilling: list[Req]  # still have prompt to prefill


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    def __init__(self, config: EngineConfig, table: TableManager, allocator: PageAllocator,
                 cache: PrefixCache, budget: PrefillBudget | None = None) -> None:
        """`budget`: how a step's max_prefill_tokens is counted (tokens where None)."""
        self.config = config
        self.budget = budget or PrefillBudget()
        self.page_size = config.page_size
        self.table, self.allocator, self.cache = table, allocator, cache
        self.waiting = WaitingQueue(self._waits_long)
        self.running: list[Req] = []  # in admission order: the tail is retracted first
        self.estimate = OutputEstimate(config.admission)
        self.step_cost = StepCost()  # fed by the engine with each step's length
        # Running requests with full prefill pages not yet handed to the prefix cache (_publish),
        # in admission order (a dict: a request retracted and admitted again is in it once): only
        # they are looked at each step, not every running request.
        self._unpublished: dict[Req, None] = {}
        self.retractions_total = 0
        self._retracted_this_step = False

    def add(self, req: Req) -> None:
        """Queue a new request at the back of the waiting queue."""
        req.queued_at = time.monotonic()
        self.waiting.append(req)

    # -- accounting -----------------------------------------------------------------------------
    def lifetime_pages(self, prompt_len: int, max_new_tokens: int) -> int:
        return _ceil_div(prompt_len + max_new_tokens, self.page_size)

    def _planned_pages(self, req: Req, fill_len: int) -> int:
        """Pages the request is planned to end with: its whole prefill plus the planned outputs."""
        remaining = req.max_new_tokens - (fill_len - req.prompt_len)
        return _ceil_div(fill_len + self.estimate.planned_outputs(remaining), self.page_size)

    def _pages_still_needed(self, reqs: Iterable[Req]) -> int:
        """Pages the requests may still allocate, summed: each one's planned pages
        (`_planned_pages` at its fill length) less those its computed KV holds, at least 0. One
        loop with `_planned_pages`' terms written out, not a call per request: every step that
        admits runs it over all the running requests (`reserved_pages`), in two thirds of the
        time."""
        P, planned = self.page_size, self.estimate.planned_outputs
        total = 0
        for r in reqs:
            fill = r.fill_len
            # ceil(planned / P) - ceil(cached / P), without _ceil_div's two calls a request
            need = (-(-(fill + planned(r.max_new_tokens - fill + r.prompt_len)) // P)
                    + (-r.cached_len // P))
            if need > 0:
                total += need
        return total

    def reserved_pages(self) -> int:
        return self._pages_still_needed(self.running)

    def available_pages(self, reserved: int) -> int:
        """Pages free or evictable that no running request has reserved; `reserved`: the
        running requests' reservations (`reserved_pages`, or a step's kept total)."""
        return self.allocator.num_free + self.cache.sizes().evictable_pages - reserved

    def _obtainable(self) -> int:
        return self.allocator.num_free + self.cache.sizes().evictable_pages

    def _alloc(self, n: int) -> list[int]:
        short = n - self.allocator.num_free
        if short > 0:
            self.allocator.free(self.cache.evict(short))
        return self.allocator.alloc(n)

    # -- one step -------------------------------------------------------------------------------
    def schedule(self) -> Batch | None:
        batch = Batch()
        self._retracted_this_step = False
        self.estimate.on_step()
        if self._unpublished:  # a retracted or finished request has nothing left to publish
            self._unpublished = {r: None for r in self._unpublished
                                 if r.status is ReqStatus.RUNNING and self._publish(r)}
        decodes, prefilling = self._make_room_for_decodes()
        self._add_decodes(decodes, batch)
        budget = full = self._prefill_budget(decodes, prefilling)
        # Prompts too long for one step share `long_left` of the budget (_long_share).
        long_left = self._long_share(prefilling) if decodes and (prefilling or self.waiting) \
            else math.inf
        for req in prefilling:  # a chunked prompt continues before anyone new is admitted
            if budget > 0 and req.status is ReqStatus.RUNNING:  # not retracted by an earlier chunk
                taken, long_left = self._next_chunk(req, batch, budget, long_left)
                budget -= taken
        admit = self.waiting and not self._retracted_this_step and self._admission_due(budget)
        # The running requests' reservations, summed once per step (a sum over every running
        # request per admission made a burst of arrivals cost O(running x arrivals)); each
        # admission adds its own, and a retraction (it frees some) has it summed again.
        reserved: int | None = None
        while admit and budget > 0 and self.waiting and self.table.num_free_slots > 0:
            req = self._next_waiting()
            if req is None or (long_left <= 0 and self._waits_long(req)):
                break
            if reserved is None or self._retracted_this_step:
                reserved = self.reserved_pages()
            if not self._admit(req, reserved):
                break
            taken, long_left = self._next_chunk(req, batch, budget, long_left)
            budget -= taken
            reserved += self._pages_still_needed((req,))
        batch.decode_rows, batch.prefill_cost = len(decodes), full - budget
        return batch if len(batch) else None

    def _prefill_budget(self, decodes: list[Req], prefilling: list[Req]) -> float:
        """The step's prefill budget: `max_prefill_tokens`, and where the step also decodes, at
        most `mixed_prefill_tokens` and what keeps it within `mixed_step_ratio` decode steps
        (step_cost.py), unless the prefill waiting needs more to enter within
        `mixed_horizon_steps` steps."""
        c = self.config
        budget = float(c.max_prefill_tokens)
        if not decodes:
            return budget
        if c.mixed_prefill_tokens is not None:
            budget = min(budget, c.mixed_prefill_tokens)
        cap = self.step_cost.prefill_within(c.mixed_step_ratio) if c.mixed_step_ratio else None
        if cap is None or cap >= budget:
            return budget
        later = (c.mixed_horizon_steps - 1) * cap  # what the capped steps after this one take
        backlog = self._prefill_backlog(prefilling, later + budget)
        return min(budget, max(cap, backlog - later))

    def long_prompt_chunk(self) -> float:
        """The chunk of a prompt too long for one step (`mixed_budget`) in a step that decodes:
        the smallest that keeps its prefill within `long_prompt_slack` of the time it would take
        in chunks of a whole step's budget (step_cost.py), and no smaller than the
        `mixed_step_ratio` cap. Such prompts share that much of a step, so the gap they make in
        every decoding stream shrinks for a bounded delay of their first token; prompts that fit
        one step are left whole, so a burst of them enters as fast as before. inf (chunks as
        large as the budget) where the slack or the ratio is off, or the costs are not learned."""
        c = self.config
        if not c.long_prompt_slack or not c.mixed_step_ratio:
            return math.inf
        chunk = self.step_cost.chunk_within_slack(self.mixed_budget, c.long_prompt_slack)
        if chunk is None:
            return math.inf
        return max(chunk, self.step_cost.prefill_within(c.mixed_step_ratio) or 0.0)

    @property
    def mixed_budget(self) -> float:
        """The most prefill a step that decodes may take."""
        c = self.config
        return min(c.max_prefill_tokens, c.mixed_prefill_tokens or math.inf)

    def _next_chunk(self, req: Req, batch: Batch, budget: float,
                    long_left: float) -> tuple[float, float]:
        """Add `req`'s next chunk within `budget`, and within `long_left` where its prefill (what
        the cache did not hold) is too long for one step: the budget it takes, and what long
        prompts have left."""
        if long_left == math.inf or not self._prefills_long(req):
            return self._prefill_chunk(req, batch, budget), long_left
        if long_left <= 0:
            return 0.0, long_left
        taken = self._prefill_chunk(req, batch, min(budget, long_left))
        return taken, long_left - taken

    def _long_share(self, prefilling: list[Req]) -> float:
        """What long prompts may prefill in this step: one `long_prompt_chunk` for each that is
        prefilling or waiting, taken first come first served. One long prompt alone keeps its
        slack; a queue of them drains faster as it grows (arrivals faster than one chunk a step
        clears them, or a burst) and widens the decoding streams' gap with it, up to the whole
        budget. At least one chunk, so a long prompt always moves."""
        chunk = self.long_prompt_chunk()
        if chunk == math.inf:
            return chunk
        pending = self.waiting.long + sum(map(self._prefills_long, prefilling))
        return chunk * max(1, pending)

    def _prefills_long(self, req: Req) -> bool:
        """Whether running `req`'s prefill (what the cache did not hold) is too long for one
        step."""
        return self.budget.cost(req.matched_len, req.fill_len) > self.mixed_budget

    def _waiting_prefill(self, req: Req) -> float:
        """The budget waiting `req` would spend on prefill: its prompt, and the outputs of a
        retracted request (what the cache holds is not known before admission)."""
        return self.budget.cost(0, req.prompt_len + len(req.output_ids))

    def _waits_long(self, req: Req) -> bool:
        """Whether waiting `req`'s prefill is too long for one step."""
        return self._waiting_prefill(req) > self.mixed_budget

    def _prefill_backlog(self, prefilling: list[Req], enough: float) -> float:
        """The prefill budget that the running prompts' rest and the waiting requests the free
        slots can take would spend, counted until it reaches `enough`."""
        cost, total = self.budget.cost, 0.0
        for r in prefilling:
            total += cost(r.cached_len, r.fill_len)
        for r in itertools.islice(self.waiting, self.table.num_free_slots):
            if total >= enough:
                break
            total += self._waiting_prefill(r)
        return total

    def _admission_due(self, budget: float) -> bool:
        """Whether this step admits new requests. With `admission_wait_ms` and at least a quarter
        of the request slots decoding, arrivals wait to be admitted together until the oldest has
        waited that long, or until the prompts that the free slots can take fill the step's prefill
        budget (waiting longer would add nobody to the step). Full slots do not end the wait:
        running requests finish meanwhile and free more, and an offline queue of thousands then
        still enters in groups. A lightly loaded engine admits at once: it has the room, and
        waiting would only add to the time to first token."""
        wait_s = (self.config.admission_wait_ms or 0.0) / 1000  # None resolved by EngineCore
        if wait_s <= 0 or len(self.running) * 4 < self.config.max_running_requests:
            return True  # below a quarter of the slots the engine has room: no one waits
        if time.monotonic() - self.waiting[0].queued_at >= wait_s:
            return True
        pending = 0  # prompt tokens of those the free slots can take now
        for req in itertools.islice(self.waiting, self.table.num_free_slots):
            pending += req.prompt_len + len(req.output_ids)
            if pending >= budget:
                return True
        return False

    def _next_waiting(self) -> Req | None:
        if self.config.schedule_policy == "fcfs":
            return next((r for r in self.waiting if self.ready(r)), None)
        window = [r for r in list(self.waiting)[:LPM_WINDOW] if self.ready(r)]
        return max(window, key=lambda r: self.cache.match(r.known_ids()[:-1]).length, default=None)

    def ready(self, req: Req) -> bool:
        """Whether `req` may be admitted: one that follows another (`Req.after`) waits until the
        other's full prompt pages are published to the prefix cache (the step after its prefill
        launched), then matches them. Without a sharing cache there is nothing to wait for."""
        lead = req.after
        if lead is None or lead.finished or not self.cache.shares:
            return True
        P = self.page_size
        return lead.status is ReqStatus.RUNNING and lead.cache_len >= lead.prompt_len // P * P

    def _admit(self, req: Req, reserved: int) -> bool:
        ids = req.known_ids()  # the prompt, plus the outputs of a retracted request
        # Match all but the last token: a fully cached prefill still computes one token and samples.
        match = self.cache.match(ids[:-1])
        self.cache.lock(match.handle)
        need = self._planned_pages(req, len(ids)) - match.length // self.page_size
        if need > self.available_pages(reserved):
            self.cache.unlock(match.handle)
            return False
        self.waiting.remove(req)
        req.slot = self.table.alloc_slot()
        req.status = ReqStatus.RUNNING
        req.matched_len = req.cache_len = req.cached_len = req.device_len = match.length
        req.fill_len = len(ids)
        req.cache_handle = match.handle
        if match.length:
            self.table.set_locations(req.slot, 0, match.locations)
        self.table.set_tokens(req.slot, 0, ids)
        self.running.append(req)
        if self.cache.shares and req.fill_len // self.page_size * self.page_size > req.cache_len:
            self._unpublished[req] = None
        return True

    def _prefill_chunk(self, req: Req, batch: Batch, budget: float) -> float:
        """Add the next chunk of `req`'s prefill to the step; the budget it takes."""
        P, start = self.page_size, req.cached_len
        end = self.budget.chunk_end(start, req.fill_len, budget)
        first_page = _ceil_div(start, P)
        need = _ceil_div(end, P) - first_page
        if need > self._obtainable():  # only under "optimistic": admission guarantees it otherwise
            self._retract_until(need, keep=set(batch.reqs) | {req})
            end = min(end, (first_page + self._obtainable()) * P)  # what is left: a shorter chunk
            if end <= start:
                return 0
            need = _ceil_div(end, P) - first_page
        self.table.alloc_pages(req.slot, first_page, self._alloc(need))
        last = end == req.fill_len
        batch.add(req, start, end, sample=last)
        req.cached_len = end
        req.device_len = end + 1 if last else end
        return self.budget.cost(start, end)

    def _publish(self, req: Req) -> bool:
        """Hand the cache the full pages of prefill that launched steps have computed; whether
        some of the prefill's full pages are still to come.

        Runs before this step's work is added, so every published page is written by an earlier
        step (the device orders later readers after it). Where the cache already holds the same
        tokens (a twin request prefilled them first), the request switches to the cache's pages and
        frees its own copies.
        """
        P = self.page_size
        last = req.fill_len // P * P
        aligned = min(req.cached_len // P * P, last)
        if aligned <= req.cache_len:
            return req.cache_len < last
        tokens = req.token_ids(aligned)
        row = self.table.page_table_cpu[req.slot]
        already = self.cache.insert(tokens, row[:aligned].clone())
        match = self.cache.match(tokens)
        assert match.length == aligned, "a page inserted into the cache does not match"
        if already > req.cache_len:
            own = row[req.cache_len : already : P] // P  # copy before the row is rewritten
            self.table.set_locations(req.slot, req.cache_len,
                                     match.locations[req.cache_len : already])
            self.allocator.free(own)
        self.cache.lock(match.handle)
        self.cache.unlock(req.cache_handle)
        req.cache_handle, req.cache_len = match.handle, aligned
        return aligned < last

    # -- retraction (optimistic admission) -------------------------------------------------------
    def _make_room_for_decodes(self) -> RunningSplit:
        """Retract until every decode this step that starts a new page can have one. Returns the
        running requests that decode this step and those still prefilling."""
        P = self.page_size
        while True:
            decodes, prefilling = split_running(self.running)
            if not self.estimate.optimistic or len(self.running) <= 1:
                return RunningSplit(decodes, prefilling)
            need = sum(1 for r in decodes if r.cached_len % P == 0)
            if need <= self._obtainable():
                return RunningSplit(decodes, prefilling)
            self._retract(self.running[-1])

    def _add_decodes(self, decodes: list[Req], batch: Batch) -> None:
        """One sampled row per request for the token at its cached_len; the requests whose token
        starts a page get their new pages in one allocation and one table write."""
        P = self.page_size
        starting = [r for r in decodes if r.cached_len % P == 0]
        if starting:
            self.table.map_pages([r.slot for r in starting], [r.cached_len // P for r in starting],
                                 self._alloc(len(starting)))
        batch.add_decodes(decodes)
        for r in decodes:
            r.cached_len += 1
            r.device_len += 1

    def _retract_until(self, pages: int, keep: set[Req]) -> None:
        """Retract the latest admitted requests not in `keep` until `pages` are obtainable."""
        for req in reversed(list(self.running)):
            if self._obtainable() >= pages or not self.estimate.optimistic:
                return
            if req not in keep:
                self._retract(req)

    def _retract(self, req: Req) -> None:
        self._release(req)
        self.running.remove(req)
        req.status = ReqStatus.WAITING
        req.matched_len = req.cache_len = req.cached_len = req.device_len = 0
        req.cache_handle = None
        self.waiting.appendleft(req)  # first in line again; its outputs so far are kept
        self.retractions_total += 1
        self._retracted_this_step = True
        self.estimate.on_retraction()

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
        # Only tokens the host has seen can key the cache: a request freed while two overlapped
        # steps are in flight (an abort in the engine's launched_hook) has KV computed for the
        # input of the later one, the token the earlier one is still sampling.
        known = req.prompt_len + len(req.output_ids)
        aligned, held_end = min(L, known) // P * P, _ceil_div(L, P) * P
        row = self.table.page_table_cpu[req.slot]
        if aligned > 0:
            tokens = req.token_ids(aligned)
            already = self.cache.insert(tokens, row[:aligned].clone())
            # Our own copies of pages the cache already had are duplicates: free them.
            self.allocator.free(row[req.cache_len : already : P] // P)
        self.allocator.free(row[aligned:held_end:P] // P)
        self.cache.unlock(req.cache_handle)
        self.table.free_slot(req.slot)
        req.slot = -1
