"""The gateway's one seam between protobuf (public and internal) and its domain types.

Parsing a GenerateRequest validates everything that does not need the model or the tokenizer;
the frontend checks the rest (vocabulary, context length) once the prompt's ids are known.

The frontend, the inbox and the links never read or build a message themselves: what they send is
built here and handed to them as an opaque message, and what they receive is turned into domain
types here (`outputs_from_pb` runs once per token at full load: no more objects than it needs).
"""

from __future__ import annotations

from typing import Any

from radixserve.engine.sampling.params import InvalidRequestError, SamplingParams
from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as detok_pb
from radixserve.internal.scheduler.v1 import scheduler_pb2 as sched_pb
from radixserve.internal.tokenizer.v1 import tokenizer_pb2 as tok_pb
from radixserve.services.common.errors import code_from_number, invalid_argument
from radixserve.services.gateway.types import (
    Acks,
    ChatPrompt,
    Delta,
    Event,
    Failure,
    Finish,
    GenerateSpec,
    IdsPrompt,
    JobResult,
    ModelInfo,
    Output,
    Prompt,
    ReplicaReport,
    ReplicaStats,
    Started,
    StepTimes,
    TextPrompt,
)
from radixserve.v1 import generate_pb2 as pb

MAX_REQUEST_ID_LEN = 256
MAX_N = 64  # completions per request (sampling.n)

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
                    "frequency_penalty", "presence_penalty")
_REASONS: dict[str, int] = {
    "eos": pb.FINISH_REASON_EOS,
    "stop_token": pb.FINISH_REASON_STOP_TOKEN,
    "stop_string": pb.FINISH_REASON_STOP_STRING,
    "length": pb.FINISH_REASON_LENGTH,
    "aborted": pb.FINISH_REASON_ABORTED,
}
_INTERNAL_REASONS: dict[int, str] = {
    detok_pb.FINISH_REASON_EOS: "eos",
    detok_pb.FINISH_REASON_STOP_TOKEN: "stop_token",
    detok_pb.FINISH_REASON_STOP_STRING: "stop_string",
    detok_pb.FINISH_REASON_LENGTH: "length",
    detok_pb.FINISH_REASON_ABORTED: "aborted",
}


def chat_from_pb(chat: pb.ChatMessages) -> ChatPrompt:
    if not chat.messages:
        raise invalid_argument("chat needs at least one message")
    for i, m in enumerate(chat.messages):
        if not m.role.strip():
            raise invalid_argument(f"chat message {i} has an empty role")
    if not any(m.content.strip() for m in chat.messages):
        raise invalid_argument("chat messages are all empty or whitespace")
    add_prompt = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
    return ChatPrompt(tuple((m.role, m.content) for m in chat.messages), add_prompt)


def prompt_from_pb(request: pb.GenerateRequest) -> Prompt:
    kind = request.WhichOneof("prompt")
    if kind == "text":
        if not request.text:
            raise invalid_argument("prompt text is empty")
        return TextPrompt(request.text)
    if kind == "token_ids":
        if not request.token_ids.ids:
            raise invalid_argument("prompt token_ids is empty")
        return IdsPrompt(tuple(request.token_ids.ids))
    if kind == "chat":
        return chat_from_pb(request.chat)
    raise invalid_argument("a prompt is required: set one of text, token_ids, chat")


def params_from_pb(request: pb.GenerateRequest) -> SamplingParams:
    """Only fields the client set are passed, so unset ones take SamplingParams' defaults and an
    explicit 0 stays 0. Bound violations raise INVALID_ARGUMENT naming the field."""
    kwargs: dict[str, Any] = {}
    sampling, stopping, options = request.sampling, request.stopping, request.options
    for name in _SAMPLING_FIELDS:
        if sampling.HasField(name):
            kwargs[name] = getattr(sampling, name)
    kwargs["max_new_tokens"] = (
        stopping.max_new_tokens if stopping.HasField("max_new_tokens") else None
    )
    kwargs.update(
        min_new_tokens=stopping.min_new_tokens,
        stop=tuple(stopping.stop),
        stop_token_ids=tuple(stopping.stop_token_ids),
        ignore_eos=stopping.ignore_eos,
        include_stop_str=stopping.include_stop_str,
        top_logprobs=options.top_logprobs,
        logprobs=options.logprobs,
    )
    constraint = sampling.WhichOneof("constraint")
    if constraint is not None:  # checked (size, emptiness) by SamplingParams, compiled later
        kwargs[constraint] = getattr(sampling, constraint)
    try:
        return SamplingParams(**kwargs)
    except InvalidRequestError as exc:
        raise invalid_argument(str(exc)) from None


def generate_spec_from_pb(request: pb.GenerateRequest) -> GenerateSpec:
    if len(request.request_id) > MAX_REQUEST_ID_LEN:
        raise invalid_argument(f"request_id is longer than {MAX_REQUEST_ID_LEN} characters")
    n = request.sampling.n if request.sampling.HasField("n") else 1
    if not 1 <= n <= MAX_N:
        raise invalid_argument(f"sampling.n must be in [1, {MAX_N}], got {n}")
    return GenerateSpec(
        request_id=request.request_id,
        prompt=prompt_from_pb(request),
        params=params_from_pb(request),
        return_prompt_info=request.options.return_prompt_info,
        n=n,
    )


def _logprobs_to_pb(items: Any) -> list[pb.TokenLogprobs]:
    return [
        pb.TokenLogprobs(
            logprob=lp.logprob,
            top=[pb.TopLogprob(token_id=t.token_id, logprob=t.logprob) for t in lp.top],
        )
        for lp in items
    ]


def event_to_pb(request_id: str, event: Event) -> pb.GenerateResponse:
    if isinstance(event, Started):
        started = pb.Started(prompt_tokens=event.prompt_tokens, prompt_token_ids=event.prompt_ids)
        return pb.GenerateResponse(request_id=request_id, started=started)
    if isinstance(event, Delta):
        # One per token per stream: the fields are set in place (a sub-message built apart is
        # copied into its parent), and logprobs are converted only when asked for.
        msg = pb.GenerateResponse(request_id=request_id, index=event.index)
        msg.delta.token_ids.extend(event.token_ids)
        msg.delta.text = event.text
        if event.logprobs:
            msg.delta.logprobs.extend(_logprobs_to_pb(event.logprobs))
        return msg
    finished = pb.Finished(
        finish_reason=_REASONS[event.reason],
        usage=pb.Usage(
            prompt_tokens=event.prompt_tokens,
            completion_tokens=event.completion_tokens,
            cached_tokens=event.cached_tokens,
        ),
        timings=pb.Timings(
            queue_seconds=event.queue_s,
            time_to_first_token_seconds=event.ttft_s,
            total_seconds=event.total_s,
        ),
    )
    if event.stop_string is not None:
        finished.stop_string = event.stop_string
    elif event.stop_token_id is not None:
        finished.stop_token_id = event.stop_token_id
    return pb.GenerateResponse(request_id=request_id, finished=finished, index=event.index)


def _finish_from_pb(f: detok_pb.Finish) -> Finish:
    matched = f.WhichOneof("matched_stop")
    return Finish(
        _INTERNAL_REASONS.get(f.reason, "aborted"),  # type: ignore[arg-type]
        f.stop_string if matched == "stop_string" else None,
        f.stop_token_id if matched == "stop_token_id" else None,
        f.completion_tokens,
        f.cached_tokens,
    )


def step_times_from_pb(msg: detok_pb.SubscribeResponse) -> StepTimes:
    return StepTimes(msg.step_unix_ns, msg.received_unix_ns, msg.detokenized_unix_ns)


def outputs_from_pb(msg: detok_pb.SubscribeResponse) -> list[Output]:
    """One processed engine step's deltas (a request has at most one): the full ones, then the
    plain ones from their packed columns."""
    step_ns = msg.step_unix_ns
    outputs = [
        Output(d.request_id, list(d.token_ids), d.text, list(d.logprobs),
               _finish_from_pb(d.finish) if d.HasField("finish") else None, step_ns)
        for d in msg.deltas
    ]
    outputs += [Output(rid, [token], text, [], None, step_ns) for rid, token, text
                in zip(msg.plain_request_ids, msg.plain_token_ids, msg.plain_texts)]
    return outputs


def submit_to_pb(requests: list[sched_pb.NewRequest], abort_ids: list[str]
                 ) -> sched_pb.SubmitRequest:
    return sched_pb.SubmitRequest(requests=requests, abort_ids=abort_ids)


def acks_from_pb(msg: sched_pb.SubmitResponse) -> Acks:
    return Acks(
        list(msg.accepted_ids),
        [(r.request_id, Failure(code_from_number(r.status.code), r.status.message))
         for r in msg.rejected],
    )


def jobs_to_pb(jobs: list[tok_pb.Job]) -> tok_pb.ProcessRequest:
    return tok_pb.ProcessRequest(jobs=jobs)


def job_results_from_pb(msg: tok_pb.ProcessResponse) -> list[tuple[str, JobResult | Failure]]:
    """(job id, its result) for each job the message answers."""
    out: list[tuple[str, JobResult | Failure]] = []
    for r in msg.results:
        if r.WhichOneof("result") == "error":
            out.append((r.job_id, Failure(code_from_number(r.error.code), r.error.message)))
        else:
            out.append((r.job_id, JobResult(list(r.token_ids.ids), r.text)))
    return out


def new_request_to_pb(
    rid: str, prompt_ids: list[int], params: SamplingParams, skip_special_tokens: bool,
    group: str = "", subscriber: str = "",
) -> sched_pb.NewRequest:
    assert params.max_new_tokens is not None, "max_new_tokens is resolved before submission"
    sampling = sched_pb.SamplingParams(
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        min_p=params.min_p,
        max_new_tokens=params.max_new_tokens,
        min_new_tokens=params.min_new_tokens,
        stop_token_ids=params.stop_token_ids,
        ignore_eos=params.ignore_eos,
        repetition_penalty=params.repetition_penalty,
        frequency_penalty=params.frequency_penalty,
        presence_penalty=params.presence_penalty,
        top_logprobs=params.top_logprobs,
        logprobs=params.logprobs,
    )
    if params.seed is not None:
        sampling.seed = params.seed
    if params.constraint is not None:  # the oneof's field names are SamplingParams' kinds
        kind, text = params.constraint
        setattr(sampling, kind, text)
    options = detok_pb.RequestOptions(
        stop=params.stop,
        include_stop_str=params.include_stop_str,
        skip_special_tokens=skip_special_tokens,
        subscriber=subscriber,
    )
    return sched_pb.NewRequest(
        request_id=rid, prompt_ids=prompt_ids, sampling=sampling, detokenize=options,
        group_id=group,
    )


def tokenize_job_to_pb(job_id: str, prompt: Prompt) -> tok_pb.Job:
    if isinstance(prompt, TextPrompt):
        text = tok_pb.EncodeText(text=prompt.text, add_special_tokens=prompt.add_special_tokens)
        return tok_pb.Job(job_id=job_id, encode_text=text)
    assert isinstance(prompt, ChatPrompt), "token-id prompts skip the tokenizer"
    chat = tok_pb.EncodeChat(
        messages=[tok_pb.ChatMessage(role=r, content=c) for r, c in prompt.messages],
        add_generation_prompt=prompt.add_generation_prompt,
    )
    return tok_pb.Job(job_id=job_id, encode_chat=chat)


def decode_job_to_pb(job_id: str, ids: list[int], skip_special_tokens: bool) -> tok_pb.Job:
    decode = tok_pb.Decode(token_ids=ids, skip_special_tokens=skip_special_tokens)
    return tok_pb.Job(job_id=job_id, decode=decode)


def model_info_to_pb(info: ModelInfo) -> pb.GetModelInfoResponse:
    return pb.GetModelInfoResponse(
        model_name=info.model_name,
        max_context=info.max_context,
        vocab_size=info.vocab_size,
        eos_token_ids=info.eos_token_ids,
        has_chat_template=info.has_chat_template,
        architecture=info.architecture,
        dtype=info.dtype,
    )


def model_info_requests() -> tuple[sched_pb.GetModelInfoRequest, tok_pb.GetTokenizerInfoRequest]:
    return sched_pb.GetModelInfoRequest(), tok_pb.GetTokenizerInfoRequest()


def stats_requests() -> tuple[sched_pb.GetStatsRequest, detok_pb.GetStatsRequest]:
    return sched_pb.GetStatsRequest(), detok_pb.GetStatsRequest()


def subscribe_request(subscriber: str) -> detok_pb.SubscribeRequest:
    return detok_pb.SubscribeRequest(subscriber=subscriber)


def replica_stats_from_pb(msg: sched_pb.GetStatsResponse) -> ReplicaStats:
    return ReplicaStats(*(getattr(msg, name) for name in ReplicaStats._fields))


def live_requests_from_pb(msg: detok_pb.GetStatsResponse) -> int:
    return msg.live_requests


def model_info_from_pb(msg: sched_pb.GetModelInfoResponse) -> ModelInfo:
    """A scheduler's model; `has_chat_template` is the tokenizer's to say (`has_chat_template`)."""
    return ModelInfo(msg.model_name, msg.architecture, msg.vocab_size, msg.max_context,
                     tuple(msg.eos_token_ids), msg.dtype, has_chat_template=False)


def has_chat_template(msg: tok_pb.GetTokenizerInfoResponse) -> bool:
    return msg.has_chat_template


def tokenize_prompt_from_pb(request: pb.TokenizeRequest) -> Prompt:
    kind = request.WhichOneof("input")
    if kind == "chat":
        return chat_from_pb(request.chat)
    add_special = request.add_special_tokens if request.HasField("add_special_tokens") else True
    return TextPrompt(request.text, add_special)


def tokenize_response_to_pb(ids: list[int]) -> pb.TokenizeResponse:
    return pb.TokenizeResponse(token_ids=ids)


def detokenize_args_from_pb(request: pb.DetokenizeRequest) -> tuple[list[int], bool]:
    """(token ids, skip_special_tokens)."""
    return list(request.token_ids), request.skip_special_tokens


def detokenize_response_to_pb(text: str) -> pb.DetokenizeResponse:
    return pb.DetokenizeResponse(text=text)


def abort_ids_from_pb(request: pb.AbortRequest) -> list[str]:
    return list(request.request_ids)


def abort_response_to_pb(aborted: int) -> pb.AbortResponse:
    return pb.AbortResponse(aborted=aborted)


_REPLICA_FIELDS = ("running_requests", "waiting_requests", "kv_pages_total", "kv_pages_free",
                   "cached_tokens_total", "prompt_tokens_total")


def _hit_rate(cached: int, prompt: int) -> float:
    return cached / prompt if prompt else 0.0


def _replica_to_pb(report: ReplicaReport) -> pb.ReplicaInfo:
    state = pb.REPLICA_STATE_SERVING if report.serving else pb.REPLICA_STATE_UNAVAILABLE
    msg = pb.ReplicaInfo(address=report.address, state=state, routed_requests=report.routed,
                         in_flight_requests=report.in_flight)
    if report.stats is not None:
        for name in _REPLICA_FIELDS:
            setattr(msg, name, getattr(report.stats, name))
        msg.prefix_cache_hit_rate = _hit_rate(msg.cached_tokens_total, msg.prompt_tokens_total)
    return msg


def server_info_to_pb(version: str, routing: str, replicas: list[ReplicaReport],
                      live: dict[str, int]) -> pb.GetServerInfoResponse:
    """Totals over the serving replicas that have answered, then each replica; `live` holds
    gateway_live_requests and detokenizer_live_requests."""
    msg = pb.GetServerInfoResponse(version=version, routing=routing, **live)
    for report in replicas:
        stats = report.stats
        if report.serving and stats is not None:
            for name in ReplicaStats._fields:
                if name != "page_size":
                    setattr(msg, name, getattr(msg, name) + getattr(stats, name))
            msg.page_size = stats.page_size
    msg.prefix_cache_hit_rate = _hit_rate(msg.cached_tokens_total, msg.prompt_tokens_total)
    msg.replicas.extend(_replica_to_pb(report) for report in replicas)
    return msg
