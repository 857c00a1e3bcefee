"""`radixserve bench offline`: throughput of the offline engine on random requests
(docs/benchmarks.md, "Workloads").

Defaults are the nano-vllm / mini-sglang workload: 256 requests, input and output lengths uniform in
[100, 1024], token ids < 10000, seed 0, temperature 0.6, ignore_eos. `--hf-requests N` runs the
first N of the same requests through `transformers.generate` one at a time, as a user without an
engine would, and reports the ratio.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch
from radixserve.bench.common import device_name, print_table, write_json
from radixserve.engine.llm import LLM, resolve_model_path
from radixserve.engine.sampling.params import SamplingParams


def make_requests(n: int, in_range: tuple[int, int], out_range: tuple[int, int], vocab: int,
                  seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    top = min(10000, vocab)
    return [([rng.randrange(top) for _ in range(rng.randint(*in_range))], rng.randint(*out_range))
            for _ in range(n)]


def run_engine(llm: LLM, requests: list[tuple[list[int], int]],
               temperature: float) -> dict[str, Any]:
    params = [SamplingParams(temperature=temperature, max_new_tokens=m, ignore_eos=True, seed=i)
              for i, (_, m) in enumerate(requests)]
    llm.generate([requests[0][0][:16]], SamplingParams(max_new_tokens=4))  # warm-up
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in requests], params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outs)
    assert tokens == sum(m for _, m in requests), (
        "ignore_eos requests must produce exactly max_new_tokens")
    return {"requests": len(requests), "output_tokens": tokens, "seconds": seconds,
            "output_tok_s": tokens / seconds}


def run_transformers(path: str, requests: list[tuple[list[int], int]], device: str,
                     dtype: torch.dtype, temperature: float) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    tokens, start = 0, time.perf_counter()
    for prompt, max_new in requests:
        ids = torch.tensor([prompt], device=device)
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_new, min_new_tokens=max_new,
                                 do_sample=True, temperature=temperature, top_k=0, pad_token_id=0)
        tokens += out.shape[1] - len(prompt)
    seconds = time.perf_counter() - start
    return {"requests": len(requests), "output_tokens": tokens, "seconds": seconds,
            "output_tok_s": tokens / seconds}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench offline", description=__doc__)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    ap.add_argument("--output-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--hf-requests", type=int, default=0,
                    help="also run the first N through transformers")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-running-requests", type=int, default=256)
    ap.add_argument("--max-prefill-tokens", type=int, default=8192)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--no-overlap", action="store_true")
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)

    path = resolve_model_path(args.model)
    llm = LLM(path, device=args.device, dtype=args.dtype,
              max_running_requests=args.max_running_requests,
              max_prefill_tokens=args.max_prefill_tokens, page_size=args.page_size,
              attention_backend=args.attention_backend, overlap=not args.no_overlap,
              cuda_graph=not args.no_cuda_graph)
    requests = make_requests(args.num_requests, tuple(args.input_len), tuple(args.output_len),
                             llm.core.model_info.vocab_size, args.seed)
    rows = [{"system": "radixserve", **run_engine(llm, requests, args.temperature)}]
    if args.hf_requests:
        device = str(llm.core.runner.device)
        hf = run_transformers(path, requests[: args.hf_requests], device, llm.core.runner.dtype,
                              args.temperature)
        rows.append({"system": "transformers.generate (one by one)", **hf})
        rows[0]["vs_transformers"] = rows[0]["output_tok_s"] / hf["output_tok_s"]
    title = (f"offline throughput: {args.model} on {device_name(args.device)} "
             f"({llm.core.model_info.dtype})")
    print_table(title, rows)
    write_json(args.json,
               {"bench": "offline", "args": vars(args), "device": device_name(args.device),
                "rows": rows})


if __name__ == "__main__":
    main()
