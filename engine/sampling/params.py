"""Per-request sampling and stopping parameters, validated once when a request is made."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LEN = 256
MAX_STOP_TOKEN_IDS = 64
MAX_TOP_LOGPROBS = 20
# Longest JSON schema / regex / EBNF text any request may carry: the wire's bound, checked by the
# gateway. The server's own limit (EngineConfig.max_constraint_bytes, 64 KiB by default) is at
# most this and is checked where the grammar compiles.
MAX_CONSTRAINT_CHARS = 1 << 20

# The kinds of structured-output constraint; a request carries at most one (engine/constrained/).
ConstraintKind = Literal["json_schema", "regex", "ebnf"]
CONSTRAINT_KINDS: tuple[ConstraintKind, ...] = ("json_schema", "regex", "ebnf")

# Why a request stopped; the engine, the detokenizer and the gateway all speak these names.
FinishReason = Literal["eos", "stop_token", "stop_string", "length", "aborted"]


class InvalidRequestError(ValueError):
    """A user mistake in a request (maps to INVALID_ARGUMENT at the service edge)."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidRequestError(message)


def _finite(name: str, value: float) -> None:
    _check(isinstance(value, (int, float)) and math.isfinite(value),
           f"{name} must be a finite number, got {value!r}")


class SamplerOptions(NamedTuple):
    """What the sampler reads of one request each step (sampling/batch.py builds its columns from
    these): its params and its seed, resolved once so that a step only gathers them."""

    greedy: bool
    temperature: float  # 1.0 where greedy
    top_k: int  # 1 << 30 where disabled
    uses_top_k: bool  # top_k > 1
    top_p: float
    uses_top_p: bool  # top_p < 1
    min_p: float
    uses_min_p: bool  # min_p > 0
    has_penalties: bool
    min_new_tokens: int
    top_logprobs: int
    wants_logprobs: bool
    seed_lo: int  # the seed's low and high 32 bits, from which the draw derives each row's key
    seed_hi: int


@dataclass(frozen=True)
class SamplingParams:
    """What to sample and when to stop. `temperature=0` (or `top_k=1`) is greedy.

    `max_new_tokens=None` means "whatever fits in the context after the prompt".
    `repetition_penalty` follows transformers (prompt and output tokens, divides positive logits);
    `frequency_penalty` / `presence_penalty` follow OpenAI (output tokens only, subtracted).
    At most one of `json_schema` (a dict is stored as its JSON text), `regex` and `ebnf` constrains
    the output to a language; the request then ends when the grammar accepts a stop token (EOS or
    one of `stop_token_ids`, whatever `ignore_eos` says) or on `max_new_tokens`.
    """

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    include_stop_str: bool = False
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    top_logprobs: int = 0
    logprobs: bool = False
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.json_schema, dict):
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema))
        # Accept lists from callers but store tuples so the object stays hashable and immutable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        self.validate()

    def validate(self) -> None:
        _finite("temperature", self.temperature)
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _finite("top_p", self.top_p)
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(isinstance(self.top_k, int) and (self.top_k == -1 or self.top_k >= 0),
               f"top_k must be -1 or 0 (disabled) or a positive integer, got {self.top_k}")
        _finite("min_p", self.min_p)
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        _check(self.seed is None or 0 <= self.seed < 2**64,
               f"seed must be in [0, 2^64), got {self.seed}")
        _check(self.max_new_tokens is None or self.max_new_tokens >= 1,
               f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _check(self.min_new_tokens >= 0, f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        _check(self.max_new_tokens is None or self.min_new_tokens <= self.max_new_tokens,
               f"min_new_tokens ({self.min_new_tokens}) must not exceed max_new_tokens "
               f"({self.max_new_tokens})")
        _check(len(self.stop) <= MAX_STOP_STRINGS,
               f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        for s in self.stop:
            _check(isinstance(s, str) and len(s) > 0, "stop strings must be non-empty")
            _check(len(s) <= MAX_STOP_STRING_LEN,
                   f"stop strings must be at most {MAX_STOP_STRING_LEN} characters, got {len(s)}")
        _check(len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
               f"at most {MAX_STOP_TOKEN_IDS} stop token ids, got {len(self.stop_token_ids)}")
        _check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids must be >= 0")
        _finite("repetition_penalty", self.repetition_penalty)
        _check(0 < self.repetition_penalty <= 2,
               f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _finite(name, value)
            _check(-2 <= value <= 2, f"{name} must be in [-2, 2], got {value}")
        _check(0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
               f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        self._validate_constraint()

    def _validate_constraint(self) -> None:
        given = [k for k in CONSTRAINT_KINDS if getattr(self, k) is not None]
        _check(len(given) <= 1, f"at most one of json_schema, regex and ebnf may be set, got "
               f"{' and '.join(given)}")
        for kind in given:
            text: Any = getattr(self, kind)
            _check(isinstance(text, str), f"{kind} must be a string, got {type(text).__name__}")
            _check(len(text.strip()) > 0, f"{kind} must not be empty")
            _check(len(text) <= MAX_CONSTRAINT_CHARS,
                   f"{kind} is {len(text)} characters long; the limit is {MAX_CONSTRAINT_CHARS}")

    @property
    def constraint(self) -> tuple[ConstraintKind, str] | None:
        """(kind, text) of the structured-output constraint, or None when the output is free."""
        for kind in CONSTRAINT_KINDS:
            text = getattr(self, kind)
            if text is not None:
                return kind, text
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0

    def sampler_options(self, seed: int) -> SamplerOptions:
        """Read per row and step: a request keeps its own copy (`Req.sampler_options`), with its
        resolved `seed` (64 bits)."""
        greedy = self.greedy
        return SamplerOptions(greedy, 1.0 if greedy else self.temperature,
                              self.top_k if self.top_k > 0 else 1 << 30, self.top_k > 1,
                              self.top_p, self.top_p < 1, self.min_p, self.min_p > 0,
                              self.has_penalties, self.min_new_tokens, self.top_logprobs,
                              self.wants_logprobs, seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
