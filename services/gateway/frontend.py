"""The gateway's domain: request ids, validation that needs the model, the request table.

Each Generate call gets a fresh internal id (a uuid) that travels through every service; the
client's `request_id` only names it here. So a client may reuse an id the moment its previous
request ends, and a late output of the old request can never reach the new one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from radixserve.engine.sampling.params import SamplingParams
from radixserve.services.common.errors import (
    ServiceError,
    invalid_argument,
    overloaded,
    unavailable,
)
from radixserve.services.gateway import convert
from radixserve.services.gateway.checks import check_ids, resolve_params
from radixserve.services.gateway.inbox import Aborted, Accepted, Item, coalesce, take_all
from radixserve.services.gateway.links import Links, SchedulerEvents
from radixserve.services.gateway.metrics import GatewayMetrics
from radixserve.services.gateway.replica import SchedulerReplica
from radixserve.services.gateway.types import (
    Delta,
    Event,
    Failure,
    Finish,
    Finished,
    GenerateSpec,
    IdsPrompt,
    ModelInfo,
    Output,
    Prompt,
    ReplicaReport,
    Started,
    StepTimes,
)

log = logging.getLogger(__name__)
# What a client hears from a stopping gateway: UNAVAILABLE (retryable) and what to do about it.
SHUTTING_DOWN = "the server is shutting down; retry on another replica"


@dataclass(frozen=True)
class FrontendConfig:
    default_max_new_tokens: int = 128  # cap when the client leaves max_new_tokens unset
    max_in_flight: int = 4096  # Generate calls held at once; more get RESOURCE_EXHAUSTED
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.default_max_new_tokens < 1 or self.max_in_flight < 1 or self.drain_timeout_s < 0:
            raise ValueError(f"invalid gateway limits: {self}")


@dataclass
class RequestHandle:
    """One Generate call: `spec.n` completions, each an internal request of its own (`rids[i]`
    is completion i), submitted as one group."""

    public_id: str
    rids: tuple[str, ...]
    spec: GenerateSpec
    t0: float = field(default_factory=time.monotonic)
    inbox: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)
    replica: SchedulerReplica | None = None  # where it was submitted
    # What went there: kept until the replica accepts it, to send it elsewhere if that replica is
    # lost first (it never started on it, so the client cannot tell).
    unacked: tuple[list[int], list[Any]] | None = None
    finished: bool = False  # the scheduler holds nothing more for it (all done, or refused)
    aborted: bool = False  # by the Abort RPC; may come before submission (while tokenizing)
    done: set[int] = field(default_factory=set)  # completions that have had their Finished

    @property
    def index(self) -> dict[str, int]:
        return {rid: i for i, rid in enumerate(self.rids)}


_ABORTED = Finish("aborted", None, None, 0, 0)


def _completion_params(params: SamplingParams, i: int) -> SamplingParams:
    """Completion i of a seeded request draws with seed + i, so the n completions differ."""
    if i == 0 or params.seed is None:
        return params
    return dataclasses.replace(params, seed=(params.seed + i) % 2**64)


class Frontend(SchedulerEvents):
    def __init__(
        self, links: Links, config: FrontendConfig, metrics: GatewayMetrics | None = None
    ) -> None:
        self._links = links
        self._config = config
        self._metrics = metrics
        self._by_rid: dict[str, RequestHandle] = {}
        self._by_public: dict[str, RequestHandle] = {}
        self.draining = False

    @property
    def live_requests(self) -> int:
        return len(self._by_rid) + self._links.pending_jobs

    def model_info(self) -> ModelInfo:
        info = self._links.model_info
        if self.draining:
            raise unavailable(SHUTTING_DOWN)
        if info is None or not self._links.ready:
            raise unavailable("the backends are not ready")
        return info

    # -- Generate -------------------------------------------------------------------------------
    def open(self, spec: GenerateSpec) -> RequestHandle:
        self.model_info()
        if len(self._by_rid) + spec.n > self._config.max_in_flight:
            raise overloaded("too many requests in flight")
        if self._links.all_full(spec.n):
            # Refused here, without a round trip (docs/reliability.md #15: <= 10 ms).
            raise overloaded("queue full")
        public_id = spec.request_id or uuid.uuid4().hex
        if public_id in self._by_public:
            raise invalid_argument(f"request_id {public_id!r} is already running")
        handle = RequestHandle(public_id, tuple(uuid.uuid4().hex for _ in range(spec.n)), spec)
        for rid in handle.rids:
            self._by_rid[rid] = handle
        self._by_public[public_id] = handle
        if self._metrics is not None:
            self._metrics.in_flight.inc()
        return handle

    async def run(self, handle: RequestHandle) -> AsyncIterator[Event]:
        """Tokenize, check, submit and stream one request. Leaving early (client cancel, deadline,
        error) aborts it in the scheduler."""
        n = len(handle.rids)
        try:
            info = self.model_info()
            prompt_ids = await self._prompt_ids(handle.rids[0], handle.spec.prompt, info)
            params = resolve_params(handle.spec.params, len(prompt_ids), info,
                                    self._config.default_max_new_tokens)
            if not handle.aborted:
                # One group in one message: the scheduler takes it whole or refuses every member
                # with one status (services/scheduler/groups.py), so the first rejection of any
                # member ends the call and leaves nothing to abort.
                group = handle.rids[0] if n > 1 else ""
                handle.unacked = (prompt_ids, [
                    convert.new_request_to_pb(rid, prompt_ids, _completion_params(params, i),
                                              handle.spec.skip_special_tokens, group,
                                              self._links.subscriber)
                    for i, rid in enumerate(handle.rids)
                ])
                self._submit(handle, self._links.pick(prompt_ids, n))
            async for event in self._stream(handle, prompt_ids):
                yield event
        finally:
            for rid in handle.rids:
                self._by_rid.pop(rid, None)
            self._by_public.pop(handle.public_id, None)
            if self._metrics is not None:
                self._metrics.in_flight.dec()
            replica = handle.replica
            if replica is not None:
                replica.in_flight -= n
                if not handle.finished:
                    for i, rid in enumerate(handle.rids):
                        if i not in handle.done:
                            replica.abort(rid)

    def _submit(self, handle: RequestHandle, replica: SchedulerReplica) -> None:
        assert handle.unacked is not None
        n = len(handle.rids)
        replica.submit(handle.unacked[1])
        if handle.replica is not None:
            handle.replica.in_flight -= n
        handle.replica = replica
        replica.in_flight += n
        if self._metrics is not None:
            self._metrics.routed.labels(replica=replica.address).inc(n)

    async def _prompt_ids(self, rid: str, prompt: Prompt, info: ModelInfo) -> list[int]:
        if isinstance(prompt, IdsPrompt):
            return check_ids(prompt.ids, info)
        ids = (await self._links.run_job(rid, convert.tokenize_job_to_pb(rid, prompt))).token_ids
        if not ids:
            raise invalid_argument("the prompt tokenizes to no tokens")
        return ids

    async def _stream(self, handle: RequestHandle, prompt_ids: list[int]) -> AsyncIterator[Event]:
        n, index = len(handle.rids), handle.index
        started_at: float | None = None
        first_token_at: float | None = None
        completion = [0] * n
        handed: list[float | None] = [None] * n  # when each completion's last tokens went out
        ready: list[Item] = []
        while True:
            if not ready:
                ready = coalesce(await take_all(handle.inbox))
            item = ready.pop(0)
            if isinstance(item, Failure):
                if item.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    if handle.replica is not None:
                        handle.replica.mark_full(n)
                    raise overloaded(item.message)
                raise ServiceError(item.code, item.message)
            if started_at is None:
                started_at = time.monotonic()
                echo = prompt_ids if handle.spec.return_prompt_info else []
                yield Started(len(prompt_ids), echo)
            if isinstance(item, Accepted):
                continue
            if isinstance(item, Aborted):
                handle.finished = True
                for i in range(n):
                    if i not in handle.done:
                        yield self._finished(handle, i, _ABORTED, len(prompt_ids), completion[i],
                                             started_at, first_token_at)
                return
            assert isinstance(item, Output)
            i = index[item.rid]
            if item.token_ids and first_token_at is None:
                first_token_at = time.monotonic()
            completion[i] += len(item.token_ids)
            if item.token_ids or item.text:
                if self._metrics is not None:
                    gap = None
                    if item.token_ids:
                        now = time.perf_counter()
                        gap = None if handed[i] is None else now - handed[i]
                        handed[i] = now
                    self._metrics.on_token_handoff(item.step_unix_ns, gap)
                yield Delta(item.token_ids, item.text, item.logprobs, i)
            if item.finish is not None:
                handle.done.add(i)
                handle.finished = len(handle.done) == n
                yield self._finished(handle, i, item.finish, len(prompt_ids),
                                     item.finish.completion_tokens or completion[i], started_at,
                                     first_token_at)
                if handle.finished:
                    return

    def _finished(
        self, handle: RequestHandle, index: int, finish: Finish, prompt_len: int, completion: int,
        started_at: float, first_token_at: float | None,
    ) -> Finished:
        now = time.monotonic()
        ttft = None if first_token_at is None else first_token_at - handle.t0
        if self._metrics is not None:
            self._metrics.on_finished(ttft, now - handle.t0, completion)
        return Finished(
            finish.reason, finish.stop_string, finish.stop_token_id, prompt_len, completion,
            finish.cached_tokens, queue_s=started_at - handle.t0, ttft_s=ttft or 0.0,
            total_s=now - handle.t0, index=index,
        )

    # -- other RPCs -----------------------------------------------------------------------------
    def abort(self, public_ids: list[str]) -> int:
        aborted = 0
        for public_id in public_ids:
            handle = self._by_public.get(public_id)
            if handle is None or handle.finished or handle.aborted:
                continue
            aborted += 1
            handle.aborted = True
            handle.inbox.put_nowait(Aborted())
            if handle.replica is not None:
                for rid in handle.rids:
                    handle.replica.abort(rid)
        return aborted

    async def tokenize(self, prompt: Prompt) -> list[int]:
        self.model_info()
        job_id = uuid.uuid4().hex
        result = await self._links.run_job(job_id, convert.tokenize_job_to_pb(job_id, prompt))
        return result.token_ids

    async def detokenize(self, ids: list[int], skip_special_tokens: bool) -> str:
        self.model_info()
        job_id = uuid.uuid4().hex
        job = convert.decode_job_to_pb(job_id, ids, skip_special_tokens)
        return (await self._links.run_job(job_id, job)).text

    async def server_info(self) -> tuple[list[ReplicaReport], dict[str, int]]:
        """Each replica, and the live requests of this gateway and of the detokenizers."""
        self.model_info()
        replicas, detokenizer_live = await self._links.replica_reports()
        return replicas, {"gateway_live_requests": self.live_requests,
                          "detokenizer_live_requests": detokenizer_live}

    async def drain(self) -> None:
        """Refuse new calls, give in-flight ones `drain_timeout_s` to finish, then end them."""
        self.draining = True
        deadline = time.monotonic() + self._config.drain_timeout_s
        while self._by_rid and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._by_rid:
            log.warning("drain timeout (%.0f s): ending %d requests", self._config.drain_timeout_s,
                        len(self._by_rid))
        self._fail_all(grpc.StatusCode.UNAVAILABLE,
                       f"{SHUTTING_DOWN} (the {self._config.drain_timeout_s:.0f} s drain ended "
                       "before this request finished)")
        while self._by_rid and time.monotonic() < deadline + 2.0:
            await asyncio.sleep(0.01)

    # -- SchedulerEvents (from the links) -------------------------------------------------------
    def on_accepted(self, rid: str) -> None:
        handle = self._by_rid.get(rid)
        if handle is not None:
            handle.unacked = None
            handle.inbox.put_nowait(Accepted())

    def on_rejected(self, rid: str, failure: Failure) -> None:
        handle = self._by_rid.get(rid)
        if handle is not None:
            handle.finished = True  # its whole group was refused: the scheduler holds none of it
            handle.inbox.put_nowait(failure)

    def on_output(self, output: Output) -> None:
        handle = self._by_rid.get(output.rid)
        if handle is not None:
            handle.inbox.put_nowait(output)

    def on_step(self, times: StepTimes) -> None:
        if self._metrics is not None:
            self._metrics.on_step_arrival(times)

    def on_aborts_sent(self, waited_s: list[float]) -> None:
        if self._metrics is not None:
            for seconds in waited_s:
                self._metrics.abort_sent.observe(seconds)

    def on_lost(self, message: str) -> None:
        self._fail_all(grpc.StatusCode.UNAVAILABLE, message)

    def on_replica_lost(self, replica: SchedulerReplica, message: str, gone: bool) -> None:
        """Requests it had accepted end UNAVAILABLE. Those a scheduler that is gone had not
        accepted go to another replica: it dropped whatever it held of this gateway's, so they
        cannot run twice."""
        for handle in list(self._by_public.values()):
            if handle.replica is not replica or handle.finished:
                continue
            if gone and handle.unacked is not None:
                try:
                    self._submit(handle, self._links.pick(handle.unacked[0], len(handle.rids),
                                                          avoid=replica))
                    continue
                except ServiceError as exc:
                    message = f"{message}; {exc.message}"
            handle.inbox.put_nowait(Failure(grpc.StatusCode.UNAVAILABLE, message))

    def _fail_all(self, code: grpc.StatusCode, message: str) -> None:
        for handle in self._by_public.values():
            handle.inbox.put_nowait(Failure(code, message))
