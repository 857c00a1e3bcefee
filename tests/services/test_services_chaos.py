"""Process failures on a stack of its own: readiness during startup, a killed scheduler, a
killed supervisor."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from svc_helpers import Stack, alive, child_pids, collect, health_status, request

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture
def own_stack(tmp_path: Path, demo_path: str) -> Iterator[Stack]:
    s = Stack(log_path=tmp_path / "serve.log")
    seen: list[int | None] = []
    deadline = time.monotonic() + 240
    while (status := health_status(s.target)) != SERVING:
        seen.append(status)
        assert s.proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    # Readiness is false while the backends start: the gateway listens before the model is in.
    assert NOT_SERVING in seen, seen
    try:
        yield s
    finally:
        for pid in [s.proc.pid, *child_pids(s.proc.pid)]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_scheduler_death_ends_every_stream_unavailable(own_stack: Stack) -> None:
    s = own_stack
    children = child_pids(s.proc.pid)
    results: list[grpc.StatusCode] = []
    ended_at: list[float] = []
    started = threading.Barrier(9)

    def stream(i: int) -> None:
        call = s.stub.Generate(request([5, i + 1], max_new_tokens=3000, ignore_eos=True))
        waiting = True
        try:
            for response in call:
                if waiting and response.HasField("delta"):
                    waiting = False
                    started.wait(60)
        except grpc.RpcError as exc:
            results.append(exc.code())
        ended_at.append(time.monotonic())

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    started.wait(60)  # every stream is decoding
    killed_at = time.monotonic()
    os.kill(s.child("scheduler"), signal.SIGKILL)
    for t in threads:
        t.join(10)
    assert results == [grpc.StatusCode.UNAVAILABLE] * 8
    assert max(ended_at) - killed_at < 5.0
    # New calls fail fast instead of hanging.
    late = collect(s.stub, request([5], max_new_tokens=1), timeout=5)
    assert late.code == grpc.StatusCode.UNAVAILABLE
    assert health_status(s.target) != SERVING
    # Policy: no restart; the supervisor stops the rest and exits non-zero, leaving no orphans.
    assert s.proc.wait(60) != 0
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)]


def test_children_die_with_the_supervisor(own_stack: Stack) -> None:
    s = own_stack
    children = child_pids(s.proc.pid)
    assert len(children) == 4
    os.kill(s.proc.pid, signal.SIGKILL)  # no chance to clean up: PR_SET_PDEATHSIG must do it
    s.proc.wait(10)
    deadline = time.monotonic() + 45
    while any(alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if alive(pid)]
