"""The engine loop: one thread that owns the engine, applies batched commands, and steps.

Everything that touches the engine happens on this thread, so the engine needs no locks. The
asyncio side talks to it through `submit` (thread-safe) and a `LoopSink` whose methods the loop
calls from its thread (implementations hop back onto the event loop).

Each iteration: drain every queued command (blocking only when idle), apply new requests then
aborts, run at most one engine step, and emit at most one `StepBatch`. Commands that arrive while
the step runs are drained once more when it has launched its work on the device (the engine's
`launched_hook`), and again as they arrive while the engine waits for the device, so an abort
frees its request's pages within the step it arrived in, or at the latest at the start of the
next one.
"""

from __future__ import annotations

import faulthandler
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from radixserve.engine.sampling.params import InvalidRequestError, SamplingParams
from radixserve.engine.step_times import HOST_BOUNDS, TimeHistogram
from radixserve.services.scheduler.groups import Refused, add_whole, partition
from radixserve.services.scheduler.profiling import EngineProfile
from radixserve.services.scheduler.types import (
    AbortOwned,
    Acks,
    Command,
    NewRequest,
    Rejection,
    StepBatch,
)

log = logging.getLogger(__name__)
# Where a timed abort came from: a gateway (a client's cancel, a deadline, the Abort RPC) or the
# detokenizer (a stop string matched)
ABORT_SOURCES = ("gateway", "stop_string")


class EngineLike(Protocol):
    """The subset of `radixserve.engine.core.EngineCore` the loop drives (docs/engine-api.md)."""

    model_info: Any

    def add_request(self, rid: str, prompt_ids: list[int], params: SamplingParams,
                    after: str | None = None, grammar: Any = None) -> None: ...
    def compile_grammar(self, params: SamplingParams) -> Any:
        """Thread-safe and cached; None when unconstrained; InvalidRequestError when it does not
        compile. Called on the scheduler's compile workers, never on the loop thread."""
    def abort(self, rid: str) -> bool: ...
    def step(self, launched_hook: Callable[..., None] | None = None) -> list[Any]:
        """`launched_hook(wait_s=0.0)`: called within the step while the device computes, once
        after the launch, then possibly again with `wait_s` > 0, the time it may block waiting for
        a command (EngineCore.step)."""
    def has_work(self) -> bool: ...
    def stats(self) -> dict[str, Any]: ...
    def check_integrity(self) -> None: ...


class LoopSink(Protocol):
    """Called on the loop thread. Implementations must not block."""

    def on_ready(self, model_info: Any) -> None: ...
    def on_acks(self, acks: Acks) -> None: ...
    def on_step(self, batch: StepBatch) -> None: ...
    def on_fatal(self, exc: BaseException) -> None: ...
    def on_stalled(self, stalled: bool) -> None:
        """Readiness hint: no loop progress for half the watchdog time (True), or moving again."""


@dataclass(frozen=True)
class LoopConfig:
    warmup: bool = True
    idle_poll_s: float = 0.5  # how often an idle loop looks at the stop flag
    max_waiting_requests: int | None = None  # None: the engine's own limit applies
    # Request slots: waiting requests that the next step moves into free slots are not queued.
    max_running_requests: int | None = None
    watchdog_s: float | None = None  # no loop iteration may take longer once ready; None: off
    watchdog_exit_grace_s: float = 10.0  # after firing, hard exit if the process still lingers


class WatchdogTimeout(RuntimeError):
    """The engine loop made no progress for `LoopConfig.watchdog_s` seconds."""


@dataclass
class _Iteration:
    accepted: dict[Hashable, list[str]] = field(default_factory=dict)
    rejected: dict[Hashable, list[Rejection]] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    setups: dict[str, NewRequest] = field(default_factory=dict)
    applied: bool = False  # any command applied in this iteration


class EngineLoop:
    def __init__(
        self, engine_factory: Callable[[], EngineLike], sink: LoopSink, config: LoopConfig
    ) -> None:
        self._factory = engine_factory
        self._sink = sink
        self._config = config
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._owner: dict[str, Hashable] = {}  # live rid -> the gateway stream that sent it
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.engine: EngineLike | None = None
        self.stats: dict[str, Any] = {}  # replaced (never mutated) after each iteration
        self._beat: float | None = None  # when the loop last finished an iteration; None: not ready
        # engine steps run; in the stats as engine_steps_total (abort latency bench)
        self._steps = 0
        # engine steps run when an abort last freed a request: the abort bench counts the steps
        # between a cancel and its free from this, not from a later snapshot that a poll reads
        self._steps_at_free = 0
        # from the scheduler receiving an abort to the engine having freed its request, by source
        self._abort_times = TimeHistogram(ABORT_SOURCES, HOST_BOUNDS)
        self._fired = False
        self._profile = EngineProfile.from_env()  # None unless the benchmark hook is set

    def start(self) -> None:
        self._thread.start()
        if self._config.watchdog_s is not None:
            threading.Thread(target=self._watch, name="engine-watchdog", daemon=True).start()

    def submit(self, command: Command) -> None:
        self._inbox.put(command)

    def stop(self, timeout: float | None = None) -> None:
        self._stopping.set()
        self._thread.join(timeout)

    @property
    def live_requests(self) -> int:
        return len(self._owner)

    def queue_full(self, held: int = 0) -> bool:
        """Whether the last iteration's stats (at most one step old) show a full queue. Callers on
        other threads refuse with it at once instead of waiting for the next step; only an abort
        still in the inbox could have made room since. `held`: requests the caller holds back
        for the engine (grammars compiling), counted as waiting."""
        limit = self._config.max_waiting_requests
        return limit is not None and self._queued(self.stats, held) >= limit

    def _run(self) -> None:
        try:
            engine = self._factory()
            if self._config.warmup:
                _warm_up(engine)
            self.engine = engine
            self._publish_stats(engine)
            self._beat = time.monotonic()
            self._sink.on_ready(engine.model_info)
            busy = False
            if self._profile is not None:
                self._profile.start()
            while not self._stopping.is_set():
                busy = self._iterate(engine, busy)
                self._beat = time.monotonic()
                if self._profile is not None:
                    self._profile.iterated()
            if self._profile is not None:
                self._profile.dump()
        except BaseException as exc:  # reported to the process, which then exits 1
            log.exception("engine loop died")
            if not self._fired:
                self._sink.on_fatal(exc)

    def _watch(self) -> None:
        """A healthy loop ends an iteration at least every `idle_poll_s` (idle) or every step
        (busy), so a beat older than `watchdog_s` means a step that hangs: report it and die."""
        limit = float(self._config.watchdog_s or 0.0)
        stalled = False
        while not self._stopping.wait(min(1.0, limit / 4)):
            beat = self._beat
            age = 0.0 if beat is None else time.monotonic() - beat
            if (age >= limit / 2) != stalled:  # readiness drops well before the watchdog fires
                stalled = not stalled
                self._sink.on_stalled(stalled)
            if beat is None or age < limit:
                continue
            self._fired = True
            log.critical("watchdog: no engine loop progress for %.1f s (%d requests live); "
                         "last pool stats: %s; stacks follow", time.monotonic() - beat,
                         len(self._owner), self.stats)
            try:
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                # The orderly exit below needs the event loop; if it never comes, exit anyway.
                faulthandler.dump_traceback_later(self._config.watchdog_exit_grace_s, exit=True)
            except (AttributeError, OSError, ValueError) as exc:  # stderr without a descriptor
                log.error("watchdog could not dump stacks: %s", exc)
            self._sink.on_fatal(WatchdogTimeout(f"no engine progress for {limit:.1f} s"))
            return

    def _iterate(self, engine: EngineLike, was_busy: bool) -> bool:
        it = _Iteration()
        self._apply_all(engine, self._drain(block=not engine.has_work()), it)
        outputs: list[Any] = []
        if engine.has_work():
            outputs = engine.step(lambda wait_s=0.0: self._apply_all(
                engine, self._drain(block=wait_s > 0, timeout_s=wait_s), it))
            self._steps += 1
        for out in outputs:
            if out.finish_reason is not None:
                self._owner.pop(out.rid, None)
        if outputs or it.aborted or it.setups:
            self._sink.on_step(StepBatch(it.aborted, list(it.setups.values()), outputs,
                                         time.time_ns()))
        if not (it.applied or outputs):
            return was_busy
        self._publish_stats(engine)
        busy = engine.has_work()
        if was_busy and not busy:
            # Idle: the pool invariant must hold and no request may be left behind.
            assert not self._owner, f"idle engine but {len(self._owner)} requests still owned"
            engine.check_integrity()
        return busy

    def _apply_all(self, engine: EngineLike, commands: list[Command], it: _Iteration) -> None:
        """Apply `commands` in order and answer their submissions. Freed requests show in the
        stats at once, not after the step (what `bench abort` reads)."""
        if not commands:
            return
        it.applied = True
        freed = len(it.aborted)
        for command in commands:
            self._apply(engine, command, it)
        for owner, accepted in it.accepted.items():
            self._sink.on_acks(Acks(owner, accepted, it.rejected.pop(owner, [])))
        for owner, rejected in it.rejected.items():
            self._sink.on_acks(Acks(owner, [], rejected))
        it.accepted, it.rejected = {}, {}
        if len(it.aborted) > freed:
            self._steps_at_free = self._steps
            self._publish_stats(engine)

    def _publish_stats(self, engine: EngineLike) -> None:
        """Replace the snapshot other threads read (queue_full, metrics) with the engine's now."""
        self.stats = {**engine.stats(), "engine_steps_total": self._steps,
                      "engine_steps_at_last_free": self._steps_at_free,
                      "abort_seconds": self._abort_times.snapshot(),
                      # this thread's CPU time: beside the engine's host phases (wall time), what
                      # it spent waiting for the interpreter other threads held
                      "engine_thread_cpu_seconds": time.thread_time()}

    def _drain(self, block: bool, timeout_s: float | None = None) -> list[Command]:
        """Every queued command; with `block`, first wait up to `timeout_s` (idle_poll_s when
        None) for one."""
        commands: list[Command] = []
        if block:
            try:
                timeout = self._config.idle_poll_s if timeout_s is None else timeout_s
                commands.append(self._inbox.get(timeout=timeout))
            except queue.Empty:
                return commands
        # The engine thread is the only reader, so what empty() saw is there to take; asked every
        # step, mostly of an empty queue, where get_nowait's exception costs more than the check.
        while not self._inbox.empty():
            commands.append(self._inbox.get_nowait())
        return commands

    def _apply(self, engine: EngineLike, command: Command, it: _Iteration) -> None:
        if isinstance(command, AbortOwned):
            doomed = [r for r, o in self._owner.items()
                      if command.owner is None or o == command.owner]
            for rid in doomed:
                self._abort(engine, rid, it)
            return
        for group in partition(command.requests):
            self._add(engine, command.owner, group, it)
        source = "stop_string" if command.owner is None else "gateway"  # ABORT_SOURCES
        for rid in command.abort_ids:
            if self._abort(engine, rid, it):
                self._abort_times.observe(source, time.perf_counter() - command.received_s)

    def _add(self, engine: EngineLike, owner: Hashable, group: list[NewRequest],
             it: _Iteration) -> None:
        """Add `group` whole or refuse it whole (groups.add_whole). Members after the first see
        the earlier ones waiting, so a group that does not fit the queue is refused."""
        limit = self._config.max_waiting_requests

        def add(req: NewRequest) -> None:
            if limit is not None and self._queued(engine.stats()) >= limit:
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"queue full ({limit} waiting requests)")
            # Later members share the first one's prompt KV instead of computing it again.
            after = group[0].rid if req is not group[0] else None
            try:
                engine.add_request(req.rid, list(req.prompt_ids), req.params, after,
                                   grammar=req.grammar)
            except InvalidRequestError as exc:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None

        # Members taken back were never announced: nothing but the engine holds them.
        rejected = add_whole(group, add, lambda req: engine.abort(req.rid))
        if rejected:
            it.rejected.setdefault(owner, []).extend(rejected)
            return
        for req in group:
            self._owner[req.rid] = owner
            it.accepted.setdefault(owner, []).append(req.rid)
            it.setups[req.rid] = req

    def _queued(self, stats: dict[str, Any], held: int = 0) -> int:
        """Waiting requests beyond those that free request slots take at the next step."""
        waiting = int(stats.get("waiting_requests", 0)) + held
        slots = self._config.max_running_requests
        if slots is None:
            return waiting
        return max(0, waiting - max(0, slots - int(stats.get("running_requests", 0))))

    def _abort(self, engine: EngineLike, rid: str, it: _Iteration) -> bool:
        """Abort `rid` in the engine; whether that freed a request it held."""
        self._owner.pop(rid, None)
        # A request added in this same iteration was never announced to the detokenizer; dropping
        # its setup keeps the detokenizer from holding state for a request that never runs.
        it.setups.pop(rid, None)
        if not engine.abort(rid):
            return False
        it.aborted.append(rid)
        return True


def _warm_up(engine: EngineLike) -> None:
    """Run two tiny requests end to end, so the first users do not pay for lazy init: the second
    arrives while the first decodes, so a step carries decode rows beside a prefill, whose
    attention kernels differ from either step's alone (on a GPU with a cold compile cache,
    building them took 10 s inside the first such step of a served run). They sample (seeded)
    rather than decoding greedily: the draw's kernels are built on first use too."""
    vocab = int(engine.model_info.vocab_size)
    params = SamplingParams(temperature=1.0, seed=0, max_new_tokens=8, ignore_eos=True)
    engine.add_request("__warmup__", [i % vocab for i in range(1, 9)], params)
    engine.step()  # its prefill (with overlap, only launched)
    engine.add_request("__warmup_2__", [i % vocab for i in range(11, 19)], params)
    while engine.has_work():
        engine.step()
    engine.check_integrity()
