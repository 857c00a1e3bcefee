"""One step's work: which requests run, which tokens of each, and who samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from radixserve.engine.request import Req

if TYPE_CHECKING:
    from radixserve.engine.constrained.bitmask import HostGrammarMask

Phase = Literal["prefill", "decode", "mixed"]


@dataclass
class Batch:
    reqs: list[Req] = field(default_factory=list)
    prefix_lens: list[int] = field(default_factory=list)  # positions before this step's tokens
    seq_lens: list[int] = field(default_factory=list)  # positions after them
    sample: list[bool] = field(default_factory=list)  # whether the step samples the next token
    # Constrained rows' token mask when filled before the step launches (tensor parallelism: the
    # plan carries it to followers, which have no grammar state); None: the runner fills it.
    grammar: HostGrammarMask | None = None
    # What the step costs, for the engine to learn from (scheduler/step_cost.py): its decoding
    # rows, the prefill budget its chunks spent, and when it was scheduled (time.perf_counter()).
    decode_rows: int = 0
    prefill_cost: float = 0.0
    scheduled_at: float = 0.0

    def add(self, req: Req, prefix_len: int, seq_len: int, sample: bool) -> None:
        self.reqs.append(req)
        self.prefix_lens.append(prefix_len)
        self.seq_lens.append(seq_len)
        self.sample.append(sample)

    def add_decodes(self, reqs: list[Req]) -> None:
        """One sampled row per request for the one token at its cached_len."""
        positions = [r.cached_len for r in reqs]
        self.reqs += reqs
        self.prefix_lens += positions
        self.seq_lens += [p + 1 for p in positions]
        self.sample += [True] * len(reqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.seq_lens) - sum(self.prefix_lens)

    @property
    def phase(self) -> Phase:
        # Only rows the TP followers can see: a resumed request's one-token last chunk is a decode.
        decode = [s - p == 1 and smp and p >= r.prompt_len
                  for r, p, s, smp in zip(self.reqs, self.prefix_lens, self.seq_lens, self.sample)]
        return "decode" if all(decode) else "prefill" if not any(decode) else "mixed"

    def __len__(self) -> int:
        return len(self.reqs)
