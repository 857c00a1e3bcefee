"""RADIXSERVE_EVENT_LOOP: the services run on uvloop where it is installed, on asyncio's own loop
when asked, and a wrong value stops the service with a message that names the choices."""

from __future__ import annotations

import asyncio

import pytest
from radixserve.services.common.lifecycle import EVENT_LOOP_ENV, run_event_loop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_auto_takes_uvloop(monkeypatch):
    pytest.importorskip("uvloop")
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    assert run_event_loop(_loop_module()).startswith("uvloop")


def test_asyncio_when_asked(monkeypatch):
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
    assert run_event_loop(_loop_module()).startswith("asyncio")


def test_a_wrong_value_names_the_choices(monkeypatch):
    monkeypatch.setenv(EVENT_LOOP_ENV, "tokio")
    main = _loop_module()
    with pytest.raises(SystemExit, match="auto, uvloop or asyncio, not 'tokio'"):
        run_event_loop(main)
    main.close()
