"""Wire abuse against the shared stack (docs/reliability.md #8, #27, #30): a reader that never
reads, 1000 streams on one connection, a PING flood, a fuzz of mutated GenerateRequest bytes, and a
fuzz of every internal RPC of the tokenizer, scheduler and detokenizer.

The gateway fuzz runs for RADIXSERVE_FUZZ_SECONDS (default 20) and the internal one for
RADIXSERVE_INTERNAL_FUZZ_SECONDS (default 15) in CI; run them longer with, e.g.,
    RADIXSERVE_FUZZ_SECONDS=3600 pytest -q tests/services/test_services_wire.py -k fuzz
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from pathlib import Path

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radixserve.bench.fuzz import ALLOWED, SEEDS, mutate
from radixserve.v1 import generate_pb2_grpc as pb_grpc
from svc_helpers import INTERNAL_SECRET, Stack, acollect, alive, collect, request

OK = grpc.StatusCode.OK
GENERATE = "/radixserve.v1.GenerateService/Generate"


def _rss_kib(pid: int) -> int:
    for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError("VmRSS")


def test_slow_reader_is_flow_controlled_and_others_proceed(stack: Stack) -> None:
    """Streams whose client never reads: the gateway's writes wait on HTTP/2 flow control (its
    per-request buffer is bounded by max_new_tokens), memory stays flat, other calls run, and
    cancelling the readers frees everything (the autouse fixture checks the pool invariant)."""
    gateway = stack.child("gateway")
    before = _rss_kib(gateway)
    with grpc.insecure_channel(stack.target) as lazy:
        stub = pb_grpc.GenerateServiceStub(lazy)
        calls = [stub.Generate(request([5, i], max_new_tokens=1500, ignore_eos=True,
                                       top_logprobs=20, logprobs=True), timeout=120)
                 for i in range(1, 5)]
        time.sleep(0.5)
        res = collect(stack.stub, request("Hello", max_new_tokens=4), timeout=30)
        assert res.code == OK and res.finished.usage.completion_tokens == 4
        time.sleep(2.0)
        growth_mib = (_rss_kib(gateway) - before) / 1024
        assert growth_mib < 64, f"gateway RSS grew {growth_mib:.0f} MiB under unread streams"
        for call in calls:
            call.cancel()
    assert collect(stack.stub, request("Hello", max_new_tokens=2)).code == OK


def test_1000_streams_on_one_connection(stack: Stack) -> None:
    """More streams than fit at once in a batch, all multiplexed on one HTTP/2 connection (the
    server allows 1024 concurrent streams per connection; more would wait in the client)."""

    async def main() -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(stack.target) as channel:
            stub = pb_grpc.GenerateServiceStub(channel)
            results = await asyncio.gather(*(
                acollect(stub, request([5, 1 + i % 900], max_new_tokens=1), timeout=120)
                for i in range(1000)))
        return [r.code for r in results]

    t0 = time.monotonic()
    codes = asyncio.run(main())
    assert codes.count(OK) == 1000, {c: codes.count(c) for c in set(codes)}
    assert time.monotonic() - t0 < 120
    assert collect(stack.stub, request("Hello", max_new_tokens=2)).code == OK


def test_ping_flood_gets_goaway(stack: Stack) -> None:
    """A client that sends PING frames far more often than the gateway allows (no more than one
    every 10 s, two strikes) with no call open: the server answers GOAWAY ENHANCE_YOUR_CALM
    ("too_many_pings") or closes the connection, within a few seconds; new clients are served."""
    import h2.config
    import h2.connection
    import h2.errors
    import h2.events

    sock = socket.create_connection(("127.0.0.1", stack.port), timeout=5)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    goaway: h2.events.ConnectionTerminated | None = None
    closed = False
    pings = 0
    deadline = time.monotonic() + 10
    sock.settimeout(0.01)
    try:
        while goaway is None and not closed and time.monotonic() < deadline:
            try:
                conn.ping(pings.to_bytes(8, "big"))
                pings += 1
                sock.sendall(conn.data_to_send())
            except OSError:  # reset by the server while we were still writing
                closed = True
                break
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
            if not data:
                closed = True
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ConnectionTerminated):
                    goaway = event
            try:  # PING acks of the server's own pings, SETTINGS ack
                sock.sendall(conn.data_to_send())
            except OSError:  # the server closed right after its GOAWAY: also an answer
                closed = True
    finally:
        sock.close()
    assert goaway is not None or closed, f"{pings} pings in 10 s and the connection is still open"
    if goaway is not None:
        assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, goaway
        assert goaway.additional_data == b"too_many_pings", goaway
    with grpc.insecure_channel(stack.target) as fresh:
        res = collect(pb_grpc.GenerateServiceStub(fresh), request("Hello", max_new_tokens=2))
    assert res.code == OK and res.finished.usage.completion_tokens == 2


# -- fuzz ----------------------------------------------------------------------------------------

# The seeds, the mutation scheme and the allowed statuses are `radixserve bench fuzz`'s, which runs
# the same fuzz at a million requests from concurrent calls (docs/reliability.md, Targets: Fuzz).


def test_fuzz_generate_with_mutated_bytes(stack: Stack) -> None:
    budget_s = float(os.environ.get("RADIXSERVE_FUZZ_SECONDS", "20"))
    generate = stack.channel.unary_stream(GENERATE)  # identity serializers: raw bytes
    seen: dict[grpc.StatusCode, int] = {}

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(seed=st.sampled_from(SEEDS) | st.binary(max_size=64),
           edits=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1 << 16),
                                    st.integers(0, 255)), max_size=6))
    def one(seed: bytes, edits: list[tuple[int, int, int]]) -> None:
        payload = mutate(seed, edits)
        try:
            for _ in generate(payload, timeout=5):
                pass
            code = OK
        except grpc.RpcError as exc:
            code = exc.code()
        seen[code] = seen.get(code, 0) + 1
        assert code in ALLOWED, (code, payload)

    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        one()
    assert sum(seen.values()) >= 100 and seen.get(grpc.StatusCode.INVALID_ARGUMENT), seen
    assert collect(stack.stub, request("Hello", max_new_tokens=2)).code == OK


def test_bench_fuzz_smoke(stack: Stack) -> None:
    """`radixserve bench fuzz` for a few hundred requests: every status allowed, the probe after
    each batch served, all four services alive, the pool invariant at the end."""
    from radixserve.bench import fuzz as bench_fuzz
    from radixserve.bench.process import SERVICES

    cfg = bench_fuzz.FuzzConfig(stack.target, requests=300, concurrency=16, batch=100, seed=1)
    result = asyncio.run(bench_fuzz.run(cfg, serve_pid=stack.proc.pid, log=lambda _: None))
    table = bench_fuzz.format_table(cfg, result)
    assert result.passed, table
    assert result.requests == 300 and result.batches == 3, table
    assert result.statuses.get("INVALID_ARGUMENT") and result.statuses.get("OK"), table
    assert set(result.processes) == set(SERVICES), table
    assert [len(point) for point in result.rss_trace] == [6, 6, 6], result.rss_trace


def _internal_methods() -> list[tuple[str, str, bool, bool, list[bytes]]]:
    """(service, method path, client streaming, server streaming, valid seed messages) for every
    RPC of the internal services."""
    from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as detok
    from radixserve.internal.scheduler.v1 import scheduler_pb2 as sched
    from radixserve.internal.tokenizer.v1 import tokenizer_pb2 as tok

    seeds = {
        "TokenizerService.Process": [
            tok.ProcessRequest(jobs=[
                tok.Job(job_id="f1", encode_text=tok.EncodeText(text="Hello world")),
                tok.Job(job_id="f2", encode_chat=tok.EncodeChat(
                    messages=[tok.ChatMessage(role="user", content="Hi")],
                    add_generation_prompt=True)),
                tok.Job(job_id="f3", decode=tok.Decode(token_ids=[5, 6, 7]))])],
        "SchedulerService.Submit": [
            sched.SubmitRequest(requests=[sched.NewRequest(
                request_id="fuzz-1", prompt_ids=[5, 6, 7],
                sampling=sched.SamplingParams(max_new_tokens=2, top_k=3, temperature=0.5))]),
            sched.SubmitRequest(abort_ids=["fuzz-1", "nobody"])],
        "DetokenizerService.Process": [
            detok.ProcessRequest(
                aborted_ids=["fuzz-0"],
                setups=[detok.RequestSetup(request_id="fuzz-2", prompt_ids=[5, 6],
                                           options=detok.RequestOptions(stop=["x"]))],
                outputs=[detok.TokenOutput(request_id="fuzz-2", token_ids=[7, 8], prompt_tokens=2,
                                           finish_reason=detok.FINISH_REASON_LENGTH)])],
    }
    methods = []
    for name, module in (("tokenizer", tok), ("scheduler", sched), ("detokenizer", detok)):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                empty = m.input_type._concrete_class().SerializeToString()
                valid = [msg.SerializeToString()
                         for msg in seeds.get(f"{service.name}.{m.name}", [])]
                methods.append((name, f"/{service.full_name}/{m.name}", m.client_streaming,
                                m.server_streaming, [empty, *valid]))
    return methods


def _call_raw(channel: grpc.Channel, method: str, client_streaming: bool, server_streaming: bool,
              payload: bytes, metadata: tuple, timeout: float) -> tuple[grpc.StatusCode, str]:
    """One call with raw bytes (identity serializers); a stream sends the payload, half-closes."""
    try:
        if client_streaming and server_streaming:
            for _ in channel.stream_stream(method)(iter([payload]), metadata=metadata,
                                                   timeout=timeout):
                pass
        elif server_streaming:
            for _ in channel.unary_stream(method)(payload, metadata=metadata, timeout=timeout):
                pass
        elif client_streaming:
            channel.stream_unary(method)(iter([payload]), metadata=metadata, timeout=timeout)
        else:
            channel.unary_unary(method)(payload, metadata=metadata, timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return OK, ""


def test_fuzz_internal_endpoints(stack: Stack) -> None:
    """docs/reliability.md #27: random bytes and truncated or mutated valid messages on every
    internal RPC. Each call ends with a status: UNAUTHENTICATED without the secret (before any
    parsing), else a clean refusal or a normal end; no service dies and the gateway keeps
    serving."""
    from radixserve.services.common.auth import METADATA_KEY

    budget_s = float(os.environ.get("RADIXSERVE_INTERNAL_FUZZ_SECONDS", "15"))
    secret = ((METADATA_KEY, INTERNAL_SECRET),)
    pids = {name: stack.child(name)
            for name in ("tokenizer", "detokenizer", "scheduler", "gateway")}
    methods = _internal_methods()
    channels = {name: grpc.insecure_channel(stack.internal_address(name))
                for name in ("tokenizer", "scheduler", "detokenizer")}
    seen: dict[tuple[str, grpc.StatusCode], int] = {}
    try:
        for name, method, cs, ss, seeds in methods:
            for metadata in ((), ((METADATA_KEY, INTERNAL_SECRET + "x"),)):
                code, _ = _call_raw(channels[name], method, cs, ss, b"\xff\x00garbage", metadata, 5)
                assert code == grpc.StatusCode.UNAUTHENTICATED, (method, metadata, code)

        @settings(max_examples=100, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(which=st.integers(0, len(methods) - 1), data=st.data(),
               edits=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1 << 16),
                                        st.integers(0, 255)), max_size=6))
        def one(which: int, data: st.DataObject, edits: list[tuple[int, int, int]]) -> None:
            seeds = methods[which][4]
            probe(which, mutate(data.draw(st.sampled_from(seeds) | st.binary(max_size=64)), edits))

        def probe(which: int, payload: bytes) -> None:
            name, method, cs, ss, _ = methods[which]
            # Subscribe never ends by itself: a short deadline ends it once the request parsed.
            code, details = _call_raw(channels[name], method, cs, ss, payload, secret, 2)
            seen[(method, code)] = seen.get((method, code), 0) + 1
            clean = (code in (OK, grpc.StatusCode.INVALID_ARGUMENT,
                              grpc.StatusCode.DEADLINE_EXCEEDED)
                     or (code == grpc.StatusCode.INTERNAL and "deserializ" in details))
            assert clean, (method, code, details, payload)

        # Every method at least once, whatever the random draws reach in the time budget.
        for which, method in enumerate(methods):
            probe(which, mutate(method[4][0], []))
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            one()
    finally:
        for channel in channels.values():
            channel.close()
    assert {m for m, _ in seen} == {m for _, m, _, _, _ in methods}, seen
    assert any(code != OK for _, code in seen), seen
    for name, pid in pids.items():
        assert alive(pid), f"the {name} died"
    assert collect(stack.stub, request("Hello", max_new_tokens=2)).code == OK


def test_scheduler_exports_retractions_and_step_costs(stack: Stack) -> None:
    import urllib.request

    assert stack.metrics_port is not None
    assert collect(stack.stub, request("Hello", max_new_tokens=2)).code == OK  # a forward ran
    url = f"http://127.0.0.1:{stack.metrics_port + 1}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    assert "# TYPE radixserve_retractions_total counter" in text
    assert "radixserve_retractions_total 0.0" in text  # this stack never runs short of pages
    # the prefill cap of steps that decode is off where such steps run eagerly (the CPU)
    assert "# TYPE radixserve_decode_step_seconds gauge" in text
    assert "radixserve_mixed_prefill_cap 0.0" in text
    assert "radixserve_long_prompt_chunk 0.0" in text
    assert "# TYPE radixserve_engine_step_seconds histogram" in text
    # every forward so far ran eagerly (no graphs on a CPU), and was counted so
    assert 'radixserve_engine_forwards_total{path="decode_graph"} 0.0' in text
    eager = re.search(r'radixserve_engine_forwards_total\{path="eager"\} (\S+)', text)
    assert eager and float(eager.group(1)) > 0, text
    assert 'radixserve_gc_pause_seconds_count{generation="2"}' in text
