"""The serving plane's own timing in a `bench serving` level, from the services' Prometheus
metrics read before and after it (bench/prometheus.py), and the tables that print it.

Per level: the step (the level's time over each scheduler replica's engine steps); the engine's
steps that decoded by kind (engine/step_times.py); the engine thread's phases of a step call and
its CPU time against its busy wall time; the garbage collector's pauses per process; the prefill
cap at the level's end; and how long after the scheduler had a step's outputs they reached each
hop on the way to the client (HOPS). bench/serving.py's module doc says what each column means.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixserve.bench.prometheus import ENGINE_STEPS, Reading, observed_ms
from radixserve.engine.step_times import HOST_PHASES, PREFILL_CLASSES
from radixserve.engine.step_times import KINDS as STEP_KINDS  # the histogram's kind labels

if TYPE_CHECKING:
    from radixserve.bench.serving import LevelResult

PREFILL_CAP = "radixserve_mixed_prefill_cap"  # services/scheduler/metrics.py
STEP_SECONDS = "radixserve_engine_step_seconds"  # engine/step_times.py, by kind
MIXED_SECONDS = "radixserve_engine_mixed_step_seconds"  # the mixed ones, by their prefill
HOST_SECONDS = "radixserve_engine_host_seconds"  # engine/step_times.py, by phase
THREAD_CPU = "radixserve_engine_thread_cpu_seconds_total"  # services/scheduler/metrics.py
INTER_TOKEN = "radixserve_inter_token_latency_seconds"  # services/gateway/metrics.py
GC_PAUSES = "radixserve_gc_pause_seconds"  # services/common/gc_pauses.py, by generation
FORWARDS = "radixserve_engine_forwards_total"  # services/scheduler/metrics.py, by path
HOPS = {"received_ms": "radixserve_step_detokenizer_received_delay_seconds",
        "detokenized_ms": "radixserve_step_detokenized_delay_seconds",
        "arrival_ms": "radixserve_step_arrival_delay_seconds",
        "handoff_ms": "radixserve_token_handoff_delay_seconds"}


def plane_timing(before: Reading, after: Reading, duration_s: float) -> dict[str, Any]:
    """The plane's figures of a level from readings of the services' metrics around it."""
    schedulers = [e for e in after.endpoints if (ENGINE_STEPS, ()) in e]  # one per replica
    steps = after.total(ENGINE_STEPS) - before.total(ENGINE_STEPS)
    step_ms = duration_s * len(schedulers) / steps * 1e3 if steps > 0 else math.nan
    out: dict[str, Any] = {"step_ms": step_ms}
    for key, histogram in HOPS.items():
        out[key] = observed_ms(before, after, histogram)
    # the streams' inter-token gaps as the gateways handed them to gRPC: the client's ITL less
    # the last hop and the client's own reading
    out["handed_itl_ms"] = observed_ms(before, after, INTER_TOKEN)
    # the steps that decoded: the engine's share of the inter-token gaps
    for kind in STEP_KINDS:
        out[f"{kind}_step_ms"] = observed_ms(before, after, STEP_SECONDS, (("kind", kind),))
    # the mixed steps by their prefill: whether their tail is the steps that took the most
    out["mixed_by_prefill_ms"] = {
        c: observed_ms(before, after, MIXED_SECONDS, (("prefill", c),)) for c in PREFILL_CLASSES}
    # the engine thread's phases of each step call: the one a late step spent its time in
    out["host_ms"] = {phase: observed_ms(before, after, HOST_SECONDS, (("phase", phase),))
                      for phase in HOST_PHASES}
    # cores of wall time the engine threads spent in phases other than the device wait, and of
    # CPU time: the difference is what they waited for the interpreter (the GIL)
    replicas = max(1, len(schedulers))
    out["engine_busy_cores"] = sum(
        h["total_ms"] for p, h in out["host_ms"].items() if p != "wait") / 1e3 / duration_s \
        / replicas
    out["engine_cpu_cores"] = (after.total(THREAD_CPU) - before.total(THREAD_CPU)) / duration_s \
        / replicas
    # the garbage collector's pauses in the schedulers and in the gateways, per process
    for role, pick in (("scheduler", True), ("gateway", False)):
        pair = [Reading([e for e in r.endpoints if ((ENGINE_STEPS, ()) in e) == pick])
                for r in (before, after)]
        gens = [observed_ms(*pair, GC_PAUSES, (("generation", str(g)),)) for g in range(3)]
        processes = len(pair[1].endpoints)
        out[f"{role}_gc"] = {
            "ms_per_s": sum(g["total_ms"] for g in gens) / max(1, processes) / duration_s,
            "p99_ms": [g["p99"] for g in gens], "count": [g["count"] for g in gens]}
    # how the engine's forwards ran (graphs of which kind, or eagerly), over every replica
    paths = sorted({dict(labels)["path"] for e in after.endpoints for name, labels in e
                    if name == FORWARDS})
    out["forwards"] = forwards = {}
    for p in paths:
        labels = (("path", p),)
        forwards[p] = after.total(FORWARDS, labels) - before.total(FORWARDS, labels)
    # the prefill a step that decodes took at the level's end (mixed_step_ratio), each replica's
    out["prefill_cap"] = [e.get((PREFILL_CAP, ()), 0.0) for e in schedulers]
    return out


def format_plane(results: list[LevelResult]) -> str:
    """Each level's plane timing (module doc). Empty when no metrics were read."""
    if not any(r.plane for r in results):
        return ""
    names = [k.removesuffix("_ms") for k in HOPS]
    head = (f"{'conc':>5} {'rate':>6} {'step':>6} {'TPOT p50/step':>13} "
            + " ".join(f"{kind + ' share/p50/p99':>22}" for kind in STEP_KINDS) + " "
            + " ".join(f"{name + ' mean/p50/p99':>26}" for name in names) + f" {'cap':>6}"
            + f" {'gc ms/s':>9} {'gc p99 by gen':>15}")
    rows = ["the plane per level, ms (step: the level's time / engine steps; decode, mixed: the "
            "engine's steps that decoded, alone or beside prefill, as streams saw them (share of "
            "steps, quantiles within buckets 2^(1/3) apart); cap: each replica's prefill budget "
            "of a step that decodes, at the level's end; gc: the garbage collector's pauses, ms "
            "a second in a scheduler / a gateway, and the scheduler's p99 pause of each "
            "generation; the others: from the scheduler having a step's outputs to each point "
            "on its way)",
            head, "-" * len(head)]
    for r in results:
        if not r.plane:
            continue
        step = r.plane["step_ms"]
        hops = ["/".join(f"{r.plane[k][q]:.1f}" for q in ("mean", "p50", "p99")) for k in HOPS]
        cap = ",".join(f"{c:.0f}" for c in r.plane.get("prefill_cap", ())) or "-"
        kinds = [r.plane.get(f"{kind}_step_ms", {}) for kind in STEP_KINDS]
        counted = sum(k.get("count", 0.0) for k in kinds)
        shown = [f"{k['count'] / counted:.2f}/{k['p50']:.1f}/{k['p99']:.1f}"
                 if counted and k.get("count") else "-" for k in kinds]
        rows.append(f"{r.concurrency:>5} {r.request_rate:>6.1f} {step:>6.2f} "
                    f"{r.tpot_ms['p50'] / step:>13.2f} " + " ".join(f"{x:>22}" for x in shown) + " "
                    + " ".join(f"{h:>26}" for h in hops) + f" {cap:>6} " + _format_gc(r.plane))
    return "\n".join(rows)


def format_streams(results: list[LevelResult]) -> str:
    """Each level's inter-token gaps as the gateways handed them to gRPC beside those the client
    read (plane_timing's handed_itl_ms, the level's itl_ms). Empty when none were read."""
    if not any(r.plane.get("handed_itl_ms", {}).get("count") for r in results):
        return ""

    def ratio(q: dict[str, float]) -> str:
        share = f"{q['p99'] / q['p50']:.2f}" if q["p50"] > 0 else "-"
        return f"{q['p50']:.2f}/{q['p99']:.2f} ({share})"

    def cells(r: LevelResult) -> list[str] | None:
        handed = r.plane.get("handed_itl_ms")
        if not handed or not handed["count"]:
            return None
        return [ratio(handed), ratio(r.itl_ms)]

    return _level_table(
        results, "the streams' inter-token gaps per level, ms, p50/p99 (p99 / p50): as the "
        "gateways handed them to gRPC (quantiles within buckets 1.1 apart) and as the client read "
        "them", [("gateways handed", 22), ("client read", 22)], cells)


def format_mixed(results: list[LevelResult]) -> str:
    """Each level's mixed steps by their prefill (plane_timing's mixed_by_prefill_ms). Empty
    when none were read."""
    def cells(r: LevelResult) -> list[str] | None:
        classes = r.plane.get("mixed_by_prefill_ms")
        counted = sum(c["count"] for c in classes.values()) if classes else 0
        if not counted:
            return None
        return [f"{q['count'] / counted:.2f}/{q['p50']:.1f}/{q['p99']:.1f}" if q["count"] else "-"
                for q in (classes.get(c, {"count": 0}) for c in PREFILL_CLASSES)]

    if not any(cells(r) for r in results):
        return ""
    return _level_table(
        results, "the engine's steps that decoded beside prefill, by their prefill (budget "
        "units: tokens under the default budget), ms: share of those steps / p50 / p99 "
        "(quantiles within buckets 2^(1/3) apart)",
        [(f"prefill {c}", 18) for c in PREFILL_CLASSES], cells)


def format_host(results: list[LevelResult]) -> str:
    """Each level's engine-thread phases (plane_timing's host_ms). Empty when none were read."""
    if not any(r.plane.get("host_ms") for r in results):
        return ""

    def cells(r: LevelResult) -> list[str] | None:
        phases = r.plane.get("host_ms")
        if not phases:
            return None
        use = f"{r.plane.get('engine_busy_cores', 0):.2f}/{r.plane.get('engine_cpu_cores', 0):.2f}"
        return ["/".join(f"{phases[p][q]:.2f}" for q in ("mean", "p50", "p99"))
                if phases[p]["count"] > 0 else "-" for p in HOST_PHASES] + [use]

    return _level_table(
        results, "the engine thread per step call and level, ms (engine/step_times.py: loop "
        "between two calls, schedule, launch, the commands after it, wait for the device, process "
        "the outputs; quantiles within buckets 2^(1/3) apart); busy/cpu: the thread's wall time "
        "outside the device wait and its CPU time, in cores (the difference: waiting for the "
        "interpreter)", [(f"{p} mean/p50/p99", 25) for p in HOST_PHASES] + [("busy/cpu", 10)],
        cells)


def format_forwards(results: list[LevelResult]) -> str:
    """Each level's engine forwards by how they ran (plane_timing's forwards). Empty when none."""
    paths = sorted({p for r in results for p in r.plane.get("forwards", {})})
    if not paths:
        return ""

    def cells(r: LevelResult) -> list[str] | None:
        counts = r.plane.get("forwards")
        if not counts:
            return None
        total = sum(counts.values()) or 1
        return [f"{counts.get(p, 0):.0f} ({counts.get(p, 0) / total:.2f})" for p in paths]

    return _level_table(
        results, "the engine's forwards per level by how they ran, count (share): decode_graph "
        "(every row one token in the decode graphs), whole_graph (the piecewise graphs, every row "
        "attended inside), pieces (attention between the pieces), eager",
        [(p, 20) for p in paths], cells)


def _level_table(results: list[LevelResult], title: str, columns: list[tuple[str, int]],
                 cells: Callable[[LevelResult], list[str] | None]) -> str:
    """A table of a row per level (conc, rate, then `columns` as (name, width)) under `title`;
    `cells` gives a level's cells, None to leave it out."""
    head = f"{'conc':>5} {'rate':>6} " + " ".join(f"{name:>{width}}" for name, width in columns)
    rows = [title, head, "-" * len(head)]
    for r in results:
        got = cells(r)
        if got is not None:
            rows.append(f"{r.concurrency:>5} {r.request_rate:>6.1f} "
                        + " ".join(f"{c:>{w}}" for c, (_, w) in zip(got, columns)))
    return "\n".join(rows)


def _format_gc(plane: dict[str, Any]) -> str:
    """The plane table's gc columns of one level ("-" where the services export no pauses)."""
    sched, gw = plane.get("scheduler_gc"), plane.get("gateway_gc")
    if not sched:
        return f"{'-':>9} {'-':>15}"
    share = f"{sched['ms_per_s']:.1f}/{gw['ms_per_s']:.1f}" if gw else f"{sched['ms_per_s']:.1f}"
    p99 = "/".join("-" if not n else f"{ms:.1f}" for ms, n in zip(sched["p99_ms"], sched["count"]))
    return f"{share:>9} {p99:>15}"
