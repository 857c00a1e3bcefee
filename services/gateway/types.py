"""Domain types of the gateway: what a client asked for, and what it is told."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Delta:
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
