"""`radixserve bench latency`: decode time per token at a small batch (batch 1 by default).

One request of --prompt-len random ids decodes --new-tokens greedy tokens; the figure is the median
gap between consecutive tokens after a short warm-up, i.e. one decode step end to end (host,
launches or graph replay, sampling, the copy back). `--hf` times transformers `generate` on the
same architecture (random weights, bf16) the same way: (t(N+1 tokens) - t(1 token)) / N.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

import torch
from radixserve.bench.common import device_name, print_table, write_json
from radixserve.bench.driver import (
    add_engine_argument,
    apply_engine_argument,
    build_core,
    drive,
    greedy_params,
    median,
    release,
)
from radixserve.bench.models import write_model_dir

WARMUP_TOKENS = 8


def engine_latency(model_dir: Path, batch: int, prompt_len: int, new_tokens: int,
                   **config: Any) -> dict[str, Any]:
    core = build_core(model_dir, max_running_requests=max(batch, 8), **config)
    try:
        rng = random.Random(0)
        vocab = core.model_info.vocab_size
        make = lambda n: [([rng.randrange(min(vocab, 10000)) for _ in range(prompt_len)],
                           greedy_params(n))
                          for _ in range(batch)]
        drive(core, make(WARMUP_TOKENS * 2), prefix="w")  # warm-up: first steps, allocator, plans
        run = drive(core, make(new_tokens))
        gaps = run.itl([rid for rid in run.token_times])
        steady = [g for rid in run.token_times for g in run.itl([rid])[WARMUP_TOKENS:]]
        return {"system": "radixserve", "batch": batch, "graphs": core.runner.graphs is not None,
                "overlap": core.config.overlap, "ms_per_token": 1e3 * median(steady or gaps),
                "backend": type(core.runner.backend).__name__}
    finally:
        release(core)


@torch.inference_mode()
def hf_latency(model_dir: Path, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(0, 10000, (1, prompt_len), device="cuda")

    def timed(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    timed(4)  # warm-up
    one, many = timed(1), timed(new_tokens + 1)
    return {"system": "transformers.generate", "batch": 1, "graphs": False, "overlap": False,
            "ms_per_token": 1e3 * (many - one) / new_tokens, "backend": "sdpa"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench latency", description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b",
                    help="a name from bench/models.py (random weights)")
    ap.add_argument("--root", default="/tmp/radixserve-bench-models")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument("--also-eager", action="store_true", help="also time without CUDA graphs")
    ap.add_argument("--hf", action="store_true", help="also time transformers generate")
    ap.add_argument("--json")
    add_engine_argument(ap)  # e.g. --engine tp_size=2
    args = ap.parse_args(argv)
    apply_engine_argument(ap, args)
    path = write_model_dir(args.model, args.root)
    common = dict(attention_backend=args.attention_backend, num_pages=4096, max_prefill_tokens=2048)
    rows = [engine_latency(path, args.batch, args.prompt_len, args.new_tokens,
                           cuda_graph=not args.no_cuda_graph, **common)]
    if args.also_eager and not args.no_cuda_graph:
        rows.append(engine_latency(path, args.batch, args.prompt_len, min(args.new_tokens, 64),
                                   cuda_graph=False, **common))
    if args.hf:
        rows.append(hf_latency(path, args.prompt_len, 32))
    print_table(f"decode latency: {args.model} on {device_name('auto')}", rows)
    write_json(args.json,
               {"bench": "latency", "args": vars(args), "device": device_name("auto"),
                "rows": rows})


if __name__ == "__main__":
    main()
