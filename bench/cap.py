"""`radixserve bench cap`: the learned prefill cap of steps that decode, on simulated steps.

`StepCost` (engine/scheduler/step_cost.py) learns what a step that decodes costs and caps the
prefill such a step takes at `mixed_step_ratio` decode steps. How that cap behaves under noisy
steps decides how long the steps that admit prompts are, and so the inter-token tail at load; a
GPU run shows one level's end. This drives the real `StepCost` with steps drawn from a model, so
the cap's whole course can be read without a device, in a second:

- each step, prompts arrive (Poisson, --arrivals a step; lengths uniform in --input-len);
- a step that decodes takes the prefill waiting up to the cap, or more where the capped steps
  after it could not clear it within --horizon steps (the scheduler's `mixed_horizon_steps`),
  never more than --max-prefill-tokens (the cap is shown within it too);
- it takes --decode-ms plus noise (exponential or gaussian of --noise-ms scale, the exponential
  shifted to a median of 0), plus --fixed-ms and --per-token-us a prefill token when it took
  prefill, and at least --host-floor-ms then (a host too slow for the launches of such a step).

Per seed it prints the cap's percentiles over the steps, the share of steps with prefill, every
step's time (what each running stream sees as its gap: p50, p99 and their ratio), the steps with
prefill alone, and how many steps a prompt waited from arrival to its last token prefilled.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import deque
from typing import Any

from radixserve.bench.common import print_table, write_json
from radixserve.bench.driver import percentile
from radixserve.engine.config import GRAPHED_MIXED_STEP_RATIO, EngineConfig
from radixserve.engine.scheduler.step_cost import StepCost

MS = 1e-3
ROWS = 256  # decode rows: StepCost only tells decode steps (rows > 0) from prefill-only ones


def _poisson(rng: random.Random, mean: float) -> int:
    threshold, k, p = math.exp(-mean), 0, rng.random()
    while p >= threshold:
        k, p = k + 1, p * rng.random()
    return k


def simulate(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    rng, cost = random.Random(seed), StepCost()
    pending: deque[list[int]] = deque()  # [tokens left, arrival step] per prompt, in order
    caps, steps, mixed, waits = [], [], [], []

    def noise() -> float:
        if args.noise == "gauss":
            return rng.gauss(0.0, args.noise_ms)
        return rng.expovariate(1 / args.noise_ms) - args.noise_ms * math.log(2)

    for step in range(args.steps):
        pending.extend([rng.randint(*args.input_len), step]
                       for _ in range(_poisson(rng, args.arrivals)))
        learned = cost.prefill_within(args.ratio)
        cap = None if learned is None else min(learned, args.max_prefill_tokens)
        waiting = sum(tokens for tokens, _ in pending)
        take = min(waiting, args.max_prefill_tokens if cap is None else
                   max(cap, waiting - (args.horizon - 1) * cap), args.max_prefill_tokens)
        left = take
        while pending and left >= pending[0][0]:
            tokens, arrived = pending.popleft()
            left -= tokens
            waits.append(step - arrived)
        if pending and left > 0:
            pending[0][0] -= left
        ms = max(0.05, args.decode_ms + noise())
        if take:
            ms = max(ms + args.fixed_ms + args.per_token_us * 1e-3 * take, args.host_floor_ms)
            mixed.append(ms)
        cost.observe(ROWS, take, ms * MS)
        steps.append(ms)
        if cap is not None:
            caps.append(cap)
    share = len(mixed) / len(steps)
    caps, mixed, waits = caps or [0.0], mixed or [0.0], waits or [0]  # nothing arrived
    p50, p99 = percentile(steps, 50), percentile(steps, 99)
    return {
        "seed": seed, "cap": {q: percentile(caps, v) for q, v in
                              (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
        "mixed_share": share, "step_ms": {"p50": p50, "p99": p99},
        "ratio": p99 / p50,
        "mixed_ms": {"p50": percentile(mixed, 50), "p99": percentile(mixed, 99)},
        "wait_steps": {"p50": percentile(waits, 50), "p99": percentile(waits, 99)},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="radixserve bench cap",
                                description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40_000)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--ratio", type=float, default=GRAPHED_MIXED_STEP_RATIO,
                   help="mixed_step_ratio")
    p.add_argument("--horizon", type=int, default=EngineConfig.mixed_horizon_steps,
                   help="mixed_horizon_steps")
    p.add_argument("--max-prefill-tokens", type=int, default=EngineConfig.max_prefill_tokens)
    p.add_argument("--arrivals", type=float, default=0.19, help="prompts arriving a step")
    p.add_argument("--input-len", type=int, nargs=2, default=[256, 512], metavar=("MIN", "MAX"))
    p.add_argument("--decode-ms", type=float, default=3.4, help="a decode step's median")
    p.add_argument("--noise", choices=("exp", "gauss"), default="exp")
    p.add_argument("--noise-ms", type=float, default=0.5,
                   help="scale of a step's noise (exp: its mean; gauss: its deviation)")
    p.add_argument("--fixed-ms", type=float, default=0.4, help="what any prefill adds to a step")
    p.add_argument("--per-token-us", type=float, default=2.0, help="what a prefill token adds")
    p.add_argument("--host-floor-ms", type=float, default=0.0,
                   help="the least a step with prefill takes (a host-bound launch)")
    p.add_argument("--json", dest="json_path", help="write the results here")
    args = p.parse_args(argv)
    if not 1 <= args.input_len[0] <= args.input_len[1]:
        p.error("need 1 <= MIN <= MAX for --input-len")
    if args.noise_ms <= 0 or args.steps < 1 or args.horizon < 1:
        p.error("need --noise-ms > 0, --steps >= 1 and --horizon >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = [simulate(args, seed) for seed in range(args.seeds)]
    print_table(f"the prefill cap at ratio {args.ratio} ({args.steps} steps a seed)", [{
        "seed": r["seed"],
        "cap p50 / p90 / p99 / max": " / ".join(f"{v:.0f}" for v in r["cap"].values()),
        "steps with prefill": f"{r['mixed_share']:.2f}",
        "step ms p50 / p99 (÷)":
            f"{r['step_ms']['p50']:.2f} / {r['step_ms']['p99']:.2f} ({r['ratio']:.2f})",
        "with prefill ms p50 / p99": f"{r['mixed_ms']['p50']:.2f} / {r['mixed_ms']['p99']:.2f}",
        "wait steps p50 / p99": f"{r['wait_steps']['p50']} / {r['wait_steps']['p99']}",
    } for r in results])
    write_json(args.json_path, {"args": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
