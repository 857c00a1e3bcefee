"""GrammarMatcher: one request's position in its grammar (host state, owned by the `Req`).

Every sampled token the host learns is accepted here, in order; the next step's bitmask is filled
from this state. A token is accepted only once the host knows it, so nothing accepted is ever
speculative: retraction keeps the outputs and therefore the state, and a dropped in-flight token
belongs to a finished request, whose matcher is dropped with it (docs/architecture.md,
"Structured output").
"""

from __future__ import annotations

import torch
from radixserve.engine.constrained.compiler import Grammar


class GrammarMatcher:
    def __init__(self, grammar: Grammar, stop_ids: tuple[int, ...]) -> None:
        """`stop_ids`: the tokens that end the output once the grammar is complete (the model's
        EOS and the request's stop_token_ids); anywhere else they are banned."""
        import xgrammar as xgr

        self.grammar = grammar
        # none given: the tokenizer's own stop tokens (xgrammar refuses an empty override)
        self._matcher = xgr.GrammarMatcher(grammar.compiled,
                                           override_stop_tokens=list(stop_ids) or None)
        self.num_accepted = 0  # == len(req.output_ids) after every processed step

    def accept(self, token: int) -> bool:
        """Advance by one sampled token; False (state unchanged) if the grammar forbids it."""
        ok = bool(self._matcher.accept_token(token))
        self.num_accepted += ok
        return ok

    @property
    def terminated(self) -> bool:
        """The grammar is complete and a stop token was accepted: the output is finished."""
        return bool(self._matcher.is_terminated())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]` ((rows, ceil(V / 32)) int32, cpu)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    @staticmethod
    def fill_rows(matchers: list[GrammarMatcher], bitmask: torch.Tensor) -> None:
        """Row i of `bitmask` from matchers[i], the rows spread over xgrammar's threads: a row
        costs about 10 us at the median but up to milliseconds with a real vocabulary (a state
        that leaves most of 150k tokens to check), and a step may hold a hundred such rows."""
        if len(matchers) == 1:
            matchers[0].fill(bitmask, 0)
            return
        _batch_filler().batch_fill_next_token_bitmask([m._matcher for m in matchers], bitmask)


_FILLER = None


def _batch_filler():  # type: ignore[no-untyped-def]
    """One xgrammar batch matcher (it owns a thread pool, sized to half the cores) per process."""
    global _FILLER
    if _FILLER is None:
        import xgrammar as xgr

        _FILLER = xgr.BatchGrammarMatcher(max_threads="auto")
    return _FILLER
