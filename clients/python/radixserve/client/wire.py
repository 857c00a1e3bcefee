"""The one seam between the client's dataclasses and the radixserve.v1 protobuf messages."""

from __future__ import annotations

import json
from collections.abc import Sequence

import grpc
from radixserve.v1 import generate_pb2 as pb

from .types import (
    ChatMessage,
    Delta,
    Event,
    Finished,
    FinishReason,
    GenerateOptions,
    GenerationResult,
    Message,
    ModelInfo,
    RadixServeError,
    ServerInfo,
    Started,
    Timings,
    TokenLogprob,
    TopLogprob,
    Usage,
)

_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "n",
)
_CONSTRAINTS = ("json_schema", "regex", "ebnf")  # the oneof `sampling.constraint`
_OPTION_NAMES = frozenset(GenerateOptions.__annotations__)
_FINISH_PREFIX = "FINISH_REASON_"


def chat_messages(
    messages: Sequence[Message], add_generation_prompt: bool | None
) -> pb.ChatMessages:
    chat = pb.ChatMessages()
    for m in messages:
        role, content = (
            (m.role, m.content) if isinstance(m, ChatMessage) else (m["role"], m["content"])
        )
        chat.messages.add(role=role, content=content)
    if add_generation_prompt is not None:
        chat.add_generation_prompt = add_generation_prompt
    return chat


def generate_request(
    prompt: str | None,
    token_ids: Sequence[int] | None,
    messages: Sequence[Message] | None,
    o: GenerateOptions,
) -> pb.GenerateRequest:
    """Build a GenerateRequest, setting only what the caller gave so server defaults apply."""
    # TypedDict keywords are not checked at run time: a typo must not silently become a default.
    unknown = set(o) - _OPTION_NAMES
    if unknown:
        raise TypeError(f"unexpected generate option(s): {', '.join(sorted(unknown))}")
    if sum(x is not None for x in (prompt, token_ids, messages)) != 1:
        raise ValueError("give exactly one of prompt, token_ids or messages")

    req = pb.GenerateRequest(request_id=o.get("request_id") or "")
    if prompt is not None:
        req.text = prompt
    elif token_ids is not None:
        req.token_ids.ids.extend(token_ids)
    elif messages is not None:
        req.chat.CopyFrom(chat_messages(messages, o.get("add_generation_prompt")))

    # Setting a proto3 optional scalar marks it present: 0 reaches the server as "0", not "unset".
    for name in _SAMPLING_FIELDS:
        value = o.get(name)
        if value is not None:
            setattr(req.sampling, name, value)

    stopping = req.stopping
    if (max_new_tokens := o.get("max_new_tokens")) is not None:
        stopping.max_new_tokens = max_new_tokens
    stopping.min_new_tokens = o.get("min_new_tokens") or 0
    stop = o.get("stop")
    stopping.stop.extend([stop] if isinstance(stop, str) else stop or [])
    stopping.stop_token_ids.extend(o.get("stop_token_ids") or [])
    stopping.ignore_eos = bool(o.get("ignore_eos", False))
    stopping.include_stop_str = bool(o.get("include_stop_str", False))

    given = [name for name in _CONSTRAINTS if o.get(name) is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of json_schema, regex, ebnf (got {', '.join(given)})")
    for name in given:  # a oneof on the wire
        value = o[name]  # type: ignore[literal-required]
        setattr(req.sampling, name, value if isinstance(value, str) else json.dumps(value))

    req.options.top_logprobs = o.get("top_logprobs", 0)
    req.options.logprobs = bool(o.get("logprobs", False))
    req.options.return_prompt_info = bool(o.get("return_prompt_info", False))
    return req


def finish_reason(value: int) -> FinishReason:
    try:
        name = pb.FinishReason.Name(value)
    except ValueError:  # a newer server's reason this client does not know yet
        return "unspecified"
    return name.removeprefix(_FINISH_PREFIX).lower()  # type: ignore[return-value]


def _logprobs(items: Sequence[pb.TokenLogprobs]) -> list[TokenLogprob]:
    return [
        TokenLogprob(lp.logprob, [TopLogprob(t.token_id, t.logprob) for t in lp.top])
        for lp in items
    ]


def event(resp: pb.GenerateResponse) -> Event | None:
    """Convert one stream message; None for event kinds newer than this client (skip them)."""
    kind = resp.WhichOneof("event")
    rid = resp.request_id
    if kind == "started":
        s = resp.started
        return Started(rid, s.prompt_tokens, list(s.prompt_token_ids))
    if kind == "delta":
        d = resp.delta
        return Delta(list(d.token_ids), d.text, _logprobs(d.logprobs), rid, resp.index)
    if kind == "finished":
        f = resp.finished
        which = f.WhichOneof("matched_stop")
        matched: str | int | None = getattr(f, which) if which else None
        u, t = f.usage, f.timings
        return Finished(
            finish_reason(f.finish_reason),
            matched,
            Usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens),
            Timings(t.queue_seconds, t.time_to_first_token_seconds, t.total_seconds),
            rid,
            resp.index,
        )
    return None


class ResultBuilder:
    """Folds a stream of events into one GenerationResult (shared by sync and async clients)."""

    def __init__(self, n: int | None = None) -> None:
        if n is not None and n != 1:
            raise ValueError("generate_text makes one completion; for n > 1 iterate generate(), "
                             "whose Delta and Finished events carry .index")
        self.request_id = ""
        self.texts: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.finished: Finished | None = None

    def add(self, ev: Event) -> None:
        if isinstance(ev, Started):
            self.request_id = ev.request_id
        elif isinstance(ev, Delta):
            self.texts.append(ev.text)
            self.token_ids.extend(ev.token_ids)
            self.logprobs.extend(ev.logprobs)
        else:
            self.finished = ev

    def result(self) -> GenerationResult:
        f = self.finished
        if f is None:
            raise RadixServeError(grpc.StatusCode.UNKNOWN, "stream ended without a Finished event")
        return GenerationResult(
            text="".join(self.texts),
            token_ids=self.token_ids,
            finish_reason=f.finish_reason,
            matched_stop=f.matched_stop,
            usage=f.usage,
            timings=f.timings,
            request_id=self.request_id or f.request_id,
            logprobs=self.logprobs,
        )


def tokenize_request(
    text: str | None,
    messages: Sequence[Message] | None,
    add_special_tokens: bool | None,
    add_generation_prompt: bool | None,
) -> pb.TokenizeRequest:
    if (text is None) == (messages is None):
        raise ValueError("give exactly one of text or messages")
    req = pb.TokenizeRequest()
    if text is not None:
        req.text = text
    else:
        req.chat.CopyFrom(chat_messages(messages or [], add_generation_prompt))
    if add_special_tokens is not None:
        req.add_special_tokens = add_special_tokens
    return req


def model_info(r: pb.GetModelInfoResponse) -> ModelInfo:
    return ModelInfo(
        r.model_name,
        r.max_context,
        r.vocab_size,
        list(r.eos_token_ids),
        r.has_chat_template,
        r.architecture,
        r.dtype,
    )


def server_info(r: pb.GetServerInfoResponse) -> ServerInfo:
    return ServerInfo(
        version=r.version,
        running_requests=r.running_requests,
        waiting_requests=r.waiting_requests,
        kv_pages_total=r.kv_pages_total,
        kv_pages_free=r.kv_pages_free,
        kv_pages_evictable=r.kv_pages_evictable,
        kv_pages_protected=r.kv_pages_protected,
        page_size=r.page_size,
        prefix_cache_hit_rate=r.prefix_cache_hit_rate,
        cached_tokens_total=r.cached_tokens_total,
        prompt_tokens_total=r.prompt_tokens_total,
        gateway_live_requests=r.gateway_live_requests,
        detokenizer_live_requests=r.detokenizer_live_requests,
    )
