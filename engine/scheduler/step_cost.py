"""What a step costs in time, learned from the engine's own steps, and the prefill that fits a
step that also decodes.

A step that admits a prompt beside running streams is a gap in every one of them: a decode step
of d seconds grows by c seconds per unit of prefill budget (a token, or its compute under
`prefill_budget="compute"`). Capping such a step at `ratio` times a decode step keeps those gaps
within `ratio` of the usual one, whatever the model, the GPU or the number of rows:

    prefill per step <= (ratio - 1) * d / c

Neither d nor c is configured. d is the recent decode step (it moves with the rows and their
context lengths); c is the recent cost of a unit of prefill in a step that decodes: what such a
step took beyond d, divided by its prefill. Each is the median of its last samples, so one step
slowed by something else (a collection, a stall on the host) does not move the cap. c is exact at
the prefill sizes it is measured at, which are the sizes the cap gives.

A long prompt beside decoding streams is a run of such steps, one per chunk. Its chunks could be
as large as the most a step takes, B (the fewest steps, each a long gap), or smaller (more,
shorter gaps). Here c alone will not do: a step with prefill also pays a fixed f (other kernels
and graphs than a decode step's), which c spreads over the units of the sizes measured, so it
would make small chunks look cheap and large ones dear. So f and c' (the cost of one more unit)
are also fitted, as a robust line (Theil-Sen) through the same samples: c' is the median slope
over the pairs of samples whose prefills differ at least twofold, f the median of what c' leaves
of each sample (at least 0). Where the recent prefills are all of about one size there is no
such pair: c' stays the last one fitted and f is refitted under it, as c' is the model's and the
GPU's while f moves with what else a step runs. Before any pair the line is c's (f = 0, c' = c).
A line that fell back to c whenever the window held one size would swing: a long prompt's chunks
are one size, c counts f in each unit and makes the chunk small, and the small chunks' pairs make
it large again.

Prefilling L units in chunks of b takes L / b steps of d + f + c' * b each,
L * (d + f) / b + L * c' in all, against L * (d + f) / B + L * c' in chunks of B. Within `slack`
(0.1: a tenth longer) of that, the smallest chunk is

    b = 1 / ((1 + slack) / B + slack * c' / (d + f))

whatever L: the prompt waits a bounded share longer for its first token, and every stream's gap
shrinks with b. The decode steps between the chunks run anyway; only the long prompt waits.
That bound is a prompt's own: where several long prompts are pending, the scheduler gives the
step one chunk for each (`Scheduler._long_share`), so a queue of them cannot outgrow what the
steps clear.

Where the fixed cost alone breaks the ratio (a host too slow for a mixed step's launches makes
such a step as long at any prefill), c would shrink the cap step after step, and no cap keeps the
ratio there: the cap is then no smaller than what a step's fixed part amortizes
(`prefill_within`). Where the steps with prefill stay within the allowance, the ratio's cap is
all there is, however noisy the steps: it grows by itself where the prefill cost less than c
said, and a floor that doubles the largest prefill whenever the window shows no slope would, on
steps whose noise hides the slope, double the cap window after window.

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
        self._per_unit: deque[float] = deque(maxlen=WINDOW)  # seconds per unit of prefill budget
        # recent steps that decoded beside prefill: (prefill units, seconds beyond the decode step)
        self._mixed: deque[tuple[float, float]] = deque(maxlen=WINDOW)
        self._decode_s: float | None = None  # medians and the line, updated as samples come
        self._per_unit_s: float | None = None  # c
        self._fixed_s, self._slope_s = 0.0, 0.0  # f, c'
        self._fitted_slope: float | None = None  # c' from the last samples of spread sizes
        # the largest prefill of the window when its spread sizes last took no longer than its
        # small ones (the host bounds those steps, not the prefill); None once a slope shows
        self._free_up_to: float | None = None

    def observe(self, decode_rows: int, prefill: float, seconds: float) -> None:
        """Learn from one step: `decode_rows` running requests decoded, `prefill` units of
        prefill budget ran beside them, and the step took `seconds`."""
        if decode_rows == 0 or seconds <= 0:
            return  # a prefill-only step pays weight reads a decode step would: it says nothing
        if prefill == 0:
            self._decode.append(seconds)
            self._decode_s = median(self._decode)
        elif prefill >= MIN_PREFILL_SAMPLE and self._decode_s is not None:
            extra = seconds - self._decode_s
            if extra > 0:
                self._per_unit.append(extra / prefill)
                self._per_unit_s = median(self._per_unit)
            self._mixed.append((prefill, extra))
            self._fit_line()

    def _fit_line(self) -> None:
        """The line f + c' * prefill through the mixed samples (module docstring)."""
        if self._per_unit_s is None:
            return
        by_size = sorted(self._mixed)
        slopes = [(e2 - e1) / (p2 - p1) for i, (p1, e1) in enumerate(by_size)
                  for p2, e2 in by_size[i + 1:] if p2 >= SLOPE_SPREAD * p1]
        slope = median(slopes) if slopes else None
        if slope is not None and slope <= 0:
            self._free_up_to = by_size[-1][0]
        elif slope is not None:
            self._fitted_slope, self._free_up_to = slope, None
        if self._fitted_slope is None:
            self._fixed_s, self._slope_s = 0.0, self._per_unit_s
            return
        self._slope_s = self._fitted_slope
        self._fixed_s = max(0.0, median(e - self._slope_s * p for p, e in self._mixed))

    @property
    def decode_s(self) -> float | None:
        """The recent decode step, seconds (None before one was seen)."""
        return self._decode_s

    @property
    def per_unit_s(self) -> float | None:
        """Seconds a unit of prefill budget adds to a step that decodes, at the sizes measured
        (None until learned)."""
        return self._per_unit_s

    @property
    def line(self) -> tuple[float, float]:
        """(f, c'): seconds any prefill adds to a step that decodes, and one more unit of it
        ((0, 0) until learned)."""
        return self._fixed_s, self._slope_s

    def expected_s(self, decode_rows: int, prefill: float) -> float | None:
        """How long a step that decodes `decode_rows` rows beside `prefill` units is expected to
        take; None where that is not known (a step without decode rows, or costs not learned)."""
        if decode_rows == 0 or self._decode_s is None:
            return None
        if prefill == 0:
            return self._decode_s
        return None if self._per_unit_s is None else self._decode_s + prefill * self._per_unit_s

    def prefill_within(self, ratio: float) -> float | None:
        """The prefill budget that keeps a step that decodes within `ratio` decode steps; None
        until both costs are known (until then the first admissions teach them).

        Where the fixed cost alone breaks the ratio (f >= (ratio - 1) * d: a step with prefill
        on a host too slow for its launches), no budget keeps it and a smaller one only makes
        more such steps: c, which counts f in every unit, would shrink the budget step after
        step. The budget is then at least f / c' (each step's prefill costs no more than its
        fixed part), or, where steps of twofold prefills took the same and beyond the allowance,
        twice the largest of them (prefill that rides free under the host's time, until the
        device's shows). Steps within the allowance keep the ratio's budget even where their
        prefills' sizes are lost in the steps' noise: that budget grows by itself where the
        prefill costs less than it counted, and doubling there would let a window of noisy steps
        double it again and again. Never under MIN_PREFILL_SAMPLE, below which the steps would
        teach the costs nothing more."""
        if self._decode_s is None or self._per_unit_s is None:
            return None
        allowance = (ratio - 1) * self._decode_s
        cap = allowance / self._per_unit_s
        if self._free_up_to is not None and self._extra_s() >= allowance:
            cap = max(cap, 2 * self._free_up_to)
        elif self._fitted_slope is not None and self._fixed_s >= allowance:
            cap = max(cap, self._fixed_s / self._slope_s)
        return max(MIN_PREFILL_SAMPLE, cap)

    def _extra_s(self) -> float:
        """What the window's steps with prefill took beyond a decode step, at their median."""
        return median(extra for _, extra in self._mixed)

    def chunk_within_slack(self, largest: float, slack: float) -> float | None:
        """The smallest chunk of a long prompt beside decodes that keeps its prefill within
        `slack` of the time it takes in chunks of `largest` units (module docstring); None until
        both costs are known."""
        if self._decode_s is None or self._per_unit_s is None:
            return None
        step = self._decode_s + self._fixed_s  # d + f
        return 1 / ((1 + slack) / largest + slack * self._slope_s / step)
