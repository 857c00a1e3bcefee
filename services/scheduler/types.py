"""Domain types of the scheduler service: what a gateway submits, what it hears back, and what
the engine loop sends on after each step."""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
from radixserve.engine.sampling.params import SamplingParams


@dataclass(frozen=True)
class NewRequest:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    passthrough: Any = None  # detokenizer options, handed back untouched with the setup
    group: str = ""  # the n completions of one public request share it (groups.py)
    grammar: Any = None  # compiled from params.constraint before submission (compile.py)


class Invalid(NamedTuple):
    """A submitted request whose fields do not make a valid request: it, and its group, are
    refused with INVALID_ARGUMENT and `message`."""

    rid: str
    group: str
    message: str


class Incoming(NamedTuple):
    """One message of a gateway's Submit stream (new requests are applied before aborts)."""

    requests: list[NewRequest | Invalid]
    abort_ids: list[str]


@dataclass(frozen=True)
class Submission:
    """A batch from one gateway stream (`owner`), or aborts from the detokenizer (owner None)."""

    owner: Hashable | None
    requests: Sequence[NewRequest] = ()
    abort_ids: Sequence[str] = ()
    # when the scheduler received it (time.perf_counter()): how long its aborts took to free
    received_s: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class AbortOwned:
    """Abort everything `owner` submitted (its stream ended); None aborts every request."""

    owner: Hashable | None


Command = Submission | AbortOwned


class Rejection(NamedTuple):
    rid: str
    code: grpc.StatusCode
    message: str


class Acks(NamedTuple):
    owner: Hashable
    accepted: list[str]
    rejected: list[Rejection]


class StepBatch(NamedTuple):
    aborted: list[str]
    setups: list[NewRequest]
    outputs: list[Any]  # engine StepOutput
    step_unix_ns: int = 0  # when the step's outputs were in hand (wall clock, ns): 0 unknown
