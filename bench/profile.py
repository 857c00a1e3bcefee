"""`radixserve bench profile`: where one decode step's time goes, host phase by phase.

Runs decode steps of B rows (B from --batches) the way EngineCore.step does with overlap on, timing
each host phase with perf_counter: schedule, forward (everything up to the launch of the step),
wait (blocked on the previous step's sampled ids) and process (appending tokens, finish checks).
With overlap, a step costs max(host, device): when `wait` is near 0 the host is the bottleneck.
--trace also runs a torch.profiler pass and prints the top host ops and the summed kernel time
per step (device busy time), so host and device can be set side by side.
--host also splits `forward` into its parts: the table flush (its writes staged, then applied), the
step's one upload (table writes, indices and sampling options in one copy), attention planning,
the model (forward or graph replay, and the LM head), grammar masks, the sampling batch (its host
columns, then the batch from their device views), the sampler (with the sampled ids' write into
the token pool) and `inputs`, the rest: the step's own tensors and the ids' copy to the host. On a
CPU the model and the sampler are the device work; every other column is host time.
--temperature samples (seeded, as the offline workload does) instead of greedy decoding.
--stagger lengthens prompt i by i % page_size tokens: the rows then start new pages at different
steps, as a served engine's rows do (some at almost every step), where rows in lockstep all start
one in the same step and the median step starts none.
--mixed TOKENS adds, before every timed decode step, one new prompt of TOKENS tokens that ends at
its first sampled token: each step then carries B decode rows and that prefill, as a served
engine's steps do while requests arrive (each count in turn, after the plain decode rows).
--prefill TOKENS profiles one prefill step of 16 fresh prompts totalling TOKENS tokens instead:
the top kernels by self device time, the host time of the forward launch and the step's wall time,
then the same step timed 3 more times without the profiler, so its overhead can be told apart.
On a CPU the ops are the kernels: their self CPU time stands in for device time.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from typing import Any

import torch
from radixserve.bench.common import device_name, print_table, write_json
from radixserve.bench.driver import (
    ENGINE_OVERRIDES,
    add_engine_argument,
    apply_engine_argument,
    build_core,
    greedy_params,
    median,
    release,
)
from radixserve.bench.models import write_model_dir
from radixserve.engine.core import EngineCore

PHASES = ("schedule", "forward", "wait", "process")
# The parts of `forward` that --host times on their own; `inputs` is what is left of it.
FORWARD_PARTS = ("flush", "upload", "prepare", "model", "grammar", "sampling_batch", "sampler")


class _PartTimers:
    """Times calls of the runner's parts by wrapping them for the duration of a `with` block."""

    def __init__(self, core: EngineCore) -> None:
        from radixserve.engine import model_runner

        r = core.runner
        self.spots: list[tuple[Any, str, str]] = [
            (r.table, "stage_flush", "flush"), (r.table, "apply_flush", "flush"),
            (model_runner.Upload, "send", "upload"), (r.backend, "prepare", "prepare"),
            (r.model, "forward", "model"), (r.model, "compute_logits", "model"),
            (model_runner, "fill_grammar_mask", "grammar"),
            (model_runner, "sampling_columns", "sampling_batch"),
            (model_runner, "sampling_batch", "sampling_batch"), (r, "sampler", "sampler")]
        if r.graphs is not None:  # a decode step's forward on CUDA: the graph's replay
            self.spots.append((r.graphs, "replay", "model"))
        if r.pieces is not None:
            self.spots.append((r.pieces, "run", "model"))
        self.totals: dict[str, float] = defaultdict(float)
        self._inside: dict[str, bool] = defaultdict(bool)
        self._saved: list[tuple[Any, str, Any, bool]] = []

    def _wrap(self, fn: Any, label: str) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._inside[label]:  # a part that calls itself (a mixed step's two plans)
                return fn(*args, **kwargs)
            self._inside[label] = True
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[label] += time.perf_counter() - t0
                self._inside[label] = False
        return timed

    def take(self) -> dict[str, float]:
        """Seconds per part since the last take."""
        out = {k: self.totals[k] for k in FORWARD_PARTS}
        self.totals.clear()
        return out

    def __enter__(self) -> _PartTimers:
        for obj, name, label in self.spots:
            own = name in vars(obj)  # an instance attribute, not one looked up on the class
            self._saved.append((obj, name, vars(obj).get(name), own))
            setattr(obj, name, self._wrap(getattr(obj, name), label))
        return self

    def __exit__(self, *exc: object) -> None:
        for obj, name, value, own in reversed(self._saved):
            if own:
                setattr(obj, name, value)
            else:
                delattr(obj, name)
        self._saved.clear()


def _fill(core: EngineCore, batch: int, prompt_len: int, steps: int,
          temperature: float = 0.0, stagger: bool = False) -> None:
    """`batch` running requests, prefilled; with `stagger`, prompt i is i % page_size tokens
    longer, so the rows start new pages at different steps."""
    rng = random.Random(0)
    P = core.scheduler.page_size
    for i in range(batch):
        ids = [rng.randrange(10000) for _ in range(prompt_len + (i % P if stagger else 0))]
        core.add_request(f"p{i}", ids, greedy_params(steps + 64, temperature, seed=i))
    while core.scheduler.waiting or any(not r.prefill_done for r in core.scheduler.running):
        core.step()
    for _ in range(4):
        core.step()


def _timed_steps(core: EngineCore, steps: int, parts: _PartTimers | None = None,
                 arrival: int = 0) -> dict[str, list[float]]:
    """`arrival` > 0: a new prompt of that many tokens is queued before each step (outside the
    timed phases) and finishes at its first token."""
    times: dict[str, list[float]] = defaultdict(list)
    in_flight, core._in_flight = core._in_flight, None  # the step core.step() left in flight
    # prompts of their own for each batch size: one seen beside another batch would hit the cache
    rng = random.Random(f"{arrival} tokens beside {len(core.scheduler.running)} rows")
    for i in range(steps):
        if arrival:
            core.add_request(f"a{arrival}-{i}", [rng.randrange(10000) for _ in range(arrival)],
                             greedy_params(1))
        t0 = time.perf_counter()
        batch = core.scheduler.schedule()
        t1 = time.perf_counter()
        out = core.runner.forward(batch)
        t2 = time.perf_counter()
        if parts is not None:
            split = parts.take()
            for name, seconds in split.items():
                times[name].append(seconds)
            times["inputs"].append(t2 - t1 - sum(split.values()))
        if in_flight is not None:
            in_flight[1].wait()
            t3 = time.perf_counter()
            core._process(*in_flight)
        else:
            t3 = t2
        t4 = time.perf_counter()
        in_flight = (batch, out)
        for name, a, b in zip(PHASES, (t0, t1, t2, t3), (t1, t2, t3, t4)):
            times[name].append(b - a)
        times["step"].append(t4 - t0)
    core._in_flight = in_flight
    return times


def _on_cuda(core: EngineCore) -> bool:
    return core.runner.device.type == "cuda"


def _activities(cuda: bool) -> list[Any]:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _kernel_rows(events: Any, cuda: bool, top: int) -> tuple[list[dict[str, Any]], float]:
    """The `top` kernels by self device time (name, calls, total_us, share) and the sum over all
    kernels in ms. On a CPU run the ops are the kernels, timed by their self CPU time."""
    timed = [(e, e.self_device_time_total if cuda else e.self_cpu_time_total) for e in events
             if (e.device_type.name == "CUDA") == cuda]
    total_us = sum(t for _, t in timed)
    timed.sort(key=lambda et: et[1], reverse=True)
    rows = [{"kernel": e.key, "calls": e.count, "total_us": float(t),
             "share": t / total_us if total_us else 0.0}
            for e, t in timed[:top]]
    return rows, total_us / 1e3


def _trace(core: EngineCore, steps: int, top: int) -> float:
    from torch.profiler import profile

    cuda = _on_cuda(core)
    with profile(activities=_activities(cuda)) as prof:
        for _ in range(steps):
            core.step()
        _sync(cuda)
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=top))
    if cuda:
        print(events.table(sort_by="self_cuda_time_total", row_limit=top))
    return _kernel_rows(events, cuda, top=0)[1] / steps


def _drain(core: EngineCore) -> None:
    """Abort every request and run the core until idle: the next measurement starts clean."""
    for rid in list(core._reqs):
        core.abort(rid)
    while core.has_work():
        core.step()


def profile_batch(core: EngineCore, batch: int, prompt_len: int, steps: int, trace: int,
                  host: bool = False, temperature: float = 0.0,
                  arrival: int = 0, stagger: bool = False) -> dict[str, Any]:
    _fill(core, batch, prompt_len, steps + trace, temperature, stagger)
    before = dict(core.runner.forward_paths)
    if host:
        with _PartTimers(core) as parts:
            times = _timed_steps(core, steps, parts, arrival)
    else:
        times = _timed_steps(core, steps, arrival=arrival)
    row: dict[str, Any] = {"batch": batch, "arrival": arrival}
    row.update({f"{k}_ms": 1e3 * median(v) for k, v in times.items()})
    # how the timed steps' forwards ran (model_runner.FORWARD_PATHS): which graphs a mixed step took
    row["forwards"] = " ".join(f"{p}:{n - before[p]}" for p, n in core.runner.forward_paths.items()
                               if n > before[p])
    if trace:
        row["kernels_ms"] = _trace(core, trace, top=25)
    _drain(core)
    return row


PREFILL_REQUESTS = 16


def _add_prefill(core: EngineCore, tokens: int, seed: int) -> None:
    """Up to PREFILL_REQUESTS prompts totalling `tokens` random ids. A new seed every time, so the
    radix cache holds none of them and the step computes every token."""
    rng = random.Random(seed)
    n = min(PREFILL_REQUESTS, tokens)
    for i in range(n):
        ids = [rng.randrange(10000) for _ in range(tokens // n + (i < tokens % n))]
        core.add_request(f"f{seed}-{i}", ids, greedy_params(4))


def _prefill_step(core: EngineCore, cuda: bool) -> dict[str, Any]:
    """Schedule, launch and finish one step of the waiting prompts; phase times in ms. `wait` runs
    up to a device synchronize, so `step` is the step's wall time, device work included."""
    assert core._in_flight is None and not core.scheduler.running, "the core must start idle"
    t0 = time.perf_counter()
    batch = core.scheduler.schedule()
    assert batch is not None and batch.phase == "prefill", "expected a pure prefill step"
    t1 = time.perf_counter()
    out = core.runner.forward(batch)
    t2 = time.perf_counter()
    out.wait()
    _sync(cuda)
    t3 = time.perf_counter()
    core._process(batch, out)
    t4 = time.perf_counter()
    row: dict[str, Any] = {"tokens": batch.num_tokens, "requests": len(batch)}
    row.update({f"{k}_ms": 1e3 * (b - a)
                for k, a, b in zip(PHASES, (t0, t1, t2, t3), (t1, t2, t3, t4))})
    row["step_ms"] = 1e3 * (t4 - t0)
    return row


def profile_prefill(core: EngineCore, tokens: int, runs: int = 3,
                    top: int = 25) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One prefill step of `tokens` under torch.profiler, then `runs` plain ones. Returns one row
    per step (profiled, each plain run, plain medians) and the profiled step's top kernels."""
    from torch.profiler import profile

    cuda = _on_cuda(core)
    _add_prefill(core, tokens, seed=0)
    _prefill_step(core, cuda)  # warm-up: first-call allocations, JIT builds, cuBLAS heuristics
    _drain(core)
    _add_prefill(core, tokens, seed=1)
    with profile(activities=_activities(cuda)) as prof:
        traced = _prefill_step(core, cuda)
    _drain(core)
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=top))  # the host side of the step
    kernels, kernels_ms = _kernel_rows(events, cuda, top)
    rows = [{"run": "profiled", **traced, "kernels_ms": kernels_ms}]
    for i in range(runs):
        _add_prefill(core, tokens, seed=2 + i)
        rows.append({"run": f"plain {i + 1}", **_prefill_step(core, cuda),
                     "kernels_ms": float("nan")})
        _drain(core)
    plain = rows[1:]
    rows.append({k: median([r[k] for r in plain]) if k.endswith("_ms") else v
                 for k, v in plain[0].items()})
    rows[-1].update(run="plain median", kernels_ms=float("nan"))
    return rows, kernels


class _Launches:
    """Every step the runner launches, for the duration of a `with` block; on CUDA also events on
    the runner's stream before and after each launch. The device reaches a step's first event when
    it has finished the step before and the host has launched this one, so the gaps between one
    step's end and the next one's start are host time left exposed: with overlap on, near 0."""

    def __init__(self, core: EngineCore) -> None:
        self.runner = core.runner
        self.batches: list[Any] = []
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def _launch(self, batch: Any) -> Any:
        stream = self.runner.stream
        if stream is not None:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record(stream)
        out = type(self.runner).forward(self.runner, batch)
        if stream is not None:
            end.record(stream)
            self.events.append((start, end))
        self.batches.append(batch)
        return out

    def __enter__(self) -> _Launches:
        self.runner.forward = self._launch
        return self

    def __exit__(self, *exc: object) -> None:
        del self.runner.forward

    def device_seconds(self) -> tuple[float, float] | None:
        """(device time from each step's start to its end, idle time between steps), summed;
        None off CUDA."""
        if not self.events:
            return None
        torch.cuda.synchronize()
        busy = sum(s.elapsed_time(e) for s, e in self.events)
        idle = sum(e.elapsed_time(s) for (_, e), (s, _) in zip(self.events, self.events[1:]))
        return busy / 1e3, idle / 1e3


Step = tuple[float, int, str, int, int]  # seconds, index, kind, rows, tokens


def _run_offline(core: EngineCore, launches: _Launches) -> tuple[
        float, dict[str, list[float]], dict[str, list[int]], list[Step]]:
    """Step until the workload is done: (wall seconds, step seconds and rows by kind, every step
    launched as (seconds, index, kind, rows, tokens)). With overlap a call returns once the step
    before the one it launched is done, so a step's time is mostly the device time of the step
    before it."""
    kinds: dict[str, list[float]] = defaultdict(list)
    rows: dict[str, list[int]] = defaultdict(list)
    steps: list[Step] = []
    start = time.perf_counter()
    while core.has_work():
        t0 = time.perf_counter()
        core.step()
        if len(launches.batches) == len(steps):
            continue  # nothing launched
        batch = launches.batches[-1]
        tokens = sum(s - p for s, p in zip(batch.seq_lens, batch.prefix_lens))
        kind = "decode" if tokens == len(batch.reqs) else "prefill+mixed"
        seconds = time.perf_counter() - t0
        kinds[kind].append(seconds)
        rows[kind].append(len(batch.reqs))
        steps.append((seconds, len(steps), kind, len(batch.reqs), tokens))
    return time.perf_counter() - start, kinds, rows, steps


def profile_offline(core: EngineCore) -> list[dict[str, Any]]:
    """The offline workload (docs/benchmarks.md, "Workloads"), steps grouped by kind: where its
    wall time goes."""
    from radixserve.bench.suite import offline_requests

    # warm-up as the suite's offline part does: first-call builds are not the workload's steps
    core.add_request("warm-up", list(range(16)), greedy_params(4, 0.6, seed=0))
    while core.has_work():
        core.step()
    for i, (ids, params) in enumerate(offline_requests(core.model_info.vocab_size)):
        core.add_request(f"o{i}", ids, params)
    with _Launches(core) as launches:
        wall, kinds, rows, steps = _run_offline(core, launches)
    device = launches.device_seconds()
    timeline_rows = [] if device is None else [
        {"kind": kind, "steps": len(steps), "total_s": s, "share": s / wall,
         "median_ms": float("nan"), "mean_rows": float("nan")}
        for kind, s in zip(("device: within steps", "device: idle between steps"), device)]
    print_table("the offline workload's slowest steps (the step launched; the one before it)",
                [{"step": i, "ms": 1e3 * t, "kind": k, "rows": r, "tokens": n,
                  "before": f"{steps[i - 1][2]} {steps[i - 1][3]}/{steps[i - 1][4]}" if i else ""}
                 for t, i, k, r, n in sorted(steps, reverse=True)[:8]])
    out = [{"kind": k, "steps": len(v), "total_s": sum(v), "share": sum(v) / wall,
            "median_ms": 1e3 * median(v),
            "mean_rows": sum(rows[k]) / len(v)} for k, v in kinds.items()]
    # Decode steps by batch size band: the long tail of a shrinking batch costs steps, not tokens.
    for lo, hi in ((1, 32), (33, 128), (129, 1 << 20)):
        band = [t for t, b in zip(kinds["decode"], rows["decode"]) if lo <= b <= hi]
        if band:
            out.append({"kind": f"decode rows {lo}-{min(hi, 256)}", "steps": len(band),
                        "total_s": sum(band),
                        "share": sum(band) / wall, "median_ms": 1e3 * median(band),
                        "mean_rows": float("nan")})
    out.append({"kind": "all", "steps": sum(len(v) for v in kinds.values()), "total_s": wall,
                "share": 1.0, "median_ms": float("nan"), "mean_rows": float("nan")})
    return out + timeline_rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench profile", description=__doc__)
    ap.add_argument("--model", default="qwen3-0.6b",
                    help="a name from bench/models.py (random weights)")
    ap.add_argument("--root", default="/tmp/radixserve-bench-models")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--trace", type=int, default=0,
                    help="also profile this many steps with torch.profiler")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: torch's default); 1 keeps a busy machine's thread "
                         "pool hand-offs out of the host columns")
    ap.add_argument("--host", action="store_true",
                    help="also time the parts of forward (decode steps)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample at this temperature, seeded (decode steps; 0: greedy)")
    ap.add_argument("--no-cuda-graph", action="store_true")
    ap.add_argument("--stagger", action="store_true",
                    help="rows at positions page_size apart, starting new pages at different steps")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--offline", action="store_true", help="profile the offline workload instead")
    mode.add_argument("--prefill", default="", metavar="TOKENS[,TOKENS...]",
                      help=f"profile one prefill step of {PREFILL_REQUESTS} prompts totalling "
                           "TOKENS instead (each count in turn)")
    mode.add_argument("--mixed", default="", metavar="TOKENS[,TOKENS...]",
                      help="also profile decode steps that each carry one new prompt of TOKENS")
    add_engine_argument(ap)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    apply_engine_argument(ap, args)
    try:
        prefill = [int(t) for t in args.prefill.split(",")] if args.prefill else []
        mixed = [int(t) for t in args.mixed.split(",")] if args.mixed else []
    except ValueError:
        ap.error("--prefill and --mixed take token counts: 64,1024")
    if any(t < 1 for t in prefill + mixed):
        ap.error("--prefill and --mixed take positive token counts")
    batches = [int(b) for b in args.batches.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    # A prefill step must hold every prompt: one slot each, and a token budget that takes them all.
    slots = max(*batches, PREFILL_REQUESTS) if prefill else max(batches)
    slots += 2 if mixed else 0  # the arrivals of the last two steps hold a slot each
    # On a CPU the pool holds every request's whole context, so decode steps never retract.
    kv_tokens = max(65536, slots * (args.prompt_len + args.steps + args.trace + 64 + 64))
    core = build_core(write_model_dir(args.model, args.root), device=args.device,
                      max_running_requests=slots, cuda_graph=not args.no_cuda_graph,
                      max_prefill_tokens=max([8192, *prefill, *mixed]), cpu_kv_tokens=kv_tokens,
                      **({"admission_wait_ms": 0.0} if mixed else {}))  # arrivals enter at once
    kernels: list[dict[str, Any]] = []
    title = f"decode step profile (medians): {args.model} on {device_name(args.device)}"
    try:
        if args.offline:
            rows = profile_offline(core)
        elif prefill:
            rows = []
            for tokens in prefill:
                got, top = profile_prefill(core, tokens)
                rows += got
                kernels += [{"tokens": tokens, **k} for k in top]
            title = (f"prefill steps of {args.prefill} tokens: {args.model} on "
                     f"{device_name(args.device)}")
        else:
            rows = [profile_batch(core, b, args.prompt_len, args.steps, args.trace, args.host,
                                  args.temperature, arrival, args.stagger)
                    for b in batches for arrival in [0, *mixed]]
    finally:
        release(core)
    if kernels:
        print_table("top kernels of the profiled prefill step, by self device time",
                    [{**k, "kernel": k["kernel"][:100]} for k in kernels])
    print_table(title, rows)
    extra = {"kernels": kernels} if prefill else {}
    write_json(args.json,
               {"bench": "profile", "args": vars(args), "engine": ENGINE_OVERRIDES,
                "device": device_name(args.device), "rows": rows, **extra})


if __name__ == "__main__":
    main()
