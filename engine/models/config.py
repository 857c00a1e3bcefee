"""The model hyper-parameters we read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelArgs:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    dtype: str

    @classmethod
    def from_folder(cls, path: str | Path) -> ModelArgs:
        cfg = json.loads((Path(path) / "config.json").read_text())
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError(f"{path}/config.json names no architecture")
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default"
                                              else None)
        return cls(
            architecture=archs[0],
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate_size=cfg["intermediate_size"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", rope.get("rope_theta", 10000.0)),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            # Qwen2 always has q/k/v biases; Llama has them only when attention_bias is set.
            attention_bias=cfg.get("attention_bias", cfg.get("model_type") == "qwen2"),
            dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
        )


def read_eos_ids(folder: Path) -> tuple[int, ...]:
    """Every EOS id the checkpoint names, in config.json or generation_config.json."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        f = folder / name
        if f.exists():
            value = json.loads(f.read_text()).get("eos_token_id")
            ids.update([value] if isinstance(value, int) else value or [])
    return tuple(sorted(ids))
