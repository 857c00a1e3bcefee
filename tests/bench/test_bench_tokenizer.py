"""`radixserve bench tokenizer`: a tiktoken BPE rank file becomes a tokenizer the engine loads."""

from __future__ import annotations

import base64
import json

import pytest
from radixserve.bench import models
from radixserve.bench.tokenizer import save_tiktoken_tokenizer

pytest.importorskip("tiktoken")


def write_ranks(path) -> dict[bytes, int]:
    """The 256 bytes, then merges up to 'hello' and ' world' (a rank's token is its bytes)."""
    ranks = {bytes([b]): b for b in range(256)}
    for merged in (b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor", b"ld", b" world"):
        ranks[merged] = len(ranks)
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    return ranks


def test_ranks_become_a_tokenizer_with_merges_and_special_tokens(tmp_path):
    ranks = write_ranks(tmp_path / "tiny.tiktoken")
    out = tmp_path / "tok"
    size = save_tiktoken_tokenizer(tmp_path / "tiny.tiktoken", out,
                                   special_tokens=("<|endoftext|>", "<|im_end|>"))
    assert size == len(ranks) + 2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok.encode("hello world<|im_end|>", add_special_tokens=False)
    assert ids == [ranks[b"hello"], ranks[b" world"], len(ranks) + 1]
    assert tok.decode(ids) == "hello world<|im_end|>"
    assert tok.eos_token_id == len(ranks) + 1
    text = "héllo, wörld! 123"  # bytes without a merge still round-trip
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_model_dir_takes_the_tokenizer_folder(tmp_path):
    write_ranks(tmp_path / "tiny.tiktoken")
    save_tiktoken_tokenizer(tmp_path / "tiny.tiktoken", tmp_path / "tok",
                            special_tokens=("<|endoftext|>", "<|im_end|>"))
    path = models.write_model_dir("tiny", tmp_path / "models", tokenizer=tmp_path / "tok")
    assert json.loads((path / "tokenizer.json").read_text()) == \
        json.loads((tmp_path / "tok" / "tokenizer.json").read_text())
    with pytest.raises(ValueError, match="no tokenizer.json"):
        models.write_model_dir("tiny", tmp_path / "models", tokenizer=tmp_path)
