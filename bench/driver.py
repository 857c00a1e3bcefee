"""Drive an EngineCore directly with token ids (no tokenizer in the loop) and time every token.

Arrival times are host clock readings when a step hands a token back; with overlap on, that is
one step after the device made it, the same delay a client would see.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from radixserve.engine.config import EngineConfig
from radixserve.engine.core import EngineCore
from radixserve.engine.sampling.params import SamplingParams

# Engine fields set on a benchmark's command line (`--engine KEY=VALUE`): every engine it builds
# takes them, over what its parts choose (e.g. the offline workload without piecewise graphs).
ENGINE_OVERRIDES: dict[str, Any] = {}


def parse_engine_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """["piecewise_graph_max_tokens=0", "attention_backend=fa"] -> typed EngineConfig fields
    (none, true/false, int, float, else the string). Unknown fields raise ValueError."""
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in known:
            raise ValueError(f"--engine takes FIELD=VALUE with an EngineConfig field, not {pair!r}")
        value: Any = text
        if text.lower() in ("none", "true", "false"):
            value = {"none": None, "true": True, "false": False}[text.lower()]
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    continue
        out[key] = value
    return out


def add_engine_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--engine", action="append", default=[], metavar="FIELD=VALUE",
                    help="an EngineConfig field for every engine built, e.g. "
                         "piecewise_graph_max_tokens=0 (repeatable)")


def apply_engine_argument(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:  # this invocation's own: none left from an earlier one in the process
        ENGINE_OVERRIDES.clear()
        ENGINE_OVERRIDES.update(parse_engine_overrides(args.engine))
    except ValueError as e:
        ap.error(str(e))


def build_core(model_dir: str | Path, **config: Any) -> EngineCore:
    """An engine on random weights for the folder's config.json (no checkpoint needed)."""
    config = {"load_format": "dummy", **config, **ENGINE_OVERRIDES}
    return EngineCore(EngineConfig(model_path=str(model_dir), **config))


def release(core: EngineCore | None) -> None:
    """Drop an engine and give its device memory back before the next one is built."""
    if core is not None:  # a TP engine's workers and group go now, not whenever gc finds them
        core.close()
    del core
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


@dataclass
class Run:
    wall_s: float
    submitted: dict[str, float] = field(default_factory=dict)
    token_times: dict[str, list[float]] = field(default_factory=dict)
    cached_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for t in self.token_times.values())

    def itl(self, rids: Sequence[str] | None = None) -> list[float]:
        """Inter-token latencies (s) of the given requests (all by default)."""
        out: list[float] = []
        for rid in rids if rids is not None else list(self.token_times):
            t = self.token_times[rid]
            out += [b - a for a, b in zip(t, t[1:])]
        return out

    def ttft(self, rids: Sequence[str] | None = None) -> list[float]:
        return [self.token_times[r][0] - self.submitted[r]
                for r in (rids or list(self.token_times))]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def drive(core: EngineCore, requests: Sequence[tuple[list[int], SamplingParams]],
          arrival_steps: Sequence[int] | None = None, prefix: str = "r",
          on_step: Callable[[], None] | None = None) -> Run:
    """Submit request i at step arrival_steps[i] (default: all at step 0) and run to completion;
    `on_step` is called after every engine step."""
    arrivals = list(arrival_steps) if arrival_steps is not None else [0] * len(requests)
    order = sorted(range(len(requests)), key=lambda i: arrivals[i])
    run = Run(0.0)
    start = time.perf_counter()
    step, nxt = 0, 0
    while nxt < len(order) or core.has_work():
        while nxt < len(order) and arrivals[order[nxt]] <= step:
            i = order[nxt]
            rid = f"{prefix}{i}"
            core.add_request(rid, requests[i][0], requests[i][1])
            run.submitted[rid], run.token_times[rid] = time.perf_counter(), []
            nxt += 1
        for out in core.step():
            now = time.perf_counter()
            run.token_times[out.rid] += [now] * len(out.token_ids)
            if out.finish_reason is not None:
                run.cached_tokens += out.cached_tokens
                run.prompt_tokens += out.prompt_tokens
        if on_step is not None:
            on_step()
        step += 1
    run.wall_s = time.perf_counter() - start
    return run


def greedy_params(max_new_tokens: int, temperature: float = 0.0,
                  seed: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, ignore_eos=True,
                          seed=seed)
