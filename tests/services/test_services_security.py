"""Security and overload at the public edge (docs/reliability.md #8, #15, #17, #29, #30): the API
key, TLS and mutual TLS, bounded queues with a retry hint, infeasible requests, and the gateway's
limits.

One "locked" stack serves the key, TLS and the small queue: --api-key, a throwaway certificate
made here with the openssl CLI, one request slot, one queue place, a 32-page KV pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc
from svc_helpers import Stack, request, wait_idle

KEY = "test-key-0123456789abcdef"
GOOD = (("authorization", f"Bearer {KEY}"),)
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
# Client-side refusal latency in the test. The figure is <= 10 ms p99 (`radixserve bench
# overload`, docs/benchmarks.md); CI shares 2 cores with other runs, whose load spikes stretch
# single calls past 10 ms, so the test holds p99 to a looser bound and p50 to the figure (the
# gateway refuses in about 1 ms; a refusal that waits for an engine step took 5-15 ms p50 here).
REFUSAL_P50_S = 0.01
REFUSAL_P99_S = 0.15


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by
    the CA; EC keys, valid for a day."""
    d = tmp_path_factory.mktemp("certs")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
             "-days", "1", "-subj", "/CN=radixserve test CA")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
                 "-subj", f"/CN={name}")
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                 "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
                 "-out", str(d / f"{name}.pem"), "-extfile", str(d / "san.ext"))
    return d


def _secure_channel(target: str, certs: Path, client_cert: bool = False) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        (certs / "ca.pem").read_bytes(),
        (certs / "client.key").read_bytes() if client_cert else None,
        (certs / "client.pem").read_bytes() if client_cert else None,
    )
    return grpc.secure_channel(target, creds)


@pytest.fixture(scope="module")
def locked(certs: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, grpc.Channel]]:
    log = tmp_path_factory.mktemp("locked") / "serve.log"
    s = Stack("--api-key", KEY, "--tls-cert", str(certs / "server.pem"),
              "--tls-key", str(certs / "server.key"), "--max-running-requests", "1",
              "--max-queued-requests", "1", "--num-pages", "32", log_path=log)
    channel = _secure_channel(s.target, certs)
    try:
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 240
        while True:
            assert s.proc.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "locked stack did not become ready"
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=2)  # no key needed
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        yield s, channel
        _wait_idle(pb_grpc.GenerateServiceStub(channel))
    finally:
        channel.close()
        assert s.stop() == 0, log.read_text()[-4000:]


def _wait_idle(stub: pb_grpc.GenerateServiceStub) -> None:
    deadline = time.monotonic() + 15
    while True:
        info = stub.GetServerInfo(pb.GetServerInfoRequest(), metadata=GOOD, timeout=5)
        if (info.running_requests == info.waiting_requests == info.gateway_live_requests == 0
                and info.kv_pages_free + info.kv_pages_evictable == info.kv_pages_total):
            return
        assert time.monotonic() < deadline, f"not idle: {info}"
        time.sleep(0.05)


# -- API key and TLS (docs/reliability.md #29) -----------------------------------------------------

PUBLIC_METHODS = [
    (f"/radixserve.v1.GenerateService/{m.name}", m.server_streaming)
    for m in pb.DESCRIPTOR.services_by_name["GenerateService"].methods
]
WRONG_KEYS = [
    (),
    (("authorization", f"Bearer {KEY}x"),),
    (("authorization", f"Bearer {KEY[:-1]}"),),
    (("authorization", f"bearer {KEY}"),),
    (("authorization", f"Bearer {KEY.upper()}"),),
    (("authorization", KEY),),
    (("x-api-key", KEY),),
]


def _code(channel: grpc.Channel, method: str, streaming: bool, payload: bytes,
          metadata: tuple) -> grpc.StatusCode:
    try:
        if streaming:
            for _ in channel.unary_stream(method)(payload, metadata=metadata, timeout=10):
                pass
        else:
            channel.unary_unary(method)(payload, metadata=metadata, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_every_public_rpc_needs_the_key(locked: tuple[Stack, grpc.Channel]) -> None:
    _, channel = locked
    for method, streaming in PUBLIC_METHODS:
        for metadata in WRONG_KEYS:
            assert _code(channel, method, streaming, b"", metadata) == UNAUTH, (method, metadata)
        # Refused before parsing: garbage from a caller without the key is still UNAUTHENTICATED.
        assert _code(channel, method, streaming, b"\xff\x00garbage", ()) == UNAUTH
    stub = pb_grpc.GenerateServiceStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
    assert err.value.code() == UNAUTH and "Bearer" in (err.value.details() or "")
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=GOOD, timeout=5).vocab_size > 0
    done = list(stub.Generate(request("Hi", max_new_tokens=2), metadata=GOOD, timeout=30))
    assert done[-1].HasField("finished")


def test_reflection_needs_the_key_and_health_does_not(locked: tuple[Stack, grpc.Channel]) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    _, channel = locked
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    with pytest.raises(grpc.RpcError) as err:
        list(stub.ServerReflectionInfo(iter([ask]), timeout=5))
    assert err.value.code() == UNAUTH
    replies = list(stub.ServerReflectionInfo(iter([ask]), metadata=GOOD, timeout=5))
    names = {s.name for s in replies[0].list_services_response.service}
    assert "radixserve.v1.GenerateService" in names
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_key_compare_time_does_not_depend_on_the_prefix(locked: tuple[Stack, grpc.Channel]) -> None:
    """A coarse timing check: keys wrong at the first or the last character take the same time
    (hmac.compare_digest; network noise dominates, so only a gross difference would fail)."""
    _, channel = locked
    call = channel.unary_unary("/radixserve.v1.GenerateService/GetModelInfo")

    def median_s(key: str) -> float:
        times = []
        for _ in range(40):
            t0 = time.perf_counter()
            with pytest.raises(grpc.RpcError):
                call(b"", metadata=(("authorization", f"Bearer {key}"),), timeout=5)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    early, late = median_s("X" + KEY[1:]), median_s(KEY[:-1] + "X")
    assert abs(early - late) < max(early, late) * 0.5 + 0.002


def test_python_client_over_tls_with_the_key(locked: tuple[Stack, grpc.Channel],
                                             certs: Path) -> None:
    from radixserve.client import Client

    stack, _ = locked
    ca = (certs / "ca.pem").read_bytes()
    with Client(stack.target, api_key=KEY, tls=True, root_certificates=ca) as client:
        result = client.generate_text("Hello", max_new_tokens=3, temperature=0)
        assert result.usage.completion_tokens == 3
    with grpc.insecure_channel(stack.target) as plain:  # no TLS: the handshake fails
        assert _code(plain, PUBLIC_METHODS[0][0], True, b"", GOOD) == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_refuses_clients_without_a_certificate(certs: Path) -> None:
    from radixserve.services.common.auth import PublicSecurity
    from radixserve.services.common.rpc import TlsFiles
    from radixserve.services.gateway import server as gw_server

    async def main() -> None:
        tls = TlsFiles(str(certs / "server.pem"), str(certs / "server.key"), str(certs / "ca.pem"))
        dead = gw_server.BackendAddresses("127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1")
        served = await gw_server.create_server(
            "127.0.0.1:0", dead, security=PublicSecurity(KEY, tls))
        await served.server.start()
        try:
            target = f"127.0.0.1:{served.port}"
            for client_cert, serving in ((True, True), (False, False)):
                channel = _secure_channel(target, certs, client_cert)
                try:
                    reply = await asyncio.to_thread(
                        health_pb2_grpc.HealthStub(channel).Check,
                        health_pb2.HealthCheckRequest(), timeout=5)
                    assert serving and reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
                except grpc.RpcError as exc:
                    assert not serving and exc.code() == grpc.StatusCode.UNAVAILABLE
                finally:
                    channel.close()
        finally:
            await served.gateway.drain()
            await served.server.stop(0)

    asyncio.run(main())


# -- overload and infeasible requests (docs/reliability.md #15, #17) -------------------------------


def test_queue_full_two_admitted_eight_refused_with_a_retry_hint(locked: tuple[Stack, grpc.Channel],
                                                                 certs: Path) -> None:
    stack, _ = locked

    async def one(stub: pb_grpc.GenerateServiceStub, i: int) -> tuple[grpc.StatusCode, float, dict]:
        t0 = time.monotonic()
        call = stub.Generate(request([5, i + 1], max_new_tokens=200, ignore_eos=True),
                             metadata=GOOD, timeout=60)
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as exc:
            return exc.code(), time.monotonic() - t0, dict(exc.trailing_metadata() or ())
        return grpc.StatusCode.OK, time.monotonic() - t0, {}

    async def main() -> list[tuple[grpc.StatusCode, float, dict]]:
        creds = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
        async with grpc.aio.secure_channel(stack.target, creds) as channel:
            stub = pb_grpc.GenerateServiceStub(channel)
            return await asyncio.gather(*(one(stub, i) for i in range(10)))

    results = asyncio.run(main())
    codes = [code for code, _, _ in results]
    assert codes.count(grpc.StatusCode.OK) == 2 and codes.count(EXHAUSTED) == 8, codes
    refused = [(t, trailers) for code, t, trailers in results if code == EXHAUSTED]
    assert all(int(trailers["retry-after-ms"]) > 0 for _, trailers in refused)
    slowest = max(t for t, _ in refused)
    # Refusals come at once (in-process they take a few ms); the admitted pair runs 400 steps.
    assert slowest < 1.0 and slowest < min(t for code, t, _ in results
                                           if code == grpc.StatusCode.OK)


def test_refusals_are_fast_while_admitted_calls_keep_streaming(tmp_path: Path) -> None:
    """Overload target (docs/reliability.md, Targets): 200 refused calls, measured one after another
    at the client, while one admitted call streams and one waits. The 10 ms p99 figure is measured
    by `radixserve bench overload`; on a shared 2-core box the test holds looser bounds
    (REFUSAL_P99_S)."""
    s = Stack("--max-running-requests", "1", "--max-queued-requests", "1",
              log_path=tmp_path / "serve.log")
    try:
        s.wait_ready()
        admitted = [s.stub.Generate(request([5, 6 + i], max_new_tokens=3000, ignore_eos=True),
                                    timeout=300) for i in range(2)]
        arrivals: list[float] = []  # when each token came (from whichever of the two runs)

        def read(call: Any) -> None:
            with contextlib.suppress(grpc.RpcError):  # cancelled at the end
                for response in call:
                    arrivals.extend([time.monotonic()] * len(response.delta.token_ids))

        readers = [threading.Thread(target=read, args=(c,), daemon=True) for c in admitted]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 30
        while True:  # the second waits behind it, so every later call is refused
            info = s.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
            if info.running_requests == 1 and info.waiting_requests == 1:
                break
            assert time.monotonic() < deadline, info
            time.sleep(0.01)
        latencies = []
        began = time.monotonic()
        for i in range(200):
            t0 = time.perf_counter()
            with pytest.raises(grpc.RpcError) as err:
                list(s.stub.Generate(request([7, i + 1], max_new_tokens=4), timeout=30))
            latencies.append(time.perf_counter() - t0)
            assert err.value.code() == EXHAUSTED
            assert dict(err.value.trailing_metadata() or ())["retry-after-ms"] == "250"
        ended = time.monotonic()
        latencies.sort()
        p50, p99 = latencies[100], latencies[197]
        print(f"refusal latency over 200 calls: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms")
        assert p50 < REFUSAL_P50_S and p99 < REFUSAL_P99_S, (f"p50 {p50 * 1000:.1f} ms, p99 "
                                                             f"{p99 * 1000:.1f} ms")
        # The running call keeps streaming through the refusals, and the queued one still waits.
        streamed = time.monotonic() + 10
        while not any(t >= began for t in arrivals):
            assert time.monotonic() < streamed, (len(arrivals), ended - began)
            time.sleep(0.01)
        info = s.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        assert info.running_requests == 1 and info.waiting_requests == 1, info
        for call in admitted:
            call.cancel()
        for reader in readers:
            reader.join(10)
        wait_idle(s.stub)
    finally:
        assert s.stop() == 0


def test_request_bigger_than_the_kv_pool_is_refused_at_admission(
        locked: tuple[Stack, grpc.Channel]) -> None:
    _, channel = locked
    stub = pb_grpc.GenerateServiceStub(channel)
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(request([5] * 10, max_new_tokens=1000, ignore_eos=True),
                           metadata=GOOD, timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "KV pages" in (err.value.details() or "") and time.monotonic() - t0 < 2.0
    # Never parked at the queue head: small requests right after it run.
    for _ in range(3):
        done = list(stub.Generate(request([5, 6], max_new_tokens=4, ignore_eos=True),
                                  metadata=GOOD, timeout=30))
        assert done[-1].finished.usage.completion_tokens == 4


def test_n_completions_are_admitted_whole_or_refused_whole(
        locked: tuple[Stack, grpc.Channel]) -> None:
    """docs/reliability.md #16 with n > 1: one slot and one queue place take 2 completions, not 3; a
    refused group reserves nothing, and a smaller call right after it is not refused."""
    _, channel = locked
    stub = pb_grpc.GenerateServiceStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(request([5, 6], max_new_tokens=4, ignore_eos=True, n=3),
                           metadata=GOOD, timeout=30))
    assert err.value.code() == EXHAUSTED, err.value.details()
    _wait_idle(stub)  # nothing of the refused group runs, waits or holds pages
    two = list(stub.Generate(request([5, 6], max_new_tokens=4, ignore_eos=True, n=2),
                             metadata=GOOD, timeout=30))
    ends = sorted((r.index, r.finished.usage.completion_tokens) for r in two
                  if r.HasField("finished"))
    assert ends == [(0, 4), (1, 4)]
    _wait_idle(stub)
