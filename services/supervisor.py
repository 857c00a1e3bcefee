"""`radixserve serve`: start the services as child processes and keep them honest.

Children (services/children.py): one tokenizer, `--dp-size` scheduler replicas (a scheduler and a
detokenizer each) and one gateway, started together (model and tokenizer loads overlap); their
readiness is awaited in that order through grpc.health.v1. Internal services listen on unix
sockets in a private (0700) folder; only the gateway takes a TCP port.

Policy when a child dies:
- The tokenizer, the gateway, and every child of a single replica (dp_size 1): the supervisor does
  not restart it. The gateway has already answered UNAVAILABLE to every open stream (it watches
  its backend streams); the supervisor then drains and stops the remaining children and exits
  non-zero, so an outer supervisor (systemd, Kubernetes, docker restart policy) restarts the whole
  stack from a clean state.
- A replica's scheduler or detokenizer when dp_size > 1: only that replica's streams end; the
  supervisor starts the child again in place (same argv, same socket) while the gateway routes
  around the replica, at most RESTART_LIMIT times per child in RESTART_WINDOW_S. One more death
  in that window takes the first path. This holds while the stack starts too (the gateway may
  serve the first replicas before the last is ready), where the startup timeout still bounds the
  wait for every child.
- A gateway that exits 0 after the supervisor asked it to retire (`--gateway-recycle-s`,
  services/rotation.py): started again in place, outside the restart budget.
Children get SIGTERM if the supervisor itself dies (PR_SET_PDEATHSIG), so nothing is orphaned.

Hung children: from its first answer on (during startup too: one child can hang while another is
still loading), each must answer a grpc.health.v1 Check (any status) at least once per
`--watchdog-timeout`; one that does not gets SIGUSR1 (its stacks go to its log through
faulthandler, which needs no GIL), then SIGKILL, and the dead-child policy above runs. A restarted
child that does not answer within `--startup-timeout` is killed the same way. This catches what
the scheduler's in-process watchdog (a Python thread) cannot: a hang that holds the GIL.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections import deque
from pathlib import Path
from types import FrameType
from typing import NamedTuple

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from radixserve.services.children import (
    Child,
    build_children,
    is_gateway,
    is_scheduler,
    replica_envs,
)
from radixserve.services.common.auth import API_KEY_ENV, SECRET_ENV
from radixserve.services.common.lifecycle import PARENT_PID_ENV
from radixserve.services.config import ServeConfig
from radixserve.services.rotation import GatewayRotation

log = logging.getLogger("radixserve.serve")
POLL_S = 0.1
STOP_GRACE_S = 10.0  # after a child's own drain, how long before SIGKILL
PROBE_INTERVAL_S = 1.0  # liveness probes per child: at most one in flight, one a second
STACK_DUMP_S = 0.5  # between SIGUSR1 (stack dump) and SIGKILL of a hung child
# A replica's child is restarted at most this often in this window; one more death stops the stack
# (a child that keeps dying will not be fixed by restarting it, and the outer manager is told).
RESTART_LIMIT = 3
RESTART_WINDOW_S = 600.0
# Probes of a child that is not listening yet: grpc's default reconnect backoff grows to 120 s, so
# a child that took 30 s to start was first answered 15 s later, and its liveness (which counts
# from that first answer) watched nothing in between. Retry at least once a second instead.
PROBE_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class Exited(NamedTuple):
    name: str
    code: int


class Supervisor:
    def __init__(self, config: ServeConfig, engine_argv: list[str]) -> None:
        """ValueError when the replicas cannot be placed (too few GPUs)."""
        self._config = config
        self._engine_argv = engine_argv
        engine = config.engine
        self._replica_envs = replica_envs(engine.device, config.dp_size, engine.tp_size,
                                          os.environ)
        self._children: dict[str, Child] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._restarts = RestartBudget(RESTART_LIMIT, RESTART_WINDOW_S)
        self._stop_signal: int | None = None
        self._rotation: GatewayRotation | None = None
        # Internal calls carry a secret even on private sockets; one is made up when none is set.
        self._secret = os.environ.get(SECRET_ENV) or secrets.token_hex(32)

    def run(self) -> int:
        sockets = tempfile.mkdtemp(prefix="radixserve-")
        os.chmod(sockets, 0o700)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            children = build_children(self._config, self._engine_argv, sockets,
                                      self._replica_envs)
            self._children = {c.name: c for c in children}
            for child in children:
                self._spawn(child)
            # Probed from the start: a child can hang while the others are still getting ready.
            timeout_s = self._config.watchdog_timeout_s
            liveness = Liveness(children, timeout_s) if timeout_s > 0 else None
            try:
                ready = self._wait_ready(children, liveness)
                if ready:
                    log.info("serving %s on %s", self._config.engine.model_path,
                             self._config.gateway_address)
                    if self._config.gateway_recycle_s > 0:
                        self._rotation = GatewayRotation(
                            [c.name for c in children if is_gateway(c.name)],
                            self._config.gateway_recycle_s, time.monotonic())
                    self._announce_ready()
                    failed = self._watch(liveness)
                else:
                    failed = self._stop_signal is None
            finally:
                if liveness is not None:
                    liveness.close()
        finally:
            if self._config.ready_file is not None:
                Path(self._config.ready_file).unlink(missing_ok=True)
            self._shutdown()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            shutil.rmtree(sockets, ignore_errors=True)
        return 1 if failed else 0

    def _announce_ready(self) -> None:
        if self._config.ready_file is None:
            return
        path = Path(self._config.ready_file)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(self._config.gateway_address + "\n")
        partial.replace(path)  # whole or absent to a reader

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signal = signum

    def _spawn(self, child: Child) -> None:
        env = {**os.environ, **child.env, PARENT_PID_ENV: str(os.getpid()),
               SECRET_ENV: self._secret}
        env.pop(API_KEY_ENV, None)  # only the gateway checks it, and it comes through env, not argv
        if is_gateway(child.name) and self._config.public.api_key:
            env[API_KEY_ENV] = self._config.public.api_key
        # A session of its own: a terminal's Ctrl-C reaches only the supervisor, which then stops
        # the children in order (gateway first) instead of all of them at once.
        self._procs[child.name] = subprocess.Popen(child.argv, env=env, start_new_session=True)
        log.info("started %s (pid %d)", child.name, self._procs[child.name].pid)

    def _wait_ready(self, children: list[Child], liveness: Liveness | None) -> bool:
        deadline = time.monotonic() + self._config.startup_timeout_s
        for child in children:
            with _probe_channel(child.address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                while not _serving(stub):
                    self._kill_if_silent(liveness)
                    if self._stop_signal is not None:
                        return False
                    dead = self._dead_child()
                    if dead is not None and not self._restart(dead, liveness):
                        return False
                    if time.monotonic() > deadline:
                        log.error("%s not ready after %.0f s", child.name,
                                  self._config.startup_timeout_s)
                        return False
                    time.sleep(POLL_S)
            if liveness is not None:
                liveness.answered(child.name)  # its SERVING answer starts the silence clock too
            log.info("%s ready", child.name)
        return True

    def _watch(self, liveness: Liveness | None) -> bool:
        """Until a signal (False: clean stop) or a death that is not restarted (True: failure); a
        child that stops answering its health check is killed, which makes it a death."""
        while self._stop_signal is None:
            dead = self._dead_child()
            if dead is not None and not self._restart(dead, liveness):
                return True
            self._kill_if_silent(liveness)
            self._rotate()
            time.sleep(POLL_S)
        log.info("signal %d: draining", self._stop_signal)
        return False

    def _kill_if_silent(self, liveness: Liveness | None) -> None:
        if liveness is None or (name := liveness.silent()) is None:
            return
        proc = self._procs[name]
        log.critical("%s (pid %d) has not answered its health check for %.1f s (hung; a stuck "
                     "call holding the GIL escapes its own watchdog): dumping its stacks to its "
                     "log and killing it", name, proc.pid, liveness.quiet_s(name))
        if proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)  # children register faulthandler for it
            time.sleep(STACK_DUMP_S)
            proc.kill()
            proc.wait()

    def _rotate(self) -> None:
        """Ask the gateway whose turn has come to retire; note when the one started again
        serves."""
        rotation = self._rotation
        if rotation is None:
            return
        if rotation.starting is not None:
            with _probe_channel(self._children[rotation.starting].address) as channel:
                if _serving(health_pb2_grpc.HealthStub(channel)):
                    log.info("%s serving again", rotation.starting)
                    rotation.serving(time.monotonic())
        name = rotation.due(time.monotonic())
        if name is not None:
            log.info("%s (pid %d): retiring it, to start it again", name, self._procs[name].pid)
            self._procs[name].send_signal(signal.SIGUSR2)

    def _restart(self, dead: Exited, liveness: Liveness | None) -> bool:
        """Start a replica's dead child, or a gateway that retired, again in place (the former
        within the budget); False: the stack stops (the module docstring's policy)."""
        child = self._children[dead.name]
        if self._rotation is not None and self._rotation.retired(*dead):
            log.info("%s retired; starting it again", dead.name)
        elif child.replica is None:
            log.error("%s exited with code %d; stopping the others", *dead)
            return False
        elif not self._restarts.allow(dead.name, time.monotonic()):
            log.error("%s exited with code %d after %d restarts in %.0f s; stopping the others",
                      *dead, RESTART_LIMIT, RESTART_WINDOW_S)
            return False
        else:
            log.warning("%s exited with code %d; restarting it (restart %d of %d in %.0f s); the "
                        "other replicas keep serving", *dead, self._restarts.used(dead.name),
                        RESTART_LIMIT, RESTART_WINDOW_S)
        self._spawn(child)
        if liveness is not None:
            liveness.restarted(dead.name, self._config.startup_timeout_s)
        return True

    def _dead_child(self) -> Exited | None:
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                return Exited(name, code)
        return None

    def _shutdown(self) -> None:
        """In the order data flows back: the gateways first (they drain client streams), then the
        schedulers, then the detokenizers and the tokenizer. A detokenizer stopped together with
        its scheduler could cancel the scheduler's stream into it mid-step (grpc then logs the
        cancelled handler as an error); stopped after it, it sees the stream end."""
        drain_s = self._config.gateway.drain_timeout_s
        for turn in range(3):
            _terminate([p for n, p in self._procs.items() if _stop_turn(n) == turn],
                       drain_s + STOP_GRACE_S)


class RestartBudget:
    """At most `limit` restarts of one child in any `window_s` seconds."""

    def __init__(self, limit: int, window_s: float) -> None:
        self._limit = limit
        self._window_s = window_s
        self._times: dict[str, deque[float]] = {}

    def allow(self, name: str, now: float) -> bool:
        """Whether `name` may be restarted at `now`; counts the restart when it may."""
        times = self._times.setdefault(name, deque())
        while times and now - times[0] >= self._window_s:
            times.popleft()
        if len(times) >= self._limit:
            return False
        times.append(now)
        return True

    def used(self, name: str) -> int:
        return len(self._times.get(name, ()))


class Liveness:
    """Out-of-process hang check of the children, polled from the supervisor's loop.

    Why a health Check and not a heartbeat file or shared memory: an answer needs the child's
    gRPC server, its event loop and the GIL, which is exactly what serving needs, so it catches a
    wedged event loop as well as a GIL hang; a heartbeat thread could keep beating through the
    former. It adds no code, file or cleanup to the children, and costs one tiny RPC per child per
    second on a channel kept open. The probes are futures, so one silent child never delays the
    supervisor's other checks. Any status counts as an answer: NOT_SERVING is alive.
    """

    def __init__(self, children: list[Child], timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._interval_s = min(PROBE_INTERVAL_S, timeout_s / 4)
        self._channels = {c.name: _probe_channel(c.address) for c in children}
        self._stubs = {n: health_pb2_grpc.HealthStub(ch) for n, ch in self._channels.items()}
        now = time.monotonic()
        # Silence counts from a child's first answer: before it, the child is still starting
        # (its server not yet up), which the startup timeout bounds instead.
        self._answered: dict[str, float | None] = dict.fromkeys(self._stubs, None)
        self._sent = dict.fromkeys(self._stubs, now - self._interval_s)
        self._pending: dict[str, grpc.Future] = {}
        # Restarted children that have not answered yet: (restarted at, must answer by).
        self._due: dict[str, tuple[float, float]] = {}

    def answered(self, name: str) -> None:
        """`name` answered a health check just now (the readiness wait's own probe). Without this
        a child that hangs right after it turned ready, before a liveness probe got through,
        would count as still starting, which only the startup timeout bounds."""
        self._answered[name] = max(self._answered[name] or 0.0, time.monotonic())

    def restarted(self, name: str, within_s: float) -> None:
        """`name` runs again as a new process: it is starting, and must answer within
        `within_s` (a restart has no readiness wait of its own to bound it)."""
        pending = self._pending.pop(name, None)
        if pending is not None:
            pending.cancel()
        self._answered[name] = None
        now = time.monotonic()
        self._due[name] = (now, now + within_s)

    def quiet_s(self, name: str) -> float:
        """Seconds since `name` last answered, or since its restart if it has not yet."""
        since = self._answered[name] or self._due.get(name, (time.monotonic(),))[0]
        return time.monotonic() - since

    def silent(self) -> str | None:
        """The first child that has not answered for `timeout_s`, or a restarted one that has
        not answered by its due time; None if there is none."""
        now = time.monotonic()
        for name, stub in self._stubs.items():
            pending = self._pending.get(name)
            if pending is not None and pending.done():
                if pending.exception() is None:
                    self._answered[name] = now
                    self._due.pop(name, None)
                del self._pending[name]
                pending = None
            if pending is None and now - self._sent[name] >= self._interval_s:
                # The deadline only bounds one probe; silence is judged over `timeout_s`.
                self._pending[name] = stub.Check.future(
                    health_pb2.HealthCheckRequest(service=""), timeout=self._timeout_s)
                self._sent[name] = now
            answered = self._answered[name]
            if answered is not None and now - answered > self._timeout_s:
                return name
            if name in self._due and now > self._due[name][1]:
                return name
        return None

    def close(self) -> None:
        for pending in self._pending.values():
            pending.cancel()
        for channel in self._channels.values():
            channel.close()


def _probe_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=PROBE_CHANNEL_OPTIONS)


def _serving(stub: health_pb2_grpc.HealthStub) -> bool:
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _stop_turn(name: str) -> int:
    """When `_shutdown` stops a child: 0 gateways, 1 schedulers, 2 the rest."""
    return 0 if is_gateway(name) else 1 if is_scheduler(name) else 2


def _terminate(procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error("pid %d did not stop in %.0f s; killing it", proc.pid, timeout_s)
            proc.kill()
            proc.wait()
