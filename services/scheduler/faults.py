"""Test-only fault injection for the failure tests (RELIABILITY 20, 21). Never set in production.

`RADIXSERVE_TEST_FAULT=hang:N` makes every engine step after the first N (warm-up steps
included) sleep forever; `raise:N` makes it raise `InjectedFault` instead; `gil:N` makes it sleep
forever *holding the GIL*, so no other Python thread of the scheduler (its event loop, its
in-process watchdog) runs again: only the supervisor's out-of-process check can catch it. The
variable is read once, when the scheduler starts; unset (the normal case) leaves the engine
untouched.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

FAULT_ENV = "RADIXSERVE_TEST_FAULT"
KINDS = ("hang", "raise", "gil")


class InjectedFault(RuntimeError):
    pass


def parse(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    kind, _, after = spec.partition(":")
    if kind not in KINDS or not after.isdigit():
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected hang:N, raise:N or gil:N")
    return kind, int(after)


def wrap_factory(factory: Callable[[], Any], spec: str | None = None) -> Callable[[], Any]:
    """`factory`, or one whose engines misbehave as `spec` (default: the environment) says."""
    fault = parse(os.environ.get(FAULT_ENV) if spec is None else spec)
    if fault is None:
        return factory
    return lambda: _Faulty(factory(), *fault)


class _Faulty:
    """Forwards everything to the engine; `step` breaks after `after` calls."""

    def __init__(self, engine: Any, kind: str, after: int) -> None:
        self._engine = engine
        self._kind = kind
        self._left = after

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def step(self) -> list[Any]:
        if self._left <= 0:
            if self._kind == "raise":
                raise InjectedFault("injected engine step failure")
            if self._kind == "gil":
                hold_gil_forever()
            threading.Event().wait()  # hang: nothing ever sets it
        self._left -= 1
        return self._engine.step()


def hold_gil_forever() -> None:
    """Block in C without releasing the GIL, like a native call that forgot to release it.

    Functions of a `ctypes.PyDLL` keep the GIL during the call (those of a `CDLL` release it), so
    libc `sleep` through PyDLL stops every Python thread of the process without burning a core.
    A signal ends a `sleep` early; the loop goes straight back in.
    """
    libc = ctypes.PyDLL(None)
    while True:
        libc.sleep(3600)
