"""Per-request incremental detokenization for one scheduler stream.

State lives from a request's setup until its finish, its abort, or the end of the scheduler's
stream, whichever comes first; nothing else keeps it alive, so an idle service holds none.

With a stream interval of N > 1, a request's deltas after its first are joined and sent once N
tokens have piled up, or at its finish: the gateways then write one message for N tokens, the
served plane's main cost per token (docs/benchmarks.md, "Stream interval"). Stop strings are
still matched token by token, so a request ends exactly where it did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from radixserve.engine.sampling.params import FinishReason


@dataclass(frozen=True)
class Setup:
    rid: str
    prompt_ids: Sequence[int]
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    skip_special_tokens: bool = True
    subscriber: str = ""  # the gateway subscription its deltas go to; "" for every one


class Output(NamedTuple):
    """What one scheduler step made for one request. `logprobs` pass through untouched. (Named
    tuples, here and for `Delta`: one of each per row per step, built at a fraction of a frozen
    dataclass's cost.)"""

    rid: str
    token_ids: Sequence[int]
    finish_reason: FinishReason | None = None
    matched_stop_token: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    logprobs: Sequence[Any] = ()


@dataclass(frozen=True)
class Step:
    """One scheduler step, applied in field order."""

    aborted: Sequence[str] = ()
    setups: Sequence[Setup] = ()
    outputs: Sequence[Output] = ()
    step_unix_ns: int = 0  # when the scheduler had the outputs (wall clock, ns); 0: unknown


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    stop_string: str | None
    stop_token_id: int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class Delta(NamedTuple):
    rid: str
    token_ids: Sequence[int]
    text: str
    logprobs: Sequence[Any] = ()
    finish: Finish | None = None
    subscriber: str = ""


class StepResult(NamedTuple):
    deltas: list[Delta]
    abort_ids: list[str]  # finished on a stop string while the engine would keep going


class DetokStep(Protocol):
    text: str
    stopped: str | None  # the stop string this push matched


class Detokenizer(Protocol):
    def push(self, ids: Sequence[int]) -> DetokStep: ...
    def flush(self) -> str: ...


DetokenizerFactory = Callable[[Setup], Detokenizer]


@dataclass
class _Live:
    detok: Detokenizer
    subscriber: str = ""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    started: bool = False  # its first delta went out
    held: Delta | None = None  # deltas joined while fewer than the interval's tokens piled up


class DetokenizerState:
    """Owns every live request of one scheduler stream."""

    def __init__(self, factory: DetokenizerFactory, stream_interval: int = 1) -> None:
        if stream_interval < 1:
            raise ValueError(f"stream interval must be >= 1, got {stream_interval}")
        self._factory = factory
        self._interval = stream_interval
        self._live: dict[str, _Live] = {}

    def __len__(self) -> int:
        return len(self._live)

    def apply(self, step: Step) -> StepResult:
        for rid in step.aborted:
            self._live.pop(rid, None)
        for setup in step.setups:
            self._live[setup.rid] = _Live(self._factory(setup), setup.subscriber)
        deltas: list[Delta] = []
        abort_ids: list[str] = []
        for out in step.outputs:
            live = self._live.get(out.rid)
            if live is None:
                continue  # already finished on a stop string; the engine ran one step further
            delta, stopped = self._advance(live, out)
            if delta.finish is not None:
                del self._live[out.rid]
                if stopped and out.finish_reason is None:
                    abort_ids.append(out.rid)
            due = self._due(live, delta)
            if due is not None:
                deltas.append(due)
        return StepResult(deltas, abort_ids)

    def _due(self, live: _Live, delta: Delta) -> Delta | None:
        """The delta to send now, joined with what was held, or None while it is held."""
        if self._interval == 1:
            return delta
        if live.held is not None:
            delta = _join(live.held, delta)
            live.held = None
        if delta.finish is None and live.started and len(delta.token_ids) < self._interval:
            live.held = delta
            return None
        live.started = True
        return delta

    def reset(self) -> None:
        self._live.clear()

    def _advance(self, live: _Live, out: Output) -> tuple[Delta, bool]:
        live.completion_tokens += len(out.token_ids)
        live.prompt_tokens = out.prompt_tokens or live.prompt_tokens
        live.cached_tokens = out.cached_tokens or live.cached_tokens
        step = live.detok.push(out.token_ids)
        text = step.text
        if step.stopped is not None:
            finish = self._finish(live, "stop_string", stop_string=step.stopped)
            return Delta(out.rid, out.token_ids, text, out.logprobs, finish, live.subscriber), True
        if out.finish_reason is None:
            return Delta(out.rid, out.token_ids, text, out.logprobs, None, live.subscriber), False
        text += live.detok.flush()
        stop_token = out.matched_stop_token if out.finish_reason == "stop_token" else None
        finish = self._finish(live, out.finish_reason, stop_token_id=stop_token)
        return Delta(out.rid, out.token_ids, text, out.logprobs, finish, live.subscriber), False

    @staticmethod
    def _finish(
        live: _Live,
        reason: FinishReason,
        stop_string: str | None = None,
        stop_token_id: int | None = None,
    ) -> Finish:
        return Finish(
            reason,
            stop_string,
            stop_token_id,
            live.prompt_tokens,
            live.completion_tokens,
            live.cached_tokens,
        )



def _join(a: Delta, b: Delta) -> Delta:
    """One delta for two consecutive ones of a request: tokens, text and logprobs in order."""
    return Delta(a.rid, [*a.token_ids, *b.token_ids], a.text + b.text,
                 [*a.logprobs, *b.logprobs], b.finish, b.subscriber)
