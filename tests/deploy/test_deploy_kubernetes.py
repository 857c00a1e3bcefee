"""docker/kubernetes/ rendered by `kubectl kustomize`: the same four services as the compose file,
with probes, the internal secret, resources and the model volume; the detokenizer as a sidecar of
each scheduler pod, and the gateway's address lists naming every pod (base: one replica; the dp2
overlays: two). Needs kubectl, not a cluster."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
import yaml
from compose_spec import COMPOSE, DOCKER, SERVICES, addresses, dockerfile_stages, interpolate, load

KUSTOMIZE = DOCKER / "kubernetes"
SECRET_ENV = "RADIXSERVE_INTERNAL_SECRET"
# The workload each service's container lives in: the detokenizer rides in the scheduler's pod.
WORKLOADS = {
    "gateway": ("Deployment", "radixserve-gateway"),
    "tokenizer": ("Deployment", "radixserve-tokenizer"),
    "detokenizer": ("StatefulSet", "radixserve-scheduler"),
    "scheduler": ("StatefulSet", "radixserve-scheduler"),
}
WITH_MODEL = ("tokenizer", "detokenizer", "scheduler")
# overlay -> (scheduler replicas, GPUs per scheduler pod)
OVERLAYS = {"base": (1, 0), "overlays/gpu": (1, 1), "overlays/dp2": (2, 0),
            "overlays/gpu-dp2": (2, 1)}

Docs = dict[tuple[str, str], dict[str, Any]]


def _render(overlay: str) -> Docs:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (Debian: kubernetes-client); the manifests need it")
    result = subprocess.run([kubectl, "kustomize", str(KUSTOMIZE / overlay)], check=False,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module", params=list(OVERLAYS), ids=["cpu", "gpu", "dp2", "gpu-dp2"])
def rendered(request: pytest.FixtureRequest) -> tuple[str, Docs]:
    return request.param, _render(request.param)


def _workload(docs: Docs, service: str) -> dict[str, Any]:
    return docs[WORKLOADS[service]]


def _pod(docs: Docs, service: str) -> dict[str, Any]:
    return _workload(docs, service)["spec"]["template"]["spec"]


def _container(docs: Docs, service: str) -> dict[str, Any]:
    pod = _pod(docs, service)
    [container] = [c for c in pod["containers"] + pod.get("initContainers", [])
                   if c["name"] == service]
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
        assert labels == {"app.kubernetes.io/name": WORKLOADS[service][1]}
        assert labels.items() <= pod["metadata"]["labels"].items()
        svc = docs[("Service", WORKLOADS[service][1])]
        assert svc["spec"]["selector"] == labels
        container = _container(docs, service)
        # The same command as the compose service, listening on the same port.
        assert container["args"][:4] == compose[service]["command"]
        port = _port(container)
        assert container["args"][3] == f"0.0.0.0:{port}"
        [svc_port] = [p for p in svc["spec"]["ports"] if p["port"] == port]
        assert svc_port["targetPort"] == container["ports"][0]["name"]
    # The tokenizer is found through its Service (the scheduler pods: next test).
    tokenizer = _env(_container(docs, "gateway"))["RADIXSERVE_TOKENIZER_ADDR"]
    assert tokenizer == f"radixserve-tokenizer:{_port(_container(docs, 'tokenizer'))}"
    # Nothing but the three workloads, their Services, the config and the model claim.
    kinds = sorted(kind for kind, _ in docs)
    assert kinds == sorted(["ConfigMap", "PersistentVolumeClaim", "Deployment", "Deployment",
                            "StatefulSet", "Service", "Service", "Service"])


def test_each_scheduler_pod_pairs_with_its_own_detokenizer(rendered) -> None:
    overlay, docs = rendered
    replicas, _ = OVERLAYS[overlay]
    scheduler = _workload(docs, "scheduler")
    assert scheduler["spec"]["replicas"] == replicas
    # The detokenizer is a native sidecar: started (and probed) before the scheduler, stopped
    # after it, so the scheduler's drain still reaches the gateway.
    [sidecar] = _pod(docs, "scheduler")["initContainers"]
    assert (sidecar["name"], sidecar["restartPolicy"]) == ("detokenizer", "Always")
    sched_port = _port(_container(docs, "scheduler"))
    detok_port = _port(sidecar)
    sched_env = _env(_container(docs, "scheduler"))
    assert sched_env["RADIXSERVE_DETOKENIZER_ADDR"] == f"127.0.0.1:{detok_port}"
    # Each pod has a stable name through the headless Service, resolvable before it is ready
    # (the gateway health-checks each replica itself), with both ports.
    name, service = scheduler["metadata"]["name"], scheduler["spec"]["serviceName"]
    headless = docs[("Service", service)]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert {p["port"] for p in headless["ports"]} == {sched_port, detok_port}
    # The gateway lists every pod, its scheduler and its detokenizer at the same position.
    pods = [f"{name}-{i}.{service}" for i in range(replicas)]
    gateway = _env(_container(docs, "gateway"))
    assert addresses(gateway["RADIXSERVE_SCHEDULER_ADDR"]) == [f"{p}:{sched_port}" for p in pods]
    assert addresses(gateway["RADIXSERVE_DETOKENIZER_ADDR"]) == [f"{p}:{detok_port}" for p in pods]


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
        pod = _pod(docs, service)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        container = _container(docs, service)
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # The scheduler pod waits out the scheduler's 30 s drain and then the detokenizer's stop.
    assert _pod(docs, "scheduler")["terminationGracePeriodSeconds"] > 35


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
        volumes = {v["name"]: v for v in _pod(docs, service)["volumes"]}
        assert volumes["models"]["persistentVolumeClaim"] == {
            "claimName": "radixserve-models", "readOnly": True
        }


def test_resources_and_images(rendered) -> None:
    overlay, docs = rendered
    _, gpus = OVERLAYS[overlay]
    for service in SERVICES:
        container = _container(docs, service)
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), service
        assert "memory" in resources["limits"], service
        # The GPU is the scheduler container's alone, one per pod, so one per replica (the
        # device plugin never hands a GPU to two pods).
        wants_gpu = gpus and service == "scheduler"
        assert container["image"] == ("radixserve:cuda" if wants_gpu else "radixserve:cpu")
        for kind in ("requests", "limits"):
            assert resources[kind].get("nvidia.com/gpu") == (gpus if wants_gpu else None), service
    scheduler = _container(docs, "scheduler")
    assert ("--device" in scheduler["args"]) == bool(gpus)
    if gpus:
        assert scheduler["args"][scheduler["args"].index("--device") + 1] == "cuda"
        pod = _pod(docs, "scheduler")
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "tolerations"
        ]
        shm = next(m for m in scheduler["volumeMounts"] if m["mountPath"] == "/dev/shm")
        assert {"name": shm["name"], "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod[
            "volumes"
        ]
