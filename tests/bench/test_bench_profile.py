"""`radixserve bench profile` on CPU: it times every phase of real decode steps and leaves the
engine idle with every KV page accounted for (it aborts its requests mid-decode, overlap on); its
--prefill mode profiles one whole prefill step and times plain ones, with the same guarantees."""

from __future__ import annotations

import json
import math
import statistics

from radixserve.bench import profile
from radixserve.bench.driver import build_core, greedy_params
from radixserve.bench.models import write_model_dir


def test_profile_times_each_phase_and_returns_every_page(tmp_path):
    core = build_core(write_model_dir("tiny", str(tmp_path)), device="cpu", max_running_requests=4,
                      page_size=1, max_prefill_tokens=256)
    rows = [profile.profile_batch(core, batch, prompt_len=40, steps=5, trace=0) for batch in (1, 3)]
    assert [r["batch"] for r in rows] == [1, 3]
    for row in rows:
        phases = [row[f"{p}_ms"] for p in profile.PHASES]
        assert all(math.isfinite(v) and v >= 0 for v in phases)
        assert row["step_ms"] >= row["forward_ms"] > 0
    assert not core.has_work()
    core.check_integrity()  # free + evictable == total, no slot or request left behind


def test_profile_host_times_each_part_of_the_forward_and_unwraps_them(tmp_path):
    core = build_core(write_model_dir("tiny", str(tmp_path)), device="cpu", max_running_requests=4,
                      page_size=4, max_prefill_tokens=256)
    from radixserve.engine import model_runner

    before = (model_runner.Upload.send, model_runner.sampling_columns)
    row = profile.profile_batch(core, 3, prompt_len=40, steps=8, trace=0, host=True,
                                temperature=0.6, stagger=True)
    parts = [row[f"{p}_ms"] for p in (*profile.FORWARD_PARTS, "inputs")]
    assert all(math.isfinite(v) for v in parts)
    # Every step flushes (staggered rows start pages), uploads once, builds and runs the sampling.
    for p in ("flush", "upload", "model", "sampling_batch", "sampler"):
        assert row[f"{p}_ms"] > 0, p
    # The parts are unwrapped after: the class's, the module's and the table's own attributes.
    assert (model_runner.Upload.send, model_runner.sampling_columns) == before
    assert not {"stage_flush", "apply_flush"} & set(vars(core.runner.table))
    assert not core.has_work()
    core.check_integrity()


def test_profile_prefill_runs_every_token_in_one_step_and_returns_every_page(tmp_path):
    core = build_core(write_model_dir("tiny", str(tmp_path)), device="cpu", max_running_requests=16,
                      page_size=1, max_prefill_tokens=256)
    rows, kernels = profile.profile_prefill(core, tokens=70, runs=2, top=5)
    assert [r["run"] for r in rows] == ["profiled", "plain 1", "plain 2", "plain median"]
    for row in rows:
        assert (row["tokens"], row["requests"]) == (70, 16)  # 16 prompts of 4 or 5 ids, none cached
        assert row["step_ms"] >= row["forward_ms"] > 0
        assert all(math.isfinite(row[f"{p}_ms"]) and row[f"{p}_ms"] >= 0 for p in profile.PHASES)
    assert rows[-1]["step_ms"] == statistics.median(r["step_ms"] for r in rows[1:3])
    # On a CPU the ops are the kernels: sorted by self time, shares of the step's summed op time.
    assert len(kernels) == 5 and all(k["calls"] >= 1 and k["total_us"] > 0 for k in kernels)
    assert [k["total_us"] for k in kernels] == sorted((k["total_us"] for k in kernels),
                                                      reverse=True)
    assert 0 < sum(k["share"] for k in kernels) <= 1
    assert rows[0]["kernels_ms"] * 1e3 >= sum(k["total_us"] for k in kernels) * (1 - 1e-9)
    assert not core.has_work()
    core.check_integrity()


def test_profile_prefill_cli_writes_rows_and_kernels(tmp_path, capsys):
    out = tmp_path / "prefill.json"
    profile.main(["--model", "tiny", "--root", str(tmp_path), "--device", "cpu", "--batches", "1",
                  "--prefill", "40,24", "--engine", "piecewise_graph_max_tokens=48",
                  "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["args"]["prefill"] == "40,24"
    assert data["engine"] == {"piecewise_graph_max_tokens": 48}
    runs = ["profiled", "plain 1", "plain 2", "plain 3", "plain median"]
    assert [r["run"] for r in data["rows"]] == runs + runs
    assert [r["tokens"] for r in data["rows"]] == [40] * 5 + [24] * 5
    assert all(r["step_ms"] > 0 for r in data["rows"])
    assert {"tokens", "kernel", "calls", "total_us", "share"} <= set(data["kernels"][0])
    assert {k["tokens"] for k in data["kernels"]} == {40, 24}
    printed = capsys.readouterr().out
    assert "top kernels of the profiled prefill step" in printed and "plain median" in printed


def test_profile_mixed_steps_each_carry_one_new_prompt(tmp_path):
    core = build_core(write_model_dir("tiny", str(tmp_path)), device="cpu", max_running_requests=5,
                      page_size=1, max_prefill_tokens=256, admission_wait_ms=0.0)
    tokens_per_step: list[int] = []
    forward = core.runner.forward

    def spy(batch):
        tokens_per_step.append(batch.num_tokens)
        return forward(batch)

    core.runner.forward = spy
    row = profile.profile_batch(core, 3, prompt_len=40, steps=6, trace=0, arrival=24)
    assert row["batch"] == 3 and row["arrival"] == 24
    # _fill's own steps come first; every timed step holds the 3 decode rows and the new prompt.
    assert tokens_per_step[-6:] == [3 + 24] * 6
    assert row["forwards"] == "eager:6"  # each counted by how it ran: eagerly, on a CPU
    assert not core.has_work()
    core.check_integrity()


def test_offline_profile_counts_every_launched_step_with_overlap_on_and_off(tmp_path):
    """The offline profile groups the steps it launched by kind. With overlap off no step stays in
    flight after a call, so the count must come from the launches themselves."""
    counts = []
    for overlap in (True, False):
        core = build_core(write_model_dir("tiny", str(tmp_path)), device="cpu",
                          max_running_requests=4, page_size=1, max_prefill_tokens=256,
                          overlap=overlap)
        for i, n in enumerate((5, 9, 17)):
            core.add_request(f"r{i}", list(range(1, n + 1)), greedy_params(6))
        with profile._Launches(core) as launches:
            wall, kinds, rows, steps = profile._run_offline(core, launches)
        assert "forward" not in vars(core.runner)  # the wrapper is gone after the block
        assert launches.device_seconds() is None  # no device timeline off CUDA
        assert wall > 0 and len(steps) == len(launches.batches)
        assert kinds["prefill+mixed"] and kinds["decode"]
        assert sum(len(v) for v in kinds.values()) == len(steps)
        core.check_integrity()
        counts.append(len(steps))
    assert counts[0] == counts[1]  # the same steps, whether or not they overlap


def test_staggered_rows_start_new_pages_at_every_step(tmp_path):
    """--stagger: prompt i is i % page_size tokens longer, so one of four rows starts a page at
    every step (as served rows do), where rows in lockstep start theirs together every fourth."""
    core = build_core(write_model_dir("tiny", str(tmp_path)), device="cpu", max_running_requests=4,
                      page_size=4, max_prefill_tokens=256)
    table, calls = core.scheduler.table, []
    mapped = table.map_pages

    def counted(slots, page_indices, pages):
        calls.append(len(slots))
        mapped(slots, page_indices, pages)

    table.map_pages = counted
    for stagger in (False, True):
        calls.clear()
        profile.profile_batch(core, 4, prompt_len=40, steps=8, trace=0, stagger=stagger)
        assert (sorted(set(calls)), len(calls) >= 8) == (([1], True) if stagger else ([4], False))
    assert not core.has_work()
    core.check_integrity()
