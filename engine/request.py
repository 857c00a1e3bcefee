"""Per-request state and its length invariants.

    positions:  0 ........ matched_len ........ cached_len ......... device_len
                [ reused from the cache ][ KV computed ][ in token pool, KV not yet ]

cached_len counts tokens whose KV is written by a launched step; device_len counts tokens present in
the device token pool, including the one a launched step is sampling. The host learns sampled ids
one step later (output_ids), so output_ids may trail device_len by the in-flight step.

fill_len is how many tokens are prefilled before sampling starts: the prompt, or, for a request
retracted under KV pressure and admitted again, the prompt plus the outputs it already has.

cache_len (>= matched_len, page-aligned) is the prefix whose pages the prefix cache owns and this
request holds locked through cache_handle: the match at admission, grown as prefill pages are
published to the cache (Scheduler._publish) so later requests can share them before this one ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
from radixserve.engine.sampling.params import FinishReason, SamplerOptions, SamplingParams

if TYPE_CHECKING:
    from radixserve.engine.constrained.matcher import GrammarMatcher


class ReqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int  # resolved: never None here
    seed: int  # resolved: the request's or a drawn one
    status: ReqStatus = ReqStatus.WAITING
    slot: int = -1
    matched_len: int = 0
    cached_len: int = 0
    device_len: int = 0
    cache_handle: Any = None
    cache_len: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    matched_stop_token: int | None = None
    fill_len: int = 0  # set at each admission
    # Admitted only once this request's full prompt pages are in the prefix cache (Scheduler.ready):
    # the n completions of one prompt then compute its KV once.
    after: Req | None = None
    # Structured output: the request's place in its grammar, advanced by each token the host learns.
    grammar: GrammarMatcher | None = None
    queued_at: float = 0.0  # time.monotonic() when it was queued (Scheduler.add)
    # The token ids that end it: its stop_token_ids, and the model's EOS ids unless ignore_eos
    # (set by EngineCore.add_request, which knows the EOS ids).
    end_ids: frozenset[int] = frozenset()
    prompt_array: np.ndarray = field(init=False, repr=False)
    # Read several times per request and step, so resolved once: prompt and params never change.
    prompt_len: int = field(init=False)
    sampler_options: SamplerOptions = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_array = np.asarray(self.prompt_ids, dtype=np.int32)
        self.prompt_len = self.fill_len = len(self.prompt_ids)
        self.sampler_options = self.params.sampler_options(self.seed)

    @property
    def prefill_done(self) -> bool:
        return self.device_len > self.fill_len

    def known_ids(self) -> np.ndarray:
        """Prompt plus every output the host has: what an admission prefills (int32)."""
        if not self.output_ids:
            return self.prompt_array
        return np.concatenate([self.prompt_array, np.asarray(self.output_ids, dtype=np.int32)])

    @property
    def num_scheduled_outputs(self) -> int:
        return max(0, self.device_len - self.prompt_len)

    @property
    def finished(self) -> bool:
        return self.status is ReqStatus.FINISHED

    def token_ids(self, n: int) -> np.ndarray:
        """The first n ids of prompt + outputs (those with KV computed), int32; within the prompt
        a view of prompt_array (never written)."""
        assert n <= self.prompt_len + len(self.output_ids), (
            "KV covers a token the host has not seen")
        if n <= self.prompt_len:
            return self.prompt_array[:n]
        return np.concatenate([self.prompt_array,
                               np.asarray(self.output_ids[: n - self.prompt_len], dtype=np.int32)])


def split_running(reqs: Iterable[Req]) -> tuple[list[Req], list[Req]]:
    """The requests that decode a token this step, and those still prefilling, in order. One
    decodes when it is running, its prefill is done and it has outputs left to schedule; a
    constrained one also needs its previous token, for its next mask, so with overlap it sits
    out the step launched while that token is still in flight.

    Run over every running request each step, so written out in one loop (a property per
    request cost three times as much): once prefill is done, device_len > fill_len >= prompt_len
    and the scheduled outputs are device_len - prompt_len."""
    decodes: list[Req] = []
    prefilling: list[Req] = []
    running = ReqStatus.RUNNING
    for r in reqs:
        device_len = r.device_len
        if device_len <= r.fill_len:
            prefilling.append(r)
            continue
        scheduled = device_len - r.prompt_len
        if (r.status is running and scheduled < r.max_new_tokens
                and (r.grammar is None or scheduled == len(r.output_ids))):
            decodes.append(r)
    return decodes, prefilling
