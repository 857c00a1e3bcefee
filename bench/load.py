"""The serving bench's load generator: requests sent under a concurrency cap at a Poisson arrival
rate, each one timed (TTFT, every inter-token gap, E2E).

One asyncio loop in one process reads every token of every stream, so at tens of thousands of
tokens a second the client itself would set the pace. `LoadPool` with processes > 1 splits each
level over worker processes started once (before any level is timed): worker i sends every P-th
request with 1/P of the concurrency and 1/P of the rate (P independent Poisson streams at rate/P
add up to one at rate), over connections of its own. Each send also counts the CPU the client
spent on it (every process that sent, all their threads), since a client on the server's machine
takes cores that the services would otherwise have; like the services, the client runs on uvloop
where it is installed (RADIXSERVE_EVENT_LOOP), which costs it less CPU per message.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import grpc
from radixserve.services.common.lifecycle import run_event_loop
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc

Work = Sequence[tuple[list[int], int]]  # (prompt ids, max new tokens) per request


@dataclass
class RequestRecord:
    ok: bool
    output_tokens: int = 0
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str = ""
    prompt_tokens: int = 0  # summed over the Finished events (one per completion)
    cached_tokens: int = 0


@dataclass(frozen=True)
class Shape:
    """How a level's requests are sent: at most `concurrency` at once, Poisson arrivals at `rate`
    requests a second (inf: all at once), over `channels` connections."""

    concurrency: int
    rate: float
    temperature: float
    n: int
    seed: int
    channels: int = 1


async def one_request(stub: pb_grpc.GenerateServiceStub, prompt: list[int], max_new: int,
                      temperature: float, n: int = 1) -> RequestRecord:
    req = pb.GenerateRequest(token_ids=pb.TokenIds(ids=prompt))
    req.stopping.max_new_tokens = max_new
    req.stopping.ignore_eos = True
    req.sampling.temperature = temperature
    if n > 1:
        req.sampling.n = n
    record = RequestRecord(ok=False)
    start = time.perf_counter()
    last: dict[int, float] = {}  # per completion: when its previous token came
    try:
        async for response in stub.Generate(req):
            if response.HasField("finished"):
                record.prompt_tokens += response.finished.usage.prompt_tokens
                record.cached_tokens += response.finished.usage.cached_tokens
            if not response.HasField("delta") or not response.delta.token_ids:
                continue
            now = time.perf_counter()
            if record.output_tokens == 0:
                record.ttft_s = now - start
            if response.index in last:
                record.itl_s.append(now - last[response.index])
            last[response.index] = now
            record.output_tokens += len(response.delta.token_ids)
    except grpc.aio.AioRpcError as exc:
        record.error = f"{exc.code().name}: {exc.details()}"
        return record
    record.e2e_s = time.perf_counter() - start
    record.ok = True
    return record


def open_channels(target: str, count: int) -> list[grpc.aio.Channel]:
    # A local subchannel pool each: channels to one target would otherwise share a connection.
    return [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(count)]


async def send(stubs: Sequence[pb_grpc.GenerateServiceStub], work: Work,
               shape: Shape) -> list[RequestRecord]:
    """Every request of `work`, in order, spread over `stubs` in turn."""
    gate = asyncio.Semaphore(shape.concurrency)
    rng = random.Random(shape.seed)

    async def limited(stub: pb_grpc.GenerateServiceStub, prompt: list[int],
                      max_new: int) -> RequestRecord:
        async with gate:
            return await one_request(stub, prompt, max_new, shape.temperature, shape.n)

    tasks = []
    for i, (prompt, max_new) in enumerate(work):
        tasks.append(asyncio.create_task(limited(stubs[i % len(stubs)], prompt, max_new)))
        if shape.rate != float("inf"):
            await asyncio.sleep(rng.expovariate(shape.rate))
    return list(await asyncio.gather(*tasks))


def _ready() -> None:
    pass


def _send_share(target: str, work: Work, shape: Shape) -> tuple[list[RequestRecord], float]:
    """A worker process's part of a level (its own event loop and connections), and the CPU
    seconds the worker spent on it."""
    async def main() -> list[RequestRecord]:
        channels = open_channels(target, shape.channels)
        try:
            return await send([pb_grpc.GenerateServiceStub(c) for c in channels], work, shape)
        finally:
            for channel in channels:
                await channel.close()

    cpu_before = time.process_time()
    records = run_event_loop(main())
    return records, time.process_time() - cpu_before


@dataclass
class Sent:
    """A level's records in the order of its work, and the client's CPU seconds sending it."""

    records: list[RequestRecord]
    cpu_s: float


class LoadPool:
    """Sends a level from this process (processes == 1) or from `processes` workers."""

    def __init__(self, target: str, stubs: Sequence[pb_grpc.GenerateServiceStub],
                 processes: int) -> None:
        self._target = target
        self._stubs = stubs
        self._processes = processes
        self._pool: ProcessPoolExecutor | None = None
        if processes > 1:
            # spawn: a forked grpc runtime is not safe to use in the child.
            self._pool = ProcessPoolExecutor(processes, multiprocessing.get_context("spawn"))
            for f in [self._pool.submit(_ready) for _ in range(processes)]:
                f.result()  # workers started, this module imported, before the first level

    async def send(self, work: Work, shape: Shape) -> Sent:
        if self._pool is None:
            cpu_before = time.process_time()
            records = await send(self._stubs, work, shape)
            return Sent(records, time.process_time() - cpu_before)
        p = self._processes
        shares = [list(work[i::p]) for i in range(p)]
        loop = asyncio.get_running_loop()
        parts = await asyncio.gather(*(
            loop.run_in_executor(self._pool, _send_share, self._target, share, Shape(
                max(1, shape.concurrency // p + (i < shape.concurrency % p)), shape.rate / p,
                shape.temperature, shape.n, shape.seed + i, max(1, shape.channels // p)))
            for i, share in enumerate(shares) if share))
        # Back in the order of `work`: request j was worker (j % p)'s (j // p)-th.
        records: list[RequestRecord] = [RequestRecord(ok=False)] * len(work)
        for i, (part, _) in enumerate(parts):
            records[i::p] = part
        return Sent(records, sum(cpu_s for _, cpu_s in parts))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
