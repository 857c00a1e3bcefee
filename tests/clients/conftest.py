from __future__ import annotations

from collections.abc import Iterator

import pytest

from .fake_server import FakeGenerateService, serve


@pytest.fixture
def fake() -> FakeGenerateService:
    return FakeGenerateService()


@pytest.fixture
def target(fake: FakeGenerateService) -> Iterator[str]:
    with serve(fake) as address:
        yield address
