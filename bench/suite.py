"""`radixserve bench suite`: the GPU figures of one model in one process, one engine at a time.

Parts (comma-separated --parts): latency (batch-1 decode, graphs and eager), offline (the offline
workload of docs/benchmarks.md, "Workloads", through EngineCore with token ids, overlap on),
no_overlap (the same, overlap off), offline_llm (the same through LLM.generate, which also
detokenizes every token), hf (transformers generate: batch-1 latency and a small batched run, with
the engine on that same small workload), prefix, long. --attention-backend and --page-size go to
every engine the parts build. Every result row is appended to --out as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch
from radixserve.bench import latency, long, prefix
from radixserve.bench.common import device_name, print_table
from radixserve.bench.driver import build_core, drive, release
from radixserve.bench.models import write_model_dir
from radixserve.engine.sampling.params import SamplingParams

OFFLINE = dict(num=256, in_range=(100, 1024), out_range=(100, 1024), seed=0, temperature=0.6)


def engine_flags(a: argparse.Namespace, kv_tokens: int | None = None) -> dict[str, Any]:
    """The engine settings every part shares; `kv_tokens` sizes a fixed pool in tokens."""
    flags: dict[str, Any] = {"attention_backend": a.attention_backend, "page_size": a.page_size}
    if kv_tokens is not None:
        flags["num_pages"] = max(2, kv_tokens // a.page_size)
    return flags


def offline_requests(vocab: int) -> list[tuple[list[int], SamplingParams]]:
    from radixserve.bench.offline import make_requests

    reqs = make_requests(OFFLINE["num"], OFFLINE["in_range"], OFFLINE["out_range"], vocab,
                         OFFLINE["seed"])
    return [(p, SamplingParams(temperature=OFFLINE["temperature"], max_new_tokens=m,
                               ignore_eos=True, seed=i))
            for i, (p, m) in enumerate(reqs)]


def part_offline(path: Path, a: argparse.Namespace, overlap: bool = True) -> list[dict[str, Any]]:
    core = build_core(path, max_running_requests=a.max_running, max_prefill_tokens=a.max_prefill,
                      overlap=overlap, **engine_flags(a))
    try:
        reqs = offline_requests(core.model_info.vocab_size)
        drive(core, reqs[:4], prefix="w")
        run = drive(core, reqs)
        return [{"part": "offline", "backend": core.runner.backend.name, "overlap": overlap,
                 "graphs": core.runner.graphs is not None, "output_tokens": run.output_tokens,
                 "wall_s": run.wall_s,
                 "output_tok_s": run.output_tokens / run.wall_s, "num_pages": core.runner.num_pages,
                 "graph_mib": core.runner.graph_bytes / 2**20}]
    finally:
        release(core)


def part_offline_llm(path: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    from radixserve.bench.offline import make_requests, run_engine
    from radixserve.engine.llm import LLM

    llm = LLM(str(path), load_format="dummy", max_running_requests=a.max_running,
              max_prefill_tokens=a.max_prefill, **engine_flags(a))
    try:
        reqs = make_requests(OFFLINE["num"], OFFLINE["in_range"], OFFLINE["out_range"], 10000,
                             OFFLINE["seed"])
        return [{"part": "offline_llm", **run_engine(llm, reqs, OFFLINE["temperature"])}]
    finally:
        release(llm.core)


def part_hf(path: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    rows = [{"part": "hf_latency", **latency.hf_latency(path, 128, 32)}]
    batch, new = 16, 128  # small batched workload, same for both systems
    prompts = torch.randint(0, 10000, (batch, 256))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path),
                                             dtype=torch.bfloat16).cuda().eval()
    with torch.inference_mode():
        model.generate(prompts[:1, :16].cuda(), max_new_tokens=4, pad_token_id=0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(prompts.cuda(), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                       pad_token_id=0)
        torch.cuda.synchronize()
        hf_s = time.perf_counter() - t
    del model
    release(None)
    core = build_core(path, max_running_requests=batch, **engine_flags(a, kv_tokens=131072))
    try:
        reqs = [(p.tolist(), SamplingParams(temperature=0, max_new_tokens=new, ignore_eos=True))
                for p in prompts]
        drive(core, reqs[:2], prefix="w")
        run = drive(core, reqs)
    finally:
        release(core)
    rows.append({"part": "hf_batched", "batch": batch, "new_tokens": new,
                 "hf_tok_s": batch * new / hf_s,
                 "engine_tok_s": run.output_tokens / run.wall_s, "ratio": hf_s / run.wall_s})
    return rows


PARTS: dict[str, Callable[[Path, argparse.Namespace], list[dict[str, Any]]]] = {
    "latency": lambda p, a: [{"part": "latency",
                              **latency.engine_latency(p, 1, 128, 256,
                                                       **engine_flags(a, kv_tokens=65536))},
                             {"part": "latency",
                              **latency.engine_latency(p, 1, 128, 48, cuda_graph=False,
                                                       **engine_flags(a, kv_tokens=65536))}],
    "offline": part_offline,
    "no_overlap": lambda p, a: part_offline(p, a, overlap=False),
    "offline_llm": part_offline_llm,
    "hf": part_hf,
    "prefix": lambda p, a: [{"part": "prefix",
                             **prefix.run_one(p, prefix.make_requests(a.prefix_groups, 16, 2048,
                                                                      128, 256),
                                              cache, max_running_requests=a.max_running,
                                              max_prefill_tokens=a.max_prefill,
                                              **engine_flags(a))}
                            for cache in ("radix", "naive")],
    "long": lambda p, a: [{"part": "long", **long.run_one(p, long.main_args(a.long_len, a), chunk)}
                          for chunk in (2048, a.long_len + 128)],
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench suite", description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--root", default="/tmp/radixserve-bench-models")
    ap.add_argument("--parts", default="latency,offline,no_overlap")
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--max-prefill", type=int, default=8192)
    ap.add_argument("--prefix-groups", type=int, default=64)
    ap.add_argument("--long-len", type=int, default=16384)
    ap.add_argument("--attention-backend", default="auto", help="as `radixserve serve` takes it")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--out", default="suite.jsonl")
    a = ap.parse_args(argv)
    path = write_model_dir(a.model, a.root)
    rows: list[dict[str, Any]] = []
    for name in a.parts.split(","):
        start = time.perf_counter()
        try:
            got = PARTS[name](path, a)
        except Exception as e:  # one failing part must not cost the others their device time
            traceback.print_exc()
            got = [{"part": name, "error": f"{type(e).__name__}: {e}"[:300]}]
        release(None)  # the part's engines are unreachable now: collect them before the next
        for row in got:
            row = {"model": a.model, "device": device_name("auto"),
                   "date": time.strftime("%Y-%m-%d %H:%M"),
                   "attention_backend": a.attention_backend, "page_size": a.page_size,
                   "part_s": round(time.perf_counter() - start, 1), **row}
            rows.append(row)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    print_table(f"suite: {a.model}",
                [{k: v for k, v in r.items() if k not in ("device", "date", "model")}
                 for r in rows])


if __name__ == "__main__":
    main()
