"""`radixserve bench tokenizer`: a real-size byte-level BPE tokenizer for the benchmark models.

The benchmark models carry the demo tokenizer (1,024 tokens), which makes the per-token host work
that depends on the vocabulary look cheaper than it is: the detokenizer (most sampled ids decode
to nothing) and constrained decoding (xgrammar's token sets per grammar state are small). A
tiktoken BPE file (one `base64(token bytes) rank` pair per line, e.g. the 151,643-token Qwen
vocabulary that the `qwen-agent` wheel ships as `qwen_agent/utils/qwen.tiktoken`) has all the
tokens of a real model; transformers' `TikTokenConverter` turns it into a `tokenizer.json` with
the merges recovered from the ranks. `write_model_dir(..., tokenizer=DIR)` then copies the folder
into a benchmark model instead of the demo tokenizer.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

# Qwen2/Qwen3's pre-tokenizer split (single digits, unlike tiktoken's cl100k default of 1-3).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3's added tokens, in id order right after the 151,643 BPE ranks.
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def save_tiktoken_tokenizer(bpe_file: str | Path, out: str | Path,
                            pattern: str = QWEN_PATTERN,
                            special_tokens: tuple[str, ...] = QWEN3_SPECIAL_TOKENS) -> int:
    """Write a transformers-loadable tokenizer for `bpe_file` into `out`; returns its size.

    Needs the `tiktoken` package (transformers reads the rank file with it)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    try:
        import tiktoken  # noqa: F401  (TikTokenConverter imports it lazily, with a vaguer error)
    except ImportError as exc:
        raise SystemExit("bench tokenizer needs tiktoken: pip install tiktoken") from exc
    backend = TikTokenConverter(vocab_file=str(bpe_file), pattern=pattern,
                                extra_special_tokens=list(special_tokens)).converted()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", clean_up_tokenization_spaces=False)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    return len(tok)


def copy_tokenizer(src: str | Path, dst: str | Path) -> None:
    """Copy a tokenizer folder's files (those present) into a model folder."""
    src = Path(src)
    if not (src / "tokenizer.json").is_file():
        raise ValueError(f"{src} holds no tokenizer.json; build one with `radixserve bench "
                         "tokenizer --tiktoken FILE --out DIR`")
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, Path(dst) / name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench tokenizer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiktoken", required=True, help="a tiktoken BPE rank file")
    ap.add_argument("--out", required=True, help="folder to write the tokenizer into")
    a = ap.parse_args(argv)
    size = save_tiktoken_tokenizer(a.tiktoken, a.out)
    print(json.dumps({"out": a.out, "tokens": size}))
