"""Retiring one gateway of several that share the public port, without failing a call.

Under `serve --gateways N --gateway-recycle-s T` the supervisor replaces the gateways one at a
time, each after about T seconds: grpc.aio keeps a little native memory for every call cancelled
while one of its writes is in flight (grpc/grpc#43360), and only a new process gives it back. On
SIGUSR2 a gateway:

1. shuts down its listening sockets on the public port, so the kernel hands new connections to
   the other gateways of the SO_REUSEPORT group (grpc logs once that its acceptor closed; the
   server itself keeps running);
2. keeps serving the connections it has until each has reached the server's maximum age
   (`grpc.max_connection_age_ms`), when grpc sends the client a GOAWAY that lets the calls in
   flight finish: the client's next call opens a connection to another gateway, and a call that
   raced the GOAWAY is still served. `server.stop` would not do: it answers such calls CANCELLED,
   which a client takes for its own cancel and does not retry;
3. waits for its last Generate calls to end, however long they take (nothing hurries a gateway
   that others stand in for, and a recycle must not cut a long generation short), then exits
   through the usual drain, which ends what else is open (a health Watch) at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable

log = logging.getLogger(__name__)
AGE_JITTER = 1.1  # grpc spreads each connection's maximum age by up to 10 %
AGE_MARGIN_S = 1.0  # for the GOAWAY and the client's next call to cross
REPORT_EVERY_S = 60.0  # how often a retirement still waiting says so


def close_listeners(port: int) -> int:
    """Shut down this process's listening TCP sockets on `port` (the socket, under every file
    descriptor that shares it); how many there were."""
    closed = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = os.dup(int(name))
        except OSError:  # the listing's own descriptor, already closed
            continue
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # not a socket
            os.close(fd)
            continue
        with sock:  # closes the duplicate only
            try:
                listening = (sock.type == socket.SOCK_STREAM
                             and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
                bound = sock.getsockname()
            except OSError:
                continue
            if listening and isinstance(bound, tuple) and bound[1] == port:
                sock.shutdown(socket.SHUT_RD)  # leaves the SO_REUSEPORT group
                closed += 1
    return closed


async def retire(port: int, connection_age_s: float, live_requests: Callable[[], int]) -> None:
    """The module docstring's steps 1 to 3, up to the drain, which the caller runs after it."""
    closed = close_listeners(port)
    wait_s = connection_age_s * AGE_JITTER + AGE_MARGIN_S
    log.info("retiring: %d listener(s) on port %d shut down; %d call(s) in flight; serving this "
             "gateway's connections for %.1f s more, until each has had its GOAWAY", closed, port,
             live_requests(), wait_s)
    await asyncio.sleep(wait_s)
    report = time.monotonic() + REPORT_EVERY_S
    while live_requests():
        if time.monotonic() > report:
            log.info("retiring: waiting for %d call(s) to end", live_requests())
            report += REPORT_EVERY_S
        await asyncio.sleep(0.05)
    log.info("retiring: no call left; draining")
