"""The model-free engine behind `RADIXSERVE_SYNTHETIC_STEP_MS` (services/scheduler/synthetic.py):
its pacing, admission, aborts and tokens, and `bench serving --launch` reporting each service's CPU
on a stack that runs it."""

from __future__ import annotations

import json
import time

import pytest
from radixserve.engine.sampling.params import InvalidRequestError, SamplingParams
from radixserve.services.scheduler.synthetic import STEP_MS_ENV, SyntheticEngine, factory_from_env


def _params(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


def test_steps_at_its_pace_admits_up_to_the_slots_and_ends_on_length(demo_path: str) -> None:
    engine = SyntheticEngine(demo_path, step_s=0.02, max_running=2)
    for i, n in enumerate((3, 1, 2)):
        engine.add_request(f"r{i}", [5, 6, 7], _params(n))
    t0 = time.monotonic()
    steps = []
    while engine.has_work():
        steps.append(engine.step())
    assert time.monotonic() - t0 >= 0.02 * (len(steps) - 1)  # never faster than one step a tick
    rows = [[o.rid for o in outs] for outs in steps]
    assert rows == [["r0", "r1"], ["r0", "r2"], ["r0", "r2"]]  # r2 waits for r1's slot
    finished = {o.rid: len([x for outs in steps for x in outs if x.rid == o.rid])
                for outs in steps for o in outs if o.finish_reason == "length"}
    assert finished == {"r0": 3, "r1": 1, "r2": 2}
    eos = set(engine.model_info.eos_token_ids)
    tokens = [t for outs in steps for o in outs for t in o.token_ids]
    assert all(0 <= t < engine.model_info.vocab_size and t not in eos for t in tokens)
    engine.check_integrity()


def test_abort_frees_running_and_waiting_requests(demo_path: str) -> None:
    engine = SyntheticEngine(demo_path, step_s=0.0, max_running=1)
    engine.add_request("a", [1], _params(100))
    engine.add_request("b", [1], _params(100))
    engine.step()
    assert engine.abort("a") and engine.abort("b") and not engine.abort("a")
    assert not engine.has_work() and engine.stats()["running_requests"] == 0


def test_refuses_what_the_real_engine_refuses(demo_path: str) -> None:
    engine = SyntheticEngine(demo_path, step_s=0.0, max_running=4)
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.add_request("a", [], _params(1))
    with pytest.raises(InvalidRequestError, match="limit"):
        engine.add_request("a", [1], _params(engine.model_info.max_context))
    with pytest.raises(InvalidRequestError, match="constraints"):
        engine.compile_grammar(SamplingParams(regex="a+"))


def test_factory_only_when_the_variable_is_set(demo_path: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STEP_MS_ENV, raising=False)
    assert factory_from_env(demo_path, 8) is None
    monkeypatch.setenv(STEP_MS_ENV, "fast")
    with pytest.raises(ValueError, match="milliseconds"):
        factory_from_env(demo_path, 8)
    monkeypatch.setenv(STEP_MS_ENV, "5")
    factory = factory_from_env(demo_path, 8)
    assert factory is not None and isinstance(factory(), SyntheticEngine)


def test_bench_serving_reports_each_service_cpu_on_a_synthetic_stack(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from radixserve.bench import serving

    monkeypatch.setenv(STEP_MS_ENV, "10")  # inherited by serve and its scheduler
    out = tmp_path / "serving.json"
    rc = serving.main(["--launch", "--num-prompts", "16", "--input-len", "16", "--output-len", "24",
                       "--range-ratio", "0", "--concurrency", "8", "--json", str(out), "--",
                       "--device", "cpu", "--max-running-requests", "8"])
    level = json.loads(out.read_text())["results"][0]
    assert rc == 0 and level["completed"] == 16 and level["failed"] == 0
    # paced by the synthetic step (10 ms; unpaced, a token would take well under 1 ms); half a
    # step of slack for late first tokens on a loaded machine
    assert level["tpot_ms"]["p50"] >= 5.0
    cores = level["service_cores"]
    assert set(cores) == {"gateway", "tokenizer", "scheduler", "detokenizer"}
    assert cores["gateway"] > 0 and all(c >= 0 for c in cores.values())
    assert level["client_cores"] > 0  # the bench's own sending, apart from the services
    assert "bench client" in capsys.readouterr().out.split("service CPU per level")[1]
