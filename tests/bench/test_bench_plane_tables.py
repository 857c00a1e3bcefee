"""The serving bench's tables of the plane's figures that show where an inter-token tail is made:
the mixed steps by their prefill, and the gaps as the gateways handed them out beside the
client's."""

from radixserve.bench import plane_timing, serving
from radixserve.engine.step_times import PREFILL_CLASSES


def _level(plane: dict, itl_ms: dict) -> serving.LevelResult:
    ms = {"mean": 1.0, "p50": 1.0, "p99": 2.0}
    return serving.LevelResult(
        concurrency=256, request_rate=57.5, completed=4, failed=0, duration_s=2.0,
        output_tok_s=16.0, request_s=2.0, ttft_ms=ms, tpot_ms=ms, itl_ms=itl_ms, e2e_ms=ms,
        goodput_s=2.0, cached_share=0.0, server_cached_share=0.0, routing="", replicas=[],
        plane=plane)


def _q(count: float, p50: float = 0.0, p99: float = 0.0) -> dict:
    return {"count": count, "p50": p50, "p99": p99}


def test_mixed_steps_by_prefill_show_each_class_share_and_quantiles() -> None:
    classes = {c: _q(0) for c in PREFILL_CLASSES}
    classes["257-512"] = _q(30, 4.6, 6.0)
    classes["1025-2048"] = _q(10, 6.4, 9.4)
    table = plane_timing.format_mixed([_level({"mixed_by_prefill_ms": classes}, _q(1, 3, 6))])
    head, row = table.splitlines()[1], table.splitlines()[3]
    assert head.split()[-2:] == ["prefill", "2049+"]
    assert row.split()[2:] == ["-", "0.75/4.6/6.0", "-", "0.25/6.4/9.4", "-"]
    # a level without mixed steps, or without metrics, leaves the table out
    empty = {c: _q(0) for c in PREFILL_CLASSES}
    assert plane_timing.format_mixed([_level({"mixed_by_prefill_ms": empty}, _q(1))]) == ""
    assert plane_timing.format_mixed([_level({}, _q(1))]) == ""


def test_gaps_handed_out_beside_the_clients() -> None:
    level = _level({"handed_itl_ms": _q(500, 3.6, 6.9)}, {"mean": 3.7, "p50": 3.7, "p99": 7.4})
    row = plane_timing.format_streams([level]).splitlines()[-1]
    assert row.split()[2:] == ["3.60/6.90", "(1.92)", "3.70/7.40", "(2.00)"]
    assert plane_timing.format_streams([_level({}, _q(1))]) == ""
