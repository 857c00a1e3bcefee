"""`radixserve bench abort`: client cancel -> the scheduler has freed the request, at N running.

The abort-latency target (docs/reliability.md, Targets): <= 2 engine steps and <= 100 ms p99 at 256
running requests. The bench opens --running streams (token-id prompts, ignore_eos, long enough to
outlast the run) and reads them as a client that shows its tokens would (--unread: not at all),
waits until the scheduler runs all of them and then --settle-s more (the last admissions' first
tokens still crossing the plane are a burst, not the running state the target names), then
cancels --cancels of them one at a time. One Python client reads some 20k tokens a second, less
than 256 streams of a GPU's decode steps carry, and a client that falls behind delays its own
cancels; with --processes P, P - 1 reader processes
hold and read the streams that stay, and this one holds only those it cancels. For each
it polls the scheduler's Prometheus endpoint (`radixserve_running_requests`,
`radixserve_engine_steps_total`) until the running count drops by one: the time from the cancel to
that snapshot, and the engine steps run between the cancel and the free (the client's loop reads
the step count right before it cancels, so its own lag is not counted). The scheduler publishes
the snapshot as soon as it has freed aborted requests (within the step in progress), so the
milliseconds are the client -> gateway -> scheduler path plus the wait for the engine loop to
drain it, plus up to one HTTP poll (every 2 ms). The steps are counted to the free itself
(`radixserve_engine_steps_at_last_free`): a step that ran between the free and the poll that saw
it is not counted. Of the milliseconds, the client's own lag (from the bench's cancel to the
call's loop making it) is shown apart, and so are the aborts' own times in the services, from
their histograms read around the cancels: in a gateway from the call's end to the abort written
to the scheduler (`radixserve_abort_sent_seconds`), in the scheduler from its receipt to the free
(`radixserve_abort_seconds`). What is left is the cancel's way from the client to the gateway's
handler, and the write's to the scheduler.
With --launch, serve gets --max-running-requests and --metrics-port.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
from radixserve.bench.process import add_stack_args, parse_stack_args, percentiles, stack
from radixserve.bench.prometheus import ENGINE_STEPS, Reading, observed_ms, served_metrics
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc

T = TypeVar("T")


POLLED = ("radixserve_running_requests", ENGINE_STEPS, "radixserve_engine_steps_at_last_free")
POLL_QUERY = urllib.parse.urlencode([("name[]", name) for name in POLLED])


def scrape(url: str) -> tuple[int, int, int]:
    """(running requests, engine steps, engine steps when an abort last freed a request) from
    the scheduler's metrics. Only these are asked for (`name[]`): a full scrape builds the
    engine's histograms too, in the scheduler process, every poll."""
    reading = Reading.take([f"{url}?{POLL_QUERY}"])
    running, steps, at_free = (int(reading.total(name)) for name in POLLED)
    return running, steps, at_free


class _Streams:
    """The bench's streams, held by an asyncio loop on a thread of its own, so that the main
    thread can poll the metrics and time each cancel. A client that shows its tokens reads every
    stream to its end (`read`); one that does not leaves them to fill their flow-control windows,
    and the gateway's writes to them then wait (a slow consumer)."""

    def __init__(self, target: str, channels: int, running: int, output_len: int, seed: int,
                 read: bool) -> None:
        self.failures: list[str] = []  # statuses other than the cancels this bench makes
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="bench-streams")
        self._thread.start()
        self._channels: list[grpc.aio.Channel] = []
        self._readers: list[asyncio.Future[None]] = []
        self.calls: list[Any] = []
        try:
            self.calls = self._run(self._open(target, channels, running, output_len, seed, read))
        except BaseException:
            self.close()  # the loop's thread and what was opened before the failure
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _open(self, target: str, channels: int, running: int, output_len: int, seed: int,
                    read: bool) -> list[Any]:
        rng = random.Random(seed)
        # a local subchannel pool each: channels to one target would otherwise share a connection
        self._channels = [grpc.aio.insecure_channel(
            target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(channels)]
        stubs = [pb_grpc.GenerateServiceStub(channel) for channel in self._channels]
        vocab = (await stubs[0].GetModelInfo(pb.GetModelInfoRequest(), timeout=30)).vocab_size
        calls = []
        for i in range(running):
            req = pb.GenerateRequest(token_ids=pb.TokenIds(
                ids=[rng.randrange(1, min(vocab, 10000)) for _ in range(8)]))
            req.stopping.max_new_tokens = output_len
            req.stopping.ignore_eos = True
            calls.append(stubs[i % channels].Generate(req, timeout=600))
        if read:
            self._readers = [asyncio.ensure_future(self._read(call)) for call in calls]
        return calls

    async def _read(self, call: Any) -> None:
        try:
            async for _ in call:
                pass
        except asyncio.CancelledError:  # this bench's own cancel
            return
        except grpc.aio.AioRpcError as e:
            self.failures.append(f"{e.code().name}: {e.details()}")

    def cancel(self, call: Any,
               steps: Callable[[], int]) -> concurrent.futures.Future[tuple[float, int]]:
        """Cancel `call` on its loop (aio calls belong to it); the future gives when the cancel
        was made there (time.monotonic), after whatever the loop had queued before it, and what
        `steps()` (the engine steps finished) read on the loop right before it."""
        made: concurrent.futures.Future[tuple[float, int]] = concurrent.futures.Future()

        def cancel() -> None:
            step0 = steps()
            made.set_result((time.monotonic(), step0))
            call.cancel()

        self.loop.call_soon_threadsafe(cancel)
        return made

    def close(self) -> None:
        async def _close() -> None:
            for call in self.calls:
                call.cancel()
            await asyncio.gather(*self._readers)
            await asyncio.gather(*(channel.close() for channel in self._channels))

        try:
            self._run(_close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


def _hold(target: str, channels: int, count: int, output_len: int, seed: int, read: bool,
          stop: Any, failures: Any) -> None:
    """A reader process: `count` streams of its own, held (and read) until `stop` is set; their
    failures go back through the `failures` queue."""
    streams = _Streams(target, channels, count, output_len, seed, read)
    try:
        stop.wait()
    finally:
        streams.close()
        failures.put(streams.failures)


class _Readers:
    """`processes` spawned readers sharing `count` streams (spawn: a forked grpc runtime is not
    safe to use in the child)."""

    def __init__(self, target: str, channels: int, count: int, output_len: int, seed: int,
                 read: bool, processes: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._stop, self._failures = ctx.Event(), ctx.Queue()
        shares = [count // processes + (i < count % processes) for i in range(processes)]
        self._procs = [ctx.Process(target=_hold, daemon=True, name=f"bench-reader-{i}", args=(
            target, channels, n, output_len, seed + 1 + i, read, self._stop, self._failures))
            for i, n in enumerate(shares) if n]
        for proc in self._procs:
            proc.start()

    def alive(self) -> bool:
        return all(proc.is_alive() for proc in self._procs)

    def close(self) -> list[str]:
        """Stop every reader; the failures they saw (a reader that died counts as one)."""
        self._stop.set()
        failures: list[str] = []
        for proc in self._procs:
            proc.join(60)
            if proc.is_alive() or proc.exitcode != 0:
                proc.kill()
                failures.append(f"{proc.name} exited with {proc.exitcode}")
        while not self._failures.empty():
            failures.extend(self._failures.get())
        return failures


def measure(target: str, metrics_url: str, running: int, cancels: int, output_len: int,
            seed: int = 0, channels: int = 1, read: bool = True,
            processes: int = 1, gateway_urls: tuple[str, ...] = (),
            settle_s: float = 0.0) -> dict[str, Any]:
    """`channels` client connections (in each process) carry the streams in turn (a server with
    several gateways on one port serves each connection on one of them); `read`: whether the
    client reads them; `processes` > 1: the streams not cancelled are held by that many - 1
    reader processes; `gateway_urls`: the gateways' metrics, whose abort timing (and the
    scheduler's) is read around the cancels (`hops`); `settle_s`: how long the streams run once
    all are running before the first cancel."""
    readers = None
    if processes > 1:
        readers = _Readers(target, channels, running - cancels, output_len, seed, read,
                           processes - 1)
    try:
        streams = _Streams(target, channels, running if readers is None else cancels,
                           output_len, seed, read)
    except BaseException:
        if readers is not None:
            readers.close()
        raise
    try:
        deadline = time.monotonic() + 300
        while scrape(metrics_url)[0] < running:
            dead = readers is not None and not readers.alive()
            if time.monotonic() > deadline or streams.failures or dead:
                why = ("a reader process died" if dead
                       else streams.failures[:3] or "no stream failed")
                raise SystemExit(f"the scheduler never ran {running} requests at once ({why})")
            time.sleep(0.05)
        time.sleep(settle_s)
        if scrape(metrics_url)[0] != running:
            raise SystemExit("a request finished while the streams settled; raise --output-len")
        ms, lags, steps, channel_of = [], [], [], []
        doomed = random.Random(seed).sample(streams.calls, cancels)
        hops_before = Reading.take([metrics_url, *gateway_urls])
        began, first_step = time.monotonic(), scrape(metrics_url)[1]
        for call in doomed:
            before, _, _ = scrape(metrics_url)
            t0 = time.monotonic()
            made = streams.cancel(call, lambda: scrape(metrics_url)[1])
            while True:
                now_running, _, step = scrape(metrics_url)
                if now_running < before:
                    break
                time.sleep(0.002)  # polls take the scheduler's GIL: do not starve its engine
            ms.append(time.monotonic() - t0)
            made_at, step0 = made.result(10)
            lags.append(made_at - t0)
            steps.append(step - step0)
            # which channel (gateway connection) carried it: a slow first cancel on each shows
            channel_of.append(streams.calls.index(call) % channels)
            if now_running != before - 1:  # another request ended on its own: not measurable
                raise SystemExit("a request finished during the run; raise --output-len")
        step_ms = (time.monotonic() - began) * 1000 / max(1, scrape(metrics_url)[1] - first_step)
        hops = _hops(hops_before, metrics_url, gateway_urls, cancels)
    finally:
        streams.close()
        if readers is not None:
            streams.failures.extend(readers.close())
    if streams.failures:
        raise SystemExit(f"{len(streams.failures)} streams failed: {streams.failures[:3]}")
    return {"running": running, "channels": channels, "processes": processes, "read": read,
            "cancels": cancels, "settle_s": settle_s,
            "ms": percentiles(ms), "client_lag_ms": percentiles(lags), "step_ms": step_ms,
            "hops": hops,
            "steps": {"p50": sorted(steps)[len(steps) // 2], "p99": _p99(steps), "max": max(steps)},
            # every cancel in the order made: where in the run the slow ones fall
            "each": [{"ms": round(t * 1000, 2), "lag_ms": round(lag * 1000, 2), "steps": n,
                      "channel": c} for t, lag, n, c in zip(ms, lags, steps, channel_of)]}


def _hops(before: Reading, scheduler_url: str, gateway_urls: tuple[str, ...],
          cancels: int) -> dict[str, Any]:
    """The aborts' own timing over the cancels, from the services' histograms (`before`: read
    from the scheduler and the gateways ahead of them): in the gateways, from the call's end to
    the abort written to the scheduler (a gateway counts it just after the scheduler may have
    freed it: waited for, a second at most; None without gateway_urls); in the scheduler, from its
    receipt to the free."""
    deadline = time.monotonic() + 1.0
    while True:
        after = Reading.take([scheduler_url, *gateway_urls])
        sent = observed_ms(before, after, "radixserve_abort_sent_seconds")
        if not gateway_urls or sent["count"] >= cancels or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    freed = observed_ms(before, after, "radixserve_abort_seconds", (("source", "gateway"),))
    return {"gateway_ms": sent if gateway_urls else None, "scheduler_ms": freed}


def _p99(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def format_table(r: dict[str, Any]) -> str:
    return "\n".join([
        (f"{r['cancels']} cancels, one at a time, at {r['running']} running requests, their "
        f"streams {'read' if r['read'] else 'unread'} by {r['processes']} client process(es), "
        f"the first cancel {r.get('settle_s', 0):g} s after all ran "
        f"(engine step: {r['step_ms']:.1f} ms on "
        "average during the run)"),
        "",
        "| cancel -> freed | p50 | p99 | max | target |", "|---|---|---|---|---|",
        f"| ms | {r['ms']['p50']:.1f} | {r['ms']['p99']:.1f} | | <= 100 p99 |",
        f"| of it, the client's own lag before its cancel went out (ms) | "
        f"{r['client_lag_ms']['p50']:.1f} | {r['client_lag_ms']['p99']:.1f} | | |",
        *_hop_rows(r.get("hops") or {}),
        f"| engine steps | {r['steps']['p50']} | {r['steps']['p99']} | {r['steps']['max']} "
        "| <= 2 |",
        "",
        "over 2 steps (#cancel in the run, channel: steps, ms): " + (", ".join(
            f"#{i} c{e['channel']}: {e['steps']}, {e['ms']:.1f}"
            for i, e in enumerate(r["each"]) if e["steps"] > 2) or "none"),
    ])


def _hop_rows(hops: dict[str, Any]) -> list[str]:
    """The table's rows of the aborts' own timing (`_hops`), where it was read."""
    rows = []
    for key, what in (("gateway_ms", "in a gateway, from the call's end to the abort written"),
                      ("scheduler_ms", "in the scheduler, from the abort's receipt to the free")):
        q = hops.get(key)
        if q and q["count"]:
            rows.append(f"| of it, {what} (ms) | {q['p50']:.1f} | {q['p99']:.1f} | | |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="radixserve bench abort", description=__doc__.split("\n")[0])
    add_stack_args(p)
    p.add_argument("--metrics", default=None,
                   help="the scheduler's metrics URL (serve: http://HOST:METRICS_PORT+1/metrics)")
    p.add_argument("--running", type=int, default=256, help="requests running when cancelling")
    p.add_argument("--cancels", type=int, default=64)
    p.add_argument("--output-len", type=int, default=200,
                   help="max_new_tokens of every stream; must outlast the run")
    p.add_argument("--channels", type=int, default=1,
                   help="client connections the streams are spread over (serve --gateways K "
                        "serves each connection on one of its gateways)")
    p.add_argument("--processes", type=int, default=1,
                   help="client processes: P - 1 of them hold and read the streams that are not "
                        "cancelled, this one those it cancels")
    p.add_argument("--unread", action="store_true",
                   help="leave the streams unread, as a client that stopped reading (the "
                        "gateway's writes then wait on full flow-control windows)")
    p.add_argument("--settle-s", type=float, default=1.0,
                   help="how long the streams run once all are running, before the first cancel "
                        "(the last admissions' first tokens are still crossing the plane then)")
    p.add_argument("--json", dest="json_path", help="write the result here")
    args, extra = parse_stack_args(p, argv)
    if not args.launch and not args.metrics:
        p.error("--metrics is needed with --target")
    if not 0 < args.cancels <= args.running:
        p.error("need 0 < --cancels <= --running")
    if args.processes < 1:
        p.error("need --processes >= 1")
    url, serve_flags, gateways = args.metrics, extra, []
    if args.launch:
        serve_flags, gateways, schedulers = served_metrics(
            ["--max-running-requests", str(args.running), *extra])
        url = schedulers[0]
    with stack(args, serve_flags) as (target, _):
        result = measure(target, url, args.running, args.cancels, args.output_len,
                         channels=args.channels, read=not args.unread,
                         processes=args.processes, gateway_urls=tuple(gateways),
                         settle_s=args.settle_s)
    print(format_table(result))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(result, f, indent=2)
    ok = result["steps"]["max"] <= 2 and result["ms"]["p99"] <= 100
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
