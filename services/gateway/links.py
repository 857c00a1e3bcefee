"""The gateway's backends: one tokenizer, N scheduler replicas, and the detokenizers they stream
to, each on long-lived batch streams, and the router that picks a replica for each call.

Replica i streams its outputs to detokenizer i when there are as many detokenizers as schedulers,
else all share the one (`BackendAddresses`). The gateway subscribes to every detokenizer and
routes each delta by request id, whichever detokenizer it came from.

Each link reconnects on its own. A replica's loss ends only its requests, and a detokenizer's
those of the replicas behind it; the others keep streaming. The tokenizer has no spare, so its
loss ends every request, as the loss of any backend does with one replica: a client hears
UNAVAILABLE within seconds and can retry elsewhere while the stack restarts (docs/reliability.md).
The gateway is ready (health SERVING) while the tokenizer and at least one replica are usable.

Messages are opaque here: what goes out was built by `convert`, what comes in is handed to
`convert` before anyone looks at it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf.message import Message
from radixserve.services.common.errors import overloaded, unavailable
from radixserve.services.gateway.replica import ReplicaEvents, SchedulerReplica
from radixserve.services.gateway.routing import ReplicaLoad, RoutingConfig, create_router
from radixserve.services.gateway.subscription import DetokenizerSubscription
from radixserve.services.gateway.tokenizer_link import TokenizerLink
from radixserve.services.gateway.types import (
    Acks,
    Failure,
    JobResult,
    ModelInfo,
    Output,
    ReplicaReport,
    StepTimes,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendAddresses:
    """Where the backends listen. `schedulers` and `detokenizers` take one address or several."""

    tokenizer: str
    schedulers: Sequence[str] | str
    detokenizers: Sequence[str] | str

    def __post_init__(self) -> None:
        for name in ("schedulers", "detokenizers"):
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        schedulers, detokenizers = self.schedulers, self.detokenizers
        if not schedulers or not detokenizers:
            raise ValueError("the gateway needs at least one scheduler and one detokenizer")
        if len(set(schedulers)) != len(schedulers):
            raise ValueError(f"a scheduler address is given twice: {list(schedulers)}")
        if len(detokenizers) not in (1, len(schedulers)):
            raise ValueError(
                f"{len(detokenizers)} detokenizers for {len(schedulers)} schedulers: give one "
                "(shared by all replicas) or one per scheduler (paired in order)")

    def detokenizer_index(self, scheduler_index: int) -> int:
        return scheduler_index if len(self.detokenizers) > 1 else 0


class SchedulerEvents:
    """What the frontend hears from the links (all called on the event loop)."""

    def on_accepted(self, rid: str) -> None: ...
    def on_rejected(self, rid: str, failure: Failure) -> None: ...
    def on_aborts_sent(self, waited_s: list[float]) -> None:
        """Aborts reached a scheduler's Submit stream, each `waited_s` after it was asked for."""
    def on_output(self, output: Output) -> None: ...
    def on_step(self, times: StepTimes) -> None:
        """A step's outputs arrived from a detokenizer (before its `on_output` calls)."""
    def on_replica_lost(self, replica: SchedulerReplica, message: str, gone: bool) -> None:
        """Its requests can no longer stream. `gone`: the scheduler itself, whose Submit stream
        ended (so it holds none of them any more); else the detokenizer behind it."""
    def on_lost(self, message: str) -> None: ...


class Links(ReplicaEvents):
    def __init__(
        self,
        backends: BackendAddresses,
        on_ready: Callable[[bool], Any],
        routing: RoutingConfig | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
        retry_s: float = 0.5,
    ) -> None:
        self.events = SchedulerEvents()  # replaced by the frontend before `run`
        self._on_ready = on_ready
        self.routing = routing or RoutingConfig()
        self.router = create_router(self.routing)
        self.tokenizer = TokenizerLink(backends.tokenizer, self._tokenizer_changed, metadata,
                                       retry_s)
        # Requests name this gateway, so that detokenizers shared with other gateways send each
        # gateway only its own deltas.
        self.subscriber = uuid.uuid4().hex
        self.subscriptions = [
            DetokenizerSubscription(address, self.subscriber, self._on_output,
                                    self._subscription_changed, self._on_step, metadata, retry_s)
            for address in backends.detokenizers
        ]
        self.replicas: list[SchedulerReplica] = []
        for i, address in enumerate(backends.schedulers):
            subscription = self.subscriptions[backends.detokenizer_index(i)]
            self.replicas.append(SchedulerReplica(
                address, self, lambda s=subscription: s.connected, metadata, retry_s))
        self._pairs = [(r, self.subscriptions[backends.detokenizer_index(i)])
                       for i, r in enumerate(self.replicas)]
        self._by_address = {r.address: r for r in self.replicas}
        self._model: ModelInfo | None = None
        self.ready = False

    # -- used by the frontend -------------------------------------------------------------------
    @property
    def model_info(self) -> ModelInfo | None:
        if self._model is None:
            return None
        return replace(self._model, has_chat_template=self.tokenizer.has_chat_template)

    @property
    def pending_jobs(self) -> int:
        return self.tokenizer.pending_jobs

    async def run_job(self, job_id: str, job: Message) -> JobResult:
        return await self.tokenizer.run_job(job_id, job)

    def all_full(self, n: int) -> bool:
        """Every usable replica has said "queue full" to a call of this size and nothing of ours
        has ended there since: refuse at once, without a round trip."""
        usable = [r for r in self.replicas if r.routable]
        return bool(usable) and all(r.refuses(n) for r in usable)

    def pick(self, prompt_ids: Sequence[int], n: int,
             avoid: SchedulerReplica | None = None) -> SchedulerReplica:
        """The replica for a call of n completions of this prompt (the router's choice among the
        usable ones that have room, other than `avoid`), recorded as routed there with the router
        when the gateway has several replicas."""
        usable = [r for r in self.replicas if r.routable and r is not avoid]
        if not usable:
            raise unavailable("no scheduler replica is serving")
        open_ = [r for r in usable if not r.refuses(n)]
        if not open_:
            raise overloaded("queue full")
        if len(open_) == 1:
            replica = open_[0]
        else:
            name = self.router.pick(prompt_ids, [ReplicaLoad(r.address, r.load) for r in open_])
            replica = self._by_address[name]
        if len(self.replicas) > 1:
            # With one replica the router is never asked, so what it learns is never read: a
            # cache-aware router would hold every prompt until its tree is full (about 60 MiB of
            # short prompts at the default bound) for nothing.
            self.router.routed(replica.address, prompt_ids)
        return replica

    async def replica_reports(self) -> tuple[list[ReplicaReport], int]:
        """Each replica as GetServerInfo reports it, and the detokenizers' live requests."""
        reports = await asyncio.gather(*(r.refresh() for r in self.replicas))
        live = await asyncio.gather(*(s.live_requests() for s in self.subscriptions))
        return list(reports), sum(live)

    # -- ReplicaEvents --------------------------------------------------------------------------
    def admits(self, replica: SchedulerReplica, info: ModelInfo) -> str | None:
        known = self._model
        if known is None or known == info:
            self._model = info
            return None
        return (f"it serves {info.model_name} (vocabulary {info.vocab_size}, context "
                f"{info.max_context}, {info.dtype}) but the other replicas serve "
                f"{known.model_name} (vocabulary {known.vocab_size}, context "
                f"{known.max_context}, {known.dtype})")

    def on_acks(self, acks: Acks) -> None:
        for rid in acks.accepted:
            self.events.on_accepted(rid)
        for rid, failure in acks.rejected:
            self.events.on_rejected(rid, failure)

    def on_aborts_sent(self, waited_s: list[float]) -> None:
        self.events.on_aborts_sent(waited_s)

    def on_lost(self, replica: SchedulerReplica, message: str) -> None:
        self.router.forget(replica.address)  # a restarted replica starts with an empty cache
        self.events.on_replica_lost(replica, message, gone=True)
        self._changed(replica)

    def on_change(self, replica: SchedulerReplica) -> None:
        self._changed(replica)

    # -- connection lifecycle -------------------------------------------------------------------
    async def run(self) -> None:
        """Connect every backend and keep reconnecting; runs until cancelled."""
        links: list[Any] = [self.tokenizer, *self.subscriptions, *self.replicas]
        tasks = [asyncio.create_task(link.run()) for link in links]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _on_output(self, output: Output) -> None:
        self.events.on_output(output)

    def _on_step(self, times: StepTimes) -> None:
        self.events.on_step(times)

    def _tokenizer_changed(self, tokenizer: TokenizerLink) -> None:
        if not tokenizer.connected and self.ready:
            self.events.on_lost(f"the tokenizer {tokenizer.address} is unavailable")
        self._changed(tokenizer)

    def _subscription_changed(self, subscription: DetokenizerSubscription) -> None:
        if not subscription.connected:
            for replica, paired in self._pairs:
                if paired is subscription:
                    self.events.on_replica_lost(
                        replica, f"detokenizer {subscription.address} is unavailable", gone=False)
        self._changed(subscription)

    def _changed(self, link: object) -> None:
        ready = self.tokenizer.connected and any(r.routable for r in self.replicas)
        if ready != self.ready:
            self.ready = ready
            self._on_ready(ready)
