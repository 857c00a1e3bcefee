"""`radixserve bench plane`: the CPU time of one decode step's conversions through the plane.

Every engine step crosses three processes as protobuf: the scheduler builds the step's message
(`scheduler/convert.py` `step_to_pb`) and sends it; the detokenizer reads it, detokenizes every
row and builds the gateways' message (`detokenizer/server.py` `_apply`); each gateway reads its
part (`gateway/convert.py` `outputs_from_pb`). Each of those runs on one core of its process, once
a step, so at a GPU's step rate their per-row costs decide whether the plane keeps up and how
late a step's tokens go out. This times the three parts in one process, over rows of one token
each (a step of running requests), with every request set up first, as at steady load.

The vocabulary matters: pass a real-size tokenizer (`radixserve bench tokenizer`) with
--tokenizer; the default is the demo model's, whose ids mostly decode to nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from radixserve.bench.common import print_table, write_json
from radixserve.engine.core import StepOutput
from radixserve.engine.sampling.params import SamplingParams
from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as detok_pb
from radixserve.services.detokenizer.server import _apply, hf_factory
from radixserve.services.detokenizer.state import DetokenizerState
from radixserve.services.gateway import convert as gateway_convert
from radixserve.services.scheduler import convert as scheduler_convert
from radixserve.services.scheduler.types import NewRequest, StepBatch


def measure(tokenizer: Any, rows: int, steps: int, prompt_len: int, seed: int = 0
            ) -> dict[str, float]:
    """Median ms a step of `rows` one-token rows spends in each part (each message serialized
    where it is sent and parsed where it arrives, as on the wire)."""
    rng = random.Random(seed)
    vocab = len(tokenizer)
    state = DetokenizerState(hf_factory(tokenizer))
    setups = [NewRequest(f"r{i}", [rng.randrange(vocab) for _ in range(prompt_len)],
                         SamplingParams(), passthrough=None) for i in range(rows)]
    first = scheduler_convert.step_to_pb(StepBatch([], setups, [])).SerializeToString()
    _apply(state, detok_pb.ProcessRequest.FromString(first), {""}, 0)
    times: dict[str, list[float]] = {"scheduler": [], "detokenizer": [], "gateways": []}
    for _ in range(steps):
        batch = StepBatch([], [], [StepOutput(f"r{i}", [rng.randrange(vocab)], None, None, None,
                                              prompt_len, 0) for i in range(rows)], 1)
        t0 = time.perf_counter()
        wire = scheduler_convert.step_to_pb(batch).SerializeToString()
        t1 = time.perf_counter()
        messages, _ = _apply(state, detok_pb.ProcessRequest.FromString(wire), {""}, 0)
        deltas = messages[""].SerializeToString()
        t2 = time.perf_counter()
        gateway_convert.outputs_from_pb(detok_pb.SubscribeResponse.FromString(deltas))
        t3 = time.perf_counter()
        for part, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
            times[part].append(seconds)
    return {part: statistics.median(values) * 1e3 for part, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="radixserve bench plane", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", help="tokenizer folder (default: the demo model's)")
    ap.add_argument("--rows", type=int, default=256, help="running requests: rows of a step")
    ap.add_argument("--steps", type=int, default=400, help="timed steps")
    ap.add_argument("--prompt-len", type=int, default=300, help="prompt ids of each request")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    if args.tokenizer is None:
        from radixserve.engine.demo import demo_model_path

        args.tokenizer = str(demo_model_path())
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    ms = measure(tokenizer, args.rows, args.steps, args.prompt_len)
    table = [{"part": part, "ms_per_step": value, "us_per_row": value * 1e3 / args.rows}
             for part, value in ms.items()]
    print_table(f"the plane's conversions of one step of {args.rows} rows, median of "
                f"{args.steps} (vocabulary {len(tokenizer):,})", table)
    write_json(args.json, {"benchmark": "plane", "rows": args.rows, "steps": args.steps,
                           "tokenizer": args.tokenizer, "ms_per_step": ms})
    return 0


if __name__ == "__main__":
    sys.exit(main())
