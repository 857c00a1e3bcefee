"""`radixserve bench prefix`: shared system prompts, radix cache on vs off (docs/benchmarks.md,
"Workloads").

--groups groups of --group-size prompts; each prompt is its group's shared prefix (--prefix-len
random ids) plus its own question (--question-len ids), and decodes --output-len tokens (greedy,
ignore_eos). Requests are submitted all at once, round-robin over the groups; the engine admits as
many as fit. Reported: wall time, output and prompt throughput, the share of prompt tokens served
from the cache, mean TTFT.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from radixserve.bench.common import device_name, print_table, write_json
from radixserve.bench.driver import build_core, drive, greedy_params, median, release
from radixserve.bench.models import write_model_dir
from radixserve.engine.sampling.params import SamplingParams


def make_requests(groups: int, group_size: int, prefix_len: int, question_len: int, output_len: int,
                  seed: int = 0) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(10000) for _ in range(n)]
    shared = [ids(prefix_len) for _ in range(groups)]
    # Round-robin over groups, as users of many system prompts arrive: a group's later prompts come
    # after its first ones have run (the cache inserts a request's pages when it finishes).
    return [(shared[g] + ids(question_len), greedy_params(output_len)) for _ in range(group_size)
            for g in range(groups)]


def run_one(model_dir: Path, requests: list[tuple[list[int], SamplingParams]], cache: str,
            **config: Any) -> dict[str, Any]:
    core = build_core(model_dir, cache=cache, **config)
    try:
        drive(core, requests[:2], prefix="w")  # warm-up (its prefix is not reused: other ids)
        core.allocator.free(core.cache.evict(core.runner.num_pages))  # start cold
        run = drive(core, requests)
        prompt = sum(len(p) for p, _ in requests)
        return {"cache": cache, "requests": len(requests), "wall_s": run.wall_s,
                "output_tok_s": run.output_tokens / run.wall_s, "prompt_tok_s": prompt / run.wall_s,
                "cached_share": run.cached_tokens / max(1, run.prompt_tokens),
                "mean_ttft_s": sum(run.ttft()) / len(requests),
                "median_itl_ms": 1e3 * median(run.itl())}
    finally:
        release(core)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench prefix", description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b",
                    help="a name from bench/models.py (random weights)")
    ap.add_argument("--root", default="/tmp/radixserve-bench-models")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--prefix-len", type=int, default=2048)
    ap.add_argument("--question-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--max-running-requests", type=int, default=256)
    ap.add_argument("--max-prefill-tokens", type=int, default=8192)
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    path = write_model_dir(args.model, args.root)
    requests = make_requests(args.groups, args.group_size, args.prefix_len, args.question_len,
                             args.output_len)
    config = dict(max_running_requests=args.max_running_requests,
                  max_prefill_tokens=args.max_prefill_tokens,
                  attention_backend=args.attention_backend)
    rows = [run_one(path, requests, cache, **config) for cache in ("radix", "naive")]
    rows[0]["speedup"] = rows[1]["wall_s"] / rows[0]["wall_s"]
    print_table(f"shared prefixes: {args.model} on {device_name('auto')}", rows)
    write_json(args.json,
               {"bench": "prefix", "args": vars(args), "device": device_name("auto"), "rows": rows})


if __name__ == "__main__":
    main()
