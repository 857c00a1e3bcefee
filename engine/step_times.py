"""How long the engine's steps took, and the host's part of each, as counts in fixed buckets.

Step times: a step that decodes is the gap every running stream sees between two of its tokens,
so these counts are the engine's share of the inter-token latency a client measures; the rest is
the plane's (scheduler -> detokenizer -> gateway -> client). Steps are kept apart by whether they
also carried prefill (`mixed`: the steps `mixed_step_ratio` bounds) or only decoded (`decode`);
steps that only prefill are no stream's gap and are not counted. A step's time is the one
StepCost learns from: from the later of the previous step's read and this step's scheduling to
the read of its outputs (EngineCore._process).

Host phases: what the engine thread did in each EngineCore.step call, so a step that came late
can be put down to a phase (HOST_PHASES). With overlap a step costs max(host, device); a decode
step whose p99 is twice its p50 while `wait` is near 0 has a host phase that is late as often.

The serving benchmark reads both before and after a level (as Prometheus histograms,
services/scheduler/metrics.py) and sets their quantiles beside the inter-token ones.
"""

from __future__ import annotations

import bisect


def geometric_bounds(first_s: float, count: int) -> tuple[float, ...]:
    """`count` upper bounds, seconds, a ratio of 2^(1/3) apart from `first_s` (then +Inf), so a
    quantile read linearly within its bucket is off by at most a quarter of the value."""
    return tuple(first_s * 2 ** (k / 3) for k in range(count))


BOUNDS = geometric_bounds(0.001, 31)  # steps: 1 ms to 1.02 s
KINDS = ("decode", "mixed")
# The mixed steps again, by their prefill (budget units: tokens under the default budget), so a
# mixed step's tail can be put down to the steps that took several prompts or a long chunk
PREFILL_EDGES = (256, 512, 1024, 2048)
PREFILL_CLASSES = ("1-256", "257-512", "513-1024", "1025-2048", "2049+")
HOST_BOUNDS = geometric_bounds(0.00002, 40)  # host phases: 20 us to 164 ms
# loop: between two step calls (the serving loop publishes the outputs, applies commands);
# schedule: Scheduler.schedule; launch: the forward's host side, up to the device's queue;
# commands: the commands applied right after the launch; wait: for the previous step's outputs
# (commands that come meanwhile applied in it); process: appending the tokens, finishing requests
HOST_PHASES = ("loop", "schedule", "launch", "commands", "wait", "process")


class TimeHistogram:
    """Seconds counted per label in the buckets of `bounds` (the engine thread's own record:
    the stats snapshot hands a copy to the metrics thread)."""

    def __init__(self, labels: tuple[str, ...], bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        # label -> count per bucket, the last one +Inf (not cumulative)
        self._counts = {label: [0] * (len(bounds) + 1) for label in labels}
        self._sums = dict.fromkeys(labels, 0.0)

    def observe(self, label: str, seconds: float) -> None:
        self._counts[label][bisect.bisect_left(self.bounds, seconds)] += 1
        self._sums[label] += seconds

    def snapshot(self) -> dict[str, tuple[tuple[int, ...], float]]:
        """label -> (count per bucket of the bounds then +Inf, not cumulative; sum of seconds)."""
        return {label: (tuple(counts), self._sums[label])
                for label, counts in self._counts.items()}


def prefill_class(units: float) -> str:
    """The PREFILL_CLASSES label of a mixed step with `units` of prefill (> 0)."""
    return PREFILL_CLASSES[bisect.bisect_left(PREFILL_EDGES, units)]


class StepTimes(TimeHistogram):
    def __init__(self) -> None:
        super().__init__(KINDS, BOUNDS)
        self.mixed = TimeHistogram(PREFILL_CLASSES, BOUNDS)  # the mixed steps by their prefill

    def observe_step(self, prefill: float, seconds: float) -> None:
        """A step that decoded beside `prefill` units of prefill (0: none) took `seconds`."""
        if prefill > 0:
            self.observe("mixed", seconds)
            self.mixed.observe(prefill_class(prefill), seconds)
        else:
            self.observe("decode", seconds)
