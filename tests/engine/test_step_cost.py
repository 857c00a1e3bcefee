"""`mixed_step_ratio`: a step that decodes takes only the prefill that keeps it within that many
decode steps, as the engine measures its own steps (scheduler/step_cost.py), unless the prefill
waiting needs larger steps to enter within `mixed_horizon_steps`."""

from __future__ import annotations

import pytest
from radixserve.engine import SamplingParams
from radixserve.engine.config import GRAPHED_MIXED_STEP_RATIO, EngineConfig
from radixserve.engine.scheduler.step_cost import MIN_PREFILL_SAMPLE, WINDOW, StepCost

GREEDY = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
MS = 1e-3


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from checkpoints import checkpoint

    return checkpoint("qwen3", tmp_path_factory)


def _taught(decode_s: float, per_unit_s: float, fixed_s: float = 0.0,
            sizes: tuple[int, ...] = tuple(100 + 10 * i for i in range(WINDOW))) -> StepCost:
    cost = StepCost()
    for i in range(WINDOW):
        cost.observe(64, 0, decode_s)
        p = sizes[i % len(sizes)]
        cost.observe(64, p, decode_s + fixed_s + p * per_unit_s)
    return cost


def test_the_cap_keeps_a_mixed_step_within_the_ratio():
    cost = _taught(10 * MS, 0.02 * MS)
    assert cost.decode_s == pytest.approx(10 * MS)
    assert cost.per_unit_s == pytest.approx(0.02 * MS)
    # (1.5 - 1) * 10 ms / 0.02 ms a token = 250 tokens, which make a step of 15 ms
    assert cost.prefill_within(1.5) == pytest.approx(250)
    assert cost.prefill_within(3.0) == pytest.approx(1000)


def test_a_fixed_cost_of_mixed_steps_is_told_from_the_cost_a_unit():
    """A step with prefill runs other kernels than a decode step: a fixed cost on top of one per
    unit. The line through the samples tells them apart; counted per unit alone, small prefills
    make a unit look dear and large ones cheap."""
    cost = _taught(10 * MS, 0.02 * MS, fixed_s=2 * MS, sizes=(40, 100, 400, 1000, 160))
    assert cost.line == pytest.approx((2 * MS, 0.02 * MS))
    cost.observe(64, 100, 90 * MS)  # one slow step among them moves neither
    assert cost.line == pytest.approx((2 * MS, 0.02 * MS))


def test_prefills_of_one_size_give_the_line_of_the_cost_a_unit():
    """Without prefills of different sizes the two costs cannot be told apart: what a step took
    beyond the decode step counts per unit, which is exact at that size."""
    cost = _taught(10 * MS, 0.02 * MS, fixed_s=2 * MS, sizes=(150, 180, 120))
    assert cost.per_unit_s == pytest.approx((2 + 0.02 * 150) / 150 * MS)
    assert cost.line == (0, cost.per_unit_s)
    assert cost.expected_s(64, 150) == pytest.approx(15 * MS)
    assert StepCost().line == (0, 0)


def test_a_fitted_line_outlives_a_window_of_one_size():
    """A long prompt's chunks are all of one size: the slope fitted before them stays, and the
    fixed cost follows what the steps take now. Falling back to the cost a unit there would make
    the chunk swing."""
    cost = _taught(10 * MS, 0.02 * MS, fixed_s=2 * MS, sizes=(40, 100, 400, 1000, 160))
    chunk = cost.chunk_within_slack(2048, 0.3)
    for _ in range(WINDOW):
        cost.observe(64, 800, 10 * MS + 2 * MS + 800 * 0.02 * MS)
    assert cost.line == pytest.approx((2 * MS, 0.02 * MS))
    assert cost.chunk_within_slack(2048, 0.3) == pytest.approx(chunk)
    for _ in range(WINDOW):
        cost.observe(64, 800, 10 * MS + 3 * MS + 800 * 0.02 * MS)
    assert cost.line == pytest.approx((3 * MS, 0.02 * MS))


def test_nothing_is_capped_until_both_costs_are_seen():
    cost = StepCost()
    assert cost.prefill_within(1.5) is None
    cost.observe(0, 512, 30 * MS)  # prefill alone: it pays weight reads a decode step pays too
    cost.observe(8, 512, 30 * MS)  # no decode step seen yet to take its excess from
    assert cost.prefill_within(1.5) is None
    cost.observe(8, 0, 10 * MS)
    cost.observe(8, 16, 11 * MS)  # too small a prefill to tell from the noise
    assert cost.decode_s == pytest.approx(10 * MS) and cost.prefill_within(1.5) is None
    cost.observe(8, 500, 20 * MS)
    assert cost.prefill_within(1.5) == pytest.approx(250)


def test_one_slow_step_does_not_move_the_cap():
    """A step stretched by something else (a collection, a host stall) is one sample of the
    median's window: the cap stays where the steps around it put it."""
    cost = _taught(10 * MS, 0.02 * MS)
    cost.observe(64, 0, 90 * MS)
    cost.observe(64, 200, 100 * MS)
    assert cost.prefill_within(1.5) == pytest.approx(250, rel=0.05)


def test_a_wrong_start_is_outvoted_by_the_steps_after_it():
    """The first mixed steps of a fresh engine can run long (kernels built on first use): once
    more than half the window has seen the steps as they are, the cap is theirs."""
    cost = StepCost()
    cost.observe(64, 0, 10 * MS)
    for _ in range(3):
        cost.observe(64, 500, 500 * MS)
    # (0.5 * 10 ms) / 1 ms a token = 5, floored where a step still teaches the costs
    assert cost.prefill_within(1.5) == MIN_PREFILL_SAMPLE
    for _ in range(WINDOW // 2 + 1):
        cost.observe(64, 0, 10 * MS)
        cost.observe(64, 400, 18 * MS)
    assert cost.prefill_within(1.5) == pytest.approx(250)


def test_a_fixed_cost_over_the_allowance_gets_chunks_that_outweigh_it():
    """A mixed step that pays 8 ms of fixed cost beside a 10-ms decode step breaks a ratio of
    1.5 at any prefill; smaller chunks would only make more of those steps. Each chunk then costs
    as much as the fixed part: 8 ms / 0.02 ms a token."""
    cost = _taught(10 * MS, 0.02 * MS, fixed_s=8 * MS, sizes=(40, 100, 400, 1000, 160))
    assert cost.line == pytest.approx((8 * MS, 0.02 * MS))
    assert cost.prefill_within(1.5) == pytest.approx(400)
    # within the allowance of 20 ms, the ratio's cap as before
    assert cost.prefill_within(3.0) == pytest.approx(20 * MS / cost.per_unit_s)


def test_a_host_bound_mixed_step_does_not_shrink_the_cap_step_after_step():
    """A host too slow for a mixed step's launches (7 ms, against a 3.6-ms decode step and a
    device that would take 2 us a prompt token) makes the step as long at every prefill. Counted
    per unit, that cost shrank the cap after every step, to where steps taught nothing more: each
    512-token arrival then entered over many long steps. The cap now keeps the prompts whole."""
    cost, prefill, caps = StepCost(), 512.0, []
    for _ in range(20 * WINDOW):
        cost.observe(128, 0, 3.6 * MS)
        cost.observe(128, prefill, max(7 * MS, 3.6 * MS + prefill * 0.002 * MS))
        caps.append(cost.prefill_within(1.5))
        prefill = min(512.0, caps[-1])  # the arrivals pending: one prompt of 512
    assert min(caps[2 * WINDOW:]) >= 1024  # twice the prefill seen to ride free of the host
    # once the device's cost shows, the ratio rules again
    for _ in range(WINDOW):
        cost.observe(128, 0, 3.6 * MS)
        cost.observe(128, 2048, 3.6 * MS + 2048 * 0.002 * MS)
        cost.observe(128, 256, 3.6 * MS + 256 * 0.002 * MS)
    assert cost.prefill_within(1.5) == pytest.approx(900, rel=0.05)


def test_noise_that_hides_the_slope_within_the_allowance_keeps_the_ratios_cap():
    """Steps with prefill that stay within the allowance (1.7 ms beside a 3.4-ms decode step)
    but whose noise hides what twice the prefill costs (650 tokens took 0.1 ms less than 300):
    the ratio's cap holds. Doubling the largest prefill there, as for a host-bound step, would
    take the cap to 1,300, and the next such window to twice its own largest."""
    cost = StepCost()
    for i in range(WINDOW):
        cost.observe(128, 0, 3.4 * MS)
        p, extra = (300, 1.2 * MS) if i % 2 else (650, 1.1 * MS)
        cost.observe(128, p, 3.4 * MS + extra)
    assert cost.per_unit_s == pytest.approx(1.1 * MS / 650)  # the median, of the 650s (8 of 15)
    assert cost.prefill_within(1.5) == pytest.approx(1.7 * MS / cost.per_unit_s)  # 1,005
    assert cost.prefill_within(1.5) < 2 * 650


def test_the_cap_follows_the_decode_step():
    """More rows make a longer decode step, and then a mixed step may carry more prefill."""
    cost = _taught(10 * MS, 0.02 * MS)
    for _ in range(WINDOW):
        cost.observe(128, 0, 20 * MS)
    assert cost.prefill_within(1.5) == pytest.approx(500)


def test_a_long_prompt_chunk_keeps_its_prefill_within_the_slack():
    """Chunks of b units beside decodes take L / b steps of d + c * b: the chunk is the smallest
    whose total stays within the slack of the total in chunks of the step's budget."""
    d, f, c, budget, L = 10 * MS, 2 * MS, 0.02 * MS, 2048, 65536
    cost = _taught(d, c, fixed_s=f, sizes=(40, 100, 400, 1000, 160))
    total = lambda b: L / b * (d + f + c * b)
    for slack in (0.05, 0.1, 0.5):
        chunk = cost.chunk_within_slack(budget, slack)
        assert chunk < budget
        assert total(chunk) == pytest.approx((1 + slack) * total(budget))
        assert total(0.98 * chunk) > (1 + slack) * total(budget)  # the smallest such chunk
    # a larger prefill cost makes the decode steps a smaller share, so the chunk may be smaller
    assert _taught(d, 2 * c).chunk_within_slack(budget, 0.1) < cost.chunk_within_slack(budget, 0.1)
    assert StepCost().chunk_within_slack(budget, 0.1) is None


class FixedCap(StepCost):
    """A cost model that has learned `cap` tokens at any ratio (and a long prompt's chunk of
    `chunk`, None: not learned) and learns nothing more."""

    def __init__(self, cap: float, chunk: float | None = None) -> None:
        super().__init__()
        self.cap, self.chunk = cap, chunk
        self.seen: list[tuple[int, float, float]] = []

    def observe(self, decode_rows: int, prefill: float, seconds: float) -> None:
        self.seen.append((decode_rows, prefill, seconds))

    def prefill_within(self, ratio: float) -> float | None:
        return self.cap

    def chunk_within_slack(self, largest: float, slack: float) -> float | None:
        return self.chunk


def _prompt(i: int, n: int = 40) -> list[int]:
    return [(i * 31 + j * 7) % 500 + 3 for j in range(n)]


def _run(core, late: int = 0, lengths: tuple[int, ...] = (),
         waiting: list[int] | None = None) -> tuple[list[int], dict[str, list[int]]]:
    """"first" alone, then `late` arrivals of 40 tokens (or arrivals of `lengths` tokens) once
    it decodes: the prompt tokens of each step that also decodes, and every request's output
    ids. `waiting` gets how many requests each of those steps left waiting."""
    mixed, schedule = [], core.scheduler.schedule

    def spy():
        batch = schedule()
        if batch is not None and batch.decode_rows and batch.prefill_cost:
            mixed.append(int(batch.prefill_cost))
            if waiting is not None:
                waiting.append(len(core.scheduler.waiting))
        return batch

    core.scheduler.schedule = spy
    outputs: dict[str, list[int]] = {}
    core.add_request("first", _prompt(0), GREEDY)
    for out in core.step():
        outputs.setdefault(out.rid, []).extend(out.token_ids)
    for i, n in enumerate(lengths or (40,) * late):
        core.add_request(f"late{i}", _prompt(i + 1, n), GREEDY)
    while core.has_work():
        for out in core.step():
            outputs.setdefault(out.rid, []).extend(out.token_ids)
    return mixed, outputs


def test_an_arrival_beside_decoding_streams_is_chunked_to_the_cap(path, make_llm):
    core = make_llm(path, max_prefill_tokens=64, page_size=4, max_running_requests=8,
                    mixed_step_ratio=1.5).core
    core.scheduler.step_cost = FixedCap(8)
    mixed, outputs = _run(core, late=1)
    assert mixed == [8] * 5  # 40 tokens: 5 steps of 8, within the horizon of 8 steps
    plain = make_llm(path, max_prefill_tokens=64, page_size=4, max_running_requests=8,
                     mixed_step_ratio=0).core
    assert _run(plain, late=1)[1] == outputs and len(outputs["late0"]) == GREEDY.max_new_tokens


@pytest.mark.parametrize("horizon", [8, 12])
def test_a_backlog_gets_steps_that_clear_it_within_the_horizon(path, make_llm, horizon):
    """Six arrivals of 40 tokens at once: at 8 a step they would wait 30 steps, so a step takes
    what exceeds the cap of the `mixed_horizon_steps` - 1 steps after it (within
    max_prefill_tokens), and the last `mixed_horizon_steps` - 1 take the cap."""
    core = make_llm(path, max_prefill_tokens=64, page_size=4, max_running_requests=8,
                    mixed_step_ratio=1.5, mixed_horizon_steps=horizon).core
    assert EngineConfig(path).mixed_horizon_steps == 8  # the default
    core.scheduler.step_cost = FixedCap(8)
    mixed, outputs = _run(core, late=6)
    later = (horizon - 1) * 8
    big = [64] * ((6 * 40 - later) // 64)  # the steps that take the whole budget
    assert mixed == big + [6 * 40 - 64 * len(big) - later] + [8] * (horizon - 1)
    plain = make_llm(path, max_prefill_tokens=64, page_size=4, max_running_requests=8,
                     mixed_step_ratio=0).core
    assert _run(plain, late=6)[1] == outputs


def _capped(make_llm, path, chunk: float | None, slack: float = 0.1):
    core = make_llm(path, max_prefill_tokens=64, page_size=4, max_running_requests=8,
                    mixed_step_ratio=1.5, long_prompt_slack=slack).core
    core.scheduler.step_cost = FixedCap(8, chunk)
    return core


def test_a_long_prompt_beside_decodes_is_cut_to_its_chunk(path, make_llm):
    """A 96-token prompt would take steps of up to max_prefill_tokens (the backlog rule above):
    beside a decoding stream it comes in chunks of `long_prompt_chunk` instead, until what is
    left fits the capped steps of the horizon. The outputs are those of an engine that does not
    cut."""
    core = _capped(make_llm, path, chunk=16)
    assert core.stats()["long_prompt_chunk"] == 16
    mixed, outputs = _run(core, lengths=(96,))
    assert mixed == [16, 16] + [8] * 8  # 64 left: 64 - 7 * 8 = 8 now, then 7 steps of the cap
    whole = _capped(make_llm, path, chunk=16, slack=0)  # off: the budget, as before
    assert whole.stats()["long_prompt_chunk"] == 0
    mixed_whole, outputs_whole = _run(whole, lengths=(96,))
    assert max(mixed_whole) > 16 and sum(mixed_whole) == 96
    assert outputs_whole == outputs and len(outputs["late0"]) == GREEDY.max_new_tokens


def test_each_long_prompt_pending_adds_a_chunk_and_short_ones_pass_beside_them(path, make_llm):
    """Long prompts at once are prefilled one after another, first come first served, and each
    one pending (prefilling or waiting) adds a chunk to the step: a queue of them drains faster
    as it grows, and the last alone gets the slack's chunk. A prompt that fits one step enters
    whole beside a long one's chunk, though it is longer than the chunk."""
    waiting: list[int] = []
    mixed, outputs = _run(_capped(make_llm, path, chunk=16), lengths=(96, 96), waiting=waiting)
    assert mixed == [32] * 3 + [16] * 2 + [8] * 8  # the first in 3 steps, the second from the 4th
    assert waiting == [1] * 3 + [0] * 10  # the second takes no slot until its turn
    assert len(outputs["late1"]) == GREEDY.max_new_tokens
    waiting = []
    mixed, _ = _run(_capped(make_llm, path, chunk=16), lengths=(96,) * 3, waiting=waiting)
    assert mixed == [48] * 2 + [32] * 3 + [16] * 2 + [8] * 8
    assert waiting == [2] * 2 + [1] * 3 + [0] * 10
    # four pending chunks exceed the step's budget (64): the budget
    assert _run(_capped(make_llm, path, chunk=20), lengths=(96,) * 4)[0][:2] == [64, 32 + 32]
    mixed, _ = _run(_capped(make_llm, path, chunk=16), lengths=(96, 40))
    assert mixed == [16 + 40, 16] + [8] * 8
    # not learned yet: chunks as the budget allows
    mixed, _ = _run(_capped(make_llm, path, chunk=None), lengths=(96,))
    assert max(mixed) > 16 and sum(mixed) == 96


class FixedLine(FixedCap):
    """A cost model whose decode step (1 s) and line (no fixed cost, SLOPE_S a token) give a long
    prompt a chunk of 16.5 tokens within a slack of 0.3 of whole 64-token steps: the real
    formulas, with the cap at 8."""

    SLOPE_S = (1 / 16.5 - 1.3 / 64) / 0.3

    def __init__(self) -> None:
        super().__init__(8)
        self._decode_s, self._per_unit_s, self._slope_s = 1.0, self.SLOPE_S, self.SLOPE_S

    chunk_within_slack = StepCost.chunk_within_slack


def test_the_scheduler_cuts_by_the_slack_formula(path, make_llm):
    core = _capped(make_llm, path, chunk=None, slack=0.3)
    core.scheduler.step_cost = FixedLine()
    assert core.stats()["long_prompt_chunk"] == 16
    assert _run(core, lengths=(96,))[0] == [16, 16] + [8] * 8


def test_a_chunk_is_never_below_the_cap(path, make_llm):
    core = _capped(make_llm, path, chunk=4)
    assert core.stats()["long_prompt_chunk"] == 8
    assert _run(core, lengths=(96,))[0] == [8] * 11  # "first" ends its 12 tokens: one step alone
    assert _run(_capped(make_llm, path, chunk=4, slack=0), lengths=(96,))[0] == [40] + [8] * 7


def test_the_engine_reports_each_step_to_the_cost_model(path, make_llm):
    core = make_llm(path, max_prefill_tokens=64, page_size=4, max_running_requests=8,
                    mixed_step_ratio=1.5).core
    core.scheduler.step_cost = seen = FixedCap(1000)
    _run(core, late=1)
    assert seen.seen[0][:2] == (0, 40)  # "first" alone: all prefill
    assert seen.seen[1][:2] == (1, 40)  # "late0" whole (cap 1000) beside "first"'s decode
    assert (2, 0) in [s[:2] for s in seen.seen]  # both decoding
    assert all(s[2] > 0 for s in seen.seen)
    assert len(seen.seen) == GREEDY.max_new_tokens + 1  # one a step: "late0" ends a step later


def test_the_ratio_defaults_on_where_piecewise_graphs_run_prefill(path, make_llm):
    eager = make_llm(path, max_running_requests=4, piecewise_graph_max_tokens=0).core
    assert eager.config.mixed_step_ratio == 0
    pieces = make_llm(path, max_running_requests=4, piecewise_graph_max_tokens=64).core
    assert pieces.config.mixed_step_ratio == GRAPHED_MIXED_STEP_RATIO > 1
    assert make_llm(path, mixed_step_ratio=2.5).core.config.mixed_step_ratio == 2.5


@pytest.mark.parametrize("slack", [-0.1, float("inf"), float("nan")])
def test_a_slack_must_be_zero_or_more(slack):
    with pytest.raises(ValueError, match="long_prompt_slack"):
        EngineConfig(model_path="m", long_prompt_slack=slack)


@pytest.mark.parametrize("ratio", [1.0, 0.5, -1.0, float("inf"), float("nan")])
def test_a_ratio_must_be_above_one_or_zero(ratio):
    with pytest.raises(ValueError, match="mixed_step_ratio"):
        EngineConfig(model_path="m", mixed_step_ratio=ratio)


def test_the_expected_length_of_a_step():
    cost = _taught(10 * MS, 0.02 * MS)
    assert cost.expected_s(64, 0) == pytest.approx(10 * MS)
    assert cost.expected_s(64, 250) == pytest.approx(15 * MS)
    assert cost.expected_s(0, 250) is None  # prefill alone: not what was learned
    fresh = StepCost()
    fresh.observe(8, 0, 10 * MS)
    assert fresh.expected_s(8, 0) == pytest.approx(10 * MS)
    assert fresh.expected_s(8, 100) is None  # no prefill cost learned yet


class _Device:
    """A step's outputs that are ready after `polls` looks (None: never)."""

    def __init__(self, polls: int | None) -> None:
        self.polls = polls

    def done(self) -> bool:
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0


def _computing(core, decode_s: float):
    import time

    from radixserve.engine.scheduler.batch import Batch

    cost = StepCost()
    cost.observe(4, 0, decode_s)
    core.scheduler.step_cost = cost
    batch = Batch(decode_rows=4)
    batch.scheduled_at = core._last_done = time.perf_counter()
    return batch


def test_the_engine_waits_for_commands_while_a_step_computes(path, make_llm):
    """While a step of known length computes, the engine waits through the hook (which applies
    commands as they come) until WAKE_SHARE of that length, then for the device itself."""
    import time

    from radixserve.engine.core import WAKE_SHARE

    core = make_llm(path, max_running_requests=4).core
    batch = _computing(core, 0.4)
    asked: list[float] = []

    def hook(wait_s: float = 0.0) -> None:
        asked.append(wait_s)
        time.sleep(min(wait_s, 0.02))

    core._apply_while_computing(batch, _Device(None), hook)
    took = time.perf_counter() - batch.scheduled_at  # the step's start
    assert WAKE_SHARE * 0.4 <= took < WAKE_SHARE * 0.4 + 0.5  # a loaded machine has room
    assert len(asked) >= 2 and all(0 < w <= WAKE_SHARE * 0.4 for w in asked)
    assert asked == sorted(asked, reverse=True)  # each wait is what is left
    # The device is done first: the engine reads it at once.
    asked.clear()
    core._apply_while_computing(_computing(core, 0.4), _Device(2), hook)
    assert len(asked) == 2
    # A step of unknown length (no decode step seen yet): only the device is waited for.
    asked.clear()
    core.scheduler.step_cost = StepCost()
    core._apply_while_computing(batch, _Device(None), hook)
    assert asked == []
