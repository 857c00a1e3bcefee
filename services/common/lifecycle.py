"""Process lifecycle of the services: run until a signal, drain, stop; die with the parent."""

from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NoReturn, TypeVar

import grpc

log = logging.getLogger(__name__)

PARENT_PID_ENV = "RADIXSERVE_PARENT_PID"
EVENT_LOOP_ENV = "RADIXSERVE_EVENT_LOOP"
_PR_SET_PDEATHSIG = 1
T = TypeVar("T")


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run a service's main coroutine on uvloop, or on asyncio's own loop.

    RADIXSERVE_EVENT_LOOP: "auto" (the default) takes uvloop where it is installed, "uvloop"
    requires it, "asyncio" never uses it. The gRPC stack is the same on both; uvloop spends less
    CPU per message, which at one message per token per stream is most of a gateway's work
    (docs/benchmarks.md, "The event loop").
    """
    choice = os.environ.get(EVENT_LOOP_ENV, "auto")
    if choice not in ("auto", "uvloop", "asyncio"):
        raise SystemExit(f"{EVENT_LOOP_ENV} must be auto, uvloop or asyncio, not {choice!r}")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise SystemExit(f"{EVENT_LOOP_ENV}=uvloop but uvloop is not installed") from None
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def die_with_parent() -> None:
    """When started by `radixserve serve`, get SIGTERM if the supervisor dies, whatever the cause.

    The supervisor passes its pid in the environment. Linux only (prctl); elsewhere the child's own
    health of the parent is not watched, which only matters if the supervisor is SIGKILLed.
    """
    expected = os.environ.get(PARENT_PID_ENV)
    if not expected:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # The parent may have died between fork and prctl; then nobody would ever signal us.
    if os.getppid() != int(expected):
        log.error("supervisor %s is gone; exiting", expected)
        sys.exit(1)


def dump_stacks_on_sigusr1() -> None:
    """SIGUSR1 writes every thread's stack to stderr (the service's log). faulthandler does it from
    the signal handler in C, so it works even while a stuck native call holds the GIL; the
    supervisor sends it to a hung child just before killing it."""
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def setup_logging(service: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def freeze_startup_objects() -> None:
    """Take every object alive now (modules, the model, the tokenizer) out of the cyclic garbage
    collector's reach, after a last collection (`gc.freeze`). A full collection walks every
    tracked object: 60-150 ms with torch and transformers loaded (docs/benchmarks.md, "Garbage
    collection"), during which a service answers nothing and the engine thread does not step.
    Objects made later are collected as before."""
    gc.collect()
    gc.freeze()


async def run_until_signal(
    server: grpc.aio.Server,
    drain: Callable[[], Awaitable[None]],
    fatal: asyncio.Event | None = None,
    stop_grace_s: float = 1.0,
    stop_server: bool = True,
    finished: asyncio.Event | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT or `finished` is set (the service ended its own serving: exit
    0) or `fatal` is set (exit 1); drain before stopping. Everything the service built to start
    is frozen out of the garbage collector first.

    `drain` flips health to NOT_SERVING, refuses new work and waits for in-flight work, so the
    final `server.stop` has little left to cancel.
    """
    freeze_startup_objects()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    waiters = [asyncio.create_task(stop.wait())]
    waiters += [asyncio.create_task(e.wait()) for e in (fatal, finished) if e is not None]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
    failed = fatal is not None and fatal.is_set()
    log.info("%s; draining", "fatal error" if failed else "serving ended"
             if finished is not None and finished.is_set() else "signal received")
    await drain()
    if stop_server:
        await server.stop(stop_grace_s)
    log.info("stopped")
    return 1 if failed else 0


def exit_now(code: int) -> NoReturn:
    """Leave at once, without interpreter teardown (which would stop a running gRPC server the
    way `exit_now`'s callers avoid): flush the log, then `os._exit`."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
