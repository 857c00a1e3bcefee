"""Shared fixtures: test checkpoints, and the pool invariant checked after every engine test."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from checkpoints import checkpoint
from engine_pool import live_engines, register_engine


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """ckpt("qwen3" | "llama" | "qwen2" | "qwen3_sharded" | "demo") -> folder, built once."""
    return lambda kind: checkpoint(kind, tmp_path_factory)


@pytest.fixture
def make_llm() -> Callable[..., Any]:
    """Build an offline LLM (float32, CPU) that the pool-invariant check below will inspect."""
    from radixserve.engine import LLM

    def make(path: Path | str, **config: Any) -> Any:
        config = {"device": "cpu", "dtype": "float32", **config}
        llm = LLM(str(path), **config)
        register_engine(llm.core)
        return llm

    return make


@pytest.fixture(autouse=True)
def pool_invariant() -> Iterator[None]:
    """After each test, every engine it made must be idle with all pages and slots accounted for."""
    yield
    engines = list(live_engines)
    live_engines.clear()
    for core in engines:
        assert not core.has_work(), "engine still has work after the test"
        core.check_integrity()
