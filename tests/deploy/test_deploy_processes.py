"""The compose stack as plain processes: the same `radixserve <service>` commands, environment and
health probes that docker/docker-compose.yml gives each container, with the container addresses
moved onto free loopback ports, started in depends_on order on the demo model the image bakes in;
once alone and once with docker-compose.dp2.yml (two scheduler replicas, as docker-compose merges
the files).
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import pytest
import yaml
from compose_spec import (
    COMPOSE,
    COMPOSE_DP2,
    DOCKERFILE,
    ENV_EXAMPLE,
    compose_config,
    environment,
    interpolate,
    load,
    read_env_file,
)
from radixserve.client import Client
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc

STARTUP_S = 45.0
STOP_S = 20.0
BIN = Path(sys.executable).parent
PROMPTS = ("Hello from compose", "Tell me a story", "Why is the sky blue?", "Count to ten")


class Proc(NamedTuple):
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _image_env() -> dict[str, str]:
    """The ENV lines of the cpu runtime stage that matter outside a container."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    runtime = text[text.index(" AS cpu\n"):]
    runtime = runtime[: runtime.index("\nFROM ")]
    env = dict(re.findall(r"\b(RADIXSERVE_\w+|HF_HUB_OFFLINE)=(\S+)", runtime))
    demo = re.search(r"^RUN radixserve demo-model (\S+)$", runtime, re.MULTILINE)
    assert demo and env["RADIXSERVE_MODEL"] == demo.group(1), "the image must serve what it built"
    return env


def _localize(value: str, ports: dict[str, int]) -> str:
    """`0.0.0.0:P` (a listen address) and `<service>:P` (a compose DNS name) -> 127.0.0.1:free,
    each address of a comma-separated list."""
    local = []
    for address in value.split(","):
        host, sep, _ = address.rpartition(":")
        local.append(f"127.0.0.1:{ports[host]}" if sep and host in ports else address)
    return ",".join(local)


def _services(variant: str, env_file: Path) -> dict[str, Any]:
    """The compose services of `variant` with the env file in place."""
    if variant == "single":
        return interpolate(load(COMPOSE), {"RADIXSERVE_ENV_FILE": str(env_file)})["services"]
    result = compose_config(COMPOSE, COMPOSE_DP2, env_file=str(env_file))
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def _replicas(gateway: str, want: int) -> list[pb.ReplicaInfo]:
    """The gateway's replicas as GetServerInfo reports them, once `want` serve or 30 s pass."""
    deadline = time.monotonic() + 30
    with grpc.insecure_channel(gateway) as channel:
        stub = pb_grpc.GenerateServiceStub(channel)
        while True:
            replicas = list(stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5).replicas)
            serving = [r for r in replicas if r.state == pb.REPLICA_STATE_SERVING]
            if len(serving) == want or time.monotonic() > deadline:
                return replicas
            time.sleep(0.2)


def _argv(command: list[str]) -> list[str]:
    assert command[0] == "radixserve"
    script = BIN / "radixserve"
    head = [str(script)] if script.exists() else [sys.executable, "-m", "radixserve.services.cli"]
    return head + command[1:]


def _startup_levels(services: dict[str, Any]) -> list[list[str]]:
    """Services grouped the way compose starts them: each level waits for the previous one."""
    levels: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(services):
        level = [n for n, s in services.items()
                 if n not in placed and set(s.get("depends_on") or {}) <= placed]
        assert level, "depends_on has a cycle"
        levels.append(sorted(level))
        placed.update(level)
    return levels


def _probe(service: dict[str, Any], address: str) -> bool:
    """Run the compose healthcheck command itself against `address`."""
    test = service["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"]
    argv = [sys.executable, *test[2:-1], address]
    return subprocess.run(argv, check=False, capture_output=True, timeout=15).returncode == 0


def _tail(proc: Proc) -> str:
    return f"--- {proc.name} ---\n" + proc.log_path.read_text(errors="replace")[-3000:]


@pytest.mark.parametrize("variant", ["single", "dp2"])
def test_compose_commands_serve_a_generate_as_processes(variant: str, tmp_path: Path) -> None:
    # Env file: the example with a fresh secret, as an operator would write docker/.env.
    env_file = tmp_path / "radixserve.env"
    example = ENV_EXAMPLE.read_text()
    env_file.write_text(example.replace("replace-with-a-long-random-string", secrets.token_hex(16)))
    file_env = read_env_file(env_file)
    assert file_env["RADIXSERVE_INTERNAL_SECRET"] != read_env_file(ENV_EXAMPLE)[
        "RADIXSERVE_INTERNAL_SECRET"]

    image_env = _image_env()
    demo_dir = tmp_path / "demo"
    image_env["RADIXSERVE_MODEL"] = str(demo_dir)
    built = subprocess.run(_argv(["radixserve", "demo-model", str(demo_dir)]), check=False,
                           capture_output=True, timeout=60)
    assert built.returncode == 0, built.stderr.decode()[-2000:]

    services = _services(variant, env_file)
    ports = {name: _free_port() for name in services}

    procs: dict[str, Proc] = {}
    try:
        for level in _startup_levels(services):
            for name in level:
                service = services[name]
                local = {**ports, "0.0.0.0": ports[name]}
                command = [_localize(arg, local) for arg in service["command"]]
                service_env = {k: _localize(v, local) for k, v in environment(service).items()}
                env = {**os.environ, **image_env, **file_env, **service_env}
                log_path = tmp_path / f"{name}.log"
                with open(log_path, "wb") as log:  # the child keeps its own descriptor
                    popen = subprocess.Popen(_argv(command), env=env, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
                procs[name] = Proc(name, popen, log_path)
            deadline = time.monotonic() + STARTUP_S
            waiting = set(level)
            while waiting:
                for name in sorted(waiting):
                    proc = procs[name]
                    assert proc.popen.poll() is None, f"{name} exited early\n{_tail(proc)}"
                    if _probe(services[name], f"127.0.0.1:{ports[name]}"):
                        waiting.discard(name)
                if waiting:
                    assert time.monotonic() < deadline, "\n".join(_tail(procs[n]) for n in waiting)
                    time.sleep(0.2)

        # Every scheduler service is a replica of the gateway, and each serves: a request routed
        # to one reaches the client through that replica's own detokenizer.
        gateway = f"127.0.0.1:{ports['gateway']}"
        schedulers = [n for n, s in services.items() if s["command"][1] == "scheduler"]
        assert len(schedulers) == (2 if variant == "dp2" else 1)
        replicas = _replicas(gateway, len(schedulers))
        assert [r.state for r in replicas] == [pb.REPLICA_STATE_SERVING] * len(schedulers)
        # Prompts with nothing in common: the cache-aware router spreads them by load.
        with Client(gateway) as client:
            for prompt in PROMPTS:
                result = client.generate_text(prompt, max_new_tokens=8, temperature=0.0,
                                              ignore_eos=True, timeout=30)
                assert result.usage.completion_tokens == 8
                assert result.text, result
        routed = [r.routed_requests for r in _replicas(gateway, len(schedulers))]
        assert sum(routed) == len(PROMPTS) and min(routed) > 0, routed

        # Compose stops dependents first: the gateway, then the scheduler, then the rest.
        for level in reversed(_startup_levels(services)):
            for name in level:
                procs[name].popen.send_signal(signal.SIGTERM)
            for name in level:
                proc = procs[name]
                try:
                    code = proc.popen.wait(STOP_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{name} ignored SIGTERM for {STOP_S} s\n{_tail(proc)}")
                assert code == 0, f"{name} exited {code}\n{_tail(proc)}"
    finally:
        for proc in procs.values():
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(10)
