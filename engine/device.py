"""The config's device and dtype names resolved to torch objects, the same way on every rank."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, checkpoint_dtype: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cpu":
            return torch.float32
        return torch.float16 if checkpoint_dtype == "float16" else torch.bfloat16
    return getattr(torch, name)
