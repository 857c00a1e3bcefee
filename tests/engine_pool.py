"""The engines a test built, whose pools the autouse `pool_invariant` fixture (conftest.py) checks
after the test. A module of its own, not conftest: tests import `register_engine`, and
`from conftest import` would find whichever conftest module pytest happened to import first."""

from __future__ import annotations

from typing import Any

live_engines: list[Any] = []


def register_engine(core: Any) -> Any:
    live_engines.append(core)
    return core
