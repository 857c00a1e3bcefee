"""How long the engine's steps that decode took, as counts in fixed buckets.

A step that decodes is the gap every running stream sees between two of its tokens, so these
counts are the engine's share of the inter-token latency a client measures; the rest is the
plane's (scheduler -> detokenizer -> gateway -> client). Steps are kept apart by whether they
also carried prefill (`mixed`: the steps `mixed_step_ratio` bounds) or only decoded (`decode`);
steps that only prefill are no stream's gap and are not counted. The serving benchmark reads the
buckets before and after a level (as a Prometheus histogram, services/scheduler/metrics.py) and
sets the step quantiles beside the inter-token ones.

A step's time is the one StepCost learns from: from the later of the previous step's read and
this step's scheduling to the read of its outputs (EngineCore._process).
"""

from __future__ import annotations

import bisect

# Upper bounds, seconds: a ratio of 2^(1/3) from 1 ms to 1.02 s (then +Inf), so a quantile read
# linearly within its bucket is off by at most a quarter of the value.
BOUNDS: tuple[float, ...] = tuple(0.001 * 2 ** (k / 3) for k in range(31))
KINDS = ("decode", "mixed")


class StepTimes:
    def __init__(self) -> None:
        # kind -> count per bucket, the last one +Inf (not cumulative)
        self._counts = {kind: [0] * (len(BOUNDS) + 1) for kind in KINDS}
        self._sums = dict.fromkeys(KINDS, 0.0)

    def observe(self, prefill: bool, seconds: float) -> None:
        """A step that decoded (beside `prefill` or not) took `seconds`."""
        kind = "mixed" if prefill else "decode"
        self._counts[kind][bisect.bisect_left(BOUNDS, seconds)] += 1
        self._sums[kind] += seconds

    def snapshot(self) -> dict[str, tuple[tuple[int, ...], float]]:
        """kind -> (count per bucket of BOUNDS then +Inf, not cumulative; sum of seconds)."""
        return {kind: (tuple(counts), self._sums[kind]) for kind, counts in self._counts.items()}
