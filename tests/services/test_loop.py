"""The scheduler service's engine loop (`services/scheduler/loop.py`) against a fake engine,
without gRPC: one message per step, aborts, queue limits, groups, crashes and the watchdog."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import grpc
import pytest
from radixserve.services.scheduler.loop import EngineLoop, LoopConfig
from radixserve.services.scheduler.types import AbortOwned, Acks, Submission
from svc_helpers import FakeEngine, Sink, new, wait_for


@pytest.fixture
def loop() -> Any:
    engine, sink = FakeEngine(step_delay_s=0.002), Sink()
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, idle_poll_s=0.02))
    lp.start()
    assert sink.ready.wait(5)
    yield lp, engine, sink
    lp.stop(5)
    assert not sink.fatal


def test_loop_one_message_per_step_with_setups_first(loop: Any) -> None:
    lp, engine, sink = loop
    lp.submit(Submission("gw", [new("a"), new("b")]))
    wait_for(lambda: lp.live_requests == 0 and len(engine.added) == 2 and not engine.reqs)
    first = sink.steps[0]
    assert [s.rid for s in first.setups] == ["a", "b"]
    assert {o.rid for o in first.outputs} == {"a", "b"}  # both in one message
    assert sink.acks[0] == Acks("gw", ["a", "b"], [])
    assert sum(len(s.outputs) for s in sink.steps) == 6
    assert lp.stats["running_requests"] == 0


def test_loop_add_and_abort_in_one_batch_never_announces(loop: Any) -> None:
    lp, engine, sink = loop
    lp.submit(Submission("gw", [new("x", 50)], abort_ids=["x"]))
    wait_for(lambda: "x" in engine.aborted)
    wait_for(lambda: sink.steps)
    assert all("x" not in [s.rid for s in step.setups] for step in sink.steps)
    assert sink.steps[-1].aborted == ["x"]
    assert lp.live_requests == 0


def test_loop_abort_owned_by_a_closed_stream(loop: Any) -> None:
    lp, engine, _ = loop
    lp.submit(Submission("g1", [new("a", 500), new("b", 500)]))
    lp.submit(Submission("g2", [new("c", 5)]))
    wait_for(lambda: len(engine.added) == 3)
    lp.submit(AbortOwned("g1"))
    wait_for(lambda: not engine.reqs)
    assert set(engine.aborted) == {"a", "b"} and lp.live_requests == 0


def test_loop_queue_limit_rejects_resource_exhausted() -> None:
    engine, sink = FakeEngine(), Sink()
    engine.stats = lambda: {"waiting_requests": 7}  # type: ignore[method-assign]
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, max_waiting_requests=7))
    lp.start()
    lp.submit(Submission("gw", [new("a")]))
    wait_for(lambda: sink.acks)
    lp.stop(5)
    (rejection,) = sink.acks[0].rejected
    assert rejection.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_loop_group_is_added_whole_or_refused_whole() -> None:
    """The n completions of a request (one group) never half-admit: a group that does not fit the
    queue takes its added members back out, and each member hears the same status."""
    engine, sink = FakeEngine(step_delay_s=0.05), Sink()
    stats = lambda: {"waiting_requests": len(engine.reqs), "running_requests": 0}
    engine.stats = stats  # type: ignore[method-assign]
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, max_waiting_requests=2))
    lp.start()
    group = [dataclasses.replace(new(f"g{i}", 50), group="g") for i in range(3)]
    lp.submit(Submission("gw", group))
    wait_for(lambda: sink.acks)
    assert sink.acks[0].accepted == []
    assert [(r.rid, r.code) for r in sink.acks[0].rejected] == [
        (f"g{i}", grpc.StatusCode.RESOURCE_EXHAUSTED) for i in range(3)]
    assert engine.added == ["g0", "g1"] and sorted(engine.aborted) == ["g0", "g1"]
    assert not engine.reqs and lp.live_requests == 0
    assert all(not step.setups for step in sink.steps)  # the detokenizer never heard of them
    # Two fit: the whole group runs. Ungrouped, three requests would half-admit instead.
    lp.submit(Submission("gw", [dataclasses.replace(new(f"h{i}", 2), group="h") for i in range(2)]))
    wait_for(lambda: len(sink.acks) == 2)
    assert sink.acks[1].accepted == ["h0", "h1"] and not sink.acks[1].rejected
    wait_for(lambda: not engine.reqs)
    lp.submit(Submission("gw", [new(f"u{i}", 50) for i in range(3)]))
    wait_for(lambda: len(sink.acks) == 3)
    assert sink.acks[2].accepted == ["u0", "u1"]
    assert [r.rid for r in sink.acks[2].rejected] == ["u2"]
    lp.stop(5)


def test_loop_group_needs_room_for_every_member() -> None:
    """Free request slots count as room: with two free slots and a queue of one, a group of four
    is refused whole and a group of three runs whole. A member the engine refuses (one that could
    never fit the KV pool) refuses its group with INVALID_ARGUMENT, the one before it taken back."""
    engine, sink = FakeEngine(step_delay_s=0.02, reject_token=9), Sink()
    stats = lambda: {"waiting_requests": len(engine.reqs), "running_requests": 0}
    engine.stats = stats  # type: ignore[method-assign]
    config = LoopConfig(warmup=False, max_waiting_requests=1, max_running_requests=2)
    lp = EngineLoop(lambda: engine, sink, config)
    lp.start()
    grouped = lambda name, k: [dataclasses.replace(new(f"{name}{i}", 2), group=name)
                               for i in range(k)]
    lp.submit(Submission("gw", grouped("f", 4)))
    wait_for(lambda: sink.acks)
    assert sink.acks[0].accepted == [] and len(sink.acks[0].rejected) == 4
    assert {r.code for r in sink.acks[0].rejected} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert not engine.reqs and sorted(engine.aborted) == ["f0", "f1", "f2"]
    lp.submit(Submission("gw", grouped("t", 3)))
    wait_for(lambda: len(sink.acks) == 2)
    assert sink.acks[1].accepted == ["t0", "t1", "t2"]
    wait_for(lambda: not engine.reqs)
    bad = grouped("b", 2)
    bad[1] = dataclasses.replace(bad[1], prompt_ids=[9])
    lp.submit(Submission("gw", bad))
    wait_for(lambda: len(sink.acks) == 3)
    assert [(r.rid, r.code) for r in sink.acks[2].rejected] == [
        ("b0", grpc.StatusCode.INVALID_ARGUMENT), ("b1", grpc.StatusCode.INVALID_ARGUMENT)]
    assert "b0" in engine.aborted and not engine.reqs and lp.live_requests == 0
    lp.stop(5)


def test_loop_engine_crash_is_fatal() -> None:
    engine, sink = FakeEngine(), Sink()
    engine.step = lambda hook=None: 1 / 0  # type: ignore[method-assign]
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False))
    lp.start()
    lp.submit(Submission("gw", [new("a")]))
    wait_for(lambda: sink.fatal)
    assert isinstance(sink.fatal[0], ZeroDivisionError)


def test_loop_watchdog_quiet_when_idle_or_slow_but_moving() -> None:
    sink = Sink()
    lp = EngineLoop(lambda: FakeEngine(step_delay_s=0.1), sink,
                    LoopConfig(warmup=False, idle_poll_s=0.05, watchdog_s=0.4))
    lp.start()
    time.sleep(0.6)  # idle
    lp.submit(Submission("gw", [new("a", 8)]))  # 8 steps of 0.1 s: 0.8 s busy, each step short
    time.sleep(1.2)
    assert not sink.fatal and not sink.stalls
    lp.stop(1)


def test_loop_applies_an_abort_that_arrives_during_a_step_within_that_step() -> None:
    """An abort that reaches the loop while a step runs is applied once the step has launched
    (the engine's launched_hook), not after it: the engine aborts within that step, that step
    reports no output for the request, and its StepBatch names it aborted."""
    loop: list[EngineLoop] = []

    class Racing(FakeEngine):
        def step(self, launched_hook: Any = None) -> list[Any]:
            if self.steps == 3:  # the abort arrives as the fourth step starts
                loop[0].submit(Submission("gw", abort_ids=["a"]))
            return super().step(launched_hook)

    engine, sink = Racing(step_delay_s=0.02), Sink()
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, idle_poll_s=0.05))
    loop.append(lp)
    lp.start()
    try:
        lp.submit(Submission("gw", [new("a", 1000), new("b", 1000)]))
        wait_for(lambda: "a" in engine.abort_steps and lp.stats.get("running_requests") == 1)
        assert engine.abort_steps["a"] == 3  # in step 4, before its outputs (steps counts after)
        wait_for(lambda: any(b.aborted for b in sink.steps))  # emitted when that step ends
        batch = next(b for b in sink.steps if b.aborted)
        assert batch.aborted == ["a"]
        assert [o.rid for o in batch.outputs] == ["b"]
    finally:
        lp.stop(1.0)


def test_an_abort_that_comes_while_the_engine_waits_for_the_device_is_applied_at_once() -> None:
    """An engine waits for the device through the hook (`launched_hook(wait_s)`, as EngineCore
    does while a step it knows the length of runs): an abort that comes then is applied when it
    comes, within the wait, not when the step ends; the wait then goes on."""
    loop: list[EngineLoop] = []
    waits: list[tuple[float, float]] = []  # (wait_s asked, seconds the hook took)

    class Waiting(FakeEngine):
        def step(self, launched_hook: Any = None) -> list[Any]:
            if self.steps == 2 and launched_hook is not None:  # a step of the device's 3 s
                launched_hook()
                end = time.monotonic() + 3.0
                while (left := end - time.monotonic()) > 0:
                    began = time.monotonic()
                    launched_hook(left)
                    waits.append((left, time.monotonic() - began))
                launched_hook = None
            return super().step(launched_hook)

    engine, sink = Waiting(), Sink()
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, idle_poll_s=0.05))
    loop.append(lp)
    lp.start()
    try:
        lp.submit(Submission("gw", [new("a", 1000), new("b", 1000)]))
        wait_for(lambda: engine.steps == 2 and len(waits) == 0)
        time.sleep(0.2)  # into the long step's wait
        t0 = time.monotonic()
        lp.submit(Submission("gw", abort_ids=["a"]))
        wait_for(lambda: lp.stats.get("running_requests") == 1)
        assert time.monotonic() - t0 < 1.5  # the wait ends at 3 s; a loaded machine has room
        assert engine.abort_steps["a"] == 2  # within the long step
        wait_for(lambda: engine.steps > 2, timeout=10)
        assert waits[0][1] < waits[0][0]  # the abort ended the first wait early ...
        assert len(waits) >= 2  # ... and the step waited on
        batch = next(b for b in sink.steps if b.aborted)
        assert batch.aborted == ["a"] and [o.rid for o in batch.outputs] == ["b"]
    finally:
        lp.stop(5.0)


def test_loop_abort_frees_before_the_next_step_and_shows_it() -> None:
    """Abort latency (docs/reliability.md #11 and Targets): an abort that reaches the loop while a
    step runs frees the request before the step after it, and the stats snapshot (what `bench abort`
    reads through the metrics) shows the freed slot at once, with the step count."""
    engine = FakeEngine(step_delay_s=0.2)
    sink = Sink()
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, idle_poll_s=0.05))
    lp.start()
    try:
        lp.submit(Submission("gw", [new("a", 1000), new("b", 1000)]))
        wait_for(lambda: lp.stats.get("running_requests") == 2)
        steps = lp.stats["engine_steps_total"]
        t0 = time.monotonic()
        lp.submit(Submission("gw", abort_ids=["a"]))
        wait_for(lambda: lp.stats.get("running_requests") == 1)
        # Only the step in progress ran in between: freed before the next one, and shown then
        # (a snapshot taken after that next step would say 2).
        assert lp.stats["engine_steps_total"] - steps <= 1
        assert engine.abort_steps["a"] - steps <= 1
        assert time.monotonic() - t0 < 2.0  # one 0.2 s step, with room for a loaded machine
        # The step count at the free stays with the free while later steps run (a poll that comes
        # a step late still counts the steps to the free).
        freed_at = lp.stats["engine_steps_at_last_free"]
        assert steps <= freed_at <= steps + 1
        wait_for(lambda: lp.stats["engine_steps_total"] >= freed_at + 2)
        assert lp.stats["engine_steps_at_last_free"] == freed_at
        # The abort is timed from its receipt to the free, by where it came from: within the
        # step it waited for. One that frees nothing (already gone) is not timed.
        lp.submit(Submission("gw", abort_ids=["a"]))
        lp.submit(Submission(None, abort_ids=["b"]))  # as the detokenizer's stop string
        wait_for(lambda: lp.stats.get("running_requests") == 0)
        timed = lp.stats["abort_seconds"]
        (counts, seconds), (stops, _) = timed["gateway"], timed["stop_string"]
        assert sum(counts) == 1 and sum(stops) == 1
        assert 0 < seconds < time.monotonic() - t0
    finally:
        lp.stop(1.0)


def test_the_profiling_hook_records_the_engine_thread_alone(tmp_path, monkeypatch) -> None:
    """RADIXSERVE_PROFILE_ENGINE: cProfile from the engine loop's thread, one file per process,
    with the engine's steps in it (and, before Python 3.12, nothing another thread ran)."""
    import os
    import pstats
    import sys

    from radixserve.services.scheduler import profiling

    monkeypatch.setenv(profiling.ENV, str(tmp_path / "engine.prof"))
    monkeypatch.setattr(profiling, "DUMP_EVERY", 3)  # written mid-run too
    engine, sink = FakeEngine(step_delay_s=0.001), Sink()
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, idle_poll_s=0.02))
    lp.start()
    assert sink.ready.wait(5)
    path = tmp_path / f"engine.prof.{os.getpid()}"
    lp.submit(Submission("gw", [new("a", 20)]))
    wait_for(lambda: path.exists())
    wait_for(lambda: lp.live_requests == 0)
    lp.stop(5)
    functions = {(f.rsplit("/", 1)[-1], name) for f, _, name in pstats.Stats(str(path)).stats}
    assert ("svc_helpers.py", "step") in functions  # the fake engine's steps, on the loop thread
    if sys.version_info < (3, 12):  # from 3.12 cProfile sees every thread (sys.monitoring)
        assert not any(name == "wait_for" for _, name in functions)


def test_the_warm_up_runs_a_step_with_decode_rows_beside_a_prefill(ckpt, make_llm) -> None:
    """Such a step's attention kernels differ from a decode step's and a prefill's: the warm-up
    builds them before the service is ready, not in a user's first step beside running streams."""
    from radixserve.services.scheduler.loop import _warm_up

    core = make_llm(ckpt("qwen3")).core
    _warm_up(core)
    counts, _ = core.stats()["step_seconds"]["mixed"]
    assert sum(counts) >= 1
    # each such step is counted again in one class of its prefill's size
    by_prefill = core.stats()["mixed_step_seconds"]
    assert sum(sum(c) for c, _ in by_prefill.values()) == sum(counts)
    assert not core.has_work()
