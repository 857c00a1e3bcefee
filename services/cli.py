"""The `radixserve` command: serve, one service each, demo-model, bench.

argparse lives here only; every subcommand turns its flags into frozen configs and hands them to
the service modules. Addresses default from RADIXSERVE_* environment variables (docker-compose).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from radixserve.services import config as cfg

# The one registry of environment switches: flag destination -> (variable, default).
ENV_DEFAULTS: dict[str, tuple[str, str]] = {
    "model": ("RADIXSERVE_MODEL", "demo"),
    "tokenizer_addr": ("RADIXSERVE_TOKENIZER_ADDR", cfg.DEFAULT_TOKENIZER_ADDRESS),
    "scheduler_addr": ("RADIXSERVE_SCHEDULER_ADDR", cfg.DEFAULT_SCHEDULER_ADDRESS),
    "detokenizer_addr": ("RADIXSERVE_DETOKENIZER_ADDR", cfg.DEFAULT_DETOKENIZER_ADDRESS),
    "log_level": ("RADIXSERVE_LOG_LEVEL", "INFO"),
}


def _env(dest: str) -> str:
    variable, default = ENV_DEFAULTS[dest]
    value = os.environ.get(variable, default)
    if not value:
        raise SystemExit(f"{variable} is set but empty")
    return value


def _on_off(text: str) -> bool:
    """An engine switch given as on / off (true / false: how `engine_argv` renders it)."""
    value = {"on": True, "true": True, "off": False, "false": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected on or off, not {text!r}")
    return value


# Engine flags: (flag, EngineConfig field, type). Rendered back to argv for the scheduler child.
ENGINE_FLAGS: tuple[tuple[str, str, type], ...] = (
    ("--device", "device", str),
    ("--dtype", "dtype", str),
    ("--page-size", "page_size", int),
    ("--max-prefill-tokens", "max_prefill_tokens", int),
    ("--prefill-budget", "prefill_budget", str),
    ("--mixed-prefill-tokens", "mixed_prefill_tokens", int),
    ("--mixed-step-ratio", "mixed_step_ratio", float),
    ("--mixed-horizon-steps", "mixed_horizon_steps", int),
    ("--long-prompt-slack", "long_prompt_slack", float),
    ("--max-running-requests", "max_running_requests", int),
    ("--max-queued-requests", "max_queued_requests", int),
    ("--num-pages", "num_pages", int),
    ("--max-context", "max_context", int),
    ("--cache", "cache", str),
    ("--attention-backend", "attention_backend", str),
    ("--tp-size", "tp_size", int),
    ("--tp-control", "tp_control", str),
    ("--seed", "seed", int),
    ("--schedule-policy", "schedule_policy", str),
    ("--admission", "admission", str),
    ("--admission-wait-ms", "admission_wait_ms", float),
    ("--memory-fraction", "memory_fraction", float),
    ("--cpu-kv-tokens", "cpu_kv_tokens", int),
    ("--cuda-graph-max-batch", "cuda_graph_max_batch", int),
    ("--graph-prefill-keys", "graph_prefill_keys", int),
    ("--small-decode-rows", "small_decode_rows", int),
    ("--pdl", "pdl", _on_off),
    ("--piecewise-graph-max-tokens", "piecewise_graph_max_tokens", int),
    ("--piece-prefill-keys", "piece_prefill_keys", int),
    ("--load-format", "load_format", str),
    ("--max-constraint-bytes", "max_constraint_bytes", int),
    ("--grammar-compile-timeout", "grammar_compile_timeout_s", float),
)
# Boolean engine switches that default on: (flag that turns it off, field).
ENGINE_SWITCHES: tuple[tuple[str, str], ...] = (
    ("--no-overlap", "overlap"),
    ("--no-cuda-graph", "cuda_graph"),
)


def _engine_fields() -> set[str]:
    """Fields the installed engine knows; flags for others are not offered."""
    import dataclasses

    from radixserve.engine.config import EngineConfig

    return {f.name for f in dataclasses.fields(EngineConfig)}


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=_env("model"), help="HF model folder, or 'demo' (default)")
    p.add_argument("--log-level", default=_env("log_level"))


def _add_engine(p: argparse.ArgumentParser) -> None:
    from radixserve.engine.config import EngineConfig

    defaults, known = EngineConfig(model_path=""), _engine_fields()
    for flag, field, kind in ENGINE_FLAGS:
        if field in known:
            p.add_argument(flag, dest=field, type=kind, default=getattr(defaults, field),
                           help=f"engine {field} (default: {getattr(defaults, field)})")
    for flag, field in ENGINE_SWITCHES:
        if field in known:
            p.add_argument(flag, dest=field, action="store_false", help=f"turn off engine {field}")


def _add_gateway_limits(p: argparse.ArgumentParser) -> None:
    from radixserve.services.gateway.frontend import FrontendConfig

    d = FrontendConfig()
    p.add_argument("--default-max-new-tokens", type=int, default=d.default_max_new_tokens,
                   help="cap on max_new_tokens when a request leaves it unset")
    p.add_argument("--max-in-flight", type=int, default=d.max_in_flight,
                   help="Generate calls held at once; more are answered RESOURCE_EXHAUSTED")
    p.add_argument("--drain-timeout", type=float, default=d.drain_timeout_s,
                   help="seconds in-flight requests get to finish after SIGTERM")


def _add_connection_age(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--max-connection-age", type=float, default=None, metavar="S",
                   help="seconds before a client connection gets a GOAWAY (its calls in flight "
                        f"finish and the client reconnects; 0: never; {default})")


def _add_watchdog(p: argparse.ArgumentParser) -> None:
    p.add_argument("--watchdog-timeout", type=float, default=60.0,
                   help="seconds an engine step may run before the scheduler dumps its stacks "
                        "and exits; under serve, also how long a service may leave its health "
                        "check unanswered before the supervisor kills it (0: off)")


def _add_security(p: argparse.ArgumentParser) -> None:
    from radixserve.services.common.auth import API_KEY_ENV

    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help=f"require metadata 'authorization: Bearer KEY' on every public RPC but "
                        f"health (default: ${API_KEY_ENV}, which keeps the key out of ps)")
    p.add_argument("--tls-cert", default=None, help="PEM certificate chain: TLS on the public port")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", default=None,
                   help="PEM CA bundle: clients must present a certificate it signed (mutual TLS)")


def _security(args: argparse.Namespace, probe_address: str | None = None) -> Any:
    from radixserve.services.common.auth import PublicSecurity
    from radixserve.services.common.rpc import TlsFiles

    if bool(args.tls_cert) != bool(args.tls_key):
        raise SystemExit("radixserve: --tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise SystemExit("radixserve: --tls-client-ca needs --tls-cert and --tls-key")
    for path in (args.tls_cert, args.tls_key, args.tls_client_ca):
        if path and not os.path.isfile(path):
            raise SystemExit(f"radixserve: {path}: no such file")
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    try:
        return PublicSecurity(args.api_key, tls, probe_address)
    except ValueError as exc:
        raise SystemExit(f"radixserve: {exc}") from None


class _Repeated(argparse.Action):
    """A repeatable flag whose default list (from the environment) the first use replaces;
    argparse's own "append" would add to it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*([] if given is self.default else given), values])


def _add_backends(p: argparse.ArgumentParser, *names: str, repeated: tuple[str, ...] = ()) -> None:
    """`--NAME-addr` per name; those in `repeated` may be given once per replica, in replica
    order, and their variable may hold several addresses, comma-separated."""
    for name in names:
        if name in repeated:
            listed = [a.strip() for a in _env(f"{name}_addr").split(",") if a.strip()]
            p.add_argument(f"--{name}-addr", action=_Repeated, default=listed,
                           help=f"a {name} service address (host:port or unix:/path); once per "
                                "replica")
        else:
            p.add_argument(f"--{name}-addr", default=_env(f"{name}_addr"),
                           help=f"{name} service address (host:port or unix:/path)")


def _add_routing(p: argparse.ArgumentParser) -> None:
    from radixserve.services.gateway.routing import RoutingConfig

    d = RoutingConfig()
    p.add_argument("--routing", choices=cfg.ROUTING_POLICIES, default=d.policy,
                   help="how the gateway picks a scheduler replica for a request")
    p.add_argument("--routing-cache-threshold", type=float, default=d.cache_threshold,
                   help="cache_aware: share of a prompt a replica must hold to win it by affinity")
    p.add_argument("--routing-balance-abs", type=int, default=d.balance_abs,
                   help="cache_aware: loads are imbalanced (least-loaded wins) past this many "
                        "requests of difference ...")
    p.add_argument("--routing-balance-rel", type=float, default=d.balance_rel,
                   help="... and past this ratio of the busiest to the idlest replica's load")
    p.add_argument("--routing-max-tree-tokens", type=int, default=d.max_tree_tokens,
                   help="cache_aware: prompt tokens remembered per replica (LRU beyond)")


def routing_config(args: argparse.Namespace) -> Any:
    from radixserve.services.gateway.routing import RoutingConfig

    try:
        return RoutingConfig(args.routing, args.routing_cache_threshold, args.routing_balance_abs,
                             args.routing_balance_rel, args.routing_max_tree_tokens)
    except ValueError as exc:
        raise SystemExit(f"radixserve: {exc}") from None


def _add_stream_interval(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream-interval", type=int, default=1, metavar="N",
                   help="send each stream's tokens in messages of N (its first token and its "
                        "finish at once): fewer writes per token through the gateway, at the "
                        "cost of tokens arriving N at a time (default 1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run all four services, supervised")
    _add_model(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--metrics-port", type=int, default=None,
                   help="Prometheus port of the gateway (gateway i uses it + i, scheduler "
                        "replica i the port after the gateways' + i)")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--ready-file", default=None,
                   help="write the public address to this file once every service (every gateway "
                        "too) is ready; it is removed when serve stops")
    p.add_argument("--dp-size", type=int, default=1,
                   help="scheduler replicas (data parallelism), each with its own detokenizer "
                        "and --tp-size GPUs")
    p.add_argument("--gateways", type=_gateway_count, default="auto",
                   help="gateway processes sharing the public port (the kernel spreads client "
                        "connections over them); each fronts every replica. auto (default): one "
                        "per 4 host cores, at most 4, for a GPU engine; one for a CPU engine")
    p.add_argument("--gateway-recycle-s", type=float, default=0.0,
                   help="replace the gateways with fresh processes one at a time, each about "
                        "this often (0: never; needs --gateways 2 or more): no call fails, and "
                        "memory that gRPC keeps for cancelled calls is given back")
    _add_connection_age(p, f"default: {cfg.RECYCLE_CONNECTION_AGE_S:.0f} with "
                           "--gateway-recycle-s, else 0")
    _add_stream_interval(p)
    _add_routing(p)
    _add_security(p)
    _add_watchdog(p)
    _add_engine(p)
    _add_gateway_limits(p)

    p = sub.add_parser("gateway", help="the public GenerateService")
    p.add_argument("--address", default=cfg.DEFAULT_GATEWAY_ADDRESS)
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--log-level", default=_env("log_level"))
    p.add_argument("--probe-address", default=None,
                   help="extra plaintext unix-socket listener for health probes (used by serve)")
    p.add_argument("--reuse-port", action="store_true",
                   help="share --address's port with other gateway processes (SO_REUSEPORT)")
    _add_connection_age(p, "default: 0; with it and --reuse-port, SIGUSR2 retires the gateway "
                           "without failing a call")
    _add_security(p)
    _add_backends(p, "tokenizer", "scheduler", "detokenizer",
                  repeated=("scheduler", "detokenizer"))
    _add_routing(p)
    _add_gateway_limits(p)

    for name, address in (("tokenizer", cfg.DEFAULT_TOKENIZER_ADDRESS),
                          ("detokenizer", cfg.DEFAULT_DETOKENIZER_ADDRESS)):
        p = sub.add_parser(name, help=f"the {name} service")
        _add_model(p)
        p.add_argument("--address", default=address)
        if name == "detokenizer":
            _add_stream_interval(p)

    p = sub.add_parser("scheduler", help="the engine behind its batching loop")
    _add_model(p)
    p.add_argument("--address", default=cfg.DEFAULT_SCHEDULER_ADDRESS)
    p.add_argument("--metrics-port", type=int, default=None)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    _add_watchdog(p)
    _add_backends(p, "detokenizer")
    _add_engine(p)

    p = sub.add_parser("demo-model", help="write the built-in demo model to DIR")
    p.add_argument("dir")

    # Shown by `radixserve --help` only: main() hands `bench ...` to radixserve.bench unparsed.
    p = sub.add_parser("bench", help="benchmarks (`radixserve bench --help` lists them)",
                       add_help=False)
    p.add_argument("name")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _resolve_model(model: str) -> str:
    """'demo' becomes the cached demo folder (created on first use); anything else must exist.
    Kept free of torch imports for real paths: the tokenizer and detokenizer never load torch."""
    if model == "demo":
        from radixserve.engine.demo import demo_model_path

        return str(demo_model_path())
    if not os.path.isdir(model):
        raise SystemExit(f"--model {model}: no such folder")
    return model


def engine_config(args: argparse.Namespace, model_path: str) -> Any:
    from radixserve.engine.config import EngineConfig

    known = _engine_fields()
    names = [f for _, f, _ in ENGINE_FLAGS] + [f for _, f in ENGINE_SWITCHES]
    fields = {name: getattr(args, name) for name in names if name in known}
    try:
        return EngineConfig(model_path=model_path, **fields)
    except ValueError as exc:
        raise SystemExit(f"radixserve: invalid engine flags: {exc}") from None


def engine_argv(engine: Any) -> list[str]:
    """The scheduler flags that rebuild `engine` (an EngineConfig) in a child process."""
    argv: list[str] = []
    for flag, field, _ in ENGINE_FLAGS:
        value = getattr(engine, field, None)
        if value is not None:
            argv += [flag, str(value)]
    return argv + [flag for flag, field in ENGINE_SWITCHES if getattr(engine, field, True) is False]


def _gateway_count(text: str) -> str | int:
    """--gateways: 'auto' or a count of 1 or more."""
    if text == "auto":
        return text
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a count, got {text!r}") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {count}")
    return count


def _connection_age(args: argparse.Namespace) -> float:
    """`serve`'s --max-connection-age: as given, else the recycling default or 0 (never)."""
    if args.max_connection_age is not None:
        return float(args.max_connection_age)
    return cfg.RECYCLE_CONNECTION_AGE_S if args.gateway_recycle_s > 0 else 0.0


def _frontend_config(args: argparse.Namespace) -> Any:
    from radixserve.services.gateway.frontend import FrontendConfig

    return FrontendConfig(args.default_max_new_tokens, args.max_in_flight, args.drain_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    # before argparse: every word after NAME is the benchmark's, --help too
    if words[:1] == ["bench"]:
        from radixserve.bench import run  # the product's one import of the benchmarks

        return run(words[1] if len(words) > 1 else None, words[2:])
    args = build_parser().parse_args(words)
    if args.command == "demo-model":
        from radixserve.engine.demo import create_demo_model

        print(create_demo_model(args.dir))
        return 0

    from radixserve.services.common.lifecycle import (
        die_with_parent,
        dump_stacks_on_sigusr1,
        run_event_loop,
        setup_logging,
    )

    setup_logging(args.command, args.log_level)
    dump_stacks_on_sigusr1()
    die_with_parent()
    if args.command == "serve":
        from radixserve.services.children import resolve_gateways
        from radixserve.services.supervisor import Supervisor

        engine = engine_config(args, _resolve_model(args.model))
        public = _security(args)
        try:
            serve_config = cfg.ServeConfig(
                engine=engine, gateway=_frontend_config(args), host=args.host, port=args.port,
                metrics_port=args.metrics_port, startup_timeout_s=args.startup_timeout,
                public=public, log_level=args.log_level,
                watchdog_timeout_s=args.watchdog_timeout, dp_size=args.dp_size,
                gateways=resolve_gateways(args.gateways, engine.device),
                routing=routing_config(args), ready_file=args.ready_file,
                stream_interval=args.stream_interval, gateway_recycle_s=args.gateway_recycle_s,
                max_connection_age_s=_connection_age(args),
            )
            supervisor = Supervisor(serve_config, engine_argv(engine))  # places the replicas
        except ValueError as exc:
            raise SystemExit(f"radixserve: {exc}") from None
        return supervisor.run()
    return run_event_loop(_serve_one(args))


async def _serve_one(args: argparse.Namespace) -> int:
    from radixserve.services.common.auth import SECRET_ENV

    secret = os.environ.get(SECRET_ENV) or None  # unset: internal calls are not authenticated
    if args.command == "gateway":
        from radixserve.services.gateway.server import BackendAddresses, serve

        try:
            backends = BackendAddresses(args.tokenizer_addr, args.scheduler_addr,
                                        args.detokenizer_addr)
        except ValueError as exc:
            raise SystemExit(f"radixserve gateway: {exc}") from None
        security = _security(args, args.probe_address)
        return await serve(args.address, backends, _frontend_config(args), args.metrics_port,
                           secret, security, routing_config(args), args.reuse_port,
                           args.max_connection_age or 0.0)
    model_path = _resolve_model(args.model)
    if args.command == "tokenizer":
        from radixserve.services.tokenizer.server import serve as serve_tokenizer

        return await serve_tokenizer(args.address, model_path, secret=secret)
    if args.command == "detokenizer":
        from radixserve.services.detokenizer.server import serve as serve_detokenizer

        if args.stream_interval < 1:
            raise SystemExit(f"radixserve detokenizer: --stream-interval must be >= 1, got "
                             f"{args.stream_interval}")
        return await serve_detokenizer(args.address, model_path, secret, args.stream_interval)
    from radixserve.services.scheduler.server import serve as serve_scheduler

    engine = engine_config(args, model_path)
    return await serve_scheduler(
        args.address, engine, args.detokenizer_addr, args.metrics_port, args.drain_timeout, secret,
        args.watchdog_timeout or None,
    )


if __name__ == "__main__":
    sys.exit(main())
