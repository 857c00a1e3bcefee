"""Wire abuse against the shared stack (RELIABILITY 8, 30): a reader that never reads, 1000
streams on one connection, and a fuzz of mutated GenerateRequest bytes.

The fuzz runs for RADIXSERVE_FUZZ_SECONDS (default 20) in CI; run it longer with, e.g.,
    RADIXSERVE_FUZZ_SECONDS=3600 pytest -q tests/services/test_services_wire.py -k fuzz
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radixserve.v1 import generate_pb2_grpc as pb_grpc
from svc_helpers import Stack, acollect, collect, request

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


# -- fuzz ----------------------------------------------------------------------------------------

SEEDS = [
    request("Hello world", max_new_tokens=2).SerializeToString(),
    request([5, 6, 7], max_new_tokens=1, temperature=0.5, top_k=3, seed=1).SerializeToString(),
    request([("user", "Hi"), ("assistant", "Yo")], max_new_tokens=2).SerializeToString(),
    request("abc", max_new_tokens=2, stop=["x"], stop_token_ids=[3], top_logprobs=2,
            request_id="r").SerializeToString(),
]
# What a mutated request may end with: a clean refusal, success, or its deadline. Never INTERNAL
# or UNKNOWN (a crash in our code) and never UNAVAILABLE (the server going down).
ALLOWED = {OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
           grpc.StatusCode.DEADLINE_EXCEEDED}


def _mutate(seed: bytes, edits: list[tuple[int, int, int]]) -> bytes:
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
            data[at % len(data)] = value  # overwrite (varint lengths, tags)
    return bytes(data)


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
        payload = _mutate(seed, edits)
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


def test_scheduler_exports_retractions(stack: Stack) -> None:
    import urllib.request

    assert stack.metrics_port is not None
    url = f"http://127.0.0.1:{stack.metrics_port + 1}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    assert "# TYPE radixserve_retractions_total counter" in text
    assert "radixserve_retractions_total 0.0" in text  # this stack never runs short of pages
