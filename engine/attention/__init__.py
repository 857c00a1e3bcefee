"""Attention backends by name. Optional dependencies are imported inside the factory."""

from __future__ import annotations

from typing import Callable

import torch

from radixserve.engine.attention.base import AttentionBackend, AttentionMetadata, StepLayout

BackendFactory = Callable[[int, int, int, torch.device], AttentionBackend]
_BACKENDS: dict[str, Callable[[], BackendFactory]] = {}


def register_backend(name: str) -> Callable[[Callable[[], BackendFactory]], Callable[[], BackendFactory]]:
    def wrap(loader: Callable[[], BackendFactory]) -> Callable[[], BackendFactory]:
        _BACKENDS[name] = loader
        return loader

    return wrap


@register_backend("torch")
def _torch() -> BackendFactory:
    from radixserve.engine.attention.torch_backend import TorchBackend

    return TorchBackend


def backend_names() -> list[str]:
    return sorted(_BACKENDS) + ["auto"]


def resolve_backend_name(name: str, device: torch.device) -> str:
    """'auto' picks the fastest backend available on the device."""
    if name != "auto":
        return name
    if device.type == "cuda":
        for candidate in ("flashinfer", "fa"):
            if candidate in _BACKENDS and _available(candidate):
                return candidate
    return "torch"


def _available(name: str) -> bool:
    try:
        _BACKENDS[name]()
    except ImportError:
        return False
    return True


def create_backend(name: str, num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device) -> AttentionBackend:
    name = resolve_backend_name(name, device)
    if "," in name:  # "prefill,decode": a hybrid of two backends
        from radixserve.engine.attention.hybrid import HybridBackend

        prefill, decode = name.split(",", 1)
        return HybridBackend(create_backend(prefill, num_heads, num_kv_heads, head_dim, device),
                             create_backend(decode, num_heads, num_kv_heads, head_dim, device))
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {backend_names()}")
    return _BACKENDS[name]()(num_heads, num_kv_heads, head_dim, device)


__all__ = ["AttentionBackend", "AttentionMetadata", "StepLayout", "backend_names", "create_backend", "register_backend"]
