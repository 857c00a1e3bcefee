"""docker/ without a Docker engine: compose validation, the service topology (one scheduler, and
two data-parallel replicas through docker-compose.dp2.yml), and the image recipe.

The images themselves are not built here (no engine); test_deploy_processes.py runs the compose
commands as plain processes instead.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import pytest
import yaml
from compose_spec import (
    COMPOSE,
    COMPOSE_DP2,
    COMPOSE_DP2_GPU,
    COMPOSE_GPU,
    DOCKER,
    ENV_EXAMPLE,
    REPO,
    SERVICES,
    addresses,
    compose_config,
    dockerfile_stages,
    environment,
    flag,
    interpolate,
    load,
    read_env_file,
)

INTERNAL = ("tokenizer", "detokenizer", "scheduler")
SECRET = "RADIXSERVE_INTERNAL_SECRET"
DP2 = (COMPOSE, COMPOSE_DP2)
DP2_GPU = (COMPOSE, COMPOSE_GPU, COMPOSE_DP2, COMPOSE_DP2_GPU)
REPLICA_1 = ("scheduler-1", "detokenizer-1")


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    """The compose file with every variable at its default (an empty environment)."""
    return interpolate(load(COMPOSE), {})


# -- (a) docker-compose accepts the files ---------------------------------------------------------


def _resolved(*files: os.PathLike[str]) -> dict[str, Any]:
    """What `docker-compose config` makes of the files merged, with the example env file."""
    result = compose_config(*files, env_file=str(ENV_EXAMPLE))
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.mark.parametrize("files", [(COMPOSE,), (COMPOSE, COMPOSE_GPU), DP2, DP2_GPU],
                         ids=["cpu", "gpu", "dp2", "gpu-dp2"])
def test_compose_config_validates(files: tuple[os.PathLike[str], ...]) -> None:
    services = _resolved(*files)["services"]
    dp2 = COMPOSE_DP2 in files
    assert set(services) == set(SERVICES) | (set(REPLICA_1) if dp2 else set())
    gpu = COMPOSE_GPU in files
    for name in ("scheduler", "scheduler-1") if dp2 else ("scheduler",):
        assert services[name]["image"] == ("radixserve:cuda" if gpu else "radixserve:cpu")


def test_compose_refuses_to_start_without_the_env_file(tmp_path: Any) -> None:
    result = compose_config(COMPOSE, env_file=str(tmp_path / "missing.env"))
    assert result.returncode != 0
    assert "env file" in result.stderr.lower()


# -- (b) topology ----------------------------------------------------------------------------------


def _listen_port(service: dict[str, Any]) -> str:
    host, _, port = flag(service["command"], "--address").rpartition(":")
    assert host == "0.0.0.0", f"{service['command']}: must listen on all container interfaces"
    return port


def test_four_services_each_running_its_radixserve_command(spec: dict[str, Any]) -> None:
    assert set(spec["services"]) == set(SERVICES)
    for name, service in spec["services"].items():
        assert service["command"][:2] == ["radixserve", name]
        assert service["image"] == "radixserve:cpu"
        assert service["build"]["target"] == "cpu"
        assert service["init"] is True  # PID 1 reaps the scheduler's TP children
        # Long enough for the services' default 30 s drain before compose sends SIGKILL.
        assert int(service["stop_grace_period"].rstrip("s")) > 30


def test_only_the_gateway_publishes_a_port(spec: dict[str, Any]) -> None:
    published = {name: s["ports"] for name, s in spec["services"].items() if s.get("ports")}
    assert list(published) == ["gateway"]
    [mapping] = published["gateway"]
    host_ip, host_port, container_port = mapping.split(":")
    assert (host_ip, host_port) == ("127.0.0.1", "50051")  # loopback unless asked otherwise
    assert container_port == _listen_port(spec["services"]["gateway"])
    for name in INTERNAL:
        assert "expose" not in spec["services"][name]


def test_every_service_has_a_grpc_health_check_on_its_own_port(spec: dict[str, Any]) -> None:
    for name, service in spec["services"].items():
        test = service["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        assert "grpc_health.v1" in test[3] and "SERVING" in test[3]
        assert test[4] == f"127.0.0.1:{_listen_port(service)}", name
        assert service["healthcheck"]["start_period"], name


def test_depends_on_every_backend_it_dials_until_healthy(spec: dict[str, Any]) -> None:
    services = spec["services"]
    ports = {name: _listen_port(s) for name, s in services.items()}
    for name, service in services.items():
        dials = {}
        for key, address in environment(service).items():
            if key.endswith("_ADDR"):
                host, _, port = address.rpartition(":")
                assert host in services and port == ports[host], f"{name}: {key}={address}"
                dials[host] = "service_healthy"
        conditions = {dep: cond["condition"]
                      for dep, cond in (service.get("depends_on") or {}).items()}
        assert conditions == dials, name
    # Startup order is a chain: detokenizer -> scheduler -> gateway, tokenizer -> gateway.
    assert set(services["scheduler"]["depends_on"]) == {"detokenizer"}
    assert set(services["gateway"]["depends_on"]) == set(INTERNAL)
    assert not services["tokenizer"].get("depends_on")
    assert not services["detokenizer"].get("depends_on")


def test_internal_services_live_only_on_the_internal_network(spec: dict[str, Any]) -> None:
    networks = spec["networks"]
    internal = {name for name, net in networks.items() if (net or {}).get("internal")}
    assert internal == {"backend"}
    for name in INTERNAL:
        assert spec["services"][name]["networks"] == ["backend"], name
    gateway = spec["services"]["gateway"]["networks"]
    assert "backend" in gateway and set(gateway) - internal, "the gateway needs a routable network"


def test_model_folder_is_mounted_read_only(spec: dict[str, Any]) -> None:
    for name in INTERNAL:
        [volume] = spec["services"][name]["volumes"]
        source, target, mode = volume.split(":")
        assert (source, target, mode) == ("models", "/models", "ro"), name
    assert "volumes" not in spec["services"]["gateway"]  # it never reads the model
    assert "models" in spec["volumes"]
    # A host folder replaces the named volume through the env file, still read-only.
    custom = interpolate(load(COMPOSE), {"RADIXSERVE_MODELS_DIR": "/srv/models"})
    assert custom["services"]["scheduler"]["volumes"] == ["/srv/models:/models:ro"]


def test_secret_comes_from_the_env_file_only(spec: dict[str, Any]) -> None:
    for name, service in spec["services"].items():
        assert service["env_file"] == [".env"], name
        assert SECRET not in environment(service), name
    assert SECRET in read_env_file(ENV_EXAMPLE)
    assert SECRET not in (DOCKER / "Dockerfile").read_text()
    ignored = subprocess.run(["git", "check-ignore", "-q", "docker/.env"], check=False,
                             cwd=REPO)
    assert ignored.returncode == 0, "docker/.env must be git-ignored"
    assert "docker/.env" in (REPO / ".dockerignore").read_text().split()
    # The path of the env file itself is overridable (the tests point it at the example).
    moved = interpolate(load(COMPOSE), {"RADIXSERVE_ENV_FILE": "/run/secrets/radixserve.env"})
    assert moved["services"]["gateway"]["env_file"] == ["/run/secrets/radixserve.env"]


def test_gpu_override_reserves_one_gpu_for_the_scheduler_only() -> None:
    override = interpolate(load(COMPOSE_GPU), {})
    assert set(override["services"]) == {"scheduler"}
    scheduler = override["services"]["scheduler"]
    assert scheduler["build"]["target"] == "cuda"
    assert scheduler["image"] == "radixserve:cuda"
    # By id: Docker's `count: 1` is GPU 0 in every container that asks (docker-compose.gpu.yml).
    [device] = scheduler["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}
    assert flag(scheduler["command"], "--device") == "cuda"


# -- (c) two scheduler replicas: docker-compose.dp2.yml -------------------------------------------


@pytest.fixture(scope="module", params=[DP2, DP2_GPU], ids=["dp2", "gpu-dp2"])
def dp2(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The dp2 stack as docker-compose merges it: {"gpu": bool, "services": {...}, ...}."""
    return {**_resolved(*request.param), "gpu": COMPOSE_GPU in request.param}


def _command_of(services: dict[str, Any], kind: str) -> list[str]:
    return sorted(name for name, s in services.items() if s["command"][1] == kind)


def test_dp2_pairs_each_scheduler_with_a_detokenizer_of_its_own(dp2: dict[str, Any]) -> None:
    services = dp2["services"]
    schedulers = _command_of(services, "scheduler")
    assert schedulers == ["scheduler", "scheduler-1"]
    assert _command_of(services, "detokenizer") == ["detokenizer", "detokenizer-1"]
    gateway = environment(services["gateway"])
    listed = addresses(gateway["RADIXSERVE_SCHEDULER_ADDR"])
    detokenizers = addresses(gateway["RADIXSERVE_DETOKENIZER_ADDR"])
    # One detokenizer per scheduler, paired by position (BackendAddresses), each used once.
    assert len(listed) == len(detokenizers) == 2
    assert len(set(detokenizers)) == 2
    for scheduler, detokenizer in zip(listed, detokenizers):
        host, _, port = scheduler.rpartition(":")
        assert port == _listen_port(services[host]), scheduler
        # The scheduler streams to the detokenizer the gateway subscribes to for it.
        assert environment(services[host])["RADIXSERVE_DETOKENIZER_ADDR"] == detokenizer
        detok_host, _, detok_port = detokenizer.rpartition(":")
        assert detok_port == _listen_port(services[detok_host]), detokenizer
        assert set(services[host]["depends_on"]) == {detok_host}
    assert sorted(h.rpartition(":")[0] for h in listed) == schedulers
    assert set(services["gateway"]["depends_on"]) == set(services) - {"gateway"}
    # Still one published port, and the replicas stay on the internal network.
    assert [name for name, s in services.items() if s.get("ports")] == ["gateway"]
    for name in REPLICA_1:
        assert list(services[name]["networks"]) == ["backend"], name
        assert services[name]["volumes"] == services["scheduler"]["volumes"], name


def test_dp2_replicas_are_copies_of_the_first(dp2: dict[str, Any]) -> None:
    """The override repeats the base file's settings (anchors do not cross files); only the
    pairing, and on GPUs the device, may differ."""
    services = dp2["services"]

    def without_pairing(service: dict[str, Any]) -> dict[str, Any]:
        copy = {k: v for k, v in service.items() if k not in ("depends_on", "deploy")}
        copy["environment"] = {k: v for k, v in environment(service).items()
                               if k != "RADIXSERVE_DETOKENIZER_ADDR"}
        return copy

    assert services["detokenizer-1"] == services["detokenizer"]
    assert without_pairing(services["scheduler-1"]) == without_pairing(services["scheduler"])


def test_dp2_gives_each_scheduler_its_own_gpu_or_none(dp2: dict[str, Any]) -> None:
    services = dp2["services"]
    gpus = []
    for name in _command_of(services, "scheduler"):
        scheduler = services[name]
        if not dp2["gpu"]:
            assert "deploy" not in scheduler and "--device" not in scheduler["command"], name
            continue
        assert flag(scheduler["command"], "--device") == "cuda"
        [device] = scheduler["deploy"]["resources"]["reservations"]["devices"]
        assert "count" not in device, f"{name}: a count is GPUs 0..count-1 in every container"
        assert (device["driver"], device["capabilities"]) == ("nvidia", ["gpu"])
        [gpu] = device["device_ids"]
        gpus.append(gpu)
    assert sorted(gpus) == (["0", "1"] if dp2["gpu"] else [])
    for name, service in services.items():
        if service["command"][1] != "scheduler":
            assert "deploy" not in service and service["image"] == "radixserve:cpu", name


# -- the image recipe (static: the build itself needs a Docker engine) ---------------------------


def test_dockerfile_targets_builders_and_runtimes() -> None:
    args, stages = dockerfile_stages()
    assert {"cpu", "cuda", "cpu-build", "cuda-build"} <= set(stages)
    for target, builder in (("cpu", "cpu-build"), ("cuda", "cuda-build")):
        runtime = stages[target]
        # Same base as its builder, pinned by an explicit tag.
        assert runtime.base == stages[builder].base
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", runtime.base)
        assert not runtime.base.endswith(":latest")
        # The builder compiles the extension; the runtime has no compiler and runs as non-root.
        assert re.search(r"\bg\+\+|build-essential", stages[builder].body)
        assert not re.search(r"\b(g\+\+|gcc|clang|build-essential|make|cmake)\b", runtime.body)
        assert f"COPY --from={builder} /opt/venv /opt/venv" in runtime.body
        users = re.findall(r"^USER (\S+)", runtime.body, re.MULTILINE)
        assert users and users[-1] not in ("root", "0")
        # Both wheels are built and installed; the native helper must have compiled.
        assert "pip wheel --no-deps --wheel-dir /wheels ./clients/python" in stages[builder].body
        assert "radixserve_client-*.whl /wheels/radixserve-*.whl" in stages[builder].body
        assert "backend_name() == 'cpp'" in stages[builder].body
        # Extra CAs and wheels (docker/build-extras/) reach the builder only, never the runtime.
        assert "COPY docker/build-extras/ /build-extras/" in stages[builder].body
        assert "PIP_FIND_LINKS=/build-extras/wheels" in stages[builder].body
        assert "build-extras" not in runtime.body
    assert args["PYTHON_IMAGE"].startswith("python:3.12-slim-")
    assert args["CUDA_IMAGE"].startswith("nvidia/cuda:") and "runtime" in args["CUDA_IMAGE"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["TORCH_VERSION"])
    assert "download.pytorch.org/whl/cpu" in stages["cpu-build"].body
    assert '"torch==${TORCH_VERSION}"' in stages["cpu-build"].body
    assert '"torch==${TORCH_VERSION}"' in stages["cuda-build"].body


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    patterns = (REPO / ".dockerignore").read_text().split()
    for needed in (".git", "**/.venv", "**/node_modules", "**/__pycache__", "**/*.egg-info",
                   "**/build", "**/*.so", "**/.pytest_cache"):
        assert needed in patterns, needed
    # Everything the Dockerfile copies must survive the ignore list.
    for kept in ("pyproject.toml", "setup.py", "README.md", "engine", "services", "bench", "native",
                 "protos", "clients", "docker/build-extras"):
        assert kept not in patterns and (REPO / kept).exists(), kept
