"""Process failures, each on a stack of its own: readiness during startup, a killed scheduler,
tokenizer, detokenizer or gateway, a killed replica's scheduler restarted in place, an engine step
that raises or hangs (watchdog), a hang that holds the GIL (the supervisor's liveness check), a
killed supervisor, and a drain under load (docs/reliability.md #19-24)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from radixserve.services.scheduler.faults import FAULT_ENV
from radixserve.v1 import generate_pb2 as pb
from svc_helpers import (
    Stack,
    Streams,
    alive,
    assert_gone,
    child_pids,
    cmdline,
    collect,
    health_status,
    request,
)

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
WATCHDOG_S = 3.0


@pytest.fixture
def make_stack(tmp_path: Path, demo_path: str) -> Iterator[Callable[..., Stack]]:
    """Start a stack with extra flags/env and wait until SERVING; kill whatever is left after."""
    stacks: list[Stack] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> Stack:
        s = Stack(*extra, log_path=tmp_path / f"serve{len(stacks)}.log", env=env)
        s.log_file = tmp_path / f"serve{len(stacks)}.log"
        stacks.append(s)
        seen: list[int | None] = []
        deadline = time.monotonic() + 240
        while (status := health_status(s.target)) != SERVING:
            seen.append(status)
            assert s.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        # Readiness is false while the backends start: the gateway listens before the model is in.
        assert NOT_SERVING in seen, seen
        return s

    yield start
    for s in stacks:
        # pytest shows this only for a failed test: the end of what the stack logged.
        lines = s.log_file.read_text(errors="replace").splitlines() if s.log_file.exists() else []
        print(f"--- {s.log_file.name}: last {min(len(lines), 200)} of {len(lines)} lines ---")
        print("\n".join(lines[-200:]))
        for pid in [s.proc.pid, *child_pids(s.proc.pid)]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        s.channel.close()


def _stack_fails_cleanly(s: Stack, children: list[int]) -> None:
    """After a failure: new calls fail fast, readiness is false, the supervisor exits non-zero
    (policy with one replica: no restarts) and no child is left behind."""
    t0 = time.monotonic()
    late = collect(s.stub, request([5], max_new_tokens=1), timeout=5)
    # UNAVAILABLE from the gateway while it runs, and from the closed socket once it has exited.
    assert late.code == UNAVAILABLE, late
    assert time.monotonic() - t0 < 2.0
    assert health_status(s.target) != SERVING
    assert s.proc.wait(30) != 0
    assert_gone(children)


@pytest.mark.parametrize("victim", ["scheduler", "tokenizer", "detokenizer", "gateway"])
def test_killed_service_ends_every_stream_unavailable(make_stack: Callable[..., Stack],
                                                      victim: str) -> None:
    s = make_stack()
    children = child_pids(s.proc.pid)
    streams = Streams(s.stub, 8, max_new_tokens=3000)
    streams.wait_decoding()
    killed_at = time.monotonic()
    os.kill(s.child(victim), signal.SIGKILL)
    streams.join(10)
    assert streams.codes == [UNAVAILABLE] * 8
    assert max(streams.ended_at) - killed_at < 5.0
    _stack_fails_cleanly(s, children)


def _listener(s: Stack, name: str) -> int | None:
    """The pid of the child that listens on `name`'s socket (`scheduler-1`), if one runs."""
    for pid in child_pids(s.proc.pid):
        argv = cmdline(pid).split()
        if "--address" in argv and argv[argv.index("--address") + 1].endswith(f"/{name}.sock"):
            return pid
    return None


def test_killed_replica_ends_only_its_streams_and_is_restarted_in_place(
        make_stack: Callable[..., Stack]) -> None:
    """With --dp-size 2 a killed replica's streams end UNAVAILABLE within 5 s while the other
    replica's finish, new calls keep succeeding, and the supervisor starts the dead scheduler
    again on the same socket, where the gateway finds it (docs/reliability.md #19)."""
    s = make_stack("--dp-size", "2", "--routing", "round_robin")
    children = child_pids(s.proc.pid)
    assert len(children) == 6  # tokenizer, two detokenizers, two schedulers, gateway
    victim = _listener(s, "scheduler-1")
    assert victim is not None
    argv = cmdline(victim)
    address = argv.split()[argv.split().index("--address") + 1]
    deadline = time.monotonic() + 240  # the gateway is ready with one replica; wait for both
    while [r.state for r in s.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5).replicas
           ] != [pb.REPLICA_STATE_SERVING] * 2:
        assert time.monotonic() < deadline, "the second replica never joined"
        time.sleep(0.2)
    streams = Streams(s.stub, 8, max_new_tokens=400)  # round robin: four on each replica
    streams.wait_decoding()
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    late = collect(s.stub, request([5], max_new_tokens=4), timeout=30)
    assert late.code == grpc.StatusCode.OK, late  # routed to the replica left
    streams.join(120)
    lost = [i for i, code in enumerate(streams.codes) if code == UNAVAILABLE]
    assert len(lost) == 4 and streams.codes.count(grpc.StatusCode.OK) == 4, streams.codes
    assert max(streams.ended_at[i] for i in lost) - killed_at < 5.0
    deadline = time.monotonic() + 240  # a fresh scheduler loads the model again
    while ((pid := _listener(s, "scheduler-1")) in (None, victim)
           or health_status(address) != SERVING):
        assert s.proc.poll() is None, "the supervisor stopped instead of restarting"
        assert time.monotonic() < deadline, "scheduler-1 was not restarted"
        time.sleep(0.2)
    assert cmdline(pid) == argv  # same command line, same socket
    assert all(alive(p) for p in children if p != victim)
    while [r.state for r in s.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5).replicas
           ] != [pb.REPLICA_STATE_SERVING] * 2:
        assert time.monotonic() < deadline, "the gateway did not take the restarted replica back"
        time.sleep(0.2)
    log = s.log_file.read_text()
    assert "scheduler-1 exited with code -9; restarting it (restart 1 of 3" in log
    assert s.stop() == 0


@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_engine_fault_fails_streams_and_stops_the_stack(make_stack: Callable[..., Stack],
                                                        fault: str, tmp_path: Path) -> None:
    trigger = tmp_path / "fault"
    s = make_stack("--watchdog-timeout", str(WATCHDOG_S), env={FAULT_ENV: f"{fault}:@{trigger}"})
    children = child_pids(s.proc.pid)
    streams = Streams(s.stub, 8, max_new_tokens=3000)
    streams.wait_decoding()
    trigger.touch()  # the next engine step breaks, with every stream decoding
    if fault == "hang":
        # Liveness stays cheap while the engine is stuck: the health check answers at once.
        time.sleep(1.0)
        t0 = time.monotonic()
        assert health_status(s.target) is not None
        assert time.monotonic() - t0 < 0.5
    # The bound that matters is measured from the last token below; the wait here is generous.
    streams.join(60)
    stuck_at = max(streams.last_token_at)
    # UNAVAILABLE: the gateway lost its scheduler; a restarted stack may serve a retry.
    assert streams.codes == [UNAVAILABLE] * 8
    budget = WATCHDOG_S + 5 if fault == "hang" else 5
    assert max(streams.ended_at) - stuck_at < budget
    assert max(streams.tokens) < 3000
    _stack_fails_cleanly(s, children)
    log = s.log_file.read_text()
    if fault == "hang":
        assert "watchdog: no engine loop progress" in log and "kv_pages_total" in log
        # Readiness went off at half the watchdog time, before the watchdog fired.
        assert log.index("stalled: readiness off") < log.index("watchdog: no engine loop progress")
        assert "most recent call first" in log  # the faulthandler dump of every thread
    else:
        assert "InjectedFault" in log


def test_gil_hang_escapes_the_in_process_watchdog() -> None:
    """The premise of the supervisor's check: a step that holds the GIL stops the scheduler's
    watchdog thread too, so it never fires (if it could, it would exit the process in ~1.5 s)."""
    script = textwrap.dedent("""
        from svc_helpers import FakeEngine
        from radixserve.engine.sampling.params import SamplingParams
        from radixserve.services.scheduler import faults
        from radixserve.services.scheduler.loop import EngineLoop, LoopConfig
        from radixserve.services.scheduler.types import NewRequest, Submission

        class Sink:
            def __getattr__(self, name):
                return lambda *args: print(name, flush=True)

        loop = EngineLoop(faults.wrap_factory(FakeEngine, "gil:3"), Sink(), LoopConfig(
            warmup=False, idle_poll_s=0.05, watchdog_s=1.0, watchdog_exit_grace_s=0.5))
        loop.start()
        loop.submit(Submission("gw", [NewRequest("a", [5], SamplingParams(max_new_tokens=50))]))
        loop._thread.join()
    """)
    path = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": path})
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(6.0)
    finally:
        proc.kill()
    out = proc.communicate()[0].decode()
    assert "on_ready" in out and "on_step" in out, out  # it ran, then hung
    assert "on_fatal" not in out and "on_stalled" not in out and "watchdog" not in out, out


def test_gil_hang_is_killed_by_the_supervisor(make_stack: Callable[..., Stack],
                                              tmp_path: Path) -> None:
    trigger = tmp_path / "fault"
    s = make_stack("--watchdog-timeout", str(WATCHDOG_S), env={FAULT_ENV: f"gil:@{trigger}"})
    children = child_pids(s.proc.pid)
    streams = Streams(s.stub, 8, max_new_tokens=3000)
    streams.wait_decoding()
    trigger.touch()
    # The bound that matters is measured from the last token below; the wait here is generous.
    streams.join(60)
    stuck_at = max(streams.last_token_at)
    assert streams.codes == [UNAVAILABLE] * 8
    # Silence for WATCHDOG_S, a probe interval and the 0.5 s stack dump, then the usual < 5 s.
    assert max(streams.ended_at) - stuck_at < WATCHDOG_S + 5
    assert max(streams.tokens) < 3000
    _stack_fails_cleanly(s, children)
    log = s.log_file.read_text()
    assert "scheduler (pid" in log and "has not answered its health check" in log
    assert "hold_gil_forever" in log  # the stack dump (SIGUSR1, faulthandler) shows where
    # Only the supervisor saw it: the scheduler's own watchdog never ran.
    assert "watchdog: no engine loop progress" not in log and "stalled" not in log


def test_drain_finishes_what_fits_and_ends_the_rest(make_stack: Callable[..., Stack]) -> None:
    drain_s = 5.0
    s = make_stack("--drain-timeout", str(drain_s))
    children = child_pids(s.proc.pid)
    long = Streams(s.stub, 4, max_new_tokens=3000)
    long.wait_decoding()
    short = Streams(s.stub, 4, max_new_tokens=8)
    short.wait_decoding()
    term_at = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    while health_status(s.target) == SERVING:
        assert time.monotonic() - term_at < 2.0, "readiness still true while draining"
        time.sleep(0.02)
    refused = collect(s.stub, request([5], max_new_tokens=1), timeout=5)
    assert refused.code == UNAVAILABLE, refused
    short.join(drain_s)
    assert short.codes == [grpc.StatusCode.OK] * 4 and short.tokens == [8] * 4
    long.join(drain_s + 5)
    assert long.codes == [UNAVAILABLE] * 4  # ended with a status at the drain deadline
    assert drain_s - 0.5 < max(long.ended_at) - term_at < drain_s + 3
    assert s.proc.wait(drain_s + 10 - (time.monotonic() - term_at)) == 0
    assert time.monotonic() - term_at < drain_s + 10
    assert_gone(children, timeout=1.0)


def test_stopping_gateway_answers_every_call_unavailable(make_stack: Callable[..., Stack]) -> None:
    """New calls during the drain, calls cut at its deadline, and calls racing the exit all end
    UNAVAILABLE (retryable), never CANCELLED; the gateway's own answers say what to do."""
    s = make_stack("--drain-timeout", "2")
    outcomes: list[tuple[grpc.StatusCode, str, bool]] = []  # (code, details, long stream)
    stop = threading.Event()

    def call(max_new: int) -> None:
        res = collect(s.stub, request([5, 6], max_new_tokens=max_new, ignore_eos=True), timeout=30)
        outcomes.append((res.code, res.details, max_new > 8))

    def hammer() -> None:
        while not stop.is_set():
            call(2)

    threads = [threading.Thread(target=call, args=(3000,)) for _ in range(2)]
    threads += [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(20) == 0
    time.sleep(0.5)  # keep calling a gateway that is gone
    stop.set()
    for t in threads:
        t.join(30)
    codes = {code for code, _, _ in outcomes}
    assert codes <= {grpc.StatusCode.OK, UNAVAILABLE}, [o for o in outcomes if o[0] not in
                                                        (grpc.StatusCode.OK, UNAVAILABLE)][:5]
    cut = [d for code, d, long in outcomes if long]
    assert len(cut) == 2 and all("shutting down; retry on another replica" in d for d in cut), cut
    refused = [d for code, d, long in outcomes if code == UNAVAILABLE and not long]
    assert any("shutting down; retry on another replica" in d for d in refused), refused[:5]


def test_children_die_with_the_supervisor(make_stack: Callable[..., Stack]) -> None:
    s = make_stack()
    children = child_pids(s.proc.pid)
    assert len(children) == 4
    os.kill(s.proc.pid, signal.SIGKILL)  # no chance to clean up: PR_SET_PDEATHSIG must do it
    s.proc.wait(10)
    assert_gone(children, timeout=45)
