"""Build a model from a Hugging Face folder and load its safetensors by dotted names."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from radixserve.engine.layers.linear import WeightSource, copy_checked
from radixserve.engine.models.base import CausalLM
from radixserve.engine.models.config import ModelArgs
from radixserve.engine.models.registry import model_class
from safetensors import safe_open


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    return files


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device) -> CausalLM:
    folder = Path(path)
    args = ModelArgs.from_folder(folder)
    with torch.device(device):
        model = model_class(args.architecture)(args)
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for file in _weight_files(folder):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                if "rotary_emb.inv_freq" in name:
                    continue
                target, shard = _resolve(model, name)
                if target not in params:
                    raise KeyError(
                        f"checkpoint tensor {name!r} has no place in {args.architecture}")
                param = params[target]
                # A lazy slice: each layer indexes its own TP shard, so only that part is read.
                source = f.get_slice(name)
                loader: Callable[..., None] = getattr(param, "weight_loader", _copy_whole)
                loader(param, source) if shard is None else loader(param, source, shard)
                loaded.add(target if shard is None else f"{target}:{shard}")
    if args.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = [n for n in params if n not in loaded
               and not any(k.startswith(n + ":") for k in loaded)]
    if missing:
        raise ValueError(f"checkpoint at {folder} lacks {missing[:5]}")
    return model.to(dtype=dtype).eval()


def _copy_whole(param: torch.nn.Parameter, loaded: WeightSource) -> None:
    copy_checked(param.data, loaded[:])


def _resolve(model: CausalLM, name: str) -> tuple[str, str | int | None]:
    for src, (dst, shard) in model.packed_modules_mapping.items():
        if f".{src}." in name:
            return name.replace(f".{src}.", f".{dst}."), shard
    return name, None
