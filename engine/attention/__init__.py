"""Attention backends by name. Optional dependencies are imported inside the factory."""

from __future__ import annotations

from typing import Callable

import torch
from radixserve.engine.attention.base import AttentionBackend, AttentionMetadata, StepLayout

# (num_heads, num_kv_heads, head_dim, device, dtype)
BackendFactory = Callable[..., AttentionBackend]
_BACKENDS: dict[str, Callable[[], BackendFactory]] = {}


def register_backend(name: str) -> Callable[[Callable[[], BackendFactory]],
                                            Callable[[], BackendFactory]]:
    def wrap(loader: Callable[[], BackendFactory]) -> Callable[[], BackendFactory]:
        _BACKENDS[name] = loader
        return loader

    return wrap


@register_backend("torch")
def _torch() -> BackendFactory:
    from radixserve.engine.attention.torch_backend import TorchBackend

    return TorchBackend


@register_backend("flashinfer")
def _flashinfer() -> BackendFactory:
    import flashinfer  # noqa: F401  (raises ImportError where it is not installed)
    from radixserve.engine.attention.flashinfer_backend import FlashInferBackend

    return FlashInferBackend


@register_backend("fa")
def _fa() -> BackendFactory:
    from radixserve.engine.attention.fa_backend import FlashAttentionBackend, load_flash_attn

    load_flash_attn()  # raises ImportError where neither flash-attn 3 nor 2 is installed
    return FlashAttentionBackend


def backend_names() -> list[str]:
    return sorted(_BACKENDS) + ["auto"]


def resolve_backend_name(name: str, device: torch.device,
                         dtype: torch.dtype = torch.bfloat16) -> str:
    """'auto' picks the fastest backend on the device (the fused kernels need 16-bit KV)."""
    if name != "auto":
        return name
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
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


def create_backend(name: str, num_heads: int, num_kv_heads: int, head_dim: int,
                   device: torch.device, dtype: torch.dtype = torch.float32) -> AttentionBackend:
    name = resolve_backend_name(name, device, dtype)
    if "," in name:  # "prefill,decode": a hybrid of two backends
        from radixserve.engine.attention.hybrid import HybridBackend

        prefill, decode = name.split(",", 1)
        backend: AttentionBackend = HybridBackend(
            create_backend(prefill, num_heads, num_kv_heads, head_dim, device, dtype),
            create_backend(decode, num_heads, num_kv_heads, head_dim, device, dtype))
    elif name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose from {backend_names()}")
    else:
        backend = _BACKENDS[name]()(num_heads, num_kv_heads, head_dim, device, dtype)
    backend.name = name
    return backend


__all__ = ["AttentionBackend", "AttentionMetadata", "StepLayout", "backend_names", "create_backend",
           "register_backend"]
