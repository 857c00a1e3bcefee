"""CPUs of their own for the engine threads (`services/common/cpus.py`, `serve --engine-cpus`):
the plan for auto and for a list, the scheduler flags the supervisor hands on, the loop thread
that pins itself once its engine is built, and the benchmarks' load that keeps off those CPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from argparse import Namespace
from typing import Any

import pytest
from radixserve.services.common.cpus import CpuPlan, parse_cpu_list, plan_cpus

SIXTEEN = frozenset(range(16))


def _pairs(cpu: int) -> frozenset[int]:
    """A host whose CPU c shares its core with c ^ 8 (0 with 8, 7 with 15)."""
    return frozenset({cpu, cpu ^ 8})


def _alone(cpu: int) -> frozenset[int]:
    return frozenset({cpu})


def test_auto_takes_the_highest_cpus_and_keeps_their_siblings_idle() -> None:
    assert plan_cpus("auto", 1, SIXTEEN, _alone) == CpuPlan((15,), frozenset({15}),
                                                            SIXTEEN - {15})
    plan = plan_cpus("auto", 2, SIXTEEN, _pairs)
    assert plan is not None
    assert plan.engines == (15, 14)  # 7 is 15's sibling: reserved, never an engine's
    assert plan.reserved == {15, 7, 14, 6}
    assert plan.rest == SIXTEEN - {15, 7, 14, 6}


def test_auto_is_off_where_too_few_cpus_would_be_left() -> None:
    assert plan_cpus("auto", 1, frozenset({0, 1}), _alone) is None
    assert plan_cpus("auto", 2, frozenset(range(6)), _pairs) is not None  # 0-5: no pairs inside
    assert plan_cpus("auto", 2, frozenset(range(5)), _alone) is None  # 3 left, under MIN_REST
    assert plan_cpus("off", 1, SIXTEEN) is None


def test_a_list_names_each_replicas_cpu_and_reserves_its_siblings() -> None:
    plan = plan_cpus("7, 14", 2, SIXTEEN, _pairs)
    assert plan is not None and plan.engines == (7, 14)
    assert plan.reserved == {7, 15, 14, 6} and plan.rest == SIXTEEN - plan.reserved


def _one_core(cpu: int) -> frozenset[int]:
    """CPUs 0 and 1 are two threads of one core."""
    return frozenset({0, 1}) if cpu < 2 else frozenset({cpu})


@pytest.mark.parametrize("spec, replicas, allowed, words", [
    ("7", 2, SIXTEEN, r"one distinct CPU per scheduler replica \(2\)"),
    ("7,7", 2, SIXTEEN, "one distinct CPU"),
    ("20", 1, SIXTEEN, r"CPU\(s\) 20 not among"),
    ("1", 1, frozenset({0, 1}), "leaves no CPU"),  # its sibling 0 is reserved with it
    ("x", 1, SIXTEEN, "not a CPU list"),
    ("3-1", 1, SIXTEEN, "not a CPU range"),
])
def test_a_list_that_does_not_fit_is_refused_naming_why(spec: str, replicas: int,
                                                        allowed: frozenset[int],
                                                        words: str) -> None:
    with pytest.raises(ValueError, match=words):
        plan_cpus(spec, replicas, allowed, _one_core)


def test_cpu_lists_read_as_the_kernel_writes_them() -> None:
    assert parse_cpu_list("0-3,7") == [0, 1, 2, 3, 7]
    assert parse_cpu_list("5\n") == [5]


def test_serve_config_refuses_a_bad_spec_and_the_cli_passes_it_on() -> None:
    from radixserve.engine.config import EngineConfig
    from radixserve.services.children import build_children
    from radixserve.services.cli import build_parser
    from radixserve.services.config import ServeConfig
    from radixserve.services.gateway.frontend import FrontendConfig

    engine = EngineConfig(model_path="/models/m", device="cpu")
    with pytest.raises(ValueError, match="not a CPU list"):
        ServeConfig(engine=engine, gateway=FrontendConfig(), engine_cpus="fast")
    assert build_parser().parse_args(["serve", "--engine-cpus", "auto"]).engine_cpus == "auto"
    cfg = ServeConfig(engine=engine, gateway=FrontendConfig(), dp_size=2, engine_cpus="6,7")
    children = build_children(cfg, [], "/s", [{}, {}], (6, 7))
    flags = {c.name: c.argv[c.argv.index("--engine-cpus") + 1]
             for c in children if "--engine-cpus" in c.argv}
    assert flags == {"scheduler-0": "6", "scheduler-1": "7"}
    scheduler = next(c for c in children if c.name == "scheduler-1")
    cli = scheduler.argv.index("radixserve.services.cli")
    assert build_parser().parse_args(scheduler.argv[cli + 1:]).engine_cpus == "7"
    assert all("--engine-cpus" not in c.argv for c in build_children(cfg, [], "/s", [{}, {}]))


def test_the_supervisor_plans_only_for_a_gpu_engine_under_auto() -> None:
    from radixserve.engine.config import EngineConfig
    from radixserve.services.config import ServeConfig
    from radixserve.services.gateway.frontend import FrontendConfig
    from radixserve.services.supervisor import Supervisor

    cfg = ServeConfig(engine=EngineConfig(model_path="/models/m", device="cpu"),
                      gateway=FrontendConfig(), engine_cpus="auto")
    assert Supervisor(cfg, [])._cpus is None  # a CPU engine computes on the cores it is given
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("one CPU: nothing to reserve")
    listed = Supervisor(ServeConfig(engine=cfg.engine, gateway=FrontendConfig(),
                                    engine_cpus=str(mine[-1])), [])._cpus
    assert listed is not None and listed.engines == (mine[-1],)
    with pytest.raises(ValueError, match="not among"):
        Supervisor(ServeConfig(engine=cfg.engine, gateway=FrontendConfig(),
                               engine_cpus=str(mine[-1] + 1000)), [])


def test_the_loop_thread_pins_itself_once_its_engine_is_built() -> None:
    from radixserve.services.scheduler.loop import EngineLoop, LoopConfig
    from svc_helpers import FakeEngine, Sink

    mine = os.sched_getaffinity(0)
    cpu = max(mine)
    seen: list[set[int]] = []

    def build() -> Any:  # the build runs on the loop thread, before it is pinned
        seen.append(os.sched_getaffinity(0))
        return FakeEngine()

    sink = Sink()
    lp = EngineLoop(build, sink, LoopConfig(warmup=False, idle_poll_s=0.02,
                                            engine_cpus=frozenset({cpu})))
    lp.start()
    try:
        assert sink.ready.wait(5)
        assert seen == [mine]
        assert os.sched_getaffinity(lp._thread.native_id) == {cpu}
        assert os.sched_getaffinity(0) == mine  # the rest of the process keeps its CPUs
    finally:
        lp.stop(5)
    assert not sink.fatal


def test_a_launched_stacks_load_keeps_to_the_stacks_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under --launch the load (this thread and the client processes it starts) runs where the
    supervisor runs, off the engine threads' CPUs; afterwards it has all its CPUs back."""
    from radixserve.bench import process

    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip("one CPU: nothing to keep off")
    first = min(mine)
    script = f"import os, time; os.sched_setaffinity(0, {{{first}}}); time.sleep(30)"
    server = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while os.sched_getaffinity(server.pid) != {first}:  # the stand-in pinned itself
            assert server.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        monkeypatch.setattr(process, "_launch", lambda model, extra, ready: (server, "t:1"))
        with process.stack(Namespace(launch=True, model="m"), []) as (target, proc):
            assert (target, proc) == ("t:1", server)
            assert os.sched_getaffinity(0) == {first}
            child = subprocess.run([sys.executable, "-c", "import os; print(sorted("
                                    "os.sched_getaffinity(0)))"], capture_output=True, text=True)
            assert child.stdout.strip() == f"[{first}]"
        assert os.sched_getaffinity(0) == mine
    finally:
        server.kill()
        server.wait()
