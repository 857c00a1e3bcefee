"""`radixserve bench long`: long prompts among short chats, chunked prefill on vs off.

--num-short short requests (--short-len ids, --short-out tokens) start together; while they decode,
--num-long long prompts (--long-len ids, --long-out tokens) arrive one every --long-every steps.
Without chunking a long prompt is prefilled in one step and every short request waits for it; with
chunking (--chunk tokens per step, or a list of sizes for the curve of short ITL against long TTFT)
decode steps keep going between chunks. Reported: inter-token latency of the short requests (p50 /
p99 / max), long TTFT, wall, and what the engine learned by the end of the run: its decode step,
the prefill cap of steps that decode (`mixed_step_ratio`; 0 where off) and the chunk of a long
prompt beside them (`long_prompt_slack`; 0 where its chunks fill the budget), with the least and
the most that chunk was over the run's steps once learned (a model that swings shows there).
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from radixserve.bench.common import device_name, print_table, write_json
from radixserve.bench.driver import (
    add_engine_argument,
    apply_engine_argument,
    build_core,
    drive,
    greedy_params,
    percentile,
    release,
)
from radixserve.bench.models import write_model_dir


def run_one(model_dir: Path, args: argparse.Namespace, chunk: int) -> dict[str, Any]:
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(10000) for _ in range(n)]
    shorts = [(ids(args.short_len), greedy_params(args.short_out)) for _ in range(args.num_short)]
    longs = [(ids(args.long_len), greedy_params(args.long_out)) for _ in range(args.num_long)]
    arrivals = [0] * len(shorts) + [args.long_every * (i + 1) for i in range(len(longs))]
    core = build_core(model_dir, max_prefill_tokens=chunk,
                      max_running_requests=args.num_short + args.num_long,
                      attention_backend=args.attention_backend)
    try:
        drive(core, shorts[:2], prefix="w")  # warm-up
        chunks: list[float] = []  # the long-prompt chunk after each step, once learned

        def sample() -> None:
            if (c := core.scheduler.long_prompt_chunk()) < core.scheduler.mixed_budget:
                chunks.append(c)

        run = drive(core, shorts + longs, arrivals, on_step=sample)
        short_ids = [f"r{i}" for i in range(len(shorts))]
        long_ids = [f"r{i}" for i in range(len(shorts), len(shorts) + len(longs))]
        itl = run.itl(short_ids)
        learned = core.stats()  # what the prefill cap (mixed_step_ratio) ended the run with
        return {"chunked": chunk < args.long_len, "max_prefill_tokens": chunk, "wall_s": run.wall_s,
                "short_itl_p50_ms": 1e3 * percentile(itl, 50),
                "short_itl_p99_ms": 1e3 * percentile(itl, 99), "short_itl_max_ms": 1e3 * max(itl),
                "long_ttft_mean_s": sum(run.ttft(long_ids)) / len(long_ids),
                "decode_step_ms": learned["decode_step_us"] / 1e3,
                "prefill_cap": learned["mixed_prefill_cap"],
                "long_chunk": learned["long_prompt_chunk"],
                "long_chunk_min": int(min(chunks, default=0)),
                "long_chunk_max": int(max(chunks, default=0))}
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
    ap.add_argument("--chunk", default="2048",
                    help="max_prefill_tokens with chunking on; several (e.g. 256,1024,4096) trace "
                         "short-request ITL against long-prompt TTFT")
    ap.add_argument("--attention-backend", default="auto")
    add_engine_argument(ap)
    ap.add_argument("--json")
    return ap


def main_args(long_len: int) -> argparse.Namespace:
    """The default workload with another long-prompt length (for the suite)."""
    args = build_parser().parse_args([])
    args.long_len = long_len
    return args


def main(argv: list[str] | None = None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)
    apply_engine_argument(ap, args)
    path = write_model_dir(args.model, args.root)
    rows = [run_one(path, args, int(chunk)) for chunk in args.chunk.split(",")]
    rows.append(run_one(path, args, args.long_len + args.short_len))
    print_table(f"long prompts among short ones: {args.model} on {device_name('auto')}", rows)
    write_json(args.json,
               {"bench": "long", "args": vars(args), "device": device_name("auto"), "rows": rows})


if __name__ == "__main__":
    main()
