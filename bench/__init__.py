"""Benchmarks (`radixserve bench NAME`): scripts that print tables, not tests.

One module per benchmark, named as the command names it; each has `main(argv) -> exit status`
(None reads as 0). BENCHMARKS is the only list of names: `radixserve bench` resolves NAME there
and nowhere else. Shared helpers: common (device name, tables, JSON lines), driver (an EngineCore
driven step by step), models (config.json of public models), process (the stack a service
benchmark drives, percentiles, RSS and open files of the services), workloads (serving's request
lists), server_info (GetServerInfo during a serving level: cache totals, per-replica load).

Imports point one way: a benchmark may use engine, services and clients; nothing there imports
this package (the CLI only dispatches to it).
"""

from __future__ import annotations

import importlib
import sys

# name -> what it measures. Engine benchmarks run in this process; service benchmarks drive a
# gateway (--target, or --launch to start `radixserve serve`).
BENCHMARKS = {
    "offline": "offline engine throughput on random requests (optionally against transformers)",
    "latency": "decode time per token at a small batch",
    "prefix": "shared system prompts, radix cache on vs off",
    "long": "long prompts among short chats, chunked prefill on vs off",
    "pressure": "admission policies under a constrained KV pool",
    "profile": "where a step's time goes, host phase by phase",
    "kernels": "GPU kernel micro-benchmarks and ceilings",
    "resources": "registers, local and shared memory of the Triton kernels, compiled without a GPU",
    "cap": "the learned prefill cap of steps that decode, on simulated noisy steps",
    "copies": "host time of a decode step's small copies: torch's host allocator or own buffers",
    "control": "tensor-parallel control plane per step: plan build, send, receive (CPU)",
    "cores": "which CPUs slow Python work on one CPU when busy (hidden SMT siblings, host load)",
    "suite": "the GPU figures of one model in one process",
    "grammar": "structured-output compile times of pathological constraints",
    "tokenizer": "a real-size tokenizer for the benchmark models, from a tiktoken BPE file",
    "routing": "cost of the gateway's replica pick (cache-aware prefix trees) per request",
    "plane": "CPU time of one step's conversions: scheduler message, detokenizer, gateways",
    "stacks": "where a sampled process's threads spent their time (py-spy raw stacks)",
    "serving": "TTFT, TPOT, ITL, E2E and throughput through the gateway",
    "overload": "refusals and admitted streams at 3x the saturating arrival rate",
    "abort": "client cancel -> request freed by the scheduler, at N running",
    "soak": "many streaming clients for a bounded time, then the leak checks",
    "fuzz": "mutated Generate requests through the gateway, then liveness checks",
}


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    return "\n".join(f"  {name:<{width}}  {what}" for name, what in BENCHMARKS.items())


def run(name: str | None, argv: list[str]) -> int:
    """Run benchmark `name` with `argv` (its own flags; `--help` shows them). Without a known name,
    print the available ones: exit status 0 when asked for (--help), else 2."""
    if name in BENCHMARKS:
        return int(importlib.import_module(f"{__name__}.{name}").main(argv) or 0)
    asked = name in ("-h", "--help")
    out = sys.stdout if asked else sys.stderr
    if name is not None and not asked:
        print(f"radixserve bench: no benchmark named {name!r}", file=out)
    print(f"usage: radixserve bench NAME [flags]   (flags: radixserve bench NAME --help)\n\n"
          f"benchmarks:\n{listing()}", file=out)
    return 0 if asked else 2
