"""`radixserve bench suite`: the GPU figures of one model in one process, one engine at a time.

Parts (comma-separated --parts): latency (batch-1 decode, graphs and eager), offline (the offline
workload of docs/benchmarks.md, "Workloads", through EngineCore with token ids, overlap on),
no_overlap (the same, overlap off), offline_llm (the same through LLM.generate, which also
detokenizes every token), hf (transformers generate: batch-1 latency and a small batched run, with
the engine on that same small workload), prefix, long, constrained (the offline workload with every
other request under a tool-call JSON schema, against the same work unconstrained; see
`part_constrained`). Every result row is appended to --out as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from radixserve.bench import latency, long, prefix
from radixserve.bench.common import device_name, print_table
from radixserve.bench.driver import (
    ENGINE_OVERRIDES,
    add_engine_argument,
    apply_engine_argument,
    build_core,
    drive,
    median,
    percentile,
    release,
)
from radixserve.bench.models import write_model_dir
from radixserve.engine.sampling.params import SamplingParams

OFFLINE = dict(num=256, in_range=(100, 1024), out_range=(100, 1024), seed=0, temperature=0.6)


def offline_requests(vocab: int) -> list[tuple[list[int], SamplingParams]]:
    from radixserve.bench.offline import make_requests

    reqs = make_requests(OFFLINE["num"], OFFLINE["in_range"], OFFLINE["out_range"], vocab,
                         OFFLINE["seed"])
    return [(p, SamplingParams(temperature=OFFLINE["temperature"], max_new_tokens=m,
                               ignore_eos=True, seed=i))
            for i, (p, m) in enumerate(reqs)]


def part_offline(path: Path, a: argparse.Namespace, overlap: bool = True) -> list[dict[str, Any]]:
    core = build_core(path, max_running_requests=a.max_running, max_prefill_tokens=a.max_prefill,
                      overlap=overlap)
    try:
        reqs = offline_requests(core.model_info.vocab_size)
        drive(core, reqs[:4], prefix="w")
        run = drive(core, reqs)
        return [{"part": "offline", "overlap": overlap, "output_tokens": run.output_tokens,
                 "wall_s": run.wall_s,
                 "output_tok_s": run.output_tokens / run.wall_s, "num_pages": core.runner.num_pages,
                 "graph_mib": core.runner.graph_bytes / 2**20}]
    finally:
        release(core)


def part_offline_llm(path: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    from radixserve.bench.offline import make_requests, run_engine
    from radixserve.engine.llm import LLM

    llm = LLM(str(path), **{"load_format": "dummy", "max_running_requests": a.max_running,
                           "max_prefill_tokens": a.max_prefill, **ENGINE_OVERRIDES})
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
    core = build_core(path, max_running_requests=batch, num_pages=8192)
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


# What a tool-calling assistant emits: a call name from a fixed set, arguments with strings,
# enums and numbers. The random-weight model writes whatever the mask allows, so most calls end
# (the grammar completes) well before max_new_tokens.
TOOL_CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"enum": ["get_weather", "search_flights", "book_table", "convert_currency"]},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 32},
                "unit": {"enum": ["celsius", "fahrenheit", "kelvin"]},
                "guests": {"type": "integer", "minimum": 1, "maximum": 12},
                "budget": {"type": "number", "minimum": 0, "maximum": 10000},
                "flexible": {"type": "boolean"},
            },
            "required": ["city", "unit", "guests"],
            "additionalProperties": False,
        },
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def part_constrained(path: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """The offline workload (first --requests of it) on one engine, three times: plain; with every
    other request under TOOL_CALL_SCHEMA; and plain again with each request's max_new_tokens set
    to what the constrained run produced. Constrained outputs end when the call is complete, so
    the third run, not the first, is the same work without masks: `ratio` is constrained tok/s
    over it. Mask figures are the host time ModelRunner spent filling masks, per step that had a
    constrained row (p50, p99) and as a share of the constrained run's wall time."""
    core = build_core(path, max_running_requests=a.max_running, max_prefill_tokens=a.max_prefill)
    try:
        reqs = offline_requests(core.model_info.vocab_size)[:a.requests]

        def fresh(run: int, work: list[tuple[list[int], Any]]) -> list[tuple[list[int], Any]]:
            # A first token of the run's own (ids below 10,000 are the workload's) keeps every run
            # from finding an earlier run's prompts in the prefix cache.
            return [([10000 + run] + p[1:], sp) for p, sp in work]

        schema = json.dumps(TOOL_CALL_SCHEMA)
        mixed = [(p, replace(sp, json_schema=schema) if i % 2 else sp)
                 for i, (p, sp) in enumerate(reqs)]
        compile_start = time.perf_counter()
        core.compile_grammar(mixed[1][1])  # the worker's start and both compiles, then cached
        compile_s = time.perf_counter() - compile_start
        drive(core, fresh(0, reqs[:4]), prefix="w")
        drive(core, fresh(1, mixed[:4]), prefix="wc")
        plain = drive(core, fresh(2, reqs), prefix="p")
        runner, masks = core.runner, []
        last = [runner.grammar_mask_s, runner.grammar_mask_steps]

        def record() -> None:  # the mask time of the step each engine step launched
            if runner.grammar_mask_steps != last[1]:
                masks.append(runner.grammar_mask_s - last[0])
            last[:] = [runner.grammar_mask_s, runner.grammar_mask_steps]

        constrained = drive(core, fresh(3, mixed), prefix="c", on_step=record)
        lengths = [len(constrained.token_times[f"c{i}"]) for i in range(len(mixed))]
        matched = drive(core, fresh(4, [(p, replace(sp, max_new_tokens=n))
                                        for (p, sp), n in zip(reqs, lengths)]), prefix="m")
        tok_s = {name: run.output_tokens / run.wall_s
                 for name, run in (("plain", plain), ("constrained", constrained),
                                   ("matched", matched))}
        calls = lengths[1::2]
        return [{"part": "constrained", "requests": len(reqs), "constrained_requests": len(calls),
                 "plain_tok_s": tok_s["plain"], "constrained_tok_s": tok_s["constrained"],
                 "matched_tok_s": tok_s["matched"],
                 "ratio": tok_s["constrained"] / tok_s["matched"],
                 "ratio_vs_plain": tok_s["constrained"] / tok_s["plain"],
                 "call_tokens_mean": sum(calls) / len(calls),
                 "calls_complete": sum(n < sp.max_new_tokens for n, (_, sp) in
                                       zip(calls, mixed[1::2])),
                 "mask_steps": len(masks), "mask_ms_p50": 1e3 * median(masks),
                 "mask_ms_p99": 1e3 * percentile(masks, 99),
                 "mask_share": sum(masks) / constrained.wall_s, "compile_s": compile_s}]
    finally:
        release(core)


PARTS: dict[str, Callable[[Path, argparse.Namespace], list[dict[str, Any]]]] = {
    "latency": lambda p, a: [{"part": "latency",
                              **latency.engine_latency(p, 1, 128, 256, num_pages=4096)},
                             {"part": "latency",
                              **latency.engine_latency(p, 1, 128, 48, num_pages=4096,
                                                                          cuda_graph=False)}],
    "offline": part_offline,
    "no_overlap": lambda p, a: part_offline(p, a, overlap=False),
    "offline_llm": part_offline_llm,
    "hf": part_hf,
    "prefix": lambda p, a: [{"part": "prefix",
                             **prefix.run_one(p, prefix.make_requests(a.prefix_groups, 16, 2048,
                                                                      128, 256),
                                              cache, max_running_requests=a.max_running,
                                              max_prefill_tokens=a.max_prefill)}
                            for cache in ("radix", "naive")],
    "constrained": part_constrained,
    "long": lambda p, a: [{"part": "long", **long.run_one(p, long.main_args(a.long_len), chunk)}
                          for chunk in (2048, a.long_len + 128)],
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench suite", description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--root", default="/tmp/radixserve-bench-models")
    ap.add_argument("--parts", default="latency,offline,no_overlap")
    ap.add_argument("--tokenizer", default=None,
                    help="a tokenizer folder to give the model instead of the demo tokenizer "
                         "(`radixserve bench tokenizer` builds a real-size one)")
    ap.add_argument("--max-running", type=int, default=256)
    ap.add_argument("--max-prefill", type=int, default=8192)
    ap.add_argument("--prefix-groups", type=int, default=64)
    ap.add_argument("--long-len", type=int, default=16384)
    ap.add_argument("--requests", type=int, default=OFFLINE["num"],
                    help="requests of the offline workload the constrained part runs")
    ap.add_argument("--out", default="suite.jsonl")
    add_engine_argument(ap)
    a = ap.parse_args(argv)
    apply_engine_argument(ap, a)
    path = write_model_dir(a.model, a.root, a.tokenizer)
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
                   "part_s": round(time.perf_counter() - start, 1), **ENGINE_OVERRIDES, **row}
            rows.append(row)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    print_table(f"suite: {a.model}",
                [{k: v for k, v in r.items() if k not in ("device", "date", "model")}
                 for r in rows])


if __name__ == "__main__":
    main()
