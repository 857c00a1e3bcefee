"""Step plans: rank 0's scheduling decisions, serialized as protobuf for the follower ranks.

This module is the one seam between the engine and the internal tp/v1 plan contract (as each
service's convert module is for its contract); nothing else under engine/ imports a *_pb2.

What a follower rebuilds is exactly what `ModelRunner.forward` and sampling read from a batch: per
row the slot, prefix_len, seq_len and sample flag, and per slot the request's prompt_len, seed and
device-side sampling options. A new read of `Req` state in the engine must be added here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch
from radixserve.engine.constrained.bitmask import HostGrammarMask
from radixserve.engine.distributed import TPGroupError
from radixserve.engine.kvcache.table import RowWrite, TableManager
from radixserve.engine.request import Req
from radixserve.engine.sampling.params import SamplerOptions, SamplingParams
from radixserve.engine.scheduler.batch import Batch
from radixserve.internal.tp.v1 import plan_pb2 as pb

_TARGETS = {"page_table": pb.ROW_TARGET_PAGE_TABLE, "token_pool": pb.ROW_TARGET_TOKEN_POOL}
_TARGET_NAMES = {v: k for k, v in _TARGETS.items()}


def _options_to_pb(p: SamplingParams) -> pb.SamplingOptions:
    return pb.SamplingOptions(
        temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p,
        min_new_tokens=p.min_new_tokens, stop_token_ids=p.stop_token_ids, ignore_eos=p.ignore_eos,
        repetition_penalty=p.repetition_penalty, frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty, top_logprobs=p.top_logprobs, logprobs=p.logprobs)


def _options_from_pb(o: pb.SamplingOptions) -> SamplingParams:
    # max_new_tokens stays on rank 0 (it decides when to stop); None keeps validation happy.
    return SamplingParams(
        temperature=o.temperature, top_k=o.top_k, top_p=o.top_p, min_p=o.min_p, max_new_tokens=None,
        min_new_tokens=o.min_new_tokens, stop_token_ids=tuple(o.stop_token_ids),
        ignore_eos=o.ignore_eos,
        repetition_penalty=o.repetition_penalty, frequency_penalty=o.frequency_penalty,
        presence_penalty=o.presence_penalty, top_logprobs=o.top_logprobs, logprobs=o.logprobs)


class PlanEncoder:
    """Rank 0: one StepPlan per launched batch, carrying the table writes that batch queued."""

    def __init__(self) -> None:
        self._seq = 0
        self._bound: dict[int, Req] = {}  # slot -> the request the followers know in it

    def _plan(self, shutdown: bool = False) -> pb.StepPlan:
        plan = pb.StepPlan(seq=self._seq, shutdown=shutdown)
        self._seq += 1
        return plan

    def encode(self, batch: Batch, table: TableManager) -> bytes:
        """Call after scheduling and before `ModelRunner.forward` (it flushes the queued writes)."""
        plan = self._plan()
        for req in batch.reqs:
            if self._bound.get(req.slot) is not req:
                self._bound[req.slot] = req
                plan.bindings.add(slot=req.slot, prompt_len=req.prompt_len, seed=req.seed,
                                  sampling=_options_to_pb(req.params))
        for w in table.pending_writes():  # add(), not append(): append copies the message
            plan.writes.add(target=_TARGETS[w.target], slot=w.slot, start=w.start,
                            values=w.values.tolist())
        rows = plan.rows
        rows.slots.extend(r.slot for r in batch.reqs)
        rows.prefix_lens.extend(batch.prefix_lens)
        rows.seq_lens.extend(batch.seq_lens)
        rows.sample.extend(batch.sample)
        if batch.grammar is not None:
            plan.grammar.rows.extend(batch.grammar.rows)
            plan.grammar.bits = batch.grammar.bits.numpy().tobytes()
        return plan.SerializeToString()

    def encode_shutdown(self) -> bytes:
        return self._plan(shutdown=True).SerializeToString()


@dataclass(eq=False)
class SlotReq:
    """A follower's view of the request in a slot: the `Req` fields the engine reads."""

    slot: int
    prompt_len: int
    seed: int
    params: SamplingParams
    device_len: int = 0
    grammar: None = None  # grammar state stays on rank 0; the plan carries each step's mask
    sampler_options: SamplerOptions = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.sampler_options = self.params.sampler_options(self.seed)

    @property
    def prefill_done(self) -> bool:
        return self.device_len > self.prompt_len


class PlanDecoder:
    """Followers: replay each plan's table writes and rebuild its batch."""

    def __init__(self, table: TableManager) -> None:
        self.table = table
        self._seq = 0
        self._slots: dict[int, SlotReq] = {}

    def decode(self, data: bytes) -> Batch | None:
        """The batch to run, or None when rank 0 is shutting down."""
        plan = pb.StepPlan.FromString(data)
        if plan.seq != self._seq:
            raise TPGroupError(f"step plan {plan.seq} arrived where {self._seq} was due: ranks out "
                               "of sync")
        self._seq += 1
        if plan.shutdown:
            return None
        for b in plan.bindings:
            self._slots[b.slot] = SlotReq(b.slot, b.prompt_len, b.seed,
                                          _options_from_pb(b.sampling))
        # np.fromiter: the quickest way from a repeated int64 field to a tensor (half of list())
        self.table.replay(RowWrite(_TARGET_NAMES[w.target], w.slot, w.start,  # type: ignore[arg-type]
                                   torch.from_numpy(np.fromiter(w.values, np.int64, len(w.values))))
                          for w in plan.writes)
        r = plan.rows
        reqs = [self._slots[slot] for slot in r.slots]
        seq_lens, sample = list(r.seq_lens), list(r.sample)
        for req, seq_len, s in zip(reqs, seq_lens, sample):
            # Rank 0's device_len right after scheduling: the sampled token sits one past seq_len.
            req.device_len = seq_len + s
        batch = Batch(cast(list[Req], reqs), list(r.prefix_lens), seq_lens, sample)
        if plan.HasField("grammar"):
            g = plan.grammar
            bits = torch.frombuffer(bytearray(g.bits), dtype=torch.int32)
            batch.grammar = HostGrammarMask(list(g.rows), bits.view(len(g.rows), -1))
        return batch
