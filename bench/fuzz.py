"""`radixserve bench fuzz`: many mutated Generate requests via the gateway, then liveness checks.

The fuzz target (docs/reliability.md, Targets): >= 10^6 mutated Generate requests with 0 crashes.
Each request is raw bytes sent as a GenerateRequest: a valid seed request (SEEDS) or up to 64 random
bytes, then up to 6 edits (bit flip, inserted byte, deleted bytes, truncation, overwritten byte;
`mutate`), the scheme of the hypothesis fuzz in tests/services/test_services_wire.py, which imports
SEEDS, ALLOWED and `mutate` from here. --concurrency calls are in flight at once (one asyncio
client, one connection), each with a --timeout deadline.

Every call must end with a status in ALLOWED (a clean refusal, success or its deadline; never
INTERNAL, UNKNOWN or UNAVAILABLE). After each --batch requests: a valid request must still get
OK with its exact token count, and the supervisor and its four services must still be alive
(known with --launch, or --serve-pid of a running `radixserve serve`). At the end the stack must
go idle with the pool invariant intact, and the RSS and open files of each service are compared
with the start.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from radixserve.bench.process import (
    add_stack_args,
    parse_stack_args,
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

GENERATE = "/radixserve.v1.GenerateService/Generate"


def _seed_requests() -> list[pb.GenerateRequest]:
    text = pb.GenerateRequest(text="Hello world")
    text.stopping.max_new_tokens = 2
    ids = pb.GenerateRequest(token_ids=pb.TokenIds(ids=[5, 6, 7]))
    ids.stopping.max_new_tokens = 1
    ids.sampling.temperature, ids.sampling.top_k, ids.sampling.seed = 0.5, 3, 1
    chat = pb.GenerateRequest(chat=pb.ChatMessages(messages=[
        pb.ChatMessage(role="user", content="Hi"), pb.ChatMessage(role="assistant", content="Yo")]))
    chat.stopping.max_new_tokens = 2
    full = pb.GenerateRequest(request_id="r", text="abc")
    full.stopping.max_new_tokens = 2
    full.stopping.stop.append("x")
    full.stopping.stop_token_ids.append(3)
    full.options.top_logprobs = 2
    return [text, ids, chat, full]


# Valid requests the mutations start from: text, token ids with sampling, chat, and one with stop
# strings, stop ids, logprobs and a request id.
SEEDS = [r.SerializeToString() for r in _seed_requests()]
# What a mutated request may end with: a clean refusal, success, or its deadline. Never INTERNAL
# or UNKNOWN (a crash in our code) and never UNAVAILABLE (the server going down).
ALLOWED = frozenset({grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
                     grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED})


def mutate(seed: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """`seed` after each (kind, position, value) edit: kind 0 flips a bit, 1 inserts a byte, 2
    deletes 1-4 bytes, 3 truncates, 4 overwrites a byte (varint lengths, tags)."""
    data = bytearray(seed)
    for kind, pos, value in edits:
        at = pos % (len(data) + 1)
        if kind == 0 and data:
            data[at % len(data)] ^= 1 << (value % 8)  # flip a bit
        elif kind == 1:
            data[at:at] = bytes([value])  # insert a byte
        elif kind == 2:
            del data[at:at + 1 + value % 4]  # delete a few bytes
        elif kind == 3:
            del data[at:]  # truncate
        elif data:
            data[at % len(data)] = value  # overwrite
    return bytes(data)


def draw(rng: random.Random) -> bytes:
    """One payload, drawn like the hypothesis test's strategies: a seed or up to 64 random bytes,
    then 0-6 edits (kind 0-4, position 0-65536, value 0-255)."""
    if rng.random() < 0.5:
        seed = rng.choice(SEEDS)
    else:
        seed = rng.randbytes(rng.randint(0, 64))
    edits = [(rng.randint(0, 4), rng.randint(0, 1 << 16), rng.randint(0, 255))
             for _ in range(rng.randint(0, 6))]
    return mutate(seed, edits)


@dataclass(frozen=True)
class FuzzConfig:
    target: str
    requests: int = 10_000
    concurrency: int = 32
    batch: int = 10_000  # requests between liveness checks
    timeout_s: float = 5.0  # deadline of every mutated call (the test's)
    duration_s: float = 0.0  # stop starting requests after this many seconds (0: no limit)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests < 1 or self.concurrency < 1 or self.batch < 1 or self.timeout_s <= 0:
            raise ValueError("requests, concurrency and batch must be >= 1, timeout > 0")
        if self.duration_s < 0:
            raise ValueError("duration must be >= 0")


@dataclass
class FuzzResult:
    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    unexpected: int = 0  # calls that ended with a status outside ALLOWED
    examples: list[dict[str, str]] = field(default_factory=list)  # the first unexpected ones
    batches: int = 0
    probes_failed: int = 0  # valid requests after a batch that did not get OK + exact tokens
    died: list[str] = field(default_factory=list)  # services (or "serve") found dead
    invariant_ok: bool = False
    idle_info: dict[str, int] = field(default_factory=dict)
    processes: dict[str, dict[str, float]] = field(default_factory=dict)
    rss_trace: list[dict[str, float]] = field(default_factory=list)  # per batch: t, MiB/service
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return (self.invariant_ok and not self.unexpected and not self.probes_failed
                and not self.died)


def _alive(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _probe(stub: pb_grpc.GenerateServiceStub) -> bool:
    """A valid request still gets OK with exactly its two tokens."""
    req = pb.GenerateRequest(text="Hello")
    req.stopping.max_new_tokens = 2
    req.stopping.ignore_eos = True
    tokens = 0
    try:
        async for response in stub.Generate(req, timeout=60):
            if response.HasField("delta"):
                tokens += len(response.delta.token_ids)
    except grpc.aio.AioRpcError:
        return False
    return tokens == 2


async def run(cfg: FuzzConfig, serve_pid: int | None = None, log: Any = print) -> FuzzResult:
    pids = service_pids(serve_pid) if serve_pid else {}
    before = {name: sample(pid) for name, pid in pids.items()}
    result = FuzzResult()
    statuses: collections.Counter[str] = collections.Counter()
    rng = random.Random(cfg.seed)
    async with grpc.aio.insecure_channel(cfg.target) as channel:
        generate = channel.unary_stream(GENERATE)  # identity serializers: raw bytes
        stub = pb_grpc.GenerateServiceStub(channel)
        start = time.monotonic()
        stop_at = start + cfg.duration_s if cfg.duration_s else float("inf")

        async def one(payload: bytes) -> None:
            try:
                async for _ in generate(payload, timeout=cfg.timeout_s):
                    pass
                code, details = grpc.StatusCode.OK, ""
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
            result.requests += 1
            statuses[code.name] += 1
            if code not in ALLOWED:
                result.unexpected += 1
                if len(result.examples) < 20:
                    result.examples.append({"code": code.name, "details": details[:500],
                                            "payload_hex": payload.hex()})
                log(f"unexpected {code.name}: {details[:200]!r} for payload {payload.hex()}")

        async def worker(quota: list[int]) -> None:
            while quota[0] > 0 and time.monotonic() < stop_at:
                quota[0] -= 1
                await one(draw(rng))

        sent, batch_began = 0, start
        while sent < cfg.requests and time.monotonic() < stop_at and not result.died:
            quota = [min(cfg.batch, cfg.requests - sent)]
            began = result.requests
            await asyncio.gather(*(worker(quota) for _ in range(cfg.concurrency)))
            sent = result.requests
            result.batches += 1
            ok = await _probe(stub)
            result.probes_failed += not ok
            if serve_pid is not None and not _alive(serve_pid):
                result.died.append("serve")
            result.died += [name for name, pid in pids.items() if not _alive(pid)]
            now = time.monotonic()
            point: dict[str, float] = {"t_s": round(now - start, 1), "requests": float(sent)}
            for name, pid in pids.items():
                if name not in result.died:
                    point[name] = round(sample(pid)["rss_mib"], 1)
            result.rss_trace.append(point)
            rate = (sent - began) / max(now - batch_began, 1e-9)
            batch_began = now
            log(f"{sent} requests, {now - start:.0f} s, {rate:.0f} req/s in the last batch, "
                f"{dict(statuses)}, probe {'ok' if ok else 'FAILED'}, "
                f"RSS MiB {({k: v for k, v in point.items() if k in pids})}"
                + (f", DEAD: {result.died}" if result.died else ""))
        result.duration_s = time.monotonic() - start
        result.statuses = dict(sorted(statuses.items()))
        if not result.died:
            result.invariant_ok, result.idle_info = await wait_idle(stub, 30.0)
    result.processes = process_changes(pids, before, skip=tuple(result.died))
    return result


def format_table(cfg: FuzzConfig, r: FuzzResult) -> str:
    rows = [
        (f"{r.requests} mutated Generate requests in {r.duration_s:.0f} s "
         f"({r.requests / max(r.duration_s, 1e-9):.0f} req/s), {cfg.concurrency} in flight, "
         f"{cfg.timeout_s:g} s deadline, seed {cfg.seed}; {r.batches} batches, each followed by "
         f"a valid request and a liveness check"),
        "",
        "| outcome | count |", "|---|---|",
        f"| requests | {r.requests} |",
        *(f"| {name} | {count} |" for name, count in r.statuses.items()),
        f"| unexpected status | {r.unexpected} |",
        f"| failed probes (valid request after a batch) | {r.probes_failed} |",
        f"| services died | {', '.join(r.died) or 'none'} |",
        f"| pool invariant at the end | {'holds' if r.invariant_ok else 'NO'} |",
        *process_table(r.processes),
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixserve bench fuzz", description=__doc__.split("\n")[0])
    add_stack_args(p)
    p.add_argument("--serve-pid", type=int, default=None,
                   help="pid of a running `radixserve serve`, to check and sample its services")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=32, help="calls in flight at once")
    p.add_argument("--batch", type=int, default=10_000, help="requests between liveness checks")
    p.add_argument("--timeout", type=float, default=5.0, help="deadline of each call (s)")
    p.add_argument("--duration", type=float, default=0.0,
                   help="stop starting requests after this many seconds (default 0: no limit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_path", help="write the result here")
    args, extra = parse_stack_args(p, argv)
    raise_fd_limit()
    with stack(args, extra) as (target, proc):
        cfg = FuzzConfig(target, args.requests, args.concurrency, args.batch, args.timeout,
                         args.duration, args.seed)
        result = asyncio.run(run(cfg, proc.pid if proc is not None else args.serve_pid,
                                 log=lambda line: print(line, flush=True)))
    print(format_table(cfg, result))
    if args.json_path:
        payload: dict[str, Any] = {"config": asdict(cfg), "result": asdict(result)}
        Path(args.json_path).write_text(json.dumps(payload, indent=2))
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
