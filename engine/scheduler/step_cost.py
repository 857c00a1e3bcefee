"""What a step costs in time, learned from the engine's own steps, and the prefill that fits a
step that also decodes.

A step that admits a prompt beside running streams is a gap in every one of them: a decode step
of d seconds grows by a fixed f (such a step runs other kernels and graphs than a decode step)
plus c seconds per unit of prefill budget (a token, or its compute under
`prefill_budget="compute"`). Capping such a step at `ratio` times a decode step keeps those gaps
within `ratio` of the usual one, whatever the model, the GPU or the number of rows:

    prefill per step <= ((ratio - 1) * d - f) / c

None of d, f and c is configured. d is the recent decode step (it moves with the rows and their
context lengths), the median of its last samples, so one step slowed by something else (a
collection, a stall on the host) does not move it. f and c are a line through the recent steps
that decode beside prefill: each sample is the prefill and what the step took beyond d. The line
is robust (Theil-Sen): c is the median slope over the pairs of samples whose prefills differ at
least twofold, f the median of what c leaves of each sample (at least 0). Where the prefills were
all of about one size there is no such pair, and the line goes through the origin (f = 0, c the
median cost a unit): exact at that size, which is the size the cap keeps giving.

A long prompt beside decoding streams is a run of such steps, one per chunk. Its chunks could be
as large as the step's budget B (the fewest steps, each a long gap), or smaller (more, shorter
gaps). Prefilling L units in chunks of b takes L / b steps of d + f + c * b each,
L * (d + f) / b + L * c in all, against L * (d + f) / B + L * c in chunks of B. Within `slack`
(0.1: a tenth longer) of that, the smallest chunk is

    b = 1 / ((1 + slack) / B + slack * c / (d + f))

whatever L: the prompt waits a bounded share longer for its first token, and every stream's gap
shrinks with b. The decode steps between the chunks run anyway; only the long prompt waits.

Measuring a step: with overlap, the engine reads step N's outputs after it launched step N + 1,
so the device ran N between the moment N - 1's outputs were read (or N was scheduled, if later:
the engine was idle) and the moment N's are. A step the host made late counts at its length as
the streams saw it, which is what the cap bounds.
"""

from __future__ import annotations

from collections import deque
from statistics import median

WINDOW = 15  # samples in each median
MIN_PREFILL_SAMPLE = 32.0  # budget units: smaller prefills are lost in a step's noise
# Two samples give the line a slope only where one's prefill is at least this many times the
# other's: closer prefills leave their slope to the noise of the steps.
SLOPE_SPREAD = 2.0


class StepCost:
    def __init__(self) -> None:
        self._decode: deque[float] = deque(maxlen=WINDOW)  # seconds of recent decode-only steps
        # recent steps that decoded beside prefill: (prefill units, seconds beyond the decode step)
        self._mixed: deque[tuple[float, float]] = deque(maxlen=WINDOW)
        self._decode_s: float | None = None  # fitted as samples come
        self._fixed_s = 0.0
        self._per_unit_s: float | None = None

    def observe(self, decode_rows: int, prefill: float, seconds: float) -> None:
        """Learn from one step: `decode_rows` running requests decoded, `prefill` units of
        prefill budget ran beside them, and the step took `seconds`."""
        if decode_rows == 0 or seconds <= 0:
            return  # a prefill-only step pays weight reads a decode step would: it says nothing
        if prefill == 0:
            self._decode.append(seconds)
            self._decode_s = median(self._decode)
        elif prefill >= MIN_PREFILL_SAMPLE and self._decode_s is not None:
            self._mixed.append((prefill, seconds - self._decode_s))
            self._fit()

    def _fit(self) -> None:
        """f and c from the mixed samples (module docstring)."""
        by_size = sorted(self._mixed)
        slopes = [(e2 - e1) / (p2 - p1) for i, (p1, e1) in enumerate(by_size)
                  for p2, e2 in by_size[i + 1:] if p2 >= SLOPE_SPREAD * p1]
        if slopes and (c := median(slopes)) > 0:
            self._per_unit_s = c
            self._fixed_s = max(0.0, median(e - c * p for p, e in self._mixed))
            return
        per_unit = [e / p for p, e in self._mixed if e > 0]
        if per_unit:
            self._per_unit_s, self._fixed_s = median(per_unit), 0.0

    @property
    def decode_s(self) -> float | None:
        """The recent decode step, seconds (None before one was seen)."""
        return self._decode_s

    @property
    def fixed_s(self) -> float:
        """Seconds any prefill adds to a step that decodes, whatever its size (0 until learned)."""
        return self._fixed_s

    @property
    def per_unit_s(self) -> float | None:
        """Seconds one more unit of prefill budget adds to a step that decodes (None until
        learned)."""
        return self._per_unit_s

    def expected_s(self, decode_rows: int, prefill: float) -> float | None:
        """How long a step that decodes `decode_rows` rows beside `prefill` units is expected to
        take; None where that is not known (a step without decode rows, or costs not learned)."""
        if decode_rows == 0 or self._decode_s is None:
            return None
        if prefill == 0:
            return self._decode_s
        if self._per_unit_s is None:
            return None
        return self._decode_s + self._fixed_s + prefill * self._per_unit_s

    def prefill_within(self, ratio: float) -> float | None:
        """The prefill budget that keeps a step that decodes within `ratio` decode steps; None
        until both costs are known (until then the first admissions teach them)."""
        if self._decode_s is None or self._per_unit_s is None:
            return None
        return max(1.0, ((ratio - 1) * self._decode_s - self._fixed_s) / self._per_unit_s)

    def chunk_within_slack(self, largest: float, slack: float) -> float | None:
        """The smallest chunk of a long prompt beside decodes that keeps its prefill within
        `slack` of the time it takes in chunks of `largest` units (module docstring); None until
        both costs are known."""
        if self._decode_s is None or self._per_unit_s is None:
            return None
        step = self._decode_s + self._fixed_s
        return 1 / ((1 + slack) / largest + slack * self._per_unit_s / step)
