"""Public architectures for benchmarks with random weights (`load_format="dummy"`).

The values are the published config.json fields of each model; only the weights are missing.
`write_model_dir` adds the demo tokenizer so `LLM` can open the folder; benchmarks feed token ids,
so the tokenizer only renders text (ids it does not know decode to nothing). Where the vocabulary's
size matters (detokenizing, constrained decoding), pass a real-size one (bench/tokenizer.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

QWEN3_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-06,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 28,
    "initializer_range": 0.02,
}

CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": QWEN3_COMMON | {"hidden_size": 1024, "intermediate_size": 3072,
                                  "num_hidden_layers": 28,
                                  "num_attention_heads": 16, "num_key_value_heads": 8,
                                  "tie_word_embeddings": True},
    "qwen3-8b": QWEN3_COMMON | {"hidden_size": 4096, "intermediate_size": 12288,
                                "num_hidden_layers": 36,
                                "num_attention_heads": 32, "num_key_value_heads": 8,
                                "tie_word_embeddings": False, "max_window_layers": 36},
    # not a public model: a smoke-test size for running the benchmarks on a CPU; its special ids
    # are the demo tokenizer's (<|endoftext|>, <|im_end|>), inside its small vocabulary
    "tiny": QWEN3_COMMON | {"vocab_size": 10240, "head_dim": 32, "hidden_size": 128,
                            "intermediate_size": 256,
                            "num_hidden_layers": 2, "num_attention_heads": 4,
                            "num_key_value_heads": 2, "tie_word_embeddings": True,
                            "bos_token_id": 0, "eos_token_id": 2},
    "llama-3-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 8192,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
    },
}


def write_model_dir(name: str, root: str | Path, tokenizer: str | Path | None = None) -> Path:
    """config.json (+ generation_config.json, tokenizer) for `name` under root/name; the tokenizer
    is the demo one, or a copy of the folder `tokenizer`."""
    from radixserve.bench.tokenizer import copy_tokenizer
    from radixserve.engine.demo import save_tokenizer

    if name not in CONFIGS:
        raise ValueError(f"unknown benchmark model {name!r}; choose from {sorted(CONFIGS)}")
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    cfg = CONFIGS[name]
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if tokenizer is None:
        save_tokenizer(path)
    else:
        copy_tokenizer(tokenizer, path)
    return path


def param_count(name: str) -> dict[str, int]:
    """Weights read per decode step (embedding row reads are negligible; the LM head is read)."""
    c = CONFIGS[name]
    h, i, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = c.get("head_dim", h // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    layer = h * (q + 2 * kv) + q * h + 3 * h * i
    return {"layers": L * layer, "lm_head": V * h, "embedding": V * h}
