"""The supervisor's liveness check (`services/supervisor.py`): silence counts from the first
answer, and a slow starter is heard soon after it listens."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc


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
