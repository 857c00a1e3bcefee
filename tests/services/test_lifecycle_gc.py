"""The services take what they built to start out of the cyclic garbage collector (gc.freeze), so
that a full collection while serving walks only the objects made since; garbage that start-up
left in reference cycles is collected first, not frozen for the life of the process."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest
from radixserve.services.common.lifecycle import freeze_startup_objects, run_until_signal


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def unfreeze() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as before


def test_freeze_collects_cycles_first_and_freezes_the_living(unfreeze):
    garbage, kept = _Cycle(), _Cycle()
    dead = weakref.ref(garbage)
    del garbage
    assert gc.get_freeze_count() == 0
    freeze_startup_objects()
    assert dead() is None, "a cycle left by start-up was frozen instead of collected"
    assert gc.get_freeze_count() > 0
    assert all(obj is not kept for obj in gc.get_objects()), "a start-up object is still tracked"


def test_a_service_freezes_before_it_serves(unfreeze):
    class Server:
        async def stop(self, grace: float) -> None:
            pass

    async def main() -> tuple[int, int]:
        fatal = asyncio.Event()
        fatal.set()  # stop at once: only the freeze on the way in matters here
        code = await run_until_signal(Server(), lambda: asyncio.sleep(0), fatal)
        return code, gc.get_freeze_count()

    code, frozen = asyncio.run(main())
    assert code == 1 and frozen > 0


@pytest.mark.parametrize("freeze", [False, True])
def test_the_scheduler_freezes_once_its_model_is_ready_where_asked(unfreeze, freeze):
    """The model loads after the server starts, so the scheduler freezes again when it is ready:
    its entry point asks for that, an app inside another process (these tests) does not."""
    from radixserve.services.scheduler.loop import LoopConfig
    from radixserve.services.scheduler.server import SchedulerApp
    from svc_helpers import FakeEngine

    async def main() -> tuple[bool, int]:
        app = SchedulerApp(FakeEngine, "127.0.0.1:1", LoopConfig())
        app.freeze_when_ready = freeze
        try:
            app.on_ready(None)  # as the engine thread reports a loaded, warmed-up model
            await asyncio.sleep(0.05)
            return app.model_ready, gc.get_freeze_count()
        finally:
            app.compiler.close()

    ready, frozen = asyncio.run(main())
    assert ready and (frozen > 0) == freeze
