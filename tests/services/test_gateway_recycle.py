"""Recycling gateways (`serve --gateways N --gateway-recycle-s T`): a retiring gateway leaves the
shared port's group and lets its connections age out, the supervisor replaces the gateways one at
a time, and no client call fails meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from radixserve.services.children import build_children
from radixserve.services.config import ServeConfig
from radixserve.services.gateway.frontend import FrontendConfig
from radixserve.services.gateway.retire import close_listeners
from radixserve.services.rotation import GatewayRotation
from radixserve.v1 import generate_pb2_grpc as pb_grpc
from svc_helpers import Stack, collect, request


def _listen() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_close_listeners_shuts_only_the_sockets_listening_on_the_port() -> None:
    retiring, other = _listen(), _listen()
    port, other_port = retiring.getsockname()[1], other.getsockname()[1]
    try:
        assert close_listeners(port) == 1
        with pytest.raises(ConnectionRefusedError):  # nothing listens on the port any more
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        socket.create_connection(("127.0.0.1", other_port), timeout=5).close()
        assert close_listeners(port) == 0  # it no longer listens
    finally:
        retiring.close()
        other.close()


def test_rotation_retires_one_gateway_at_a_time_in_turn() -> None:
    r = GatewayRotation(["gateway-0", "gateway-1"], period_s=10.0, now=0.0)
    assert r.due(4.9) is None  # every period / gateways = 5 s
    assert r.due(5.0) == "gateway-0"
    assert r.due(100.0) is None  # not while one retires
    assert not r.retired("gateway-1", 0)  # not its turn: a death like any other
    assert not r.retired("gateway-0", 1)  # a failure while retiring is one too
    assert r.retired("gateway-0", 0) and r.starting == "gateway-0"
    assert r.due(100.0) is None  # nor while it starts again
    r.serving(100.0)
    assert r.due(104.9) is None
    assert r.due(105.0) == "gateway-1"
    assert r.retired("gateway-1", 0)
    r.serving(106.0)
    assert r.due(111.0) == "gateway-0"
    with pytest.raises(ValueError):
        GatewayRotation(["gateway"], 10.0, 0.0)


def test_recycling_needs_two_gateways_and_a_connection_age() -> None:
    from radixserve.engine.config import EngineConfig

    engine, gw = EngineConfig(model_path="m"), FrontendConfig()
    with pytest.raises(ValueError, match="2 or more"):
        ServeConfig(engine=engine, gateway=gw, gateway_recycle_s=60.0, max_connection_age_s=5.0)
    with pytest.raises(ValueError, match="connection age"):
        ServeConfig(engine=engine, gateway=gw, gateways=2, gateway_recycle_s=60.0)
    cfg = ServeConfig(engine=engine, gateway=gw, gateways=2, gateway_recycle_s=60.0,
                      max_connection_age_s=5.0)
    gateways = [c for c in build_children(cfg, [], "/tmp/s", [{}]) if "gateway" in c.argv]
    assert len(gateways) == 2
    for child in gateways:
        assert child.argv[child.argv.index("--max-connection-age") + 1] == "5.0"
        assert "--reuse-port" in child.argv


class _HeldStream:
    """A long stream read on a thread of its own, with when each of its messages came."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.call = pb_grpc.GenerateServiceStub(channel).Generate(
            request([5, 6], max_new_tokens=4000, ignore_eos=True), timeout=600)
        self.times: list[float] = []
        self.code: grpc.StatusCode | None = None
        self._thread = threading.Thread(target=self._read)
        self._thread.start()

    def _read(self) -> None:
        try:
            for _ in self.call:
                self.times.append(time.monotonic())
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.code = exc.code()

    def end(self) -> grpc.StatusCode | None:
        self.call.cancel()
        self._thread.join(60)
        return self.code


def _retirements(log: Path) -> list[int]:
    """The calls in flight as each retirement began, from the serve log."""
    return [int(line.split("; ")[1].split()[0]) for line in log.read_text().splitlines()
            if "retiring: " in line and "in flight" in line]


def test_recycled_gateways_fail_no_call(tmp_path) -> None:
    """Two gateways, replaced in turn every few seconds, while a client makes short calls over
    connections of its own and others hold long streams: every short call ends OK, the held
    streams go on through a retirement of the gateway that serves some of them (until the test
    cancels them), and both gateway processes are new at the end."""
    log = tmp_path / "serve.log"
    s = Stack("--gateways", "2", "--gateway-recycle-s", "8", "--max-connection-age", "1",
              "--ready-file", str(tmp_path / "ready"), log_path=log)
    channels = [grpc.insecure_channel(s.target, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(8)]
    held: list[_HeldStream] = []
    try:
        s.wait_ready()
        deadline = time.monotonic() + 240
        while not (tmp_path / "ready").exists():  # both gateways serve (the rotation starts)
            assert s.proc.poll() is None and time.monotonic() < deadline, "not every child ready"
            time.sleep(0.2)
        first = set(s.gateway_pids())
        held = [_HeldStream(ch) for ch in channels[3:]]  # connections of their own
        codes: Counter[grpc.StatusCode] = Counter()
        busy_retirement_seen: float | None = None
        deadline = time.monotonic() + 300
        i = 0
        while set(s.gateway_pids()) & first or len(s.gateway_pids()) < 2:
            assert time.monotonic() < deadline, ("the gateways were not both replaced",
                                                 _retirements(log))
            got = collect(pb_grpc.GenerateServiceStub(channels[i % 3]),
                          request([7, i % 50], max_new_tokens=4, ignore_eos=True))
            codes[got.code] += 1
            assert got.code == grpc.StatusCode.OK and len(got.token_ids) == 4, (i, got)
            i += 1
            if busy_retirement_seen is None and any(n >= 1 for n in _retirements(log)):
                busy_retirement_seen = time.monotonic()  # a gateway retires with calls open
            if (busy_retirement_seen is not None and held
                    and time.monotonic() > busy_retirement_seen + 3):  # past its GOAWAYs
                # Every held stream still gets tokens after the GOAWAYs: none was cut; then
                # ending them lets their gateway finish retiring.
                assert all(h.code is None and h.times[-1] > busy_retirement_seen + 2
                           for h in held), [(h.code, len(h.times)) for h in held]
                assert [h.end() for h in held] == [grpc.StatusCode.CANCELLED] * len(held)
                held = []
        assert busy_retirement_seen is not None and not held
        assert codes[grpc.StatusCode.OK] == i > 0
        assert log.read_text().count("retired; starting it again") >= 2
    finally:
        for h in held:
            h.end()
        for channel in channels:
            channel.close()
        s.stop()
