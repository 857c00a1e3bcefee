"""Helpers for the service tests: a fake engine, an in-process stack, and the real
four-process stack started through `radixserve serve`."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from radixserve.engine.core import StepOutput
from radixserve.engine.sampling.params import InvalidRequestError, SamplingParams
from radixserve.services.scheduler.types import Acks, NewRequest, StepBatch
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc

# -- fake engine ---------------------------------------------------------------------------------


@dataclass
class _FakeReq:
    prompt: list[int]
    params: SamplingParams
    produced: int = 0


@dataclass
class FakeEngine:
    """Deterministic stand-in for EngineCore: emits prompt[-1]+1, +2, ... (mod vocab, never 0)."""

    vocab_size: int = 1024
    max_context: int = 4096
    step_delay_s: float = 0.0
    reject_token: int | None = None  # a prompt containing it is rejected, like a too-big request
    reqs: dict[str, _FakeReq] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    steps: int = 0
    abort_steps: dict[str, int] = field(default_factory=dict)  # rid -> steps run when aborted
    params_seen: dict[str, SamplingParams] = field(default_factory=dict)  # rid -> as added
    prompts: dict[str, list[int]] = field(default_factory=dict)  # rid -> prompt ids, as added
    grammars: dict[str, Any] = field(default_factory=dict)  # rid -> grammar, constrained ones
    compile_delay_s: float = 0.0  # compile_grammar sleeps this long (on a compile worker)
    compiled: list[tuple[str, str]] = field(default_factory=list)  # constraints compiled

    def __post_init__(self) -> None:
        self.model_info = SimpleNamespace(
            model_name="fake", architecture="FakeForCausalLM", vocab_size=self.vocab_size,
            max_context=self.max_context, eos_token_ids=(0,), dtype="float32",
        )

    def compile_grammar(self, params: SamplingParams) -> Any:
        """A constraint containing "bad" does not compile; others give ("grammar", text)."""
        if params.constraint is None:
            return None
        time.sleep(self.compile_delay_s)
        self.compiled.append(params.constraint)
        kind, text = params.constraint
        if "bad" in text:
            raise InvalidRequestError(f"{kind} does not compile: bad at offset {text.index('bad')}")
        return ("grammar", text)

    def add_request(self, rid: str, prompt_ids: list[int], params: SamplingParams,
                    after: str | None = None, grammar: Any = None) -> None:
        assert (grammar is None) == (params.constraint is None), "grammar compiled before add"
        if rid in self.reqs:
            raise InvalidRequestError(f"duplicate {rid}")
        if self.reject_token is not None and self.reject_token in prompt_ids:
            raise InvalidRequestError("request needs more KV pages than the pool has")
        self.reqs[rid] = _FakeReq(list(prompt_ids), params)
        self.added.append(rid)
        self.params_seen[rid] = params
        self.prompts[rid] = list(prompt_ids)
        if grammar is not None:
            self.grammars[rid] = grammar

    def abort(self, rid: str) -> bool:
        self.aborted.append(rid)
        self.abort_steps[rid] = self.steps
        return self.reqs.pop(rid, None) is not None

    def has_work(self) -> bool:
        return bool(self.reqs)

    def step(self, launched_hook: Callable[..., None] | None = None) -> list[StepOutput]:
        if self.step_delay_s:  # the device's time; the hook runs halfway, as with a real step
            time.sleep(self.step_delay_s / 2)
            if launched_hook is not None:
                launched_hook()
            time.sleep(self.step_delay_s / 2)
        elif launched_hook is not None:
            launched_hook()
        self.steps += 1
        outs = []
        for rid, req in list(self.reqs.items()):
            req.produced += 1
            token = 1 + (req.prompt[-1] + req.produced - 1) % (self.vocab_size - 1)
            done = req.produced >= (req.params.max_new_tokens or 1)
            if done:
                del self.reqs[rid]
            outs.append(StepOutput(rid, [token], None, "length" if done else None, None,
                                   len(req.prompt), 0))
        return outs

    def stats(self) -> dict[str, int]:
        n = len(self.reqs)
        return {"running_requests": n, "waiting_requests": 0, "kv_pages_total": 64,
                "kv_pages_free": 64 - n, "kv_pages_evictable": 0, "kv_pages_protected": n,
                "page_size": 16, "cached_tokens_total": 0, "prompt_tokens_total": 0}

    def check_integrity(self) -> None:
        assert not self.reqs


# -- engine loop sink ----------------------------------------------------------------------------


class Sink:
    """Records what an `EngineLoop` reports: acks, step batches, readiness, fatal errors, stalls."""

    def __init__(self) -> None:
        self.acks: list[Acks] = []
        self.steps: list[StepBatch] = []
        self.ready = threading.Event()
        self.fatal: list[BaseException] = []
        self.stalls: list[bool] = []

    def on_ready(self, model_info: Any) -> None:
        self.ready.set()

    def on_acks(self, acks: Acks) -> None:
        self.acks.append(acks)

    def on_step(self, batch: StepBatch) -> None:
        self.steps.append(batch)

    def on_fatal(self, exc: BaseException) -> None:
        self.fatal.append(exc)

    def on_stalled(self, stalled: bool) -> None:
        self.stalls.append(stalled)


def new(rid: str, n: int = 3, **kw: Any) -> NewRequest:
    """A one-token-prompt request for `n` new tokens, passing its id through."""
    return NewRequest(rid, [5], SamplingParams(max_new_tokens=n, **kw), passthrough=rid)


def wait_for(check: Any, timeout: float = 5.0) -> None:
    """Poll `check` every 5 ms; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.005)


# -- client helpers ------------------------------------------------------------------------------


def request(prompt: Any = "Hello world", max_new_tokens: int | None = 8,
            **kw: Any) -> pb.GenerateRequest:
    """A GenerateRequest: `prompt` is text, a list of ids, or a list of (role, content)."""
    req = pb.GenerateRequest(request_id=kw.pop("request_id", ""))
    if isinstance(prompt, str):
        req.text = prompt
    elif prompt and isinstance(prompt[0], tuple):
        req.chat.messages.extend(pb.ChatMessage(role=r, content=c) for r, c in prompt)
    else:
        req.token_ids.ids.extend(prompt)
    if max_new_tokens is not None:
        req.stopping.max_new_tokens = max_new_tokens
    for name, value in kw.items():
        for part in (req.sampling, req.stopping, req.options):
            if name in part.DESCRIPTOR.fields_by_name:
                target = getattr(part, name)
                if isinstance(value, (list, tuple)):
                    target.extend(value)
                else:
                    setattr(part, name, value)
                break
        else:
            raise KeyError(name)
    return req


@dataclass
class StreamResult:
    responses: list[pb.GenerateResponse]
    code: grpc.StatusCode
    details: str

    @property
    def token_ids(self) -> list[int]:
        return [t for r in self.responses if r.HasField("delta") for t in r.delta.token_ids]

    @property
    def text(self) -> str:
        return "".join(r.delta.text for r in self.responses if r.HasField("delta"))

    @property
    def finished(self) -> pb.Finished:
        assert self.responses and self.responses[-1].HasField("finished"), self.responses[-1:]
        return self.responses[-1].finished


def collect(stub: pb_grpc.GenerateServiceStub, req: pb.GenerateRequest,
            timeout: float = 60) -> StreamResult:
    out: list[pb.GenerateResponse] = []
    try:
        for response in stub.Generate(req, timeout=timeout):
            out.append(response)  # noqa: PERF402 - keep what came before an error
    except grpc.RpcError as exc:
        return StreamResult(out, exc.code(), exc.details() or "")
    return StreamResult(out, grpc.StatusCode.OK, "")


async def acollect(stub: Any, req: pb.GenerateRequest, timeout: float = 60) -> StreamResult:
    out: list[pb.GenerateResponse] = []
    try:
        async for response in stub.Generate(req, timeout=timeout):
            out.append(response)
    except grpc.aio.AioRpcError as exc:
        return StreamResult(out, exc.code(), exc.details() or "")
    return StreamResult(out, grpc.StatusCode.OK, "")


def health_status(target: str, service: str = "") -> int | None:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2)
        except grpc.RpcError:
            return None
    return reply.status


def wait_idle(stub: pb_grpc.GenerateServiceStub, timeout: float = 15.0) -> pb.GetServerInfoResponse:
    """Wait for the pool invariant: nothing running or queued, every KV page free or evictable,
    no per-request state in the gateway or the detokenizer."""
    deadline = time.monotonic() + timeout
    while True:
        info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        idle = (info.running_requests == 0 and info.waiting_requests == 0
                and info.kv_pages_free + info.kv_pages_evictable == info.kv_pages_total
                and info.kv_pages_protected == 0 and info.gateway_live_requests == 0
                and info.detokenizer_live_requests == 0)
        if idle:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"server did not go idle: {info}")
        time.sleep(0.05)


# -- the real stack ------------------------------------------------------------------------------


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_pids(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry.name))
    return kids


def cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# The internal secret of the shared stack (conftest.py), known so tests can reach the internal
# services; `serve` makes up a random one when none is given.
INTERNAL_SECRET = "test-internal-secret-0123456789"


class Stack:
    """`radixserve serve` in a subprocess, on a free port."""

    def __init__(self, *extra: str, log_path: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.metrics_port: int | None = None
        self.target = f"127.0.0.1:{self.port}"
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        argv = [sys.executable, "-m", "radixserve.services.cli", "serve", "--model", "demo",
                "--port", str(self.port), "--device", "cpu", *extra]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=self._log,
                                     env={**os.environ, **(env or {})})
        self.channel = grpc.insecure_channel(self.target)
        self.stub = pb_grpc.GenerateServiceStub(self.channel)

    def wait_ready(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while health_status(self.target) != health_pb2.HealthCheckResponse.SERVING:
            assert self.proc.poll() is None, f"serve exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "stack did not become ready"
            time.sleep(0.2)

    def child(self, name: str) -> int:
        for pid in child_pids(self.proc.pid):
            if f"radixserve.services.cli {name} " in cmdline(pid):
                return pid
        raise LookupError(name)

    def gateway_pids(self) -> list[int]:
        return [pid for pid in child_pids(self.proc.pid)
                if "radixserve.services.cli gateway " in cmdline(pid)]

    def internal_address(self, name: str) -> str:
        """The address `serve` gave the tokenizer, detokenizer or scheduler (a private socket)."""
        argv = cmdline(self.child(name)).split()
        return argv[argv.index("--address") + 1]

    def stop(self, timeout: float = 60.0) -> int:
        children = child_pids(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        finally:
            self.channel.close()
            if self._log is not subprocess.DEVNULL:
                self._log.close()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftovers = [pid for pid in children if alive(pid)]
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"orphaned children: {leftovers}"
        return code


class Streams:
    """`n` streaming Generate calls on threads (token-id prompts, ignore_eos), recording when each
    token arrived and how each ended."""

    def __init__(self, stub: pb_grpc.GenerateServiceStub, n: int, max_new_tokens: int,
                 timeout: float = 120) -> None:
        self.codes: list[grpc.StatusCode | None] = [None] * n
        self.tokens = [0] * n
        self.last_token_at = [0.0] * n
        self.ended_at = [0.0] * n
        self._decoding = [threading.Event() for _ in range(n)]
        self._threads = [threading.Thread(target=self._run, args=(stub, i, max_new_tokens, timeout),
                                          daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _run(self, stub: pb_grpc.GenerateServiceStub, i: int, max_new: int, timeout: float) -> None:
        req = request([5, i + 1], max_new_tokens=max_new, ignore_eos=True)
        try:
            for response in stub.Generate(req, timeout=timeout):
                if response.HasField("delta") and response.delta.token_ids:
                    self.tokens[i] += len(response.delta.token_ids)
                    self.last_token_at[i] = time.monotonic()
                    self._decoding[i].set()
            self.codes[i] = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.codes[i] = exc.code()
        self.ended_at[i] = time.monotonic()
        self._decoding[i].set()

    def wait_decoding(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for event in self._decoding:
            assert event.wait(max(0.0, deadline - time.monotonic())), "a stream never started"

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        waiting = [i for i, t in enumerate(self._threads) if t.is_alive()]
        now = time.monotonic()
        assert not waiting, (
            f"clients {waiting} still waiting after {timeout:.0f} s; tokens {self.tokens}, codes "
            f"{self.codes}, seconds since each one's last token "
            f"{[round(now - t, 1) if t else None for t in self.last_token_at]}")


def assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Every pid in `pids` exits (not a zombie) within `timeout`."""
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], (
        f"orphans: {[cmdline(p) for p in pids if alive(p)]}")


# -- in-process stack (all four servers in one event loop, port 0, fake or real engine) ----------


@dataclass
class Replica:
    """One scheduler replica of an in-process stack, with the detokenizer it streams to."""

    app: Any
    server: Any
    engine: Any
    detokenizer: Any
    detokenizer_server: Any
    address: str  # the scheduler's
    detokenizer_address: str


@dataclass
class InProcess:
    servers: list[Any]
    gateway: Any
    replicas: list[Replica]
    target: str
    ports: dict[str, int]

    # Replica 0's parts, under the names of a one-replica stack.
    @property
    def scheduler_app(self) -> Any:
        return self.replicas[0].app

    @property
    def engine(self) -> Any:
        return self.replicas[0].engine

    @property
    def detokenizer(self) -> Any:
        return self.replicas[0].detokenizer

    async def close(self) -> None:
        for server in self.servers:
            await server.stop(0)
        for replica in self.replicas:
            replica.app.loop.stop(5)


async def start_in_process(
    engine: Any, model_path: str, secret: str | None = None, engines: list[Any] | None = None,
    routing: Any = None, **frontend: Any
) -> InProcess:
    """All servers in this event loop on port 0: one replica around `engine`, or one per entry
    of `engines` (each with its own detokenizer), behind one gateway and tokenizer."""
    import asyncio

    from radixserve.services.detokenizer import server as detok_server
    from radixserve.services.gateway import server as gw_server
    from radixserve.services.gateway.frontend import FrontendConfig
    from radixserve.services.scheduler import server as sched_server
    from radixserve.services.scheduler.loop import LoopConfig
    from radixserve.services.tokenizer import server as tok_server
    from radixserve.services.tokenizer.core import TokenizerCore
    from transformers import AutoTokenizer

    core = TokenizerCore.from_pretrained(model_path)
    tok = await tok_server.create_server("127.0.0.1:0", core, secret=secret)
    factory = detok_server.hf_factory(AutoTokenizer.from_pretrained(model_path))
    replicas = []
    for eng in engines or [engine]:
        det = await detok_server.create_server("127.0.0.1:0", factory, secret)
        app = sched_server.SchedulerApp(lambda e=eng: e, f"127.0.0.1:{det.port}",
                                        LoopConfig(warmup=False, idle_poll_s=0.05), secret)
        sch = await sched_server.create_server("127.0.0.1:0", app)
        replicas.append(Replica(app, sch.server, eng, det.servicer, det.server,
                                f"127.0.0.1:{sch.port}", f"127.0.0.1:{det.port}"))
    backends = gw_server.BackendAddresses(
        f"127.0.0.1:{tok.port}", [r.address for r in replicas],
        [r.detokenizer_address for r in replicas])
    gw = await gw_server.create_server(
        "127.0.0.1:0", backends, FrontendConfig(**{"drain_timeout_s": 2.0, **frontend}),
        secret=secret, routing=routing)
    servers = [gw.server, *(s for r in replicas for s in (r.server, r.detokenizer_server)),
               tok.server]
    for server in servers:
        await server.start()
    # Ready with every replica usable; or, for a replica that is refused (another model), ready
    # for a while.
    deadline, ready_since = time.monotonic() + 10.0, None
    while time.monotonic() < deadline:
        links = gw.gateway.links
        ready_since = (ready_since or time.monotonic()) if links.ready else None
        if ready_since is not None and (all(r.routable for r in links.replicas)
                                        or time.monotonic() - ready_since > 2.0):
            break
        await asyncio.sleep(0.05)
    assert gw.gateway.links.ready, "in-process stack did not become ready"
    return InProcess(servers, gw.gateway, replicas, f"127.0.0.1:{gw.port}",
                     {"tokenizer": tok.port, "scheduler": _port(replicas[0].address),
                      "detokenizer": _port(replicas[0].detokenizer_address)})


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def run_in_process(demo_path: str, body: Any, frontend: dict[str, Any] | None = None,
                   core: Any = None, engines: list[Any] | None = None, routing: Any = None,
                   **engine: Any) -> None:
    """Start the in-process stack around `core` (a real engine), or one replica per entry of
    `engines`, or else a FakeEngine(**engine) (gateway limits from `frontend`), await
    body(stack, stub), close."""
    import asyncio

    async def main() -> None:
        stack = await start_in_process(core if core is not None else FakeEngine(**engine),
                                       demo_path, engines=engines, routing=routing,
                                       **(frontend or {}))
        try:
            async with grpc.aio.insecure_channel(stack.target) as channel:
                await body(stack, pb_grpc.GenerateServiceStub(channel))
        finally:
            await stack.close()

    asyncio.run(main())


async def until(check: Any, timeout: float = 5.0) -> None:
    import asyncio

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def idle(stack: InProcess) -> bool:
    """Nothing of any request is left in any service (grammars being compiled included)."""
    return stack.gateway.frontend.live_requests == 0 and all(
        not r.engine.reqs and r.detokenizer.live_requests == 0 and len(r.app.compiler) == 0
        and r.app.loop.live_requests == 0 for r in stack.replicas)
