"""C++ vs pure-Python prefix helpers: `python -m radixserve.native.bench [--json PATH]`.

A benchmark script, not a test. Each row times one operation on both backends and prints their
ratio. The radix rows walk a minimal tree (Python nodes, one `match_children` call per node) the
way a radix prefix cache looks a prompt up, over 10k cached sequences of two shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

import numpy as np
from radixserve.native import prefix, prefix_py
from radixserve.native.prefix import PackedKeys, pack_keys

VOCAB = 32_000
PROMPT_LEN = 32_768
NUM_SEQS = 10_000


class Node:
    __slots__ = ("children", "key", "packed")

    def __init__(self, key: np.ndarray) -> None:
        self.key = key  # (key_len,) int32: the edge label from the parent
        self.children: list[Node] = []
        self.packed = pack_keys([])

    def add(self, child: Node) -> Node:
        self.children.append(child)
        return child

    def seal(self) -> None:
        """Packs every node's child keys; a real cache repacks a node when its children change."""
        stack: list[Node] = [self]
        while stack:
            node = stack.pop()
            node.packed = pack_keys([c.key for c in node.children])
            stack.extend(node.children)


def match_prefix(root: Node, prompt: np.ndarray, backend: ModuleType) -> int:
    """Tokens of `prompt` covered by the tree: one native call per node on the path."""
    node, pos = root, 0
    while pos < len(prompt) and node.children:
        index, length = backend.match_children(prompt, pos, node.packed)
        if index < 0:
            break
        pos += length
        if length < len(node.children[index].key):
            break  # the prompt leaves this edge part-way
        node = node.children[index]
    return pos


def distinct_tokens(rng: np.random.Generator, n: int, low: int = 0) -> np.ndarray:
    return (rng.permutation(VOCAB)[:n] + low).astype(np.int32)


def conversations(rng: np.random.Generator) -> tuple[Node, np.ndarray]:
    """100 system prompts (2k tokens) x 100 cached conversations; the prompt resumes one of them."""
    root = Node(np.zeros(0, np.int32))
    prompt = np.zeros(0, np.int32)
    for s, head in enumerate(distinct_tokens(rng, 100)):
        system = root.add(Node(np.r_[head, rng.integers(0, VOCAB, 2047, dtype=np.int32)]))
        for c, first in enumerate(distinct_tokens(rng, NUM_SEQS // 100)):
            size = PROMPT_LEN - 2048 - 512 if (s, c) == (7, 42) else int(rng.integers(500, 3000))
            chat = system.add(Node(np.r_[first, rng.integers(0, VOCAB, size - 1, dtype=np.int32)]))
            if (s, c) == (7, 42):  # a new 512-token user turn on top of the cached history
                prompt = np.r_[system.key, chat.key, rng.integers(0, VOCAB, 512, dtype=np.int32)]
    root.seal()
    return root, prompt.astype(np.int32)


def spine(rng: np.random.Generator) -> tuple[Node, np.ndarray]:
    """10k sequences branching off one 32k prefix at random points: a chain of ~10k short edges."""
    prompt = rng.integers(0, VOCAB, PROMPT_LEN, dtype=np.int32)
    cuts = np.unique(rng.integers(1, PROMPT_LEN, NUM_SEQS))
    root = node = Node(np.zeros(0, np.int32))
    for start, end in zip(np.r_[0, cuts], np.r_[cuts, PROMPT_LEN]):
        node = node.add(Node(prompt[start:end]))
        if end < PROMPT_LEN:  # suffix ids >= VOCAB never collide with the spine's next token
            node.add(Node(rng.integers(VOCAB, 2 * VOCAB, 64, dtype=np.int32)))
    root.seal()
    return root, prompt


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
    chats, chat_prompt = conversations(rng)
    chain, chain_prompt = spine(rng)

    cases: list[tuple[str, Callable[[ModuleType], object]]] = [
        ("first_mismatch, 16 tokens, equal", lambda m: m.first_mismatch(short, short_copy)),
        ("first_mismatch, 32k tokens, equal", lambda m: m.first_mismatch(long, long_copy)),
        ("first_mismatch, 32k tokens, differ at 100", lambda m: m.first_mismatch(long, early)),
        ("match_children, 32k prompt, 10k children", lambda m: m.match_children(wide_prompt, 0, wide_keys)),
        ("radix match 32k: 100 sys x 100 chats (depth 2)", lambda m: match_prefix(chats, chat_prompt, m)),
        ("radix match 32k: 10k branches off one spine", lambda m: match_prefix(chain, chain_prompt, m)),
    ]  # fmt: skip
    assert match_prefix(chats, chat_prompt, prefix) == PROMPT_LEN - 512
    assert match_prefix(chain, chain_prompt, prefix_py) == PROMPT_LEN
    rows = []
    for name, case in cases:
        assert case(prefix) == case(prefix_py), name
        cpp_us = per_call_us(lambda: case(prefix), min_time)  # noqa: B023 - called right here
        python_us = per_call_us(lambda: case(prefix_py), min_time)  # noqa: B023
        rows.append(Row(name, cpp_us, python_us))
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
    print(f"{'case':<48} {'C++ us':>10} {'Python us':>11} {'ratio':>8}")
    for row in rows:
        print(f"{row.case:<48} {row.cpp_us:>10.2f} {row.python_us:>11.2f} {row.ratio:>7.1f}x")
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
