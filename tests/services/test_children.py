"""The children of `radixserve serve` (`services/children.py`), without starting any: names,
sockets, the scheduler-detokenizer pairing, metrics ports, the gateway's flags, and where each
replica runs (CUDA_VISIBLE_DEVICES, CPU threads)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest


def _config(**fields: Any) -> Any:
    from radixserve.engine.config import EngineConfig
    from radixserve.services.config import ServeConfig
    from radixserve.services.gateway.frontend import FrontendConfig

    return ServeConfig(engine=EngineConfig(model_path="/models/m", device="cpu"),
                       gateway=FrontendConfig(), **fields)


def _parse(child: Any) -> Any:
    """The child's flags as its own subcommand parses them."""
    from radixserve.services.cli import build_parser

    cli = child.argv.index("radixserve.services.cli")
    assert child.argv[cli - 1] == "-m"
    return build_parser().parse_args(child.argv[cli + 1:])


def test_two_replicas_pair_schedulers_with_detokenizers() -> None:
    from radixserve.services.children import build_children

    envs = [{"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    from radixserve.services.gateway.routing import RoutingConfig

    routing = RoutingConfig("least_load", balance_abs=8, balance_rel=1.25)
    children = build_children(_config(dp_size=2, metrics_port=9400, routing=routing),
                              ["--device", "cpu"], "/run/s", envs)
    by_name = {c.name: c for c in children}
    assert [c.name for c in children] == ["tokenizer", "detokenizer-0", "detokenizer-1",
                                          "scheduler-0", "scheduler-1", "gateway"]
    for i in range(2):
        sched, detok = by_name[f"scheduler-{i}"], by_name[f"detokenizer-{i}"]
        assert sched.address == f"unix:/run/s/scheduler-{i}.sock"
        assert detok.address == f"unix:/run/s/detokenizer-{i}.sock"
        assert sched.replica == detok.replica == i
        args = _parse(sched)
        assert (args.command, args.address) == ("scheduler", sched.address)
        assert args.detokenizer_addr == detok.address  # scheduler i streams to detokenizer i
        assert args.metrics_port == 9401 + i
        assert dict(sched.env) == envs[i] and not detok.env
        assert _parse(detok).address == detok.address
        assert _parse(detok).stream_interval == 1
    assert by_name["tokenizer"].replica is None and by_name["gateway"].replica is None

    gateway = _parse(by_name["gateway"])
    assert gateway.tokenizer_addr == "unix:/run/s/tokenizer.sock"
    # In replica order, so the gateway pairs them by position.
    assert gateway.scheduler_addr == [by_name[f"scheduler-{i}"].address for i in range(2)]
    assert gateway.detokenizer_addr == [by_name[f"detokenizer-{i}"].address for i in range(2)]
    assert gateway.routing == "least_load" and gateway.metrics_port == 9400
    assert (gateway.routing_balance_abs, gateway.routing_balance_rel) == (8, 1.25)


def test_gateways_share_the_port_and_are_probed_each_on_its_own_socket() -> None:
    from radixserve.services.children import build_children, is_gateway

    children = build_children(_config(gateways=2, dp_size=2, metrics_port=9400),
                              ["--device", "cpu"], "/run/s", [{}, {}])
    gateways = [c for c in children if is_gateway(c.name)]
    assert [c.name for c in gateways] == ["gateway-0", "gateway-1"]
    for i, child in enumerate(gateways):
        args = _parse(child)
        assert args.address == "127.0.0.1:50051" and args.reuse_port
        # A probe of the shared port could reach any of them: each has a socket of its own.
        assert child.address == args.probe_address == f"unix:/run/s/gateway-{i}.sock"
        assert args.metrics_port == 9400 + i
        assert args.scheduler_addr == [f"unix:/run/s/scheduler-{r}.sock" for r in range(2)]
    schedulers = [_parse(c) for c in children if c.name.startswith("scheduler-")]
    assert [a.metrics_port for a in schedulers] == [9402, 9403]  # after the gateways'
    one = [c for c in build_children(_config(), [], "/run/s", [{}]) if is_gateway(c.name)]
    assert [c.name for c in one] == ["gateway"] and not _parse(one[0]).reuse_port


def test_every_detokenizer_takes_the_stream_interval() -> None:
    from radixserve.services.children import build_children

    children = build_children(_config(dp_size=2, stream_interval=4), [], "/run/s", [{}, {}])
    detoks = [_parse(c) for c in children if c.name.startswith("detokenizer")]
    assert [d.stream_interval for d in detoks] == [4, 4]
    with pytest.raises(ValueError, match="stream interval must be >= 1"):
        _config(stream_interval=0)


def test_one_replica_keeps_the_single_names() -> None:
    from radixserve.services.children import build_children

    children = build_children(_config(), ["--device", "cpu"], "/run/s", [{}])
    assert [c.name for c in children] == ["tokenizer", "detokenizer", "scheduler", "gateway"]
    assert all(c.replica is None and not c.env for c in children)
    sched = _parse(children[2])
    assert sched.address == "unix:/run/s/scheduler.sock" and sched.metrics_port is None
    assert sched.detokenizer_addr == "unix:/run/s/detokenizer.sock"
    gateway = _parse(children[3])
    assert gateway.scheduler_addr == ["unix:/run/s/scheduler.sock"]
    assert gateway.detokenizer_addr == ["unix:/run/s/detokenizer.sock"]
    assert gateway.routing == "cache_aware"


def test_replicas_split_the_visible_gpus() -> None:
    from radixserve.services.children import replica_envs

    def four() -> int:
        return 4

    split = replica_envs("cuda", 2, 2, {}, count_gpus=four)
    assert split == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert replica_envs("auto", 4, 1, {}, count_gpus=four) == [
        {"CUDA_VISIBLE_DEVICES": str(i)} for i in range(4)]
    # An existing list is indexed into, entries handed on as written; unused ones stay unused.
    listed = {"CUDA_VISIBLE_DEVICES": "3, 5,GPU-abc,7,2"}
    assert replica_envs("cuda", 2, 2, listed) == [{"CUDA_VISIBLE_DEVICES": "3,5"},
                                                  {"CUDA_VISIBLE_DEVICES": "GPU-abc,7"}]
    # dp_size 1 keeps today's behaviour: nothing set, nothing counted.
    assert replica_envs("cuda", 1, 8, {}, count_gpus=lambda: pytest.fail("counted")) == [{}]


@pytest.mark.parametrize(("device", "environ", "gpus", "message"), [
    ("cuda", {}, 3, "--dp-size 2 x --tp-size 2 needs 4 GPUs; 3 visible"),
    ("auto", {}, 2, "--dp-size 2 x --tp-size 2 needs 4 GPUs; 2 visible"),
    ("cuda", {"CUDA_VISIBLE_DEVICES": "4,5,6"}, 8,
     "needs 4 GPUs; 3 visible (CUDA_VISIBLE_DEVICES=4,5,6)"),
    ("cuda", {}, 0, "needs 4 GPUs; 0 visible"),
])
def test_too_few_gpus_fail_naming_the_counts(device: str, environ: dict[str, str], gpus: int,
                                            message: str) -> None:
    from radixserve.services.children import replica_envs

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        replica_envs(device, 2, 2, environ, count_gpus=lambda: gpus)


def test_cpu_replicas_share_the_cores() -> None:
    from radixserve.services.children import replica_envs

    assert replica_envs("cpu", 2, 1, {}, num_cores=16) == [{"OMP_NUM_THREADS": "8"}] * 2
    assert replica_envs("cpu", 3, 1, {}, num_cores=2) == [{"OMP_NUM_THREADS": "1"}] * 3
    # `auto` with no GPU visible is CPU; so is an empty CUDA_VISIBLE_DEVICES.
    assert replica_envs("auto", 2, 1, {}, count_gpus=lambda: 0, num_cores=4) == [
        {"OMP_NUM_THREADS": "2"}] * 2
    assert replica_envs("auto", 2, 1, {"CUDA_VISIBLE_DEVICES": ""}, num_cores=4) == [
        {"OMP_NUM_THREADS": "2"}] * 2
    # The operator's own thread count wins.
    assert replica_envs("cpu", 2, 1, {"OMP_NUM_THREADS": "3"}, num_cores=16) == [{}, {}]


def test_gpus_are_counted_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from radixserve.services.children import count_visible_gpus

    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-a)'\n"
                      "echo '  MIG 1g.10gb Device 0: (UUID: MIG-b)'\n"
                      "echo 'GPU 1: NVIDIA H100 (UUID: GPU-c)'\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert count_visible_gpus() == 2


def test_auto_gateways_give_a_gpu_engine_one_per_four_cores() -> None:
    from radixserve.services.children import auto_gateways

    assert auto_gateways("cuda", {}, num_cores=16) == 4
    assert auto_gateways("cuda:1", {}, num_cores=8) == 2
    assert auto_gateways("cuda", {}, num_cores=64) == 4  # at most four
    assert auto_gateways("cuda", {}, num_cores=2) == 1
    assert auto_gateways("cpu", {}, num_cores=64) == 1  # a CPU engine's model needs the cores
    # `auto` is a GPU where one is visible: listed, or counted by nvidia-smi when nothing is set
    assert auto_gateways("auto", {"CUDA_VISIBLE_DEVICES": "0"}, num_cores=16) == 4
    assert auto_gateways("auto", {"CUDA_VISIBLE_DEVICES": ""}, num_cores=16) == 1
    assert auto_gateways("auto", {}, count_gpus=lambda: 1, num_cores=16) == 4
    assert auto_gateways("auto", {}, count_gpus=lambda: 0, num_cores=16) == 1
    assert auto_gateways("auto", {}, count_gpus=lambda: None, num_cores=16) == 1  # no nvidia-smi
