"""The test-only fault hook (`services/scheduler/faults.py`): its spec, the trigger file, and the
engine loop's answer to an injected raise or hang."""

from __future__ import annotations

from typing import Any

import pytest
from radixserve.engine.sampling.params import SamplingParams
from radixserve.services.scheduler.loop import EngineLoop, LoopConfig
from radixserve.services.scheduler.types import Submission
from svc_helpers import FakeEngine, Sink, new, wait_for


@pytest.mark.parametrize("spec", ["raise:2", "hang:2"])
def test_loop_injected_fault_is_fatal(spec: str, capfd: pytest.CaptureFixture[str]) -> None:
    from radixserve.services.scheduler import faults
    from radixserve.services.scheduler.loop import WatchdogTimeout

    sink = Sink()
    factory = faults.wrap_factory(FakeEngine, spec)
    lp = EngineLoop(factory, sink, LoopConfig(warmup=False, idle_poll_s=0.05, watchdog_s=0.5,
                                              watchdog_exit_grace_s=60))
    lp.start()
    lp.submit(Submission("gw", [new("a", 10)]))
    wait_for(lambda: sink.fatal)
    expected = faults.InjectedFault if spec.startswith("raise") else WatchdogTimeout
    assert isinstance(sink.fatal[0], expected) and len(sink.fatal) == 1
    if expected is WatchdogTimeout:
        assert sink.stalls[:1] == [True]  # readiness dropped before the watchdog fired
        import faulthandler

        faulthandler.cancel_dump_traceback_later()  # this process is the test runner
        assert "most recent call first" in capfd.readouterr().err
    lp.stop(0.1)


def test_fault_armed_by_a_trigger_file_breaks_the_next_step(tmp_path: Any) -> None:
    from radixserve.services.scheduler import faults

    trigger = tmp_path / "fault"
    assert faults.parse(f"raise:@{trigger}") == ("raise", str(trigger))
    for bad in ("raise:", "raise:@", "boom:3", "hang:x"):
        with pytest.raises(ValueError, match="KIND:N or KIND:@PATH"):
            faults.parse(bad)
    engine = faults.wrap_factory(FakeEngine, f"raise:@{trigger}")()
    engine.add_request("a", [5], SamplingParams(max_new_tokens=100))
    for _ in range(5):  # no step count arms it: the file does
        engine.step()
    trigger.touch()
    with pytest.raises(faults.InjectedFault):
        engine.step()
