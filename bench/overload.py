"""`radixserve bench overload`: refusals and admitted streams at 3x the saturating arrival rate.

The overload target (docs/reliability.md, Targets): rejected calls get RESOURCE_EXHAUSTED (with
`retry-after-ms`) in <= 10 ms p99, admitted calls keep p99 ITL within 1.5x of the unloaded value,
and no call ends on its client deadline without a status. Two phases against one stack whose
admission is `--max-running R --max-queued Q` (passed to `serve` with --launch; give the server's
values with --target):
  1. unloaded: R closed-loop clients; gives the unloaded ITL and the saturating rate (req/s);
  2. overload: Poisson arrivals at --factor x that rate for --duration seconds.
Requests are random token-id prompts (--input-len), --output-len tokens with ignore_eos, greedy,
spread over --channels client connections in turn (a server with several gateways on one port
serves each connection on one of them). Refusal latency is send -> status at the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
from radixserve.bench.load import open_channels
from radixserve.bench.process import add_stack_args, parse_stack_args, percentiles, stack
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class OverloadConfig:
    target: str
    max_running: int = 8
    max_queued: int = 8
    factor: float = 3.0
    duration_s: float = 20.0
    input_len: int = 32
    output_len: int = 64
    timeout_s: float = 60.0
    seed: int = 0
    channels: int = 1


@dataclass
class Phase:
    itl: list[float] = field(default_factory=list)
    refusals: list[float] = field(default_factory=list)
    codes: dict[str, int] = field(default_factory=dict)
    hinted: int = 0  # refusals that carried retry-after-ms
    wall_s: float = 0.0


async def _one(stub: pb_grpc.GenerateServiceStub, cfg: OverloadConfig, rng: random.Random,
               phase: Phase, vocab: int) -> None:
    req = pb.GenerateRequest(token_ids=pb.TokenIds(
        ids=[rng.randrange(1, min(vocab, 10000)) for _ in range(cfg.input_len)]))
    req.stopping.max_new_tokens = cfg.output_len
    req.stopping.ignore_eos = True
    req.sampling.temperature = 0.0
    start = time.perf_counter()
    last, gaps, code = None, [], "OK"
    call = stub.Generate(req, timeout=cfg.timeout_s)
    try:
        async for response in call:
            if response.HasField("delta") and response.delta.token_ids:
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
    except grpc.aio.AioRpcError as exc:
        code = exc.code().name
        if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            phase.refusals.append(time.perf_counter() - start)
            phase.hinted += "retry-after-ms" in dict(exc.trailing_metadata() or ())
    phase.codes[code] = phase.codes.get(code, 0) + 1
    if code == "OK":
        phase.itl.extend(gaps)


async def _unloaded(stubs: list[pb_grpc.GenerateServiceStub], cfg: OverloadConfig,
                    vocab: int) -> tuple[Phase, float]:
    """R clients, 3 requests each, one after another: ITL and completions per second."""
    phase, rng = Phase(), random.Random(cfg.seed)

    async def client(stub: pb_grpc.GenerateServiceStub) -> None:
        for _ in range(3):
            await _one(stub, cfg, rng, phase, vocab)

    began = time.perf_counter()
    await asyncio.gather(*(client(stubs[i % len(stubs)]) for i in range(cfg.max_running)))
    phase.wall_s = time.perf_counter() - began
    return phase, phase.codes.get("OK", 0) / phase.wall_s


async def _overload(stubs: list[pb_grpc.GenerateServiceStub], cfg: OverloadConfig, rate: float,
                    vocab: int) -> Phase:
    phase, rng = Phase(), random.Random(cfg.seed + 1)
    tasks = []
    began = time.perf_counter()
    while time.perf_counter() - began < cfg.duration_s:
        stub = stubs[len(tasks) % len(stubs)]
        tasks.append(asyncio.create_task(_one(stub, cfg, rng, phase, vocab)))
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    phase.wall_s = time.perf_counter() - began
    return phase


async def run(cfg: OverloadConfig) -> dict[str, Any]:
    channels = open_channels(cfg.target, cfg.channels)
    try:
        stubs = [pb_grpc.GenerateServiceStub(channel) for channel in channels]
        vocab = (await stubs[0].GetModelInfo(pb.GetModelInfoRequest(), timeout=30)).vocab_size
        for stub in stubs:  # warm each path end to end
            await _one(stub, cfg, random.Random(0), Phase(), vocab)
        calm, rate = await _unloaded(stubs, cfg, vocab)
        if not rate:
            raise SystemExit(f"no request finished without load: {calm.codes}")
        loaded = await _overload(stubs, cfg, cfg.factor * rate, vocab)
    finally:
        await asyncio.gather(*(channel.close() for channel in channels))
    return {"saturating_req_s": rate, "arrival_req_s": cfg.factor * rate,
            "unloaded": asdict(calm), "overload": asdict(loaded)}


def format_table(cfg: OverloadConfig, result: dict[str, Any]) -> str:
    calm, loaded = result["unloaded"], result["overload"]
    refused = percentiles(loaded["refusals"])
    itl_calm, itl_loaded = percentiles(calm["itl"]), percentiles(loaded["itl"])
    codes = loaded["codes"]
    timeouts = codes.get("DEADLINE_EXCEEDED", 0)
    ratio = itl_loaded["p99"] / itl_calm["p99"] if itl_calm["p99"] else float("nan")
    rows = [
        (f"max running {cfg.max_running}, max queued {cfg.max_queued}; saturating rate "
        f"{result['saturating_req_s']:.2f} req/s (unloaded, {cfg.max_running} clients); arrivals "
        f"{result['arrival_req_s']:.2f} req/s ({cfg.factor:g}x) for {cfg.duration_s:g} s; "
        f"input {cfg.input_len}, output {cfg.output_len} tokens; {cfg.channels} connection(s)"),
        "",
        "| figure | value | target |", "|---|---|---|",
        f"| calls under overload | {sum(codes.values())} "
        f"({', '.join(f'{k} {v}' for k, v in sorted(codes.items()))}) | |",
        f"| refusal latency p50 / p99 (ms) | {refused['p50']:.1f} / {refused['p99']:.1f} "
        "| p99 <= 10 |",
        f"| refusals with retry-after-ms | {loaded['hinted']} of {len(loaded['refusals'])} | all |",
        f"| unloaded ITL p50 / p99 (ms) | {itl_calm['p50']:.1f} / {itl_calm['p99']:.1f} | |",
        (f"| admitted ITL p50 / p99 (ms) under overload | {itl_loaded['p50']:.1f} / "
         f"{itl_loaded['p99']:.1f} "
        f"({ratio:.2f}x unloaded p99) | <= 1.5x |"),
        f"| timeouts without status | {timeouts} | 0 |",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixserve bench overload",
                                description=__doc__.split("\n")[0])
    add_stack_args(p)
    p.add_argument("--max-running", type=int, default=8, help="the server's request slots")
    p.add_argument("--max-queued", type=int, default=8, help="the server's queue limit")
    p.add_argument("--factor", type=float, default=3.0, help="arrival rate / saturating rate")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of overload")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--timeout", type=float, default=60.0, help="client deadline per call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--channels", type=int, default=1,
                   help="client connections, calls spread over them in turn")
    p.add_argument("--json", dest="json_path", help="write the result here")
    args, extra = parse_stack_args(p, argv)
    admission = ["--max-running-requests", str(args.max_running), "--max-queued-requests",
                 str(args.max_queued)]
    with stack(args, admission + extra) as (target, _):
        cfg = OverloadConfig(target, args.max_running, args.max_queued, args.factor,
                             args.duration, args.input_len, args.output_len, args.timeout,
                             args.seed, args.channels)
        result = asyncio.run(run(cfg))
    print(format_table(cfg, result))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"config": asdict(cfg), "result": result}, f, indent=2)
    codes = result["overload"]["codes"]
    refused_otherwise = set(codes) - {"OK", "RESOURCE_EXHAUSTED"}
    return 1 if codes.get("DEADLINE_EXCEEDED", 0) or refused_otherwise else 0


if __name__ == "__main__":
    raise SystemExit(main())
