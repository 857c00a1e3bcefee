"""Tiny random-weight Hugging Face checkpoints and transformers reference outputs for the
engine-vs-HF parity tests (docs/reliability.md #25).

Every checkpoint is built with transformers' own model classes and `save_pretrained`, shares the
demo tokenizer (so vocab sizes match and text round-trips), and uses the demo's weight scaling so
greedy outputs vary. The config.json files are in the format the installed transformers writes
(v5: `rope_parameters`, `dtype`); the demo model itself uses the older Hub layout (`rope_theta`,
`rope_scaling`, `torch_dtype`), so a loader meets both.

Fixtures live in conftest.py; use `checkpoint(kind, tmp_path_factory)` to build each kind once.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import torch
from radixserve.engine.demo import (
    DEMO_ARCH,
    ENDOFTEXT,
    IM_END,
    create_demo_model,
    init_weight,
    save_tokenizer,
    special_token_ids,
)
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 512,
}


def _common(path: Path) -> dict:
    """Sizes shared by all test checkpoints, plus the tokenizer written into `path`."""
    tok = save_tokenizer(path)
    ids = special_token_ids(tok)
    return {
        **DEMO_ARCH.to_config(),
        "vocab_size": tok.get_vocab_size(),
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[ENDOFTEXT],
    }


def _save(
    model_cls: type[PreTrainedModel], config: PretrainedConfig, path: Path, seed: int, **save_kw
) -> Path:
    model = model_cls(config).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # named_parameters() lists a tied lm_head once (under the embedding's name); sorting fixes
        # the draw order so the weights depend only on the seed.
        for name, param in sorted(model.named_parameters()):
            param.copy_(init_weight(name, tuple(param.shape), gen))
    model.save_pretrained(path, safe_serialization=True, **save_kw)
    return path


def make_qwen3(path: str | Path, tie: bool = True, *, seed: int = 1) -> Path:
    path = Path(path)
    config = Qwen3Config(**_common(path), tie_word_embeddings=tie)
    return _save(Qwen3ForCausalLM, config, path, seed)


def make_llama(path: str | Path, *, seed: int = 2) -> Path:
    """Untied Llama with GQA (4 heads / 2 KV heads) and llama3 RoPE scaling."""
    path = Path(path)
    common = _common(path) | {"rope_theta": 500_000.0}
    # transformers 5 folds the legacy `rope_scaling` argument into `rope_parameters`.
    config = LlamaConfig(**common, rope_scaling=LLAMA3_ROPE_SCALING, tie_word_embeddings=False)
    return _save(LlamaForCausalLM, config, path, seed)


def make_qwen2(path: str | Path, *, seed: int = 3) -> Path:
    """Untied Qwen2: q/k/v projections carry biases (always on in this architecture)."""
    path = Path(path)
    common = {k: v for k, v in _common(path).items() if k != "head_dim"}  # Qwen2: hidden / heads
    config = Qwen2Config(**common, tie_word_embeddings=False)
    return _save(Qwen2ForCausalLM, config, path, seed)


def make_qwen3_sharded(path: str | Path, *, seed: int = 4) -> Path:
    """Untied Qwen3 split over several safetensors files with `model.safetensors.index.json`
    (about 3.4 MB of weights, 2 MB per shard at most)."""
    path = Path(path)
    config = Qwen3Config(**_common(path), tie_word_embeddings=False)
    return _save(Qwen3ForCausalLM, config, path, seed, max_shard_size="2MB")


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "demo": create_demo_model,
    "qwen3": make_qwen3,
    "qwen3_untied": functools.partial(make_qwen3, tie=False),
    "llama": make_llama,
    "qwen2": make_qwen2,
    "qwen3_sharded": make_qwen3_sharded,
}

_built: dict[tuple[int, str], Path] = {}


def checkpoint(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build checkpoint `kind` (a key of BUILDERS) once per pytest session and return its folder."""
    key = (id(tmp_path_factory), kind)
    if key not in _built:
        _built[key] = BUILDERS[kind](tmp_path_factory.mktemp(f"ckpt-{kind}"))
    return _built[key]


def shard_files(path: str | Path) -> list[str]:
    """The distinct safetensors files named by a checkpoint's index ([] when not sharded)."""
    index = Path(path) / "model.safetensors.index.json"
    if not index.is_file():
        return []
    return sorted(set(json.loads(index.read_text())["weight_map"].values()))


def sample_prompts(vocab_size: int, n: int = 4, *, seed: int = 0) -> list[list[int]]:
    """`n` distinct random prompts of 3..24 ids, skipping the three special ids at the bottom."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    while len(prompts) < n:
        prompt = [rng.randrange(3, vocab_size) for _ in range(rng.randint(3, 24))]
        if prompt not in prompts:
            prompts.append(prompt)
    return prompts


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread for a while. These models are too small to gain from more,
    and on a busy 2-core CI box spinning worker threads made the reference 20x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@functools.lru_cache(maxsize=8)
def load_hf(path: str) -> PreTrainedModel:
    """The reference model in float32 on CPU, eval mode (cached per folder)."""
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def hf_greedy(
    path: str | Path, prompts: Sequence[Sequence[int]], max_new_tokens: int
) -> list[list[int]]:
    """Greedy continuations from transformers, one prompt at a time (no padding), exactly
    `max_new_tokens` each. EOS neither stops nor is suppressed, which is what an engine run with
    `ignore_eos=True` must reproduce. A hand-written loop rather than `generate()`, whose
    generation_config defaults (eos, min length, processors) vary between versions."""
    if max_new_tokens <= 0:
        return [[] for _ in prompts]
    model = load_hf(str(path))
    # transformers 5.2x renamed `past_key_values` (argument and output field) to `cache`.
    forward_args = inspect.signature(model.forward).parameters
    cache_name = "cache" if "cache" in forward_args else "past_key_values"
    results = []
    with one_thread():
        for prompt in prompts:
            results.append(_greedy_one(model, list(prompt), max_new_tokens, cache_name))
    return results


def _greedy_one(
    model: PreTrainedModel, prompt: list[int], max_new_tokens: int, cache_name: str
) -> list[int]:
    out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    tokens: list[int] = []
    while True:
        tokens.append(int(out.logits[0, -1].argmax()))
        if len(tokens) >= max_new_tokens:
            return tokens
        step_input = torch.tensor([[tokens[-1]]])
        out = model(input_ids=step_input, use_cache=True, **{cache_name: out[cache_name]})


@torch.inference_mode()
def hf_logits(path: str | Path, token_ids: Sequence[int]) -> torch.Tensor:
    """Logits of one full forward over `token_ids`. Shape: (len(token_ids), vocab_size), float32."""
    model = load_hf(str(path))
    with one_thread():
        return model(input_ids=torch.tensor([list(token_ids)])).logits[0].float()


def assert_outputs_vary(outputs: Sequence[Sequence[int]], *, min_distinct: int = 4) -> None:
    """Each sequence uses at least `min_distinct` different tokens, and no two sequences are equal
    (call with outputs for distinct prompts)."""
    for i, seq in enumerate(outputs):
        assert len(set(seq)) >= min_distinct, f"output {i} barely varies: {list(seq)}"
    as_tuples = [tuple(seq) for seq in outputs]
    assert len(set(as_tuples)) == len(as_tuples), f"outputs repeat across prompts: {as_tuples}"
