"""docker/kubernetes/ rendered by `kubectl kustomize`: the same four services as the compose file,
with probes, the internal secret, resources and the model volume. Needs kubectl, not a cluster."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
import yaml
from compose_spec import COMPOSE, DOCKER, SERVICES, dockerfile_stages, interpolate, load

KUSTOMIZE = DOCKER / "kubernetes"
SECRET_ENV = "RADIXSERVE_INTERNAL_SECRET"
WORKLOADS = {
    "gateway": "Deployment",
    "tokenizer": "Deployment",
    "detokenizer": "Deployment",
    "scheduler": "StatefulSet",
}
WITH_MODEL = ("tokenizer", "detokenizer", "scheduler")


def _render(overlay: str) -> dict[tuple[str, str], dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (Debian: kubernetes-client); the manifests need it")
    result = subprocess.run([kubectl, "kustomize", str(KUSTOMIZE / overlay)], check=False,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module", params=["base", "overlays/gpu"], ids=["cpu", "gpu"])
def rendered(request: pytest.FixtureRequest) -> tuple[str, dict[tuple[str, str], dict[str, Any]]]:
    return request.param, _render(request.param)


def _workload(docs: dict[tuple[str, str], dict[str, Any]], service: str) -> dict[str, Any]:
    return docs[(WORKLOADS[service], f"radixserve-{service}")]


def _container(docs: dict[tuple[str, str], dict[str, Any]], service: str) -> dict[str, Any]:
    [container] = _workload(docs, service)["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _port(container: dict[str, Any]) -> int:
    [port] = container["ports"]
    return port["containerPort"]


def test_topology_matches_compose(rendered) -> None:
    _, docs = rendered
    compose = interpolate(load(COMPOSE), {})["services"]
    for service in SERVICES:
        workload = _workload(docs, service)
        pod = workload["spec"]["template"]
        # The selector picks this workload's pods only, and its Service selects the same pods.
        labels = workload["spec"]["selector"]["matchLabels"]
        assert labels == {"app.kubernetes.io/name": f"radixserve-{service}"}
        assert labels.items() <= pod["metadata"]["labels"].items()
        svc = docs[("Service", f"radixserve-{service}")]
        assert svc["spec"]["selector"] == labels
        container = _container(docs, service)
        # The same command as the compose service, listening on the same port.
        assert container["args"][:4] == compose[service]["command"]
        port = _port(container)
        assert container["args"][3] == f"0.0.0.0:{port}"
        [svc_port] = svc["spec"]["ports"]
        assert (svc_port["port"], svc_port["targetPort"]) == (port, "grpc")
    # The scheduler replicas get stable names through a headless Service.
    scheduler = _workload(docs, "scheduler")
    headless = docs[("Service", "radixserve-scheduler")]
    assert scheduler["spec"]["serviceName"] == "radixserve-scheduler"
    assert headless["spec"]["clusterIP"] == "None"
    # Backends are found through their Services.
    env = _env(_container(docs, "gateway"))
    for backend in ("tokenizer", "scheduler", "detokenizer"):
        port = _port(_container(docs, backend))
        assert env[f"RADIXSERVE_{backend.upper()}_ADDR"] == f"radixserve-{backend}:{port}"
    detok_port = _port(_container(docs, "detokenizer"))
    scheduler_env = _env(_container(docs, "scheduler"))
    assert scheduler_env["RADIXSERVE_DETOKENIZER_ADDR"] == f"radixserve-detokenizer:{detok_port}"
    # Nothing but the four services, their Services, the config and the model claim.
    kinds = sorted(kind for kind, _ in docs)
    assert kinds == sorted(
        ["ConfigMap", "PersistentVolumeClaim", "Deployment", "Deployment", "Deployment",
         "StatefulSet", "Service", "Service", "Service", "Service"]
    )


def test_every_service_has_grpc_health_probes(rendered) -> None:
    _, docs = rendered
    for service in SERVICES:
        container = _container(docs, service)
        port = _port(container)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": port}, (service, probe)
        # A slow model load is the startup probe's business, not the liveness probe's.
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, service


def test_internal_secret_comes_from_a_secret_never_from_the_manifests(rendered) -> None:
    _, docs = rendered
    assert not [name for kind, name in docs if kind == "Secret"]
    refs = set()
    for service in SERVICES:
        ref = _env(_container(docs, service))[SECRET_ENV]
        assert set(ref) == {"secretKeyRef"}, service
        refs.add((ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"]))
    assert refs == {("radixserve-internal", "internal-secret")}


def test_pods_run_as_the_image_user_without_privileges(rendered) -> None:
    _, docs = rendered
    _, stages = dockerfile_stages()
    assert "--uid 10001" in stages["cpu"].body
    for service in SERVICES:
        pod = _workload(docs, service)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        container = _container(docs, service)
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_model_comes_from_the_config_and_a_read_only_volume(rendered) -> None:
    _, docs = rendered
    config = docs[next(key for key in docs if key[0] == "ConfigMap")]
    assert config["data"]["RADIXSERVE_MODEL"] == "/opt/radixserve/demo"
    claim = docs[("PersistentVolumeClaim", "radixserve-models")]
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    for service in WITH_MODEL:
        container = _container(docs, service)
        assert {"configMapRef": {"name": config["metadata"]["name"]}} in container["envFrom"]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "models")
        assert (mount["mountPath"], mount["readOnly"]) == ("/models", True)
        pod = _workload(docs, service)["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["models"]["persistentVolumeClaim"] == {
            "claimName": "radixserve-models", "readOnly": True
        }


def test_resources_and_images(rendered) -> None:
    overlay, docs = rendered
    gpu = overlay == "overlays/gpu"
    for service in SERVICES:
        container = _container(docs, service)
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), service
        assert "memory" in resources["limits"], service
        wants_gpu = gpu and service == "scheduler"
        assert container["image"] == ("radixserve:cuda" if wants_gpu else "radixserve:cpu")
        for kind in ("requests", "limits"):
            assert resources[kind].get("nvidia.com/gpu") == (1 if wants_gpu else None), service
    scheduler = _container(docs, "scheduler")
    assert ("--device" in scheduler["args"]) == gpu
    if gpu:
        assert scheduler["args"][scheduler["args"].index("--device") + 1] == "cuda"
        pod = _workload(docs, "scheduler")["spec"]["template"]["spec"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        shm = next(m for m in scheduler["volumeMounts"] if m["mountPath"] == "/dev/shm")
        assert {"name": shm["name"], "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod[
            "volumes"
        ]
