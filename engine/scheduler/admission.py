"""How much of a request's remaining output admission plans KV pages for.

"reserve" plans for every token up to max_new_tokens, so a running request never runs out of pages
but most of the pool sits reserved for outputs that usually end early. "optimistic" plans for a
share of the remaining output that shrinks step by step while the pool copes, and jumps back up as
soon as a decode step had to retract requests, so admission backs off exactly when it overcommitted.
"""

from __future__ import annotations

from radixserve.engine.config import AdmissionPolicy

# The share starts moderate (no evidence yet), decays by STEP per scheduled step down to FLOOR, and
# returns to START after a retraction. The floor keeps a little room for requests already running.
START = 0.6
FLOOR = 0.15
STEP = 0.005


class OutputEstimate:
    def __init__(self, policy: AdmissionPolicy) -> None:
        self.optimistic = policy == "optimistic"
        self.share = START if self.optimistic else 1.0

    def planned_outputs(self, remaining: int) -> int:
        """Output tokens to plan pages for, out of `remaining` still allowed."""
        if not self.optimistic:
            return remaining  # exact: no float rounding may shave a page off a reservation
        return min(remaining, int(self.share * remaining + 0.999))

    def on_step(self) -> None:
        if self.optimistic:
            self.share = max(FLOOR, self.share - STEP)

    def on_retraction(self) -> None:
        if self.optimistic:
            self.share = max(self.share, START)
