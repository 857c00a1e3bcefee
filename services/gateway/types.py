"""Domain types of the gateway: what a client asked for, and what it is told."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc
from radixserve.engine.sampling.params import FinishReason, SamplingParams


@dataclass(frozen=True)
class TextPrompt:
    text: str
    add_special_tokens: bool = True


@dataclass(frozen=True)
class IdsPrompt:
    ids: tuple[int, ...]


@dataclass(frozen=True)
class ChatPrompt:
    messages: tuple[tuple[str, str], ...]  # (role, content)
    add_generation_prompt: bool = True


Prompt = TextPrompt | IdsPrompt | ChatPrompt


@dataclass(frozen=True)
class GenerateSpec:
    """A validated Generate call. `params.max_new_tokens` is None when the client left it unset;
    the frontend resolves it once the prompt length is known."""

    request_id: str  # the client's id, "" to have one assigned
    prompt: Prompt
    params: SamplingParams
    return_prompt_info: bool = False
    skip_special_tokens: bool = True
    n: int = 1  # completions to make from the prompt


@dataclass(frozen=True)
class Started:
    prompt_tokens: int
    prompt_ids: Sequence[int]


class Delta(NamedTuple):
    """One per token per stream at full load, so a tuple (as the detokenizer's `Output` and
    `Delta`)."""

    token_ids: Sequence[int]
    text: str
    logprobs: Sequence[Any]  # internal TokenLogprobs messages, converted at the edge
    index: int = 0  # which of the request's n completions


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    stop_string: str | None
    stop_token_id: int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    queue_s: float
    ttft_s: float
    total_s: float
    index: int = 0  # which of the request's n completions


Event = Started | Delta | Finished


@dataclass(frozen=True)
class ModelInfo:
    model_name: str
    architecture: str
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    dtype: str
    has_chat_template: bool


@dataclass(frozen=True)
class Failure:
    """Ends a request with a status (queued into a request's event stream by the links)."""

    code: grpc.StatusCode
    message: str


class Finish(NamedTuple):
    """How one internal request ended, as the detokenizer reports it."""

    reason: FinishReason
    stop_string: str | None
    stop_token_id: int | None
    completion_tokens: int  # 0 when not counted there
    cached_tokens: int


class Output(NamedTuple):
    """What the detokenizer made for one internal request since its previous output. One comes per
    request and engine step (a token each, at full load), so it is a tuple, not a dataclass: it is
    built once and its lists are handed on to the client's `Delta` as they are."""

    rid: str
    token_ids: list[int]
    text: str
    logprobs: list[Any]  # internal TokenLogprobs messages, converted at the edge
    finish: Finish | None
    # when the scheduler had the engine step that made it (wall clock, ns; 0: not stated): of the
    # first of them once several are joined (inbox.coalesce)
    step_unix_ns: int = 0


class StepTimes(NamedTuple):
    """Where one engine step was on its way to this gateway, in wall-clock ns (0: not stated):
    when the scheduler had its outputs, when the detokenizer received it and when it had
    detokenized it. On several hosts the differences include their clocks' skew."""

    scheduled: int = 0
    received: int = 0
    detokenized: int = 0


class JobResult(NamedTuple):
    """A tokenizer job's answer: the ids of an encoding, or the text of a decoding."""

    token_ids: list[int]
    text: str


class Acks(NamedTuple):
    """The scheduler's answer to submitted requests: accepted ids, and each refused one's status."""

    accepted: list[str]
    rejected: list[tuple[str, Failure]]


class ReplicaStats(NamedTuple):
    """One scheduler replica's counters, polled for routing and GetServerInfo."""

    running_requests: int
    waiting_requests: int
    kv_pages_total: int
    kv_pages_free: int
    kv_pages_evictable: int
    kv_pages_protected: int
    page_size: int
    cached_tokens_total: int
    prompt_tokens_total: int


class ReplicaReport(NamedTuple):
    """What GetServerInfo says of one replica."""

    address: str
    serving: bool
    stats: ReplicaStats | None  # None until its first answer
    routed: int  # completions this gateway has sent it
    in_flight: int  # completions of this gateway it holds now
