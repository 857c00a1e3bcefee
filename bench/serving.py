"""`radixserve bench serving`: online serving latency and throughput through the gateway.

Requests are token-id prompts (bench/workloads.py) sent with ignore_eos, so every request makes
exactly its output length: --workload random (input and output lengths uniform in
[len * (1 - range_ratio), len]) or shared-prefix (--groups x --per-group requests sharing a
--prefix-len "system prompt" per group, each with its own --suffix-len ids, shuffled; each level
draws prefixes of its own, so no level finds another's in the cache). Arrivals are Poisson at
--request-rate (or all at once: "inf", a burst), capped at each --concurrency level in turn.
Metrics follow vLLM / SGLang definitions:
  TTFT  send -> first token;   TPOT  (E2E - TTFT) / (output tokens - 1) per request;
  ITL   gap between consecutive token arrivals;   E2E  send -> last event;
  output tok/s = all output tokens / wall time of the level;
  cached  prompt tokens served from the prefix cache / prompt tokens, from the Finished events
          ("srv cached": the same from GetServerInfo's totals before and after the level).
GetServerInfo is polled during each level; a server with several scheduler replicas gets a table
per level of each one's routed requests, peak running / waiting and cache share.
The services' Prometheus endpoints (--launch: always; --target: --metrics) are read before and
after each level, for the plane's own timing:
  step      the level's time / the engine steps each scheduler replica ran in it (mixed steps
            included), so TPOT ÷ step is what the plane adds to the engine's pace;
  decode, mixed  the engine's steps that decoded (alone, or beside prefill) as the streams saw
            them: their share and p50 / p99, the engine's part of the ITL tail (and a table of
            the mixed ones by their prefill: 1-256 tokens, ..., 2049+);
  gc        the garbage collector's pauses: ms a second in a scheduler / a gateway, and the
            scheduler's p99 pause per generation;
  and how long after the scheduler had a step's outputs they were at each point on the way:
  received  the detokenizer received the step;   detokenized  it had detokenized it;
  arrival   a gateway received the step's deltas from the detokenizer;
  handoff   a gateway handed a stream's message with them to gRPC
            (per step, the handoff per message, from the gateways' histograms: quantiles within
            buckets that double from 0.5 ms);
  and a table of the gaps between a stream's messages as the gateways handed them to gRPC,
  beside the ITL the client read: what the last hop and the client add to the tail.
--compare-routing runs the whole thing once per routing policy, each on a fresh --launch'ed server
(`serve --routing P` and the flags after --), and ends with one table side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from radixserve.bench.load import LoadPool, Shape, one_request, open_channels
from radixserve.bench.plane_timing import (
    format_forwards,
    format_host,
    format_mixed,
    format_plane,
    format_streams,
    plane_timing,
)
from radixserve.bench.process import (
    add_stack_args,
    cpu_seconds,
    machine_cpu,
    parse_stack_args,
    percentiles,
    service_pids,
    stack,
)
from radixserve.bench.prometheus import Reading, served_metrics
from radixserve.bench.server_info import (
    POLL_INTERVAL_S,
    ReplicaLoad,
    ServerWatch,
    cached_share,
    replica_table,
)
from radixserve.bench.workloads import (
    WORKLOADS,
    SharedPrefix,
    Work,
    random_work,
    shared_prefix_work,
    warm_up_prompts,
)
from radixserve.services.common.lifecycle import run_event_loop
from radixserve.services.gateway.routing import ROUTING_POLICIES  # what `serve --routing` takes
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class BenchConfig:
    target: str
    concurrencies: tuple[int, ...]
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float
    request_rate: float  # requests per second; inf sends all at once
    temperature: float
    seed: int
    n: int = 1  # completions per request (sampling.n); tokens and ITLs count every completion
    # After the levels above: Poisson arrivals at these fractions of the best measured request rate,
    # capped at the largest concurrency (online load below saturation).
    rate_fractions: tuple[float, ...] = ()
    slo_ttft_ms: float = float("inf")  # goodput counts requests within both SLOs
    slo_tpot_ms: float = float("inf")
    # The shared-prefix workload (every request decodes exactly output_len); None: random.
    shared_prefix: SharedPrefix | None = None
    poll_interval_s: float = POLL_INTERVAL_S  # GetServerInfo during a level
    # Client connections, requests spread over them in turn: a server with several gateways on
    # one port (serve --gateways) gives each connection to one of them.
    channels: int = 1
    processes: int = 1  # client processes (bench/load.py): one loop tops out at some 20k tok/s

    def __post_init__(self) -> None:
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise ValueError("concurrency levels must be >= 1")
        if min(self.num_prompts, self.input_len, self.output_len, self.n) < 1:
            raise ValueError("num-prompts, input-len, output-len and n must be >= 1")
        if not 0 <= self.range_ratio < 1 or self.request_rate <= 0:
            raise ValueError("range-ratio must be in [0, 1) and request-rate > 0")
        if any(not 0 < f for f in self.rate_fractions):
            raise ValueError("rate fractions must be > 0")
        if not self.poll_interval_s > 0:
            raise ValueError("poll-interval must be > 0")
        if self.channels < 1 or self.processes < 1:
            raise ValueError("channels and processes must be >= 1")


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    request_rate: float  # offered Poisson rate (requests/s); inf: all at once
    completed: int
    failed: int
    duration_s: float
    output_tok_s: float
    request_s: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2e_ms: dict[str, float]
    goodput_s: float  # completed requests per second within both SLOs
    cached_share: float  # prompt tokens served from the prefix cache, by the Finished events
    server_cached_share: float  # the same by GetServerInfo's totals before and after the level
    routing: str  # the routing policy GetServerInfo names ("" from a server without replicas)
    replicas: list[ReplicaLoad]  # one per scheduler replica GetServerInfo reports
    # CPU time of each service of a --launch'ed stack during the level, in cores (1.0: one core)
    service_cores: dict[str, float] = dataclasses.field(default_factory=dict)
    # the bench's own client (every sending process) during the level, in cores
    client_cores: float = 0.0
    # The whole machine during the level, in cores: busy, and stolen by the hypervisor
    # (bench/process.py: machine_cpu)
    machine_cores: float = 0.0
    stolen_cores: float = 0.0
    # From the services' metrics (none read: empty): plane_timing's (bench/plane_timing.py)
    plane: dict[str, Any] = dataclasses.field(default_factory=dict)


# New tokens of each warm-up request (`warm_up_work`).
WARM_UP_TOKENS = 32


def warm_up_work(cfg: BenchConfig, vocab: int, replicas: int = 1) -> list[list[int]]:
    """The prompts that warm the path before the first level and before the offline baseline,
    drawn apart from the levels' (no cache hit): the largest level's concurrency for each replica
    (at most a level's requests), as long as the longest prompt a level sends. With
    WARM_UP_TOKENS each, steps that prefill many prompts beside hundreds of decoding rows run once
    before anything is timed, so kernels built on first use (Triton's, on a fresh machine) are
    not built inside a timed run."""
    sp = cfg.shared_prefix
    length = sp.prefix_len + sp.suffix_len if sp is not None else cfg.input_len
    requests = sp.num_requests if sp is not None else cfg.num_prompts
    count = min(max(cfg.concurrencies), requests) * max(1, replicas)
    return warm_up_prompts(count, length, vocab, cfg.seed)


def _workload(cfg: BenchConfig, vocab: int, level: int = 0) -> Work:
    """The requests of level `level` (0 first, the offline baseline's), each level's prompts its
    own: a prompt an earlier level sent would come from the prefix cache, and the level would
    measure steps that carry almost no prefill."""
    if cfg.shared_prefix is not None:
        return shared_prefix_work(cfg.shared_prefix, cfg.output_len, vocab, cfg.seed + level)
    return random_work(cfg.num_prompts, cfg.input_len, cfg.output_len, cfg.range_ratio, vocab,
                       cfg.seed + level)


@dataclass(frozen=True)
class Probes:
    """What a level reads of the server besides its streams: the services' pids (name -> pid; CPU
    time) and Prometheus endpoints (URLs; the plane's timing). Either may be empty."""

    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    metrics: list[str] = dataclasses.field(default_factory=list)


async def _level(pool: LoadPool, stub: pb_grpc.GenerateServiceStub, cfg: BenchConfig,
                 concurrency: int, work: Work, rate: float, probes: Probes) -> LevelResult:
    shape = Shape(concurrency, rate, cfg.temperature, cfg.n, cfg.seed + concurrency, cfg.channels)
    pids = probes.pids
    async with ServerWatch(stub, cfg.poll_interval_s) as watch:
        metrics_before = await asyncio.to_thread(Reading.take, probes.metrics)
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        machine_before = machine_cpu()
        began = time.perf_counter()
        sent = await pool.send(work, shape)
        duration = time.perf_counter() - began
        records = sent.records
        cores = {name: (cpu_seconds(pid) - cpu_before[name]) / duration
                 for name, pid in pids.items()}
        machine = tuple((b - a) / duration for a, b in zip(machine_before, machine_cpu()))
        metrics_after = await asyncio.to_thread(Reading.take, probes.metrics)
    done = [r for r in records if r.ok]
    for r in records:
        if not r.ok:
            print(f"request failed: {r.error}", file=sys.stderr)
    tokens = sum(r.output_tokens for r in done)
    tpot = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    good = [r for r in done if r.ttft_s * 1e3 <= cfg.slo_ttft_ms and (
        r.output_tokens < 2
        or (r.e2e_s - r.ttft_s) / (r.output_tokens - 1) * 1e3 <= cfg.slo_tpot_ms)]
    return LevelResult(
        concurrency=concurrency, request_rate=rate, completed=len(done),
        failed=len(records) - len(done), goodput_s=len(good) / duration,
        duration_s=duration, output_tok_s=tokens / duration, request_s=len(done) / duration,
        ttft_ms=percentiles([r.ttft_s for r in done]), tpot_ms=percentiles(tpot),
        itl_ms=percentiles([g for r in done for g in r.itl_s]),
        e2e_ms=percentiles([r.e2e_s for r in done]),
        cached_share=cached_share(sum(r.cached_tokens for r in done),
                                  sum(r.prompt_tokens for r in done)),
        server_cached_share=watch.cached_share, routing=watch.last.routing,
        replicas=watch.replicas(), service_cores=cores, client_cores=sent.cpu_s / duration,
        machine_cores=machine[0], stolen_cores=machine[1],
        plane=plane_timing(metrics_before, metrics_after, duration) if probes.metrics else {},
    )


async def run(cfg: BenchConfig, probes: Probes | None = None) -> list[LevelResult]:
    """The levels of `cfg`, each measuring what `probes` names."""
    channels = open_channels(cfg.target, cfg.channels)
    stubs = [pb_grpc.GenerateServiceStub(c) for c in channels]
    pool = LoadPool(cfg.target, stubs, cfg.processes)
    try:
        return await _run(cfg, pool, stubs[0], probes or Probes())
    finally:
        pool.close()
        for channel in channels:
            await channel.close()


async def _run(cfg: BenchConfig, pool: LoadPool, stub: pb_grpc.GenerateServiceStub,
               probes: Probes) -> list[LevelResult]:
    vocab = (await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)).vocab_size
    server = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=30)
    # Warm the path end to end, the requests sent together so that a router spreads them.
    warm = warm_up_work(cfg, vocab, len(server.replicas))
    await asyncio.gather(*(one_request(stub, prompt, WARM_UP_TOKENS, cfg.temperature)
                           for prompt in warm))
    results = []
    for level, c in enumerate(cfg.concurrencies):
        work = _workload(cfg, vocab, level)
        results.append(await _level(pool, stub, cfg, c, work, cfg.request_rate, probes))
    peak = max(r.request_s for r in results)
    for level, fraction in enumerate(cfg.rate_fractions, start=len(results)):
        work = _workload(cfg, vocab, level)
        results.append(await _level(pool, stub, cfg, max(cfg.concurrencies), work,
                                    fraction * peak, probes))
    return results


def format_table(results: list[LevelResult]) -> str:
    head = (f"{'conc':>5} {'rate':>6} {'ok':>5} {'fail':>4} {'tok/s':>8} {'req/s':>6} "
            f"{'good/s':>6} "
            f"{'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9} "
            f"{'ITL p50':>8} {'ITL p99':>8} {'E2E p50':>9} {'E2E p99':>9} "
            f"{'cached':>6} {'srv cached':>10}")
    rows = [head, "-" * len(head)]
    for r in results:
        rows.append(
            f"{r.concurrency:>5} {r.request_rate:>6.1f} {r.completed:>5} {r.failed:>4} "
            f"{r.output_tok_s:>8.1f} {r.request_s:>6.2f} {r.goodput_s:>6.2f} "
            f"{r.ttft_ms['p50']:>9.1f} {r.ttft_ms['p99']:>9.1f} "
            f"{r.tpot_ms['p50']:>9.1f} {r.tpot_ms['p99']:>9.1f} {r.itl_ms['p50']:>8.1f} "
            f"{r.itl_ms['p99']:>8.1f} {r.e2e_ms['p50']:>9.1f} {r.e2e_ms['p99']:>9.1f} "
            f"{r.cached_share:>6.3f} {r.server_cached_share:>10.3f}")
    return "\n".join(rows) + "\n(latencies in ms; cached: share of prompt tokens from the cache)"


def format_cores(results: list[LevelResult]) -> str:
    """Each service's CPU during each level, then the bench client's: cores busy (1.00: one core),
    and microseconds of CPU per output token. Empty when no service was measured (a --target
    run)."""
    names = sorted({name for r in results for name in r.service_cores})
    if not names:
        return ""
    head = (f"{'conc':>5} {'rate':>6} {'tok/s':>8} " + " ".join(f"{n:>20}" for n in names)
            + f" {'bench client':>20} {'machine':>8} {'stolen':>7}")
    rows = ["service CPU per level: cores busy / us per output token; the whole machine's busy "
            "and stolen cores (stolen: the hypervisor ran something else)", head, "-" * len(head)]
    for r in results:
        tokens = max(1.0, r.output_tok_s * r.duration_s)
        cores = [r.service_cores.get(n, 0.0) for n in names] + [r.client_cores]
        cells = [f"{c:>8.2f} / {c * r.duration_s / tokens * 1e6:>9.1f}" for c in cores]
        rows.append(f"{r.concurrency:>5} {r.request_rate:>6.1f} {r.output_tok_s:>8.1f} "
                    + " ".join(f"{c:>20}" for c in cells)
                    + f" {r.machine_cores:>8.2f} {r.stolen_cores:>7.3f}")
    return "\n".join(rows)


def format_report(results: list[LevelResult]) -> str:
    """The table, each service's CPU (a --launch'ed stack), the plane's timing (metrics read),
    then each level's replicas when the server reports any."""
    parts = [format_table(results)]
    for table in (format_cores(results), format_plane(results), format_mixed(results),
                  format_streams(results), format_host(results), format_forwards(results)):
        if table:
            parts.append(f"\n{table}")
    for r in results:
        if r.replicas:
            routing = f", routing {r.routing}" if r.routing else ""
            parts.append(f"\nreplicas at concurrency {r.concurrency}, rate {r.request_rate:.1f}"
                         f"{routing}:\n{replica_table(r.replicas)}")
    return "\n".join(parts)


def format_comparison(runs: dict[str, list[LevelResult]]) -> str:
    """One row per routing policy and level: the figures that tell the policies apart."""
    head = (f"{'routing':<12} {'conc':>5} {'rate':>6} {'ok':>5} {'fail':>4} {'tok/s':>8} "
            f"{'req/s':>6} {'TTFT p50':>9} {'TTFT p99':>9} {'cached':>6} {'srv cached':>10}")
    rows = [head, "-" * len(head)]
    for policy, results in runs.items():
        rows += [f"{policy:<12} {r.concurrency:>5} {r.request_rate:>6.1f} {r.completed:>5} "
                 f"{r.failed:>4} {r.output_tok_s:>8.1f} {r.request_s:>6.2f} "
                 f"{r.ttft_ms['p50']:>9.1f} {r.ttft_ms['p99']:>9.1f} {r.cached_share:>6.3f} "
                 f"{r.server_cached_share:>10.3f}" for r in results]
    return "\n".join(rows) + "\n(TTFT in ms; cached: share of prompt tokens from the cache)"


@dataclass(frozen=True)
class OfflineBaseline:
    """The same requests through the offline engine (`offline_run`), measured as a level is."""

    tok_s: float
    tpot_ms: dict[str, float]  # per request: (its last token's time - its first's) / (tokens - 1)
    step_ms: float  # the run's time / the engine steps in it, as a level's `step`
    # the same over the steps run while requests still waited for a slot (every slot busy), before
    # the run drains: the step a request's TPOT is made of when the slots are the limit
    full_step_ms: float = math.nan


def offline_run(model: str, cfg: BenchConfig, serve_flags: list[str]) -> OfflineBaseline:
    """The same workload through the offline engine, configured as `radixserve serve --model MODEL
    SERVE_FLAGS` configures its scheduler: the service plane's ceiling. Every request is queued at
    once and the engine's request slots cap how many run, as a level's concurrency does; a
    request's tokens are timed when the engine hands them over, as a stream's when they arrive."""
    from radixserve.bench.driver import drive
    from radixserve.engine import LLM, SamplingParams
    from radixserve.services.cli import build_parser, engine_config

    args = build_parser().parse_args(["serve", "--model", model, *serve_flags])
    config = engine_config(args, model)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    fields.pop("model_path")
    llm = LLM(model, **fields)
    vocab = llm.core.model_info.vocab_size
    llm.generate(warm_up_work(cfg, vocab), SamplingParams(  # as `_run` does
        temperature=cfg.temperature, max_new_tokens=WARM_UP_TOKENS, ignore_eos=True))
    core = llm.core
    work = [(prompt, SamplingParams(temperature=cfg.temperature, max_new_tokens=new,
                                    ignore_eos=True)) for prompt, new in _workload(cfg, vocab)]
    steps, full = 0, (0, 0.0)  # (steps, seconds) up to the last one that left requests waiting

    def counted() -> None:
        nonlocal steps, full
        steps += 1
        if core.scheduler.waiting:
            full = (steps, time.perf_counter() - start)

    start = time.perf_counter()
    run = drive(core, work, prefix="baseline-", on_step=counted)
    times = run.token_times.values()
    tpot = [(t[-1] - t[0]) / (len(t) - 1) for t in times if len(t) > 1]
    return OfflineBaseline(run.output_tokens / run.wall_s, percentiles(tpot),
                           run.wall_s / steps * 1e3,
                           full[1] / full[0] * 1e3 if full[0] else math.nan)


def workload_argv(cfg: BenchConfig) -> list[str]:
    """The flags that make `cfg`'s requests (its first level's)."""
    argv = ["--output-len", str(cfg.output_len), "--seed", str(cfg.seed)]
    if cfg.shared_prefix is None:
        return [*argv, "--num-prompts", str(cfg.num_prompts), "--input-len", str(cfg.input_len),
                "--range-ratio", str(cfg.range_ratio)]
    sp = cfg.shared_prefix
    return [*argv, "--workload", "shared-prefix", "--groups", str(sp.groups), "--per-group",
            str(sp.per_group), "--prefix-len", str(sp.prefix_len), "--suffix-len",
            str(sp.suffix_len)]


def offline_in_child(model: str, cfg: BenchConfig, serve_flags: list[str]) -> OfflineBaseline:
    """`offline_run` in a process of its own, run before the stack starts: it has the device to
    itself and gives all of its memory back when it exits. (Run after the stack, in this process,
    the baseline sized its KV pool from memory that the stopping services had not yet returned,
    and varied by a third between runs.)"""
    argv = [sys.executable, "-m", "radixserve.bench.serving", "--offline-only", "--launch",
            "--model", model, *workload_argv(cfg), "--temperature", str(cfg.temperature),
            "--concurrency", ",".join(map(str, cfg.concurrencies)),  # the warm-up's size
            "--", *serve_flags]
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout
    return OfflineBaseline(**json.loads(out.strip().splitlines()[-1]))


def routing_runs(args: argparse.Namespace, cfg: BenchConfig, serve_flags: list[str],
                 policies: list[str] | None) -> dict[str, list[LevelResult]]:
    """The levels of `cfg` per routing policy, each on a stack of its own started with
    `--routing P` after `serve_flags`; without policies, one run keyed by "" on the stack as
    given (--target and its --metrics, or --launch with `serve_flags` and metrics ports)."""
    runs = {}
    for policy in policies or [""]:
        flags = [*serve_flags, "--routing", policy] if policy else serve_flags
        probes = Probes(metrics=[u for u in (args.metrics or "").split(",") if u])
        if args.launch:
            flags, gateways, schedulers = served_metrics(flags)
            probes = Probes(metrics=gateways + schedulers)
        with stack(args, flags) as (target, proc):
            if proc is not None:
                probes = dataclasses.replace(probes, pids=service_pids(proc.pid))
            runs[policy] = run_event_loop(run(dataclasses.replace(cfg, target=target), probes))
        reported = {r.routing for r in runs[policy]} - {""}
        if policy and reported - {policy}:
            print(f"asked for routing {policy}, the server reports {sorted(reported)}",
                  file=sys.stderr)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixserve bench serving", description=__doc__.split("\n")[0])
    add_stack_args(p)
    p.add_argument("--workload", choices=WORKLOADS, default="random")
    p.add_argument("--concurrency", default=None,
                   help="comma-separated levels (default 1,4,16; shared-prefix: 256)")
    p.add_argument("--num-prompts", type=int, default=64, help="random workload")
    p.add_argument("--input-len", type=int, default=128, help="random workload")
    p.add_argument("--output-len", type=int, default=None,
                   help="the most output tokens (default 64); shared-prefix: exactly (256)")
    p.add_argument("--range-ratio", type=float, default=0.5, help="random workload")
    sp = SharedPrefix()
    p.add_argument("--groups", type=int, default=sp.groups, help="shared-prefix: prefix groups")
    p.add_argument("--per-group", type=int, default=sp.per_group,
                   help="shared-prefix: requests per group")
    p.add_argument("--prefix-len", type=int, default=sp.prefix_len,
                   help="shared-prefix: ids of a group's shared prefix")
    p.add_argument("--suffix-len", type=int, default=sp.suffix_len,
                   help="shared-prefix: ids of each request's own suffix")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals per second (default inf: a burst)")
    p.add_argument("--rate-fractions", default="",
                   help="then Poisson arrivals at these fractions of the best measured request "
                        "rate, e.g. 0.5,0.75,0.9 (capped at the largest concurrency)")
    p.add_argument("--slo-ttft-ms", type=float, default=float("inf"),
                   help="goodput counts requests with TTFT within this "
                        "(and TPOT within --slo-tpot-ms)")
    p.add_argument("--slo-tpot-ms", type=float, default=float("inf"))
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=1, help="completions per request (sampling.n)")
    p.add_argument("--channels", type=int, default=1,
                   help="client connections, requests spread over them in turn (a server with "
                        "--gateways K serves each connection on one of its gateways)")
    p.add_argument("--processes", type=int, default=1,
                   help="client processes, each sending every P-th request with 1/P of the "
                        "concurrency and the rate (one process reads some 20k tokens/s at most)")
    p.add_argument("--poll-interval", type=float, default=POLL_INTERVAL_S,
                   help="seconds between GetServerInfo polls during a level")
    p.add_argument("--compare-routing", nargs="?", const=",".join(ROUTING_POLICIES),
                   metavar="POLICIES",
                   help="with --launch: run once per routing policy (default all: "
                        f"{','.join(ROUTING_POLICIES)}), each on a fresh server")
    p.add_argument("--metrics", default=None, metavar="URLS",
                   help="with --target: the services' Prometheus endpoints, comma-separated "
                        "(the gateways' and the schedulers', http://HOST:PORT/metrics), read "
                        "around each level; --launch finds its own")
    p.add_argument("--offline-baseline", action="store_true",
                   help="first run the same requests through the offline engine (--model, the "
                        "engine flags given to serve after --) and report the ratios of "
                        "throughput and TPOT p50")
    p.add_argument("--offline-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", dest="json_path", help="write the results here")
    args, extra = parse_stack_args(p, argv)
    if args.n > 1 and args.offline_baseline:
        p.error("--offline-baseline runs one completion per request: leave --n at 1")
    policies = None
    if args.compare_routing is not None:
        policies = [x for x in args.compare_routing.split(",") if x]
        if not args.launch or not policies or set(policies) - set(ROUTING_POLICIES):
            p.error(f"--compare-routing takes policies among {','.join(ROUTING_POLICIES)} and "
                    f"needs --launch (each policy gets a server of its own)")
        if any(a == "--routing" or a.startswith("--routing=") for a in extra):
            p.error("--compare-routing sets --routing for serve: leave it out of the serve flags")
    shared = args.workload == "shared-prefix"
    try:
        cfg = BenchConfig(
            args.target,
            tuple(int(c) for c in (args.concurrency or ("256" if shared else "1,4,16")).split(",")),
            args.num_prompts, args.input_len,
            args.output_len if args.output_len is not None else (256 if shared else 64),
            args.range_ratio, args.request_rate, args.temperature, args.seed, args.n,
            tuple(float(f) for f in args.rate_fractions.split(",") if f),
            args.slo_ttft_ms, args.slo_tpot_ms,
            SharedPrefix(args.groups, args.per_group, args.prefix_len, args.suffix_len)
            if shared else None, args.poll_interval, args.channels, args.processes)
    except ValueError as exc:
        p.error(str(exc))
    if args.offline_only:  # the child of offline_in_child
        print(json.dumps(asdict(offline_run(args.model, cfg, extra))))
        return 0
    offline = offline_in_child(args.model, cfg, extra) if args.offline_baseline else None
    runs = routing_runs(args, cfg, extra, policies)
    for policy, results in runs.items():
        print(f"\nrouting {policy}:" if policy else "", format_report(results), sep="\n")
    if policies:
        print(f"\n{format_comparison(runs)}")
    payload: dict[str, Any] = {"config": asdict(cfg)}
    if policies:
        payload["by_routing"] = {k: [asdict(r) for r in rs] for k, rs in runs.items()}
    else:
        payload["results"] = [asdict(r) for r in runs[""]]
    every = [r for results in runs.values() for r in results]
    if offline is not None:
        best = max(every, key=lambda r: r.output_tok_s)
        payload["offline_tok_s"], payload["offline"] = offline.tok_s, asdict(offline)
        tpot = offline.tpot_ms["p50"]
        print(f"offline engine, same requests: {offline.tok_s:.1f} tok/s, TPOT p50 {tpot:.2f} ms, "
              f"step {offline.step_ms:.2f} ms (TPOT p50 / step {tpot / offline.step_ms:.2f}), "
              f"{offline.full_step_ms:.2f} ms while every slot was busy "
              f"(TPOT p50 / that step {tpot / offline.full_step_ms:.2f}); "
              f"best through the gateway: {best.output_tok_s:.1f} tok/s at concurrency "
              f"{best.concurrency} ({best.output_tok_s / offline.tok_s:.2f} of offline), TPOT p50 "
              f"{best.tpot_ms['p50']:.2f} ms ({best.tpot_ms['p50'] / tpot:.2f} of offline's)")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(payload, f, indent=2)
    return 1 if any(r.failed for r in every) else 0


if __name__ == "__main__":
    raise SystemExit(main())
