"""Checks of a Generate call that need the model: token ids in the vocabulary, the prompt and
`max_new_tokens` within the context (the unset `max_new_tokens` resolved). They run before
anything is submitted, so nothing invalid reaches a scheduler."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from radixserve.engine.sampling.params import InvalidRequestError, SamplingParams
from radixserve.services.common.errors import invalid_argument
from radixserve.services.gateway.types import ModelInfo


def check_ids(ids: Sequence[int], info: ModelInfo) -> list[int]:
    """A token-id prompt as a list, each id checked against the vocabulary."""
    for i, token in enumerate(ids):
        if token >= info.vocab_size:
            raise invalid_argument(
                f"token_ids[{i}] = {token} is outside the vocabulary (size {info.vocab_size})")
    return list(ids)


def resolve_params(params: SamplingParams, prompt_len: int, info: ModelInfo,
                   default_max_new_tokens: int) -> SamplingParams:
    """The request's sampling parameters with max_new_tokens set, after the length checks."""
    limit = info.max_context
    if prompt_len >= limit:
        raise invalid_argument(
            f"prompt is too long: {prompt_len} tokens in prompt, limit {limit} "
            "(the context must leave room for at least one new token)"
        )
    for token in params.stop_token_ids:
        if token >= info.vocab_size:
            raise invalid_argument(
                f"stop_token_ids: {token} is outside the vocabulary (size {info.vocab_size})"
            )
    wanted = params.max_new_tokens
    if wanted is None:
        # Unset: what fits after the prompt, capped by the server default (never below the
        # client's own min_new_tokens, which the length check below then judges).
        wanted = max(min(limit - prompt_len, default_max_new_tokens),
                     params.min_new_tokens)
    if prompt_len + wanted > limit:
        raise invalid_argument(
            f"prompt + max_new_tokens exceed the context: {prompt_len} in prompt, "
            f"{wanted} requested, limit {limit}"
        )
    try:
        return dataclasses.replace(params, max_new_tokens=wanted)
    except InvalidRequestError as exc:
        raise invalid_argument(str(exc)) from None
