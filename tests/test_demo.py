"""The built-in demo model: deterministic, loadable offline by transformers, and not degenerate."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import torch
from checkpoints import one_thread
from radixserve.engine.demo import DEMO_VERSION, create_demo_model, demo_model_path
from radixserve.engine.demo_corpus import CORPUS
from transformers import AutoModelForCausalLM, AutoTokenizer

FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]


def _contents(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in sorted(p.name for p in path.iterdir())}


def test_same_seed_same_bytes(tmp_path):
    a = _contents(create_demo_model(tmp_path / "a"))
    assert sorted(a) == FILES
    assert a == _contents(create_demo_model(tmp_path / "b", seed=0))
    other = _contents(create_demo_model(tmp_path / "c", seed=1))
    assert other["model.safetensors"] != a["model.safetensors"]
    assert other["tokenizer.json"] == a["tokenizer.json"]


def test_files_are_world_readable_whatever_the_umask(tmp_path):
    # An image builds the model as root and serves it as another user (docker/Dockerfile).
    old = os.umask(0o077)
    try:
        path = create_demo_model(tmp_path / "m")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.iterdir()} == dict.fromkeys(
        FILES, 0o644
    )


def test_config_and_tokenizer(ckpt):
    path = ckpt("demo")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert (config["hidden_size"], config["num_hidden_layers"], config["head_dim"]) == (128, 4, 32)
    assert config["tie_word_embeddings"] is True and config["torch_dtype"] == "float32"
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == config["vocab_size"] and 1000 <= len(tok) <= 2000
    eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
    assert sorted(eos) == sorted(tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    chat = [{"role": "user", "content": "Hi"}]
    rendered = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    text = "Tea at 7, café 🙂 你好"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_start|>") == [tok.convert_tokens_to_ids("<|im_start|>")]


def _greedy(path: Path, prompts: list[str]) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([tok.encode(prompt)])
        with torch.inference_mode(), one_thread():
            out = model.generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=None)
        outputs.append(out[0, ids.shape[1] :].tolist())
    return outputs


def test_greedy_generation_is_not_degenerate(ckpt):
    prompts = ["The weather today", "My cat sleeps in", "Numbers: 3 apples and", "Hello"]
    outputs = _greedy(ckpt("demo"), prompts)
    assert all(len(set(o)) >= 8 for o in outputs), outputs
    assert len({tuple(o) for o in outputs}) == len(outputs)


def _known_word_share(path: Path) -> float:
    """Share of the words (whitespace-split) in greedy continuations of corpus line openings that
    are words of the corpus."""
    prompts = [" ".join(line.split()[:3]) for line in CORPUS.splitlines()[::8]]
    tok = AutoTokenizer.from_pretrained(path)
    words = [w for out in _greedy(path, prompts) for w in tok.decode(out).split()]
    assert len(words) >= 5 * len(prompts), words
    return sum(w in set(CORPUS.split()) for w in words) / len(words)


def test_trained_demo_writes_words_of_its_corpus(ckpt):
    # The random-init baseline: the same architecture, tokenizer and init recipe, untrained (about
    # 0.13 of its words are corpus words, against 0.97 for the trained demo).
    trained, untrained = _known_word_share(ckpt("demo")), _known_word_share(ckpt("qwen3"))
    assert trained >= 0.8 and trained - untrained >= 0.5, (trained, untrained)


def test_cached_path_survives_concurrent_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXSERVE_CACHE", str(tmp_path))
    barrier, results = threading.Barrier(4), []

    def first_use() -> None:
        barrier.wait()
        results.append(demo_model_path())

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = tmp_path / f"demo-v{DEMO_VERSION}"
    assert results == [final] * 4
    assert [p.name for p in tmp_path.iterdir()] == [final.name]  # no temp folders left behind
    assert _contents(final) == _contents(create_demo_model(tmp_path / "fresh"))
    assert demo_model_path() == final
    # Once cached, resolving the path must not load torch: torch-free services call it.
    code = (
        "import sys, radixserve.engine.demo as m; m.demo_model_path(); exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
