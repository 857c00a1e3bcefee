"""The scheduler service's one seam between protobuf and engine/loop types."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from radixserve.engine.detokenize import PROMPT_CONTEXT_IDS
from radixserve.engine.sampling.params import InvalidRequestError, SamplingParams
from radixserve.internal.common.v1 import common_pb2
from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as detok_pb
from radixserve.internal.scheduler.v1 import scheduler_pb2 as pb
from radixserve.services.common.errors import code_number
from radixserve.services.scheduler.types import Acks, Incoming, Invalid, NewRequest, StepBatch

_REASONS = {
    "eos": detok_pb.FINISH_REASON_EOS,
    "stop_token": detok_pb.FINISH_REASON_STOP_TOKEN,
    "length": detok_pb.FINISH_REASON_LENGTH,
    "aborted": detok_pb.FINISH_REASON_ABORTED,
}


def params_from_pb(p: pb.SamplingParams) -> SamplingParams:
    """Raises InvalidRequestError (the gateway validated already; this is the second line)."""
    constraint = p.WhichOneof("constraint")  # json_schema, regex or ebnf: SamplingParams' names
    extra = {constraint: getattr(p, constraint)} if constraint is not None else {}
    return SamplingParams(
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        min_p=p.min_p,
        seed=p.seed if p.HasField("seed") else None,
        max_new_tokens=p.max_new_tokens,
        min_new_tokens=p.min_new_tokens,
        stop_token_ids=tuple(p.stop_token_ids),
        ignore_eos=p.ignore_eos,
        repetition_penalty=p.repetition_penalty,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        top_logprobs=p.top_logprobs,
        logprobs=p.logprobs,
        **extra,
    )


def new_request_from_pb(msg: pb.NewRequest) -> NewRequest:
    return NewRequest(
        rid=msg.request_id,
        prompt_ids=list(msg.prompt_ids),
        params=params_from_pb(msg.sampling),
        passthrough=msg.detokenize,
        group=msg.group_id,
    )


def incoming_from_pb(msg: pb.SubmitRequest) -> Incoming:
    """A request whose fields do not make a valid request becomes an Invalid (refused, with its
    group, at the door), not an error for the whole message."""
    requests: list[NewRequest | Invalid] = []
    for new in msg.requests:
        try:
            requests.append(new_request_from_pb(new))
        except InvalidRequestError as exc:
            requests.append(Invalid(new.request_id, new.group_id, str(exc)))
    return Incoming(requests, list(msg.abort_ids))


def acks_to_pb(acks: Acks) -> pb.SubmitResponse:
    return pb.SubmitResponse(
        accepted_ids=acks.accepted,
        rejected=[
            pb.Rejection(
                request_id=r.rid,
                status=common_pb2.Status(code=code_number(r.code), message=r.message),
            )
            for r in acks.rejected
        ],
    )


def _logprobs_to_pb(logprobs: Sequence[Any] | None) -> list[detok_pb.TokenLogprobs]:
    if not logprobs:
        return []
    return [
        detok_pb.TokenLogprobs(
            logprob=lp.logprob,
            top=[detok_pb.TopLogprob(token_id=t, logprob=v) for t, v in lp.top],
        )
        for lp in logprobs
    ]


def step_to_pb(batch: StepBatch) -> detok_pb.ProcessRequest:
    msg = detok_pb.ProcessRequest(
        step_unix_ns=batch.step_unix_ns,
        aborted_ids=batch.aborted,
        setups=[
            # Only the prompt's tail matters as decoding context; the rest would be wasted bytes.
            detok_pb.RequestSetup(
                request_id=s.rid,
                prompt_ids=s.prompt_ids[-PROMPT_CONTEXT_IDS:],
                options=s.passthrough,
            )
            for s in batch.setups
        ],
    )
    # One row per running request each step. Plain rows (one token, nothing else) go into two
    # packed columns: 256 of them cost 0.30 ms as TokenOutput messages on the 2-core VM, and the
    # detokenizer's parse and conversion of them 0.52 ms. The others are added in place, with
    # only the fields a row has set.
    plain_ids, plain_tokens = msg.plain_request_ids, msg.plain_token_ids
    rids: list[str] = []
    tokens: list[int] = []
    add = msg.outputs.add
    for out in batch.outputs:
        if (out.finish_reason is None and not out.logprobs and len(out.token_ids) == 1
                and out.matched_stop_token is None):
            rids.append(out.rid)
            tokens.append(out.token_ids[0])
            continue
        row = add(request_id=out.rid, token_ids=out.token_ids, prompt_tokens=out.prompt_tokens,
                  cached_tokens=out.cached_tokens)
        if out.logprobs:
            row.logprobs.extend(_logprobs_to_pb(out.logprobs))
        if out.finish_reason is not None:
            row.finish_reason = _REASONS[out.finish_reason]
        if out.matched_stop_token is not None:
            row.matched_stop_token = out.matched_stop_token
    plain_ids.extend(rids)
    plain_tokens.extend(tokens)
    return msg


def stop_aborts_from_pb(msg: detok_pb.ProcessResponse) -> list[str]:
    """The requests the detokenizer finished on a stop string, for the engine to abort."""
    return list(msg.abort_ids)


def model_info_to_pb(info: Any) -> pb.GetModelInfoResponse:
    return pb.GetModelInfoResponse(
        model_name=str(info.model_name),
        architecture=str(info.architecture),
        vocab_size=int(info.vocab_size),
        max_context=int(info.max_context),
        eos_token_ids=[int(t) for t in info.eos_token_ids],
        dtype=str(info.dtype),
    )


_STAT_FIELDS = (
    "running_requests",
    "waiting_requests",
    "kv_pages_total",
    "kv_pages_free",
    "kv_pages_evictable",
    "kv_pages_protected",
    "page_size",
    "cached_tokens_total",
    "prompt_tokens_total",
)


def stats_to_pb(stats: dict[str, Any]) -> pb.GetStatsResponse:
    return pb.GetStatsResponse(**{name: int(stats.get(name, 0)) for name in _STAT_FIELDS})
