"""Architecture name (config.json `architectures[0]`) -> model class."""

from __future__ import annotations

from typing import Callable, TypeVar

from radixserve.engine.models.base import CausalLM

M = TypeVar("M", bound=type[CausalLM])
_MODELS: dict[str, type[CausalLM]] = {}


def register_model(name: str) -> Callable[[M], M]:
    def wrap(cls: M) -> M:
        _MODELS[name] = cls
        return cls

    return wrap


def model_class(architecture: str) -> type[CausalLM]:
    # Importing the model modules registers them.
    from radixserve.engine.models import llama, qwen2, qwen3  # noqa: F401

    if architecture not in _MODELS:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(_MODELS)}")
    return _MODELS[architecture]
