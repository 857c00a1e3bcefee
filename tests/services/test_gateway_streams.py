"""The gateway's backend sessions end the same way: their stream tasks and their call cancelled."""

from __future__ import annotations

import asyncio

from radixserve.services.gateway.streams import end_session


class _Call:
    def __init__(self, events: list[str]) -> None:
        self._events = events

    def cancel(self) -> bool:
        self._events.append("call")
        return True


def test_end_session_cancels_every_task_and_the_call() -> None:
    async def main() -> None:
        events: list[str] = []

        async def stream(name: str) -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                events.append(name)
                raise

        tasks = [asyncio.create_task(stream(name)) for name in ("pump", "read")]
        await asyncio.sleep(0)
        end_session(tasks, _Call(events))  # type: ignore[arg-type]
        assert events == ["call"]  # the call now; each task ends at its next step
        await asyncio.gather(*tasks, return_exceptions=True)
        assert all(task.cancelled() for task in tasks) and events == ["call", "pump", "read"]
        end_session([], None)  # a session that ended before its call was opened

    asyncio.run(main())
