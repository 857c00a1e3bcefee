"""`radixserve bench long`: long prompts among short chats, chunked prefill on vs off.

--num-short short requests (--short-len ids, --short-out tokens) start together; while they
decode, --num-long long prompts (--long-len ids, --long-out tokens) arrive one every
--long-every steps. Without chunking a long prompt is prefilled in one step and every short
request waits for it; with chunking (--chunk tokens per step) decode steps keep going between
chunks. Reported: inter-token latency of the short requests (p50 / p99 / max), long TTFT, wall.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from radixserve.bench.common import device_name, print_table, write_json
from radixserve.bench.driver import build_core, drive, greedy_params, percentile, release
from radixserve.bench.models import write_model_dir


def run_one(model_dir: Path, args: argparse.Namespace, chunk: int) -> dict[str, Any]:
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(10000) for _ in range(n)]
    shorts = [(ids(args.short_len), greedy_params(args.short_out)) for _ in range(args.num_short)]
    longs = [(ids(args.long_len), greedy_params(args.long_out)) for _ in range(args.num_long)]
    arrivals = [0] * len(shorts) + [args.long_every * (i + 1) for i in range(len(longs))]
    core = build_core(model_dir, max_prefill_tokens=chunk,
                      max_running_requests=args.num_short + args.num_long,
                      attention_backend=args.attention_backend, page_size=args.page_size)
    try:
        drive(core, shorts[:2], prefix="w")  # warm-up
        run = drive(core, shorts + longs, arrivals)
        short_ids = [f"r{i}" for i in range(len(shorts))]
        long_ids = [f"r{i}" for i in range(len(shorts), len(shorts) + len(longs))]
        itl = run.itl(short_ids)
        return {"chunked": chunk < args.long_len, "max_prefill_tokens": chunk, "wall_s": run.wall_s,
                "short_itl_p50_ms": 1e3 * percentile(itl, 50),
                "short_itl_p99_ms": 1e3 * percentile(itl, 99), "short_itl_max_ms": 1e3 * max(itl),
                "long_ttft_mean_s": sum(run.ttft(long_ids)) / len(long_ids)}
    finally:
        release(core)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="radixserve bench long", description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b",
                    help="a name from bench/models.py (random weights)")
    ap.add_argument("--root", default="/tmp/radixserve-bench-models")
    ap.add_argument("--num-short", type=int, default=32)
    ap.add_argument("--short-len", type=int, default=128)
    ap.add_argument("--short-out", type=int, default=256)
    ap.add_argument("--num-long", type=int, default=8)
    ap.add_argument("--long-len", type=int, default=16384)
    ap.add_argument("--long-out", type=int, default=16)
    ap.add_argument("--long-every", type=int, default=24, help="steps between long arrivals")
    ap.add_argument("--chunk", type=int, default=2048, help="max_prefill_tokens with chunking on")
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--json")
    return ap


def main_args(long_len: int, engine: argparse.Namespace | None = None) -> argparse.Namespace:
    """The default workload with another long-prompt length (for the suite), on the attention
    backend and page size of `engine` where given."""
    args = build_parser().parse_args([])
    args.long_len = long_len
    if engine is not None:
        args.attention_backend, args.page_size = engine.attention_backend, engine.page_size
    return args


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    path = write_model_dir(args.model, args.root)
    rows = [run_one(path, args, args.chunk), run_one(path, args, args.long_len + args.short_len)]
    print_table(f"long prompts among short ones: {args.model} on {device_name('auto')}", rows)
    write_json(args.json,
               {"bench": "long", "args": vars(args), "device": device_name("auto"), "rows": rows})


if __name__ == "__main__":
    main()
