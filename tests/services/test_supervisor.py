"""The supervisor (`services/supervisor.py`): its liveness check (silence counts from the first
answer, a slow starter is heard soon after it listens, a restarted child starts over) and the
restart rule of replicas' children and its budget."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

import grpc
import pytest


def test_liveness_judges_silence_from_the_first_answer() -> None:
    """A child not listening yet is starting, not hung; one that answered and then went quiet
    for the timeout is named, whatever phase the supervisor is in."""
    from concurrent import futures

    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from radixserve.services.supervisor import Child, Liveness

    quiet = threading.Event()

    class Health(health_pb2_grpc.HealthServicer):
        def Check(self, request: Any, context: Any) -> Any:
            if quiet.is_set():
                time.sleep(5)  # like a process whose GIL is held: no answer in time
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    server = grpc.server(futures.ThreadPoolExecutor(4))
    health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    children = [Child("up", [], f"127.0.0.1:{port}"),
                Child("starting", [], "unix:/nonexistent.sock")]
    liveness = Liveness(children, timeout_s=0.8)
    try:
        deadline = time.monotonic() + 1.6
        while time.monotonic() < deadline:  # both quiet past the timeout: "starting" never answered
            assert liveness.silent() is None
            time.sleep(0.05)
        quiet.set()
        t0 = time.monotonic()
        while liveness.silent() != "up":
            assert time.monotonic() - t0 < 3.0, "a silent child was never named"
            time.sleep(0.05)
        assert time.monotonic() - t0 > 0.5  # named after the timeout, not at the first late probe
    finally:
        liveness.close()
        server.stop(0)


def test_liveness_hears_a_slow_starter_within_two_seconds(tmp_path: Any) -> None:
    """A child that listens 12 s after spawn is answered within ~2 s of it, not after grpc's
    default reconnect backoff (which grows towards 120 s); until then a hang would go unseen."""
    from concurrent import futures

    from grpc_health.v1 import health, health_pb2_grpc
    from radixserve.services.supervisor import Child, Liveness

    sock = tmp_path / "child.sock"
    liveness = Liveness([Child("slow", [], f"unix:{sock}")], timeout_s=3.0)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    try:
        deadline = time.monotonic() + 12.0
        while time.monotonic() < deadline:
            assert liveness.silent() is None  # not listening yet: starting, not hung
            time.sleep(0.05)
        server.add_insecure_port(f"unix:{sock}")
        server.start()
        up = time.monotonic()
        while liveness._answered["slow"] is None:
            assert time.monotonic() - up < 2.5, "the first answer came too late"
            liveness.silent()
            time.sleep(0.05)
    finally:
        liveness.close()
        server.stop(0)


def test_liveness_counts_the_readiness_answer() -> None:
    """A child that turned ready (the readiness wait heard it) and then hung before any liveness
    probe got through is judged on silence from that answer, not left as "starting"."""
    from radixserve.services.supervisor import Child, Liveness

    liveness = Liveness([Child("hung", [], "unix:/nonexistent.sock")], timeout_s=0.5)
    try:
        assert liveness.silent() is None
        liveness.answered("hung")
        deadline = time.monotonic() + 5.0
        while liveness.silent() is None:
            assert time.monotonic() < deadline, "a silent child that had answered went unnoticed"
            time.sleep(0.05)
        assert liveness.silent() == "hung"
    finally:
        liveness.close()


def test_liveness_gives_a_restarted_child_until_its_due_time() -> None:
    """A restarted child starts over: silence before its first answer is not a hang, but no
    answer by the due time (the startup timeout) names it."""
    from radixserve.services.supervisor import Child, Liveness

    liveness = Liveness([Child("again", [], "unix:/nonexistent.sock")], timeout_s=30.0)
    try:
        liveness.answered("again")
        liveness.restarted("again", within_s=0.5)
        assert liveness.silent() is None  # it answered moments ago, but that was the old process
        deadline = time.monotonic() + 5.0
        while liveness.silent() is None:
            assert time.monotonic() < deadline, "a restart that never answered went unnoticed"
            time.sleep(0.05)
        assert liveness.silent() == "again" and liveness.quiet_s("again") > 0.5
    finally:
        liveness.close()


def test_restart_budget_counts_within_its_window() -> None:
    from radixserve.services.supervisor import RestartBudget

    budget = RestartBudget(limit=3, window_s=600.0)
    assert [budget.allow("scheduler-1", t) for t in (0.0, 10.0, 20.0)] == [True] * 3
    assert budget.used("scheduler-1") == 3
    assert not budget.allow("scheduler-1", 30.0)  # a fourth death within ten minutes
    assert budget.allow("detokenizer-1", 30.0)  # each child has its own budget
    assert budget.allow("scheduler-1", 600.5)  # the first restart left the window
    assert not budget.allow("scheduler-1", 601.0)
    assert budget.used("scheduler-1") == 3


# A stand-in child: serves grpc.health.v1 on argv[1], then exits with status 3, after argv[2]
# seconds the first time (long enough for the supervisor to see it ready) and 0.3 s when restarted.
HEALTHY_FOR = """
import os, sys, time
from concurrent import futures
import grpc
from grpc_health.v1 import health, health_pb2_grpc
server = grpc.server(futures.ThreadPoolExecutor(2))
health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
server.add_insecure_port(sys.argv[1])
server.start()
marker = sys.argv[1].removeprefix("unix:") + ".ran"
time.sleep(0.3 if os.path.exists(marker) else float(sys.argv[2]))
open(marker, "w").close()
sys.exit(3)
"""


@pytest.mark.parametrize("replica", [1, None])
def test_a_dying_replica_child_is_restarted_until_its_budget_is_spent(
        replica: int | None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The restart rule end to end, on stand-in children: a replica's child that keeps dying is
    started again RESTART_LIMIT times, then the stack stops with status 1; a child of no replica
    (dp_size 1, tokenizer, gateway) stops it at its first death."""
    from radixserve.engine.config import EngineConfig
    from radixserve.services import supervisor
    from radixserve.services.config import ServeConfig
    from radixserve.services.gateway.frontend import FrontendConfig

    def children(cfg: Any, engine_argv: list[str], sockets: str, envs: Any) -> list[Any]:
        def child(name: str, seconds: float, replica: int | None = None) -> Any:
            address = f"unix:{sockets}/{name}.sock"
            argv = [sys.executable, "-c", HEALTHY_FOR, address, str(seconds)]
            return supervisor.Child(name, argv, address, replica)
        return [child("tokenizer", 600), child("scheduler-1", 5.0, replica)]

    monkeypatch.setattr(supervisor, "build_children", children)
    caplog.set_level(logging.INFO, logger="radixserve.serve")
    config = ServeConfig(engine=EngineConfig(model_path="/m", device="cpu"),
                         gateway=FrontendConfig(drain_timeout_s=1.0), dp_size=2,
                         startup_timeout_s=120, watchdog_timeout_s=30)
    t0 = time.monotonic()
    assert supervisor.Supervisor(config, []).run() == 1
    assert time.monotonic() - t0 < 120
    messages = [r.getMessage() for r in caplog.records]
    restarts = [m for m in messages if "scheduler-1 exited with code 3; restarting it" in m]
    spawned = [m for m in messages if m.startswith("started scheduler-1 ")]
    if replica is None:
        assert not restarts and len(spawned) == 1
        assert "scheduler-1 exited with code 3; stopping the others" in messages
    else:
        assert len(restarts) == supervisor.RESTART_LIMIT == 3
        assert "restart 3 of 3 in 600 s" in restarts[-1]
        assert len(spawned) == 4
        assert ("scheduler-1 exited with code 3 after 3 restarts in 600 s; stopping the others"
                in messages)


def test_shutdown_stops_gateways_then_schedulers_then_the_rest(monkeypatch: Any) -> None:
    """Stopped in the order data flows back, a detokenizer outlives the scheduler streaming into
    it, so it sees that stream end instead of cancelling it."""
    from types import SimpleNamespace

    from radixserve.services import supervisor as sv

    rounds: list[list[str]] = []
    monkeypatch.setattr(sv, "_terminate",
                        lambda procs, timeout_s: rounds.append(sorted(p.name for p in procs)))
    sup = sv.Supervisor.__new__(sv.Supervisor)
    names = ["tokenizer", "detokenizer-0", "detokenizer-1", "scheduler-0", "scheduler-1",
             "gateway-0", "gateway-1"]
    sup._procs = {n: SimpleNamespace(name=n) for n in names}
    sup._config = SimpleNamespace(gateway=SimpleNamespace(drain_timeout_s=1.0))
    sup._shutdown()
    assert rounds == [["gateway-0", "gateway-1"], ["scheduler-0", "scheduler-1"],
                      ["detokenizer-0", "detokenizer-1", "tokenizer"]]
