"""Training of the demo weights: the training forward is transformers' Qwen3, training lowers the
corpus loss, and the process-wide torch settings it changes come back."""

from __future__ import annotations

import torch
from radixserve.engine import demo_train
from radixserve.engine.demo import init_weight, qwen3_param_shapes, train_tokenizer
from radixserve.engine.demo_corpus import CORPUS
from radixserve.engine.demo_train import qwen3_logits, train_weights
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def test_forward_matches_transformers(ckpt):
    path = ckpt("demo")
    params = load_file(str(path / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor([train_tokenizer().encode(CORPUS).ids[:96]]).view(2, 48)
    with torch.no_grad():
        expected = model(ids).logits
        got = qwen3_logits(params, ids)
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), (got - expected).abs().max()


def _corpus_loss(params: dict[str, torch.Tensor], token_ids: list[int]) -> float:
    ids = torch.tensor([token_ids[:257]])
    with torch.no_grad():
        logits = qwen3_logits(params, ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits[0], ids[0, 1:]).item()


def test_training_lowers_the_loss_and_restores_torch_settings(monkeypatch):
    monkeypatch.setattr(demo_train, "TRAIN_STEPS", 20)
    token_ids = train_tokenizer().encode(CORPUS).ids
    gen = torch.Generator().manual_seed(0)
    shapes = qwen3_param_shapes(train_tokenizer().get_vocab_size())
    params = {name: init_weight(name, shape, gen) for name, shape in sorted(shapes.items())}
    before = _corpus_loss(params, token_ids)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    train_weights(params, token_ids, seed=0)
    assert _corpus_loss(params, token_ids) < before / 2, before
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == deterministic
