"""`radixserve bench soak`: many streaming clients for a bounded time, then the leak checks.

Each of --clients clients loops until --duration runs out. Every request has a random token-id
prompt (--input-len range) and max_new_tokens (--output-len range) with ignore_eos. A share
(--invalid-share) is deliberately invalid (an id outside the vocabulary, a length over the
context, a negative temperature) and must get INVALID_ARGUMENT; a share (--cancel-share) is
cancelled by the client at a uniform random point (before its first token up to its last);
the rest must finish OK with exactly max_new_tokens tokens.

At the end the stack must go idle with the pool invariant intact (GetServerInfo: nothing running
or queued, kv_pages_free + kv_pages_evictable == kv_pages_total, no live requests in the gateway
or the detokenizer), and the RSS and open files of each service are compared with the start
(known with --launch, or --serve-pid of a running `radixserve serve`). During the load each
service's RSS is sampled every --rss-every seconds; its growth is the least-squares slope over the
samples after --warmup (for a recycled gateway, over the peak of each process life), and
--max-rss-growth fails the run when a service grows faster. --json
keeps every sample and, per interval, the TTFT median beside them: a queue that deepened for a
while grows a heap as well as a leak does, and only the series tells the two apart.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from radixserve.bench.process import (
    RssSeries,
    add_stack_args,
    growth_table,
    parse_stack_args,
    percentiles,
    process_changes,
    process_table,
    raise_fd_limit,
    sample,
    service_pids,
    stack,
    wait_idle,
)
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc

STREAMS_PER_CHANNEL = 256


@dataclass(frozen=True)
class SoakConfig:
    target: str
    clients: int = 200
    duration_s: float = 300.0
    cancel_share: float = 0.3
    invalid_share: float = 0.01
    input_len: tuple[int, int] = (4, 256)
    output_len: tuple[int, int] = (4, 64)
    seed: int = 0
    timeout_s: float = 120.0  # client deadline of every request
    rss_every_s: float = 60.0
    warmup_s: float = 300.0  # RSS samples before this are the caches filling, not a leak
    max_rss_growth_pct: float | None = None  # per hour; None reports the growth without a limit

    def __post_init__(self) -> None:
        if self.clients < 1 or self.duration_s <= 0 or self.timeout_s <= 0:
            raise ValueError("clients must be >= 1, duration and timeout > 0")
        if self.rss_every_s <= 0 or self.warmup_s < 0:
            raise ValueError("--rss-every must be > 0 and --warmup >= 0")
        if not (0 <= self.cancel_share <= 1 and 0 <= self.invalid_share <= 1):
            raise ValueError("shares must be in [0, 1]")
        for lo, hi in (self.input_len, self.output_len):
            if not 1 <= lo <= hi:
                raise ValueError("length ranges must satisfy 1 <= min <= max")


@dataclass
class SoakResult:
    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # "<kind> <status>" -> count
    exact: int = 0  # finished normal requests with exactly max_new_tokens tokens
    wrong_count: int = 0  # finished normal requests with any other count
    unexpected: int = 0  # a status that its kind of request must not get
    output_tokens: int = 0
    ttft_ms: dict[str, float] = field(default_factory=dict)
    idle_info: dict[str, int] = field(default_factory=dict)
    invariant_ok: bool = False
    processes: dict[str, dict[str, float]] = field(default_factory=dict)
    rss_growth: dict[str, dict[str, float]] = field(default_factory=dict)  # RssSeries.growth
    # every sample behind the fit, per service: (seconds since the load began, RSS in MiB, pid)
    rss_series: dict[str, list[tuple[float, float, int]]] = field(default_factory=dict)
    # the queue beside it, per --rss-every interval: (interval start s, normal requests that saw
    # their first token in it, their TTFT p50 ms); a deeper queue grows heaps without a leak
    ttft_series: list[tuple[float, int, float]] = field(default_factory=list)
    too_fast: list[str] = field(default_factory=list)  # services above max_rss_growth_pct
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return (self.invariant_ok and not self.wrong_count and not self.unexpected
                and not self.too_fast)


# -- the load ------------------------------------------------------------------------------------


class _Soak:
    def __init__(self, cfg: SoakConfig, stubs: list[pb_grpc.GenerateServiceStub], vocab: int,
                 context: int):
        self.cfg = cfg
        self.stubs = stubs
        self.vocab = vocab
        self.context = context
        self.result = SoakResult()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.ttft: list[float] = []  # seconds, normal requests that finished OK
        self.first_at: list[float] = []  # when each of `ttft`'s first tokens came, monotonic

    def _request(self, rng: random.Random, kind: str) -> tuple[pb.GenerateRequest, int]:
        n_in = rng.randint(*self.cfg.input_len)
        n_out = rng.randint(*self.cfg.output_len)
        req = pb.GenerateRequest()
        req.token_ids.ids.extend(rng.randrange(1, min(self.vocab, 10000)) for _ in range(n_in))
        req.stopping.max_new_tokens = n_out
        req.stopping.ignore_eos = True
        if kind == "invalid":
            flavour = rng.randrange(3)
            if flavour == 0:
                req.token_ids.ids[rng.randrange(n_in)] = self.vocab
            elif flavour == 1:
                req.stopping.max_new_tokens = self.context
            else:
                req.sampling.temperature = -1.0
        return req, n_out

    async def _one(self, rng: random.Random, stub: pb_grpc.GenerateServiceStub) -> None:
        draw = rng.random()
        kind = ("invalid" if draw < self.cfg.invalid_share
                else "cancel" if draw < self.cfg.invalid_share + self.cfg.cancel_share
                else "normal")
        req, n_out = self._request(rng, kind)
        cancel_at = rng.randrange(n_out) if kind == "cancel" else -1  # tokens seen before cancel
        t0 = time.monotonic()
        call = stub.Generate(req, timeout=self.cfg.timeout_s)
        if cancel_at == 0:
            await asyncio.sleep(rng.uniform(0, 0.05))
            call.cancel()
        tokens, first = 0, None
        try:
            async for response in call:
                if response.HasField("delta") and response.delta.token_ids:
                    first = first or time.monotonic()
                    tokens += len(response.delta.token_ids)
                    if 0 < cancel_at <= tokens:
                        call.cancel()
            code = grpc.StatusCode.OK
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED  # grpc.aio raises this for a call we cancelled
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
        self._record(kind, code, tokens, n_out, t0, first)

    def _record(self, kind: str, code: grpc.StatusCode, tokens: int, n_out: int,
                t0: float, first: float | None) -> None:
        """`t0`, `first`: monotonic seconds of the call and of its first token (None: none came)."""
        r = self.result
        r.requests += 1
        r.output_tokens += tokens
        self.statuses[f"{kind} {code.name}"] += 1
        allowed = {"normal": {grpc.StatusCode.OK},
                   "cancel": {grpc.StatusCode.OK, grpc.StatusCode.CANCELLED},
                   "invalid": {grpc.StatusCode.INVALID_ARGUMENT}}[kind]
        if code not in allowed:
            r.unexpected += 1
        if kind == "normal" and code == grpc.StatusCode.OK:
            if tokens == n_out:
                r.exact += 1
            else:
                r.wrong_count += 1
            if first is not None:
                self.ttft.append(first - t0)
                self.first_at.append(first)

    def ttft_series(self, start: float, every_s: float) -> list[tuple[float, int, float]]:
        """The normal requests' TTFT p50 per `every_s` interval since `start` (SoakResult)."""
        buckets: dict[int, list[float]] = collections.defaultdict(list)
        for at, ttft in zip(self.first_at, self.ttft):
            buckets[int((at - start) // every_s)].append(ttft)
        return [(i * every_s, len(v), 1000 * statistics.median(v))
                for i, v in sorted(buckets.items())]

    async def _client(self, index: int, deadline: float) -> None:
        rng = random.Random(self.cfg.seed * 100003 + index)
        stub = self.stubs[index % len(self.stubs)]
        while time.monotonic() < deadline:
            await self._one(rng, stub)


async def run(cfg: SoakConfig, serve_pid: int | None = None) -> SoakResult:
    pids = service_pids(serve_pid) if serve_pid else {}
    before = {name: sample(pid) for name, pid in pids.items()}
    # One connection per STREAMS_PER_CHANNEL clients: the gateway serves at most 1024 streams per
    # connection (more wait in the client, which would count as TTFT); a local subchannel pool
    # keeps grpc from sharing one connection between channels to the same target.
    channels = [grpc.aio.insecure_channel(cfg.target,
                                          options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(math.ceil(cfg.clients / STREAMS_PER_CHANNEL))]
    try:
        stub = pb_grpc.GenerateServiceStub(channels[0])
        info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        soak = _Soak(cfg, [pb_grpc.GenerateServiceStub(c) for c in channels], info.vocab_size,
                     info.max_context)
        series = RssSeries(pids, cfg.rss_every_s, cfg.warmup_s,
                           (lambda: service_pids(serve_pid)) if serve_pid else None)
        sampler = asyncio.create_task(series.run())
        start = time.monotonic()
        deadline = start + cfg.duration_s
        try:
            await asyncio.gather(*(soak._client(i, deadline) for i in range(cfg.clients)))
        finally:
            sampler.cancel()
        result = soak.result
        result.duration_s = time.monotonic() - start
        result.statuses = dict(sorted(soak.statuses.items()))
        result.ttft_ms = percentiles(soak.ttft)
        result.ttft_series = soak.ttft_series(start, cfg.rss_every_s)
        result.invariant_ok, result.idle_info = await wait_idle(stub, 30.0)
    finally:
        for channel in channels:
            await channel.close()
    now = service_pids(serve_pid) if serve_pid else {}  # recycled gateways: their new pids
    result.processes = process_changes({n: p for n, p in now.items() if n in before}, before)
    result.rss_growth = series.growth()
    result.rss_series = series.samples
    limit = cfg.max_rss_growth_pct
    result.too_fast = [] if limit is None else [
        name for name, g in result.rss_growth.items() if g["pct_per_h"] > limit]
    return result


def format_table(cfg: SoakConfig, r: SoakResult) -> str:
    rows = [
        (f"{cfg.clients} clients, {cfg.duration_s:.0f} s of load ({r.duration_s:.0f} s with the "
        f"last requests' tail), cancel share {cfg.cancel_share:.0%}, "
        f"invalid share {cfg.invalid_share:.0%}, input {cfg.input_len[0]}-{cfg.input_len[1]}, "
        f"output {cfg.output_len[0]}-{cfg.output_len[1]} tokens"),
        "",
        "| outcome | count |", "|---|---|",
        f"| requests | {r.requests} |",
        *(f"| {name} | {count} |" for name, count in r.statuses.items()),
        f"| normal, exact token count | {r.exact} |",
        f"| normal, wrong token count | {r.wrong_count} |",
        f"| unexpected status | {r.unexpected} |",
        f"| output tokens (tok/s) | {r.output_tokens} "
        f"({r.output_tokens / max(r.duration_s, 1e-9):.0f}) |",
        f"| TTFT p50 / p99 (ms, normal) | {r.ttft_ms.get('p50', 0):.0f} / "
        f"{r.ttft_ms.get('p99', 0):.0f} |",
        "",
        "| pool at the end | value |", "|---|---|",
        *(f"| {k} | {r.idle_info.get(k, 0)} |" for k in (
            "running_requests", "waiting_requests", "kv_pages_total", "kv_pages_free",
            "kv_pages_evictable", "kv_pages_protected", "gateway_live_requests",
            "detokenizer_live_requests")),
        f"| invariant holds | {'yes' if r.invariant_ok else 'NO'} |",
        *process_table(r.processes),
        *growth_table(r.rss_growth, cfg.warmup_s),
        *(["", f"RSS growth above {cfg.max_rss_growth_pct} %/h: {', '.join(r.too_fast)}"]
          if r.too_fast else []),
    ]
    return "\n".join(rows)


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixserve bench soak", description=__doc__.split("\n")[0])
    add_stack_args(p)
    p.add_argument("--serve-pid", type=int, default=None,
                   help="pid of a running `radixserve serve`, to sample its services' RSS")
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    p.add_argument("--cancel-share", type=float, default=0.3)
    p.add_argument("--invalid-share", type=float, default=0.01)
    p.add_argument("--input-len", default="4-256", help="prompt length range MIN-MAX")
    p.add_argument("--output-len", default="4-64", help="max_new_tokens range MIN-MAX")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="client deadline per request (s)")
    p.add_argument("--rss-every", type=float, default=60.0,
                   help="seconds between RSS samples of each service during the load")
    p.add_argument("--warmup", type=float, default=300.0,
                   help="seconds of load before the RSS samples that the growth is fitted to")
    p.add_argument("--max-rss-growth", type=float, default=None, metavar="PCT",
                   help="fail when a service's RSS grows faster than PCT percent an hour")
    p.add_argument("--json", dest="json_path", help="write the result here")
    args, extra = parse_stack_args(p, argv)
    raise_fd_limit()
    with stack(args, extra) as (target, proc):
        cfg = SoakConfig(target, args.clients, args.duration, args.cancel_share,
                         args.invalid_share, _range(args.input_len), _range(args.output_len),
                         args.seed, args.timeout, args.rss_every, args.warmup,
                         args.max_rss_growth)
        result = asyncio.run(run(cfg, proc.pid if proc is not None else args.serve_pid))
    print(format_table(cfg, result))
    if args.json_path:
        payload: dict[str, Any] = {"config": asdict(cfg), "result": asdict(result)}
        Path(args.json_path).write_text(json.dumps(payload, indent=2))
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
