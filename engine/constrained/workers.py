"""CompileWorkers: a grammar first compiles in a worker process, which can be stopped at a limit.

xgrammar compiles in C++ with the GIL released and offers no way to interrupt a compile. A thread
that runs one past its time limit would keep a CPU core (and the memory it builds) until xgrammar
finishes, and some constraints well inside the size limit take minutes (docs/benchmarks.md,
"Grammar compile times"). A process can be killed: a compile that passes its limit takes its
worker with it, and the slot starts a fresh one on its next job.

The worker only proves that the text compiles in time: its result is thrown away, and the caller
compiles the text again in its own process (compiler.py). Shipping the result back would cost
far more than compiling twice: `CompiledGrammar.serialize_json()` of a schema with 500 properties
is 55 MB and takes 5.7 s to write, against 0.06 s to compile. The second compile does the same
work as the first, so it takes about as long.

A worker is `python -m radixserve.engine.constrained.workers` (like the tensor-parallel ranks),
not a multiprocessing child, so nothing re-runs the caller's main script: an offline script
without a `__main__` guard works. Its start (importing xgrammar, seconds) is not counted in a
compile's time limit. It builds its compiler from the caller's serialized `TokenizerInfo`, talks
over a socket pair (a `multiprocessing.connection.Connection`), and exits when the process that
started it is gone, even in the middle of a compile.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from radixserve.engine.sampling.params import ConstraintKind

COMPILE_WORKERS = 2  # processes; the scheduler service's compile threads match it
START_TIMEOUT_S = 300.0  # a worker that is not ready by then is a broken installation


class CompileTimeout(Exception):
    """The compile ran past its limit; its worker was killed."""


class CompileError(Exception):
    """xgrammar refused the constraint; the message is its own."""


class _Worker(NamedTuple):
    process: subprocess.Popen
    conn: Connection


def compile_text(compiler: Any, kind: ConstraintKind, text: str) -> Any:
    """`compiler.compile_*` (an xgrammar.GrammarCompiler) for one constraint. JSON is generated
    compact (no free whitespace): fewer tokens, and a bounded language for a bounded schema."""
    if kind == "json_schema":
        return compiler.compile_json_schema(text, any_whitespace=False)
    return compiler.compile_regex(text) if kind == "regex" else compiler.compile_grammar(text)


def _exit_with_parent(parent_pid: int) -> None:
    """On a daemon thread of the worker: a dead parent re-parents this process."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(0)


def _serve(conn: Connection) -> None:
    """The worker's loop: "ready" once xgrammar is imported, the TokenizerInfo JSON in, "ready"
    again; then (kind, text) in and ("ok", "") or ("error", message) out, until None or a closed
    connection."""
    import xgrammar as xgr

    conn.send(("ready", ""))
    info = xgr.TokenizerInfo.deserialize_json(conn.recv())
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    conn.send(("ready", ""))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        kind, text = job
        try:
            compile_text(compiler, kind, text)
            conn.send(("ok", ""))
        except (RuntimeError, ValueError, TypeError) as e:
            conn.send(("error", str(e)))


def _stop(workers: set[_Worker]) -> None:
    for w in list(workers):
        w.process.kill()
        w.process.wait(5)
        w.conn.close()
    workers.clear()


class CompileWorkers:
    """`num_workers` worker processes, started on first use. `check` is thread-safe: a caller
    takes an idle worker (waiting for one if all are busy) and gives it back when done."""

    def __init__(self, info_json: str, num_workers: int = COMPILE_WORKERS) -> None:
        self._info_json = info_json
        # Last in, first out: a worker that just finished takes the next job, so a second process
        # starts only when jobs overlap. None is a slot whose process is not started.
        self._idle: queue.LifoQueue[_Worker | None] = queue.LifoQueue()
        for _ in range(num_workers):
            self._idle.put(None)
        self._live: set[_Worker] = set()
        self.num_killed = 0  # workers killed for running past their limit (or dying)
        self._finalizer = weakref.finalize(self, _stop, self._live)

    def check(self, kind: ConstraintKind, text: str, timeout_s: float) -> None:
        """Compile in a worker and throw the result away. Raises CompileTimeout after `timeout_s`
        of compiling, CompileError when xgrammar refuses the text, RuntimeError when a worker
        cannot start or dies."""
        worker = self._idle.get()
        try:
            if worker is None:
                worker = self._start()
            worker.conn.send((kind, text))
            if not worker.conn.poll(timeout_s):
                self._kill(worker)
                worker = None
                raise CompileTimeout()
            status, message = worker.conn.recv()
        except (EOFError, OSError) as e:  # the worker died
            code = None
            if worker is not None:
                self._kill(worker)
                code, worker = worker.process.returncode, None
            raise RuntimeError(f"grammar compile worker failed (exit code {code})") from e
        finally:
            self._idle.put(worker)
        if status == "error":
            raise CompileError(message)

    def pids(self) -> list[int]:
        """Process ids of the running workers."""
        return [w.process.pid for w in list(self._live)]

    def _start(self) -> _Worker:
        mine, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", __name__, str(theirs.fileno()), str(os.getpid())]
        process = subprocess.Popen(cmd, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        worker = _Worker(process, Connection(mine.detach()))
        self._live.add(worker)
        problem = f"not ready after {START_TIMEOUT_S:g} s"
        try:  # sent only once the worker reads, so a worker that never does cannot block us
            if worker.conn.poll(START_TIMEOUT_S):
                worker.conn.recv()  # ("ready", ""): xgrammar imported
                worker.conn.send(self._info_json)
                if worker.conn.poll(START_TIMEOUT_S):
                    worker.conn.recv()  # ("ready", ""): its compiler built
                    return worker
        except (EOFError, OSError):
            problem = "exited while starting"
        self._kill(worker)
        raise RuntimeError(f"grammar compile worker {problem} (exit code "
                           f"{process.returncode})")

    def _kill(self, worker: _Worker) -> None:
        worker.process.kill()
        worker.process.wait(5)
        worker.conn.close()
        self._live.discard(worker)
        self.num_killed += 1

    def close(self) -> None:
        """Stop every worker; a compile in flight fails with RuntimeError."""
        self._finalizer()


def main(argv: list[str]) -> None:
    """`python -m radixserve.engine.constrained.workers FD PARENT_PID`."""
    fd, parent_pid = int(argv[0]), int(argv[1])
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    _serve(Connection(fd))


if __name__ == "__main__":
    main(sys.argv[1:])
