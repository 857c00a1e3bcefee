"""Typed values the client hands out: stream events, results, model/server info and errors.

These are plain dataclasses so callers never touch generated protobuf classes; the conversion
lives in one place, `wire.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypedDict

import grpc

FinishReason = Literal["unspecified", "eos", "stop_token", "stop_string", "length", "aborted"]


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


# Chat turns may be given as ChatMessage or as {"role": ..., "content": ...} mappings.
Message = ChatMessage | Mapping[str, str]


class TopLogprob(NamedTuple):
    token_id: int
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """Logprob of one sampled token, plus the most likely alternatives when asked for."""

    logprob: float
    top: list[TopLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the server's prefix cache


@dataclass(frozen=True)
class Timings:
    """Seconds, measured by the gateway from the moment it received the request."""

    queue_seconds: float = 0.0
    time_to_first_token_seconds: float = 0.0
    total_seconds: float = 0.0


@dataclass(frozen=True)
class Started:
    request_id: str
    prompt_tokens: int
    prompt_token_ids: list[int] = field(default_factory=list)  # only with return_prompt_info


@dataclass(frozen=True)
class Delta:
    token_ids: list[int]
    text: str  # may be empty while a multi-byte character is still incomplete
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token when asked for
    request_id: str = ""
    index: int = 0  # which of the request's n completions


@dataclass(frozen=True)
class Finished:
    finish_reason: FinishReason
    matched_stop: str | int | None  # the stop string or stop token id that ended generation
    usage: Usage
    timings: Timings
    request_id: str = ""
    index: int = 0  # which of the request's n completions; the stream ends after all n


Event = Started | Delta | Finished


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    matched_stop: str | int | None
    usage: Usage
    timings: Timings
    request_id: str
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class ModelInfo:
    model_name: str
    max_context: int
    vocab_size: int
    eos_token_ids: list[int]
    has_chat_template: bool
    architecture: str
    dtype: str


@dataclass(frozen=True)
class ServerInfo:
    version: str
    running_requests: int
    waiting_requests: int
    kv_pages_total: int
    kv_pages_free: int
    kv_pages_evictable: int
    kv_pages_protected: int
    page_size: int
    prefix_cache_hit_rate: float  # share of prompt tokens served from the prefix cache, in [0, 1]
    cached_tokens_total: int
    prompt_tokens_total: int
    # Per-request state held outside the scheduler; both 0 when idle (a leak check).
    gateway_live_requests: int = 0
    detokenizer_live_requests: int = 0


class GenerateOptions(TypedDict, total=False):
    """Keyword options of `generate` / `generate_text`.

    Anything left out (or None) stays unset on the wire, so the server's default applies; an
    explicit 0 is sent as 0 (e.g. temperature=0 asks for greedy decoding).
    """

    temperature: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    seed: int | None
    repetition_penalty: float | None
    frequency_penalty: float | None
    presence_penalty: float | None
    n: int | None  # completions from one prompt (events carry .index); generate() only
    max_new_tokens: int | None
    min_new_tokens: int | None
    stop: str | Sequence[str] | None
    stop_token_ids: Sequence[int] | None
    ignore_eos: bool
    include_stop_str: bool
    top_logprobs: int
    logprobs: bool
    return_prompt_info: bool
    add_generation_prompt: bool | None  # chat prompts only
    # Structured output, at most one: a JSON Schema (text, or a dict sent as JSON), a regular
    # expression the whole output matches, or an EBNF grammar (start rule `root`). One that does
    # not compile fails the call with INVALID_ARGUMENT and the compiler's message.
    json_schema: str | Mapping[str, Any] | None
    regex: str | None
    ebnf: str | None
    request_id: str | None


class RadixServeError(Exception):
    """A failed call: the gRPC status code the server (or the channel) ended it with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, err: grpc.RpcError) -> RadixServeError:
        # Both sync calls and grpc.aio errors expose code()/details(); a bare RpcError may not.
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")
