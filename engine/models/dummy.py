"""Random weights for a config.json alone (`load_format="dummy"`): benchmarks of real
architectures where no checkpoint can be fetched. Timing does not depend on the values."""

from __future__ import annotations

from pathlib import Path

import torch
from radixserve.engine.models.base import CausalLM
from radixserve.engine.models.config import ModelArgs
from radixserve.engine.models.registry import model_class

INIT_STD = 0.02


@torch.no_grad()
def init_dummy_model(path: str | Path, dtype: torch.dtype, device: torch.device,
                     seed: int = 0) -> CausalLM:
    args = ModelArgs.from_folder(path)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype if dtype.is_floating_point else previous)
    try:  # built directly in the target dtype: an 8B model never exists in float32
        with torch.device(device):
            model = model_class(args.architecture)(args)
    finally:
        torch.set_default_dtype(previous)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, INIT_STD, generator=gen)
    return model.to(dtype=dtype).eval()
