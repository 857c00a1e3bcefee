"""Fixtures shared by the benchmark tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from radixserve.bench.driver import ENGINE_OVERRIDES


@pytest.fixture(autouse=True)
def no_engine_overrides() -> Iterator[None]:
    """A benchmark's `--engine FIELD=VALUE` holds for every engine its process builds after it;
    a test that runs one with the flag must not set the engines of the tests after it."""
    yield
    ENGINE_OVERRIDES.clear()
