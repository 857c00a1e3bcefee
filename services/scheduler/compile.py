"""Grammar compilation for constrained requests, off the event loop and off the engine thread.

A request with a constraint (`SamplingParams.constraint`: a JSON schema, regex or EBNF grammar)
waits here until its grammar is compiled, then goes to the engine loop with the grammar attached.
Compiling can take from milliseconds to seconds, so it runs on a small thread pool: the event loop
keeps serving the gateway streams and the engine thread keeps stepping. The engine's
`compile_grammar` caches by constraint text, so a repeated schema costs nothing the second time,
and bounds each call: a text over `--max-constraint-bytes` is refused before it compiles, and a
compile past `--grammar-compile-timeout` is killed (it runs in one of the engine's worker
processes) and refused, so a thread here is never held longer than that limit plus a worker's
start. Both refusals are INVALID_ARGUMENT naming the limit.

Everything here except the compile call itself runs on the event loop, so the bookkeeping needs
no locks. A group (the n completions of one public request) compiles once and is submitted
whole, or rejected whole when its grammar does not compile. A request aborted while it compiles
(by id, or because its gateway stream closed) is forgotten, and its compile result is dropped
when it comes: the engine never sees it. Unconstrained requests never come here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from radixserve.engine.constrained.workers import COMPILE_WORKERS
from radixserve.engine.sampling.params import InvalidRequestError, SamplingParams
from radixserve.services.scheduler.groups import Refused, partition, refuse
from radixserve.services.scheduler.types import NewRequest, Rejection

log = logging.getLogger(__name__)

Submit = Callable[[Hashable, list[NewRequest]], None]
Reject = Callable[[Hashable, list[Rejection]], None]


def split(requests: Sequence[NewRequest]) -> tuple[list[NewRequest], list[list[NewRequest]]]:
    """(requests that go to the loop now, constrained groups that compile first). A group with
    a constrained member compiles as a whole (groups.py), so its members stay together; order
    within each part is kept."""
    now: list[NewRequest] = []
    waiting: list[list[NewRequest]] = []
    for group in partition(requests):
        if any(req.params.constraint is not None for req in group):
            waiting.append(group)
        else:
            now += group
    return now, waiting


class GrammarCompiler:
    """Holds constrained requests while their grammars compile on `workers` threads."""

    def __init__(self, compile_fn: Callable[[SamplingParams], Any], submit: Submit,
                 reject: Reject, workers: int = COMPILE_WORKERS) -> None:
        self._compile = compile_fn
        self._submit = submit
        self._reject = reject
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="grammar-compile")
        self._owner: dict[str, Hashable] = {}  # rid -> gateway stream, while it compiles

    def __len__(self) -> int:
        """Requests still compiling (they count as queued: docs/reliability.md #15)."""
        return len(self._owner)

    def start(self, owner: Hashable, group: list[NewRequest]) -> None:
        for req in group:
            self._owner[req.rid] = owner
        job = asyncio.get_running_loop().run_in_executor(self._pool, self._compile_group, group)
        job.add_done_callback(lambda fut: self._done(owner, group, fut))

    def abort(self, rids: Iterable[str]) -> None:
        for rid in rids:
            self._owner.pop(rid, None)

    def abort_owned(self, owner: Hashable | None) -> None:
        """Forget every request `owner` sent (None: every request)."""
        self.abort([r for r, o in self._owner.items() if owner is None or o == owner])

    def close(self) -> None:
        self._owner.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile_group(self, group: list[NewRequest]) -> list[Any]:
        """On a worker: one compile per distinct constraint (n completions share theirs)."""
        done: dict[Any, Any] = {}
        for req in group:
            key = req.params.constraint
            if key not in done:
                done[key] = self._compile(req.params)
        return [done[req.params.constraint] for req in group]

    def _done(self, owner: Hashable, group: list[NewRequest], fut: asyncio.Future) -> None:
        live = [(i, r) for i, r in enumerate(group) if self._owner.pop(r.rid, None) is not None]
        if not live or fut.cancelled():
            return  # aborted while compiling (or shutting down): nothing else holds them
        exc = fut.exception()
        if exc is None:
            grammars = fut.result()
            self._submit(owner, [dataclasses.replace(r, grammar=grammars[i]) for i, r in live])
            return
        if isinstance(exc, InvalidRequestError):
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
        else:
            log.error("grammar compilation failed", exc_info=exc)
            code, message = grpc.StatusCode.INTERNAL, f"grammar compilation failed: {exc}"
        self._reject(owner, refuse([r for _, r in live], Refused(code, message)))
