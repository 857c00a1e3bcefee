"""`radixserve bench grammar`: how long xgrammar takes to compile pathological constraints.

Each case compiles in the engine's own compile worker (engine/constrained/workers.py), with --cap
as its time limit, so a case that runs past the cap is killed the way the server kills it and
reported as "> cap". Two vocabularies: the demo tokenizer (1,024 tokens; the benchmark models use
it too) and a synthetic one of 150,000 random 2-9 character strings, close to a real model's size
(compile time grows with the vocabulary for constraints whose next character is free). Both are
padded to Qwen3's 151,936 ids. Figures: docs/benchmarks.md, "Grammar compile times".
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from radixserve.bench.common import print_table, write_json


def nested_objects(depth: int) -> str:
    """A schema of objects nested `depth` deep, built as text (json.dumps recurses too deep)."""
    schema = '{"type": "integer"}'
    for i in range(depth):
        schema = (f'{{"type": "object", "properties": {{"k{i}": {schema}, "z": {{"type": '
                  f'"string"}}}}, "required": ["k{i}"]}}')
    return schema


def nested_arrays(depth: int) -> str:
    schema = '{"type": "integer"}'
    for _ in range(depth):
        schema = f'{{"type": "array", "items": {schema}, "minItems": 1, "maxItems": 3}}'
    return schema


CASES: dict[str, tuple[str, str]] = {
    "enum of 10k strings": ("json_schema", json.dumps({"enum": [f"value_{i}"
                                                                for i in range(10000)]})),
    "500 integer properties": ("json_schema", json.dumps({
        "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(500)},
        "required": [f"p{i}" for i in range(500)]})),
    "objects nested 50 deep": ("json_schema", nested_objects(50)),
    "objects nested 200 deep": ("json_schema", nested_objects(200)),
    "objects nested 400 deep": ("json_schema", nested_objects(400)),
    "objects nested 700 deep": ("json_schema", nested_objects(700)),
    "arrays nested 300 deep": ("json_schema", nested_arrays(300)),
    "(a|b){1000}": ("regex", "(a|b){1000}"),
    "[a-z]{1,20000}": ("regex", "[a-z]{1,20000}"),
    "((a|b){1,100}c){1,100}": ("regex", "((a|b){1,100}c){1,100}"),
    "5000 alternatives": ("regex", "|".join(f"w{i}x" for i in range(5000))),
    ".{1,200}": ("regex", ".{1,200}"),
    ".{5000}": ("regex", ".{5000}"),
    ".{1,20000}": ("regex", ".{1,20000}"),
    "EBNF (\"a\"|\"b\"){1,5000}": ("ebnf", 'root ::= ("a" | "b"){1,5000}'),
}


def tokenizer_info(vocab: str) -> Any:
    import xgrammar as xgr

    if vocab == "demo":
        from radixserve.engine.demo import demo_model_path
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(demo_model_path()))
        return xgr.TokenizerInfo.from_huggingface(tok, vocab_size=151936)
    rng = random.Random(0)
    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:{}[]\"'"
    tokens = {chr(i) for i in range(32, 127)}
    while len(tokens) < 150000:
        tokens.add(rng.choice(("", " ")) + "".join(rng.choice(chars)
                                                   for _ in range(rng.randint(2, 9))))
    return xgr.TokenizerInfo(sorted(tokens), vocab_size=151936, stop_token_ids=[0])


def main(argv: list[str] | None = None) -> None:
    from radixserve.engine.constrained.workers import CompileError, CompileTimeout, CompileWorkers

    ap = argparse.ArgumentParser(prog="radixserve bench grammar", description=__doc__)
    ap.add_argument("--vocab", choices=("demo", "synthetic"), default="demo")
    ap.add_argument("--cap", type=float, default=120.0, help="seconds a case may compile")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    workers = CompileWorkers(tokenizer_info(a.vocab).serialize_json(), num_workers=1)
    workers.check("regex", "warm", a.cap)  # the worker's start is not a compile time
    rows = []
    for name in a.cases.split(",") if a.cases else CASES:
        kind, text = CASES[name]
        start = time.perf_counter()
        try:
            workers.check(kind, text, a.cap)
            result = f"{time.perf_counter() - start:.3f} s"
        except CompileTimeout:
            result = f"> {a.cap:g} s"
        except CompileError as e:
            result = f"error: {str(e)[-80:]}"
        rows.append({"case": name, "kind": kind, "bytes": len(text.encode()), "compile": result})
        print(json.dumps(rows[-1]), flush=True)
    workers.close()
    print_table(f"grammar compile times ({a.vocab} vocabulary)", rows)
    write_json(a.json, {"vocab": a.vocab, "cap_s": a.cap, "rows": rows})


if __name__ == "__main__":
    main()
