"""EngineCore: the step loop shared by the offline LLM and the scheduler service.

With overlap on, step N+1 is scheduled and launched before step N's sampled ids are read back, so
the host's bookkeeping hides behind the device's work. A request that step N finishes has already
been given a (wasted) slot in step N+1; its result is simply dropped.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from radixserve.engine.config import (
    EAGER_PREFILL_ADMISSION_WAIT_MS,
    GRAPHED_MIXED_STEP_RATIO,
    EngineConfig,
)
from radixserve.engine.constrained.bitmask import fill_grammar_mask
from radixserve.engine.constrained.compiler import Grammar, GrammarCompiler
from radixserve.engine.constrained.matcher import GrammarMatcher
from radixserve.engine.device import resolve_device, resolve_dtype
from radixserve.engine.finish import finish_reason
from radixserve.engine.kvcache import create_prefix_cache
from radixserve.engine.kvcache.allocator import PageAllocator
from radixserve.engine.model_runner import ForwardOutput, ModelRunner
from radixserve.engine.models.config import ModelArgs, read_eos_ids
from radixserve.engine.request import Req, ReqStatus
from radixserve.engine.sampling.params import FinishReason, InvalidRequestError, SamplingParams
from radixserve.engine.scheduler.batch import Batch
from radixserve.engine.scheduler.prefill_budget import PrefillBudget, keys_per_token
from radixserve.engine.scheduler.scheduler import Scheduler
from radixserve.engine.step_times import HOST_BOUNDS, HOST_PHASES, StepTimes, TimeHistogram
from radixserve.engine.tp.launch import TPLeader, building

# While the device computes a step, the engine waits for commands (`launched_hook`) until this
# share of the step's expected length has passed, then for the device: a step shorter than the
# median by more than this is read late by the difference.
WAKE_SHARE = 0.75


class TokenLogprobs(NamedTuple):
    logprob: float
    top: list[tuple[int, float]]


class StepOutput(NamedTuple):
    rid: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs] | None
    finish_reason: FinishReason | None
    matched_stop_token: int | None
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class ModelInfo:
    model_name: str
    architecture: str
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    dtype: str


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        folder = Path(config.model_path)
        self.args = ModelArgs.from_folder(folder)
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, self.args.dtype, device)
        self.config = config
        eos = read_eos_ids(folder)
        # With tp_size > 1 this process is rank 0: it spawns the others and broadcasts every step.
        self.tp = TPLeader(config, self.args, device) if config.tp_size > 1 else None
        with building(self.tp):
            self.runner = ModelRunner(config, self.args, self.tp.device if self.tp else device,
                                      dtype, eos)
        graphed = self.runner.pieces is not None  # steps with prefill replay piecewise graphs
        if config.admission_wait_ms is None:  # hold arrivals back only where prefill is eager
            wait = 0.0 if graphed else EAGER_PREFILL_ADMISSION_WAIT_MS
            config = self.config = replace(config, admission_wait_ms=wait)
        if config.mixed_step_ratio is None:
            ratio = GRAPHED_MIXED_STEP_RATIO if graphed else 0.0
            config = self.config = replace(config, mixed_step_ratio=ratio)
        self.model_info = ModelInfo(folder.name, self.args.architecture, self.args.vocab_size,
                                    self.runner.max_context, eos, str(dtype).removeprefix("torch."))
        self.allocator = PageAllocator(self.runner.num_pages)
        self.cache = create_prefix_cache(config.cache, config.page_size)
        a = self.args
        budget = PrefillBudget(config.prefill_budget, keys_per_token(
            a.hidden_size, a.intermediate_size, a.num_heads, a.num_kv_heads, a.head_dim))
        self.scheduler = Scheduler(config, self.runner.table, self.allocator, self.cache, budget)
        self._reqs: dict[str, Req] = {}
        self._in_flight: tuple[Batch, ForwardOutput] | None = None
        self._last_done = 0.0  # when the last step's outputs were read (time.perf_counter())
        self.step_times = StepTimes()  # steps that decoded, as the streams saw them
        # the engine thread's phases of each step call
        self.host_times = TimeHistogram(HOST_PHASES, HOST_BOUNDS)
        self._busy_since: float | None = None  # the end of the last step call that left work
        self._rng = random.Random(config.seed)
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self._grammars: GrammarCompiler | None = None  # built on the first constraint
        self._grammars_lock = threading.Lock()

    # -- structured output ----------------------------------------------------------------------
    def compile_grammar(self, params: SamplingParams) -> Grammar | None:
        """The compiled constraint of `params` (None when it has none), for `add_request`.

        Thread-safe, unlike the rest of the core: the scheduler service compiles on worker threads
        while the engine thread steps. Cached by (kind, text). Raises InvalidRequestError with the
        compiler's message when the grammar does not compile, or naming the limit (size, compile
        time) it broke."""
        constraint = params.constraint
        if constraint is None:
            return None
        with self._grammars_lock:
            if self._grammars is None:
                c = self.config
                self._grammars = GrammarCompiler(
                    c.model_path, self.args.vocab_size, self.model_info.eos_token_ids,
                    max_bytes=c.max_constraint_bytes, timeout_s=c.grammar_compile_timeout_s)
        return self._grammars.compile(*constraint)

    # -- requests -------------------------------------------------------------------------------
    def add_request(self, rid: str, prompt_ids: Sequence[int], params: SamplingParams,
                    after: str | None = None, grammar: Grammar | None = None) -> None:
        """Queue a request. `after` names a running request with the same prompt (the first of n
        completions): this one is admitted once that one's prompt KV is in the prefix cache and
        reuses it instead of computing it again. `grammar` is what `compile_grammar(params)`
        returned; a constrained request without one is compiled here, on the caller's thread."""
        info = self.model_info
        if rid in self._reqs:
            raise InvalidRequestError(f"request id {rid!r} is already running")
        if len(prompt_ids) == 0:
            raise InvalidRequestError("prompt is empty")
        bad = next((t for t in prompt_ids if not 0 <= t < info.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"token id {bad} is outside the vocabulary [0, "
                                      f"{info.vocab_size})")
        n = len(prompt_ids)
        if n >= info.max_context:
            raise InvalidRequestError(f"prompt has {n} tokens; the model context is "
                                      f"{info.max_context}")
        max_new = (params.max_new_tokens if params.max_new_tokens is not None
                   else info.max_context - n)
        if n + max_new > info.max_context:
            raise InvalidRequestError(f"{n} tokens in prompt, {max_new} requested, limit "
                                      f"{info.max_context}")
        need = self.scheduler.lifetime_pages(n, max_new)
        if need > self.runner.num_pages:
            raise InvalidRequestError(
                f"request needs {need} KV pages ({n} prompt + {max_new} new tokens) but the whole "
                f"pool has {self.runner.num_pages}; lower max_new_tokens or the prompt length")
        if grammar is None:
            grammar = self.compile_grammar(params)
        elif grammar.key != params.constraint:
            raise InvalidRequestError("the compiled grammar is not the request's constraint")
        seed = params.seed if params.seed is not None else self._rng.getrandbits(64)
        req = Req(rid, list(prompt_ids), params, max_new, seed)
        # the ids that end it (`finish_reason`), read for each of its outputs
        req.end_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else frozenset(info.eos_token_ids))
        if grammar is not None:  # each request (each of n completions too) has its own matcher
            # xgrammar refuses stop ids outside the vocabulary (a config may list such an EOS)
            stop_ids = tuple(sorted(t for t in set(info.eos_token_ids) | set(params.stop_token_ids)
                                    if t < info.vocab_size))
            req.grammar = GrammarMatcher(grammar, stop_ids)
        req.after = self._reqs.get(after) if after is not None else None
        self._reqs[rid] = req
        self.scheduler.add(req)

    def abort(self, rid: str) -> bool:
        req = self._reqs.pop(rid, None)
        if req is None or req.finished:
            return False
        self.scheduler.finish(req, "aborted")
        return True

    def has_work(self) -> bool:
        return bool(self.scheduler.waiting or self.scheduler.running or self._in_flight)

    # -- the loop -------------------------------------------------------------------------------
    def step(self, launched_hook: Callable[..., None] | None = None) -> list[StepOutput]:
        """Schedule and launch a step, then read the outputs of the one before it (overlap on) or
        of this one. `launched_hook(wait_s=0.0)` runs in between, while the device computes: the
        serving loop applies the commands (aborts) that came during the step there, rather than
        after it. It runs once after the launch, then, while the step being read is expected to
        run a while longer, with `wait_s` > 0: the loop then blocks up to that long for the next
        command, so an abort that comes while the engine waits for the device is applied at once
        (`_apply_while_computing`). An abort there frees a request with steps in flight, which
        `_process` then skips, as it does when one overlapped step is in flight; pages freed there
        go to steps launched later on the same stream, so no kernel still reading them is
        overtaken."""
        scheduled_at = time.perf_counter()
        host = self.host_times
        if self._busy_since is not None:
            host.observe("loop", scheduled_at - self._busy_since)
        batch = self.scheduler.schedule()
        if batch is not None:
            batch.scheduled_at = scheduled_at
            host.observe("schedule", time.perf_counter() - scheduled_at)
        if batch is not None and self.tp is not None:
            # Every rank samples, but only this one has grammar state: the plan carries the mask.
            batch.grammar = fill_grammar_mask([r.grammar for r, s in zip(batch.reqs, batch.sample)
                                               if s], self.args.vocab_size)
            self.tp.send_plan(batch, self.runner.table)
        launched = None
        if batch is not None:
            launch_at = time.perf_counter()
            launched = (batch, self.runner.forward(batch))
            host.observe("launch", time.perf_counter() - launch_at)
        if launched_hook is not None:
            hook_at = time.perf_counter()
            launched_hook()
            host.observe("commands", time.perf_counter() - hook_at)
        if not self.config.overlap:
            outputs = self._process(*launched, launched_hook) if launched else []
        else:
            previous, self._in_flight = self._in_flight, launched
            outputs = self._process(*previous, launched_hook) if previous else []
        self._busy_since = time.perf_counter() if self.has_work() else None
        return outputs

    def _started(self, batch: Batch) -> float:
        """When the device began `batch`: when the step before it was read, or when it was
        scheduled if the engine was idle in between (time.perf_counter())."""
        return max(self._last_done, batch.scheduled_at)

    def _apply_while_computing(self, batch: Batch, out: ForwardOutput,
                               hook: Callable[..., None]) -> None:
        """Until WAKE_SHARE of `batch`'s expected length has passed since it started, wait
        for commands through `hook` instead of for the device. Nothing is waited where the length
        is not known yet."""
        expected = self.scheduler.step_cost.expected_s(batch.decode_rows, batch.prefill_cost)
        if expected is None:
            return
        wake = self._started(batch) + WAKE_SHARE * expected
        while not out.done():
            left = wake - time.perf_counter()
            if left <= 0:
                return
            hook(left)

    def _process(self, batch: Batch, out: ForwardOutput,
                 hook: Callable[..., None] | None = None) -> list[StepOutput]:
        wait_at = time.perf_counter()
        if hook is not None:
            self._apply_while_computing(batch, out, hook)
        out.wait()
        done = time.perf_counter()
        self.host_times.observe("wait", done - wait_at)
        seconds = done - self._started(batch)
        self.scheduler.step_cost.observe(batch.decode_rows, batch.prefill_cost, seconds)
        if batch.decode_rows:
            self.step_times.observe_step(batch.prefill_cost, seconds)
        self._last_done = done
        if self.tp is not None:
            self.tp.check()  # a peer that died mid-step leaves results that must not be used
        results: list[StepOutput] = []
        reqs, finished = batch.reqs, ReqStatus.FINISHED
        logprobs = None
        with_logprobs = out.sample.logprobs is not None  # None: no row of the step wants them
        # Every sampled row of every step runs this loop, so it is written for the interpreter:
        # a row that cannot end here skips finish_reason (`end_ids` and the length are all that
        # can end an unconstrained one), and outputs are built as tuple.__new__ builds them for
        # NamedTuple._make, without the generated __new__'s Python call (together 110 against 65
        # us for 192 rows on a CPU).
        new = tuple.__new__
        for j, (row, token) in enumerate(zip(out.rows, out.sample.tokens.tolist())):
            req = reqs[row]
            if req.status is finished:
                continue  # finished or aborted while this step was in flight
            outputs = req.output_ids
            if not outputs:
                self.prompt_tokens_total += req.prompt_len
                self.cached_tokens_total += req.matched_len
            outputs.append(token)
            if (req.grammar is None and token not in req.end_ids
                    and len(outputs) < req.max_new_tokens):
                reason = None
            else:
                reason = finish_reason(req, token, self.model_info.eos_token_ids)
            if reason is not None:
                self.scheduler.finish(req, reason)
                del self._reqs[req.rid]
            if with_logprobs:
                logprobs = self._logprobs(out, j, req)
            results.append(new(StepOutput, (req.rid, [token], logprobs, reason,
                                            req.matched_stop_token, req.prompt_len,
                                            req.matched_len)))
        self.host_times.observe("process", time.perf_counter() - done)
        return results

    @staticmethod
    def _logprobs(out: ForwardOutput, j: int, req: Req) -> list[TokenLogprobs] | None:
        s = out.sample
        if not req.params.wants_logprobs or s.logprobs is None:
            return None
        top: list[tuple[int, float]] = []
        if req.params.top_logprobs and s.top_ids is not None and s.top_logprobs is not None:
            n = req.params.top_logprobs
            top = list(zip(s.top_ids[j, :n].tolist(), s.top_logprobs[j, :n].tolist()))
        return [TokenLogprobs(float(s.logprobs[j]), top)]

    def close(self) -> None:
        """Stop tensor-parallel workers and grammar compile workers; the core is unusable after."""
        if self.tp is not None:
            self.tp.close()
        if self._grammars is not None:
            self._grammars.close()

    # -- introspection --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        sizes = self.cache.sizes()
        cost, ratio = self.scheduler.step_cost, self.config.mixed_step_ratio
        long_chunk = self.scheduler.long_prompt_chunk()
        return {
            "running_requests": len(self.scheduler.running),
            "waiting_requests": len(self.scheduler.waiting),
            "kv_pages_total": self.runner.num_pages,
            "kv_pages_free": self.allocator.num_free,
            "kv_pages_evictable": sizes.evictable_pages,
            "kv_pages_protected": sizes.protected_pages,
            "page_size": self.config.page_size,
            "cached_tokens_total": self.cached_tokens_total,
            "prompt_tokens_total": self.prompt_tokens_total,
            "retractions_total": self.scheduler.retractions_total,
            # what the engine has learned of its steps (scheduler/step_cost.py); 0: not yet, or
            # (the cap) mixed_step_ratio off
            "decode_step_us": int((cost.decode_s or 0.0) * 1e6),
            "mixed_prefill_cap": int(cost.prefill_within(ratio) or 0) if ratio else 0,
            # the chunk of a prompt longer than a step beside decodes (long_prompt_slack); 0: its
            # chunks fill max_prefill_tokens
            "long_prompt_chunk": int(long_chunk) if long_chunk < self.scheduler.mixed_budget else 0,
            # host time ModelRunner spent filling structured-output token masks, and its steps
            "grammar_mask_us_total": int(self.runner.grammar_mask_s * 1e6),
            "grammar_mask_steps_total": self.runner.grammar_mask_steps,
            "forward_paths": dict(self.runner.forward_paths),  # model_runner.FORWARD_PATHS
            "step_seconds": self.step_times.snapshot(),  # engine/step_times.py
            "mixed_step_seconds": self.step_times.mixed.snapshot(),
            "host_seconds": self.host_times.snapshot(),
        }

    def check_integrity(self) -> None:
        """Pool invariant: when idle, free + evictable + protected pages == total, no slot held;
        the scheduler's counts match its queues."""
        self.cache.check_integrity()
        self.scheduler.waiting.check_integrity()
        if self.has_work():
            return
        s = self.stats()
        total = s["kv_pages_free"] + s["kv_pages_evictable"] + s["kv_pages_protected"]
        assert total == s["kv_pages_total"], f"KV pages leaked: {s}"
        assert s["kv_pages_protected"] == 0, f"idle engine still protects pages: {s}"
        assert self.runner.table.num_free_slots == self.config.max_running_requests, (
            "request slot leaked")
        assert not self._reqs, f"requests left behind: {list(self._reqs)[:5]}"
