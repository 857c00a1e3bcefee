"""`radixserve bench pressure`: admission policies under a constrained KV pool.

Runs the same random requests through "reserve" and "optimistic" admission with `--num-pages` far
below what the requests could use, and reports concurrency (running requests per step), retractions
and output throughput. Outputs are compared: the policies must produce the same tokens.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from radixserve.bench.common import device_name, print_table, write_json
from radixserve.bench.offline import make_requests
from radixserve.engine.llm import LLM, resolve_model_path
from radixserve.engine.models.config import ModelArgs
from radixserve.engine.sampling.params import SamplingParams


def run_policy(path: str, admission: str, requests: list[tuple[list[int], int]],
               args: argparse.Namespace
               ) -> tuple[dict[str, Any], list[list[int]]]:
    llm = LLM(path, device=args.device, num_pages=args.num_pages, page_size=args.page_size,
              admission=admission)
    core = llm.core
    core.add_request("warm-up", requests[0][0][:8], SamplingParams(max_new_tokens=2))
    while core.has_work():
        core.step()
    base_retractions = core.stats()["retractions_total"]
    for i, (prompt, max_new) in enumerate(requests):
        core.add_request(f"r{i}", prompt, SamplingParams(temperature=args.temperature, seed=i,
                                                         max_new_tokens=max_new, ignore_eos=True))
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(requests))}
    running: list[int] = []
    start = time.perf_counter()
    while core.has_work():
        for out in core.step():
            outputs[out.rid].extend(out.token_ids)
        running.append(len(core.scheduler.running))
    seconds = time.perf_counter() - start
    tokens = sum(len(v) for v in outputs.values())
    row = {"admission": admission, "num_pages": core.runner.num_pages, "steps": len(running),
           "mean_running": sum(running) / len(running), "peak_running": max(running),
           "retractions": core.stats()["retractions_total"] - base_retractions,
           "output_tokens": tokens, "seconds": seconds, "output_tok_s": tokens / seconds}
    return row, [outputs[f"r{i}"] for i in range(len(requests))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench pressure",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--input-len", type=int, nargs=2, default=(16, 96))
    ap.add_argument("--output-len", type=int, nargs=2, default=(16, 128))
    ap.add_argument("--num-pages", type=int, default=96,
                    help="KV pool size in pages (kept small on purpose)")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    path = resolve_model_path(args.model)
    vocab = ModelArgs.from_folder(Path(path)).vocab_size
    requests = make_requests(args.requests, tuple(args.input_len), tuple(args.output_len), vocab,
                             args.seed)
    demand = sum(-(-(len(p) + m) // args.page_size) for p, m in requests)
    rows, outs = [], []
    for admission in ("reserve", "optimistic"):
        row, out = run_policy(path, admission, requests, args)
        rows.append(row)
        outs.append(out)
    assert outs[0] == outs[1], "admission policies produced different tokens"
    print_table(f"KV pressure: {args.requests} requests needing {demand} pages in a pool of "
                f"{args.num_pages}, "
                f"page size {args.page_size}, {device_name(args.device)}", rows)
    write_json(args.json, {"args": vars(args), "demand_pages": demand, "results": rows})


if __name__ == "__main__":
    main()
