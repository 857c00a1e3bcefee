"""C++ vs pure-Python prefix helpers and radix cache: `python -m radixserve.native.bench`.

A benchmark script, not a test. Each row times one operation on both backends and prints their
ratio. The small-helper rows call `first_mismatch` / `match_children`; the radix rows time
`RadixPrefixCache.match` of a 32k-token prompt on the C++ tree against the pure-Python twin, both
filled with the same 10k cached sequences (page size 1) of two shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from radixserve.native import prefix, prefix_py
from radixserve.native.prefix import PackedKeys, pack_keys

VOCAB = 32_000
PROMPT_LEN = 32_768
NUM_SEQS = 10_000


def distinct_tokens(rng: np.random.Generator, n: int, low: int = 0) -> np.ndarray:
    return (rng.permutation(VOCAB)[:n] + low).astype(np.int32)


def conversations(rng: np.random.Generator, caches: list[Any]) -> np.ndarray:
    """100 system prompts (2k tokens) x 100 cached conversations; the prompt resumes one of them."""
    locations = _locations(PROMPT_LEN)
    prompt = np.zeros(0, np.int32)
    for s, head in enumerate(distinct_tokens(rng, 100)):
        system = np.r_[head, rng.integers(0, VOCAB, 2047, dtype=np.int32)]
        for c, first in enumerate(distinct_tokens(rng, NUM_SEQS // 100)):
            size = PROMPT_LEN - 2048 - 512 if (s, c) == (7, 42) else int(rng.integers(500, 3000))
            seq = np.r_[system, first, rng.integers(0, VOCAB, size - 1, dtype=np.int32)]
            for cache in caches:
                cache.insert(seq, locations[: len(seq)])
            if (s, c) == (7, 42):  # a new 512-token user turn on top of the cached history
                prompt = np.r_[seq, rng.integers(0, VOCAB, 512, dtype=np.int32)]
    return prompt.astype(np.int32)


def spine(rng: np.random.Generator, caches: list[Any]) -> np.ndarray:
    """10k sequences branching off one 32k prefix at random points: a chain of ~8.6k short edges.

    Branches go in from the deepest cut up, so each insert walks one edge (the build stays fast
    on the Python twin); the order does not change the tree.
    """
    prompt = rng.integers(0, VOCAB, PROMPT_LEN, dtype=np.int32)
    locations = _locations(PROMPT_LEN + 64)
    for cache in caches:
        cache.insert(prompt, locations[:PROMPT_LEN])
    for cut in np.unique(rng.integers(1, PROMPT_LEN, NUM_SEQS))[::-1]:
        # suffix ids >= VOCAB never collide with the spine's next token
        seq = np.r_[prompt[:cut], rng.integers(VOCAB, 2 * VOCAB, 64, dtype=np.int32)]
        for cache in caches:
            cache.insert(seq, locations[: len(seq)])
    return prompt


def _locations(n: int) -> Any:
    import torch

    return torch.arange(n, dtype=torch.int64)


def per_call_us(fn: Callable[[], object], min_time: float) -> float:
    """Best of 3 runs of at least `min_time` seconds each, in microseconds per call."""
    best = float("inf")
    for _ in range(3):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < min_time:
            fn()
            calls += 1
        best = min(best, elapsed / calls)
    return best * 1e6


class Row(NamedTuple):
    case: str
    cpp_us: float
    python_us: float

    @property
    def ratio(self) -> float:
        return self.python_us / self.cpp_us


def run(min_time: float) -> list[Row]:
    from radixserve.engine.kvcache.radix import CppRadixPrefixCache, PyRadixPrefixCache

    rng = np.random.default_rng(0)
    short = rng.integers(0, VOCAB, 16, dtype=np.int32)
    long = rng.integers(0, VOCAB, PROMPT_LEN, dtype=np.int32)
    short_copy, long_copy, early = short.copy(), long.copy(), long.copy()
    early[100] += 1
    wide_prompt = long.copy()
    wide = [wide_prompt[: PROMPT_LEN - 512]]  # the one cached sequence the prompt continues
    heads = distinct_tokens(rng, NUM_SEQS - 1, low=VOCAB)  # other roots: distinct first tokens
    wide += [np.r_[h, rng.integers(0, VOCAB, 255, dtype=np.int32)] for h in heads]
    wide_keys: PackedKeys = pack_keys(wide[::-1])  # the match is the last of 10k candidates
    chats = CppRadixPrefixCache(1), PyRadixPrefixCache(1)
    chat_prompt = conversations(rng, list(chats))
    chain = CppRadixPrefixCache(1), PyRadixPrefixCache(1)
    chain_prompt = spine(rng, list(chain))

    # (name, C++ call, Python call)
    cases: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
        (name, lambda f=f, a=a: getattr(prefix, f)(*a), lambda f=f, a=a: getattr(prefix_py, f)(*a))
        for name, f, a in [
            ("first_mismatch, 16 tokens, equal", "first_mismatch", (short, short_copy)),
            ("first_mismatch, 32k tokens, equal", "first_mismatch", (long, long_copy)),
            ("first_mismatch, 32k tokens, differ at 100", "first_mismatch", (long, early)),
            ("match_children, 32k prompt, 10k children", "match_children", (wide_prompt, 0, wide_keys)),
        ]
    ] + [
        ("RadixPrefixCache.match 32k: 100 sys x 100 chats", lambda: chats[0].match(chat_prompt),
         lambda: chats[1].match(chat_prompt)),
        ("RadixPrefixCache.match 32k: 10k branches, 1 spine", lambda: chain[0].match(chain_prompt),
         lambda: chain[1].match(chain_prompt)),
    ]  # fmt: skip
    assert chats[0].match(chat_prompt).length == PROMPT_LEN - 512
    assert chain[1].match(chain_prompt).length == PROMPT_LEN
    rows = []
    for name, cpp_case, python_case in cases:
        want, got = cpp_case(), python_case()
        if hasattr(want, "locations"):  # a MatchResult: compare values, not handles
            assert want.length == got.length and bool((want.locations == got.locations).all())
        else:
            assert want == got, name
        rows.append(Row(name, per_call_us(cpp_case, min_time), per_call_us(python_case, min_time)))
    return rows


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass  # not Linux: keep platform's answer
    return f"{model}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement")
    args = parser.parse_args()
    if prefix.load() is None:
        raise SystemExit("the C++ module is not built: run `pip install -e .` first")
    rows = run(args.min_time)
    print(f"machine: {machine()}")
    print(f"{'case':<52} {'C++ us':>10} {'Python us':>11} {'ratio':>8}")
    for row in rows:
        print(f"{row.case:<52} {row.cpp_us:>10.2f} {row.python_us:>11.2f} {row.ratio:>7.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "machine": machine(),
                    "rows": [{**row._asdict(), "ratio": row.ratio} for row in rows],
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
