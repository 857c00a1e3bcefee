"""The children of `radixserve serve`: their names, command lines, sockets and environments.

One tokenizer and one gateway serve `dp_size` scheduler replicas. Replica i is a scheduler and a
detokenizer of its own (the detokenizer is a single-core stage, so it scales with the replicas):
scheduler i streams to detokenizer i, and the gateway is given every scheduler and every
detokenizer, paired by position (`--scheduler-addr` and `--detokenizer-addr` repeated, in replica
order). With dp_size 1 the names are `scheduler` and `detokenizer`; above it `scheduler-0`,
`detokenizer-0`, `scheduler-1`, ... Each internal child listens on `<name>.sock` in the private
folder. Metrics: the gateway's on `--metrics-port P`, scheduler i's on P + 1 + i.

Devices of the replicas (`replica_envs`), decided once before anything starts:

- dp_size 1: nothing is set; the scheduler sees what the supervisor sees, as before replicas.
- CUDA (`--device cuda`, or `auto` with a GPU visible): replica i of tensor-parallel size T gets
  CUDA_VISIBLE_DEVICES = visible GPUs i*T .. i*T+T-1. The visible GPUs are the entries of the
  supervisor's own CUDA_VISIBLE_DEVICES when it is set (indices or UUIDs, handed on as written),
  else the GPUs `nvidia-smi -L` lists, else (no nvidia-smi) torch's count in a subprocess: the
  supervisor never imports torch itself. Fewer visible GPUs than dp_size * T is an error at
  startup naming both counts.
- Otherwise (`--device cpu`, `auto` with no GPU visible): the replicas share the host's cores, and
  each scheduler gets OMP_NUM_THREADS = max(1, cores // dp_size), torch's thread count, unless the
  supervisor's environment already sets it.

Gateways (`--gateways`, `auto_gateways` for `auto`, the default): a GPU engine gets one per four
host cores, at most four, on the one public port; a CPU engine one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from radixserve.services.config import ServeConfig
from radixserve.services.gateway.routing import RoutingConfig

CUDA_ENV = "CUDA_VISIBLE_DEVICES"
THREADS_ENV = "OMP_NUM_THREADS"
TORCH_COUNT = "import torch; print(torch.cuda.device_count())"
MAX_AUTO_GATEWAYS = 4  # `serve --gateways auto` on a GPU engine (auto_gateways)
CORES_PER_GATEWAY = 4


@dataclass(frozen=True)
class Child:
    name: str
    argv: list[str]
    address: str  # where its health service answers
    # Its replica when dp_size > 1 (such a child is restarted in place when it dies); None for the
    # tokenizer, the gateway and every child of a single replica.
    replica: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the supervisor's environment


def replica_name(service: str, replica: int, dp_size: int) -> str:
    return service if dp_size == 1 else f"{service}-{replica}"


def is_gateway(name: str) -> bool:
    return name == "gateway" or name.startswith("gateway-")


def is_scheduler(name: str) -> bool:
    return name == "scheduler" or name.startswith("scheduler-")


def build_children(cfg: ServeConfig, engine_argv: list[str], sockets: str,
                   envs: list[dict[str, str]]) -> list[Child]:
    """Every child, in the order their readiness is awaited: tokenizer, detokenizers, schedulers,
    gateway. `envs[i]` is replica i's scheduler environment (`replica_envs`)."""
    cli = [sys.executable, "-m", "radixserve.services.cli"]
    model = ["--model", cfg.engine.model_path, "--log-level", cfg.log_level]
    tokenizer = f"unix:{sockets}/tokenizer.sock"
    detokenizers: list[Child] = []
    schedulers: list[Child] = []
    for i in range(cfg.dp_size):
        replica = i if cfg.dp_size > 1 else None
        detok, sched = (replica_name(s, i, cfg.dp_size) for s in ("detokenizer", "scheduler"))
        detok_addr, sched_addr = f"unix:{sockets}/{detok}.sock", f"unix:{sockets}/{sched}.sock"
        metrics = ["--metrics-port", str(cfg.metrics_port + cfg.gateways + i)] \
            if cfg.metrics_port else []
        interval = ["--stream-interval", str(cfg.stream_interval)] \
            if cfg.stream_interval > 1 else []
        detokenizers.append(Child(detok, [*cli, "detokenizer", *model, "--address", detok_addr,
                                          *interval], detok_addr, replica))
        schedulers.append(Child(sched, [*cli, "scheduler", *model, "--address", sched_addr,
                                        "--detokenizer-addr", detok_addr, *engine_argv,
                                        "--watchdog-timeout", str(cfg.watchdog_timeout_s),
                                        *metrics], sched_addr, replica, envs[i]))
    backends = ["--tokenizer-addr", tokenizer]
    for s in schedulers:
        backends += ["--scheduler-addr", s.address]
    for d in detokenizers:
        backends += ["--detokenizer-addr", d.address]
    return [
        Child("tokenizer", [*cli, "tokenizer", *model, "--address", tokenizer], tokenizer),
        *detokenizers,
        *schedulers,
        *(_gateway(cfg, cli, sockets, backends, i) for i in range(cfg.gateways)),
    ]


def _gateway(cfg: ServeConfig, cli: list[str], sockets: str, backends: list[str],
             i: int) -> Child:
    """Gateway i of `cfg.gateways`. Several share the public port (the kernel spreads client
    connections over them); each then also listens on a private socket for its own probe."""
    name = replica_name("gateway", i, cfg.gateways)
    limits = [
        "--default-max-new-tokens", str(cfg.gateway.default_max_new_tokens),
        "--max-in-flight", str(cfg.gateway.max_in_flight),
        "--drain-timeout", str(cfg.gateway.drain_timeout_s),
        *routing_argv(cfg.routing),
    ]
    tls, probe = cfg.public.tls, cfg.gateway_address
    if tls is not None or cfg.gateways > 1:
        # The health probe cannot present a client certificate, and on a shared port it would
        # reach any gateway: each also listens on a private unix socket, next to the internal
        # ones, for it.
        probe = f"unix:{sockets}/{name}.sock"
        limits += ["--probe-address", probe]
    if tls is not None:
        limits += ["--tls-cert", tls.cert, "--tls-key", tls.key]
        limits += ["--tls-client-ca", tls.client_ca] if tls.client_ca else []
    limits += ["--reuse-port"] if cfg.gateways > 1 else []
    if cfg.max_connection_age_s > 0:
        limits += ["--max-connection-age", str(cfg.max_connection_age_s)]
    metrics = ["--metrics-port", str(cfg.metrics_port + i)] if cfg.metrics_port else []
    argv = [*cli, "gateway", "--address", cfg.gateway_address, *backends,
            "--log-level", cfg.log_level, *limits, *metrics]
    return Child(name, argv, probe)


def routing_argv(routing: RoutingConfig) -> list[str]:
    """The gateway flags that rebuild `routing` (a RoutingConfig) in a child process."""
    return ["--routing", routing.policy,
            "--routing-cache-threshold", str(routing.cache_threshold),
            "--routing-balance-abs", str(routing.balance_abs),
            "--routing-balance-rel", str(routing.balance_rel),
            "--routing-max-tree-tokens", str(routing.max_tree_tokens)]


def replica_envs(device: str, dp_size: int, tp_size: int, environ: Mapping[str, str],
                 count_gpus: Callable[[], int] | None = None,
                 num_cores: int | None = None) -> list[dict[str, str]]:
    """The environment each replica's scheduler gets on top of the supervisor's (module docstring
    for the rules); ValueError when a CUDA machine has too few GPUs for the replicas."""
    if dp_size == 1:
        return [{}]
    kind = device.split(":")[0]
    if kind in ("cuda", "auto"):
        visible = _listed_gpus(environ)
        if visible is None:
            visible = [str(i) for i in range((count_gpus or count_visible_gpus)())]
        if visible or kind == "cuda":
            need = dp_size * tp_size
            if len(visible) < need:
                seen = f" ({CUDA_ENV}={environ[CUDA_ENV]})" if CUDA_ENV in environ else ""
                raise ValueError(f"--dp-size {dp_size} x --tp-size {tp_size} needs {need} GPUs; "
                                 f"{len(visible)} visible{seen}")
            return [{CUDA_ENV: ",".join(visible[i * tp_size:(i + 1) * tp_size])}
                    for i in range(dp_size)]
    if THREADS_ENV in environ:
        return [{} for _ in range(dp_size)]
    threads = max(1, (num_cores or _host_cores()) // dp_size)
    return [{THREADS_ENV: str(threads)} for _ in range(dp_size)]


def _listed_gpus(environ: Mapping[str, str]) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES's entries as written (indices or UUIDs); None where it is unset."""
    listed = environ.get(CUDA_ENV)
    return None if listed is None else [d.strip() for d in listed.split(",") if d.strip()]


def resolve_gateways(gateways: str | int, device: str) -> int:
    """`serve --gateways` as a count: as given, or `auto_gateways`' for the engine's device (the
    benchmarks resolve it the same way to find every gateway's metrics port)."""
    return gateways if isinstance(gateways, int) else auto_gateways(device, os.environ)


def auto_gateways(device: str, environ: Mapping[str, str],
                  count_gpus: Callable[[], int] | None = None,
                  num_cores: int | None = None) -> int:
    """`serve --gateways auto`: how many gateway processes the public port gets.

    A gateway is one core of Python per ~16k streamed tokens a second, so one caps a GPU engine
    serving a small model (Qwen3-0.6B streams ~30k on an H100: through four gateways the
    services carried 0.99-1.00 of the offline engine, through one 0.93, docs/benchmarks.md): a
    GPU engine gets one per CORES_PER_GATEWAY host cores, at most MAX_AUTO_GATEWAYS. A CPU engine
    gets one, since its model needs the cores. `auto` is a GPU where CUDA_VISIBLE_DEVICES lists
    one or, unset, where `nvidia-smi -L` does (without nvidia-smi, one gateway: a start-up probe
    through torch would cost seconds on every CPU machine)."""
    kind = device.split(":")[0]
    if kind == "cpu":
        return 1
    if kind == "auto":
        listed = _listed_gpus(environ)
        gpus = len(listed) if listed is not None else (count_gpus or _nvidia_smi_gpus)() or 0
        if gpus == 0:
            return 1
    return max(1, min(MAX_AUTO_GATEWAYS, (num_cores or _host_cores()) // CORES_PER_GATEWAY))


def _nvidia_smi_gpus() -> int | None:
    """The GPUs `nvidia-smi -L` lists; None where it cannot be run."""
    listed = _run(["nvidia-smi", "-L"], 30)
    if listed is None or listed.returncode != 0:
        return None
    # "GPU 0: NVIDIA H100 ..."; MIG devices are indented lines under their GPU.
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


def count_visible_gpus() -> int:
    """GPUs of this machine, counted in other processes so that the supervisor loads no torch."""
    listed = _nvidia_smi_gpus()
    if listed is not None:
        return listed
    probe = _run([sys.executable, "-c", TORCH_COUNT], 120)  # no nvidia-smi: ask torch
    words = probe.stdout.split() if probe is not None and probe.returncode == 0 else []
    return int(words[-1]) if words and words[-1].isdigit() else 0


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str] | None:
    """`argv`'s result, or None when it cannot be run or does not finish in time."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on (taskset, cgroups)
    except AttributeError:
        return os.cpu_count() or 1
