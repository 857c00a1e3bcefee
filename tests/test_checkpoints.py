"""The parity-test checkpoints load in transformers and make varied greedy output."""

from __future__ import annotations

import json

import pytest
import torch
from checkpoints import (
    BUILDERS,
    assert_outputs_vary,
    checkpoint,
    hf_greedy,
    hf_logits,
    load_hf,
    sample_prompts,
    shard_files,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

KINDS = sorted(BUILDERS)


@pytest.mark.parametrize("kind", KINDS)
def test_loads_without_missing_or_unexpected_weights(kind, tmp_path_factory):
    path = checkpoint(kind, tmp_path_factory)
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.vocab_size == len(tok)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_outputs_vary(kind, tmp_path_factory):
    path = checkpoint(kind, tmp_path_factory)
    vocab_size = load_hf(str(path)).config.vocab_size
    outputs = hf_greedy(path, sample_prompts(vocab_size, 4), max_new_tokens=32)
    assert all(len(seq) == 32 for seq in outputs)
    assert_outputs_vary(outputs)


def test_greedy_loop_matches_full_forward(tmp_path_factory):
    # The cached greedy loop must agree with recomputing the whole sequence each time.
    path = checkpoint("llama", tmp_path_factory)
    prompt = sample_prompts(load_hf(str(path)).config.vocab_size, 1, seed=7)[0]
    [generated] = hf_greedy(path, [prompt], max_new_tokens=8)
    logits = hf_logits(path, prompt + generated)
    assert logits.shape == (len(prompt) + 8, load_hf(str(path)).config.vocab_size)
    assert logits[len(prompt) - 1 : -1].argmax(-1).tolist() == generated


def test_sharded_variant_has_index(tmp_path_factory):
    path = checkpoint("qwen3_sharded", tmp_path_factory)
    shards = shard_files(path)
    assert len(shards) >= 2 and all((path / name).is_file() for name in shards)
    assert not (path / "model.safetensors").exists()


def test_architecture_details(tmp_path_factory):
    llama = json.loads((checkpoint("llama", tmp_path_factory) / "config.json").read_text())
    rope = llama.get("rope_parameters") or llama["rope_scaling"]
    assert rope["rope_type"] == "llama3" and llama["num_key_value_heads"] == 2
    assert llama["tie_word_embeddings"] is False
    qwen2 = load_hf(str(checkpoint("qwen2", tmp_path_factory)))
    bias = qwen2.model.layers[0].self_attn.q_proj.bias
    assert bias is not None and torch.count_nonzero(bias) > 0
    qwen3 = load_hf(str(checkpoint("qwen3", tmp_path_factory)))
    assert qwen3.lm_head.weight.data_ptr() == qwen3.model.embed_tokens.weight.data_ptr()
