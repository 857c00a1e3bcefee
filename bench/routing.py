"""`radixserve bench routing`: the gateway's cost of picking a replica, cache-aware or not.

Each workload routes --prefixes prompts over --replicas replicas through the router itself (equal
loads, so the trees fill as in service), then times `pick` and `routed` on further prompts of
--prompt-len tokens drawn the same way. Workloads:

- system: 100 system prompts of half the prompt length, each request a fresh question after one
  (trees of depth 2: the system prompts, then the questions);
- turns: conversations growing by 128-token turns up to the prompt length (depth up to 16);
- spine: every prompt leaves one shared prompt-length spine at a random point (the worst case: a
  walk down the spine visits about one node per distinct branch point).

Pure Python, one thread; figures: docs/benchmarks.md, "Routing picks".
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from radixserve.bench.common import print_table
from radixserve.services.gateway.routing import ReplicaLoad, RoutingConfig, create_router

VOCAB = 150_000
Workload = Callable[[random.Random, int], list[int]]


def system_prompts(length: int) -> Workload:
    systems = [[random.Random(s).randrange(VOCAB) for _ in range(length // 2)] for s in range(100)]
    return lambda rng, _: rng.choice(systems) + [rng.randrange(VOCAB) for _ in range(length // 2)]


def turns(length: int) -> Workload:
    conversations: list[list[int]] = []

    def next_prompt(rng: random.Random, _: int) -> list[int]:
        if not conversations or rng.random() < 0.1 or len(conversations[-1]) >= length:
            conversations.append([])
        chat = rng.choice(conversations[-50:])
        if len(chat) < length:
            chat += [rng.randrange(VOCAB) for _ in range(min(128, length - len(chat)))]
        return list(chat)

    return next_prompt


def spine(length: int) -> Workload:
    trunk = [random.Random(-1).randrange(VOCAB) for _ in range(length)]

    def next_prompt(rng: random.Random, i: int) -> list[int]:
        if i < 0:  # a timed query: the whole spine, the longest walk
            return list(trunk)
        return trunk[: rng.randrange(length)] + [rng.randrange(VOCAB) for _ in range(64)]

    return next_prompt


WORKLOADS: dict[str, Callable[[int], Workload]] = {
    "system": system_prompts, "turns": turns, "spine": spine,
}


def measure(policy: str, workload: str, args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(0)
    router = create_router(RoutingConfig(policy=policy))  # type: ignore[arg-type]
    replicas = [ReplicaLoad(f"10.0.0.{i}:7001", 0) for i in range(args.replicas)]
    draw = WORKLOADS[workload](args.prompt_len)
    for i in range(args.prefixes):
        prompt = draw(rng, i)
        router.routed(router.pick(prompt, replicas), prompt)
    queries = [draw(rng, -1 if workload == "spine" else args.prefixes + i)
               for i in range(args.queries)]
    pick_ns, routed_ns = [], []
    for prompt in queries:
        t0 = time.perf_counter_ns()
        name = router.pick(prompt, replicas)
        t1 = time.perf_counter_ns()
        router.routed(name, prompt)
        pick_ns.append(t1 - t0)
        routed_ns.append(time.perf_counter_ns() - t1)
    trees = getattr(router, "tree_tokens", lambda _: 0)
    return {
        "policy": policy, "workload": workload,
        "tokens/replica": max(trees(r.name) for r in replicas),
        "pick p50 us": statistics.median(pick_ns) / 1e3,
        "pick p99 us": sorted(pick_ns)[int(0.99 * (len(pick_ns) - 1))] / 1e3,
        "routed p50 us": statistics.median(routed_ns) / 1e3,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="radixserve bench routing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--prefixes", type=int, default=5000, help="prompts routed before timing")
    parser.add_argument("--queries", type=int, default=500, help="prompts timed")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args(argv)
    rows = [measure("cache_aware", w, args) for w in args.workloads.split(",")]
    rows.append(measure("least_load", "system", args))
    print_table(f"routing: {args.replicas} replicas, {args.prompt_len}-token prompts, "
                f"{args.prefixes} prompts routed first", rows)
    return 0
