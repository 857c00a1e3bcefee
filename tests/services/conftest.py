"""Fixtures of the service tests: one real `radixserve serve` stack for the whole session, and
the pool invariant checked after every test that used it (docs/reliability.md #14)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from radixserve.services.common.auth import SECRET_ENV
from svc_helpers import INTERNAL_SECRET, Stack, free_port, wait_idle


@pytest.fixture(scope="session")
def demo_path() -> str:
    from radixserve.engine.demo import demo_model_path

    return str(demo_model_path())


@pytest.fixture(scope="session")
def stack(demo_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log = tmp_path_factory.mktemp("stack") / "serve.log"
    metrics_port = free_port()
    # 16 slots: the 32- and 64-stream tests also exercise queued requests and their cancellation.
    # A known internal secret, so the wire tests can call the internal services directly.
    s = Stack("--metrics-port", str(metrics_port), "--max-running-requests", "16", log_path=log,
              env={SECRET_ENV: INTERNAL_SECRET})
    s.metrics_port = metrics_port
    try:
        s.wait_ready()
        yield s
    finally:
        code = s.stop()
        # SIGTERM is a clean drain: exit 0, no child left behind (Stack.stop asserts that).
        assert code == 0, Path(log).read_text()[-4000:]


@pytest.fixture(autouse=True)
def _pool_invariant(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "stack" in request.fixturenames:
        s: Stack = request.getfixturevalue("stack")
        if s.proc.poll() is None:
            wait_idle(s.stub)
