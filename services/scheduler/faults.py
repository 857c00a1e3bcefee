"""Test-only fault injection for the failure tests (docs/reliability.md #20, #21). Never set in
production.

`RADIXSERVE_TEST_FAULT=hang:N` makes every engine step after the first N (warm-up steps
included) sleep forever; `raise:N` makes it raise `InjectedFault` instead; `gil:N` makes it sleep
forever *holding the GIL*, so no other Python thread of the scheduler (its event loop, its
in-process watchdog) runs again: only the supervisor's out-of-process check can catch it.
`KIND:@PATH` arms the fault once the file PATH exists instead of after a step count, so a test
can break the engine at the moment it chooses (every stream decoding) however slow the machine.
The variable is read once, when the scheduler starts; unset (the normal case) leaves the engine
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


def parse(spec: str | None) -> tuple[str, int | str] | None:
    """(kind, steps before the fault) or (kind, trigger file path); None when unset."""
    if not spec:
        return None
    kind, _, when = spec.partition(":")
    if kind in KINDS and when.isdigit():
        return kind, int(when)
    if kind in KINDS and when.startswith("@") and len(when) > 1:
        return kind, when[1:]
    raise ValueError(f"{FAULT_ENV}={spec!r}: expected KIND:N or KIND:@PATH, KIND one of {KINDS}")


def wrap_factory(factory: Callable[[], Any], spec: str | None = None) -> Callable[[], Any]:
    """`factory`, or one whose engines misbehave as `spec` (default: the environment) says."""
    fault = parse(os.environ.get(FAULT_ENV) if spec is None else spec)
    if fault is None:
        return factory
    return lambda: _Faulty(factory(), *fault)


class _Faulty:
    """Forwards everything to the engine; `step` breaks after `when` calls, or once the file
    `when` names exists."""

    def __init__(self, engine: Any, kind: str, when: int | str) -> None:
        self._engine = engine
        self._kind = kind
        self._when = when
        self._steps = 0  # steps run so far

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def _armed(self) -> bool:
        if isinstance(self._when, str):
            return os.path.exists(self._when)
        return self._steps >= self._when

    def step(self, launched_hook: Callable[..., None] | None = None) -> list[Any]:
        if self._armed():
            if self._kind == "raise":
                raise InjectedFault("injected engine step failure")
            if self._kind == "gil":
                hold_gil_forever()
            threading.Event().wait()  # hang: nothing ever sets it
        self._steps += 1
        return self._engine.step(launched_hook)


def hold_gil_forever() -> None:
    """Block in C without releasing the GIL, like a native call that forgot to release it.

    Functions of a `ctypes.PyDLL` keep the GIL during the call (those of a `CDLL` release it), so
    libc `sleep` through PyDLL stops every Python thread of the process without burning a core.
    A signal ends a `sleep` early; the loop goes straight back in.
    """
    libc = ctypes.PyDLL(None)
    while True:
        libc.sleep(3600)
