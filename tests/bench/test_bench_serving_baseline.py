"""bench serving's offline baseline: the same requests through the offline engine, configured by
the flags the stack's scheduler gets, in a process of its own."""

from __future__ import annotations

import subprocess

import pytest
from radixserve.bench import serving


def _cfg() -> serving.BenchConfig:
    return serving.BenchConfig("unused:0", (2,), num_prompts=3, input_len=8, output_len=4,
                               range_ratio=0.5, request_rate=float("inf"), temperature=0.0, seed=0)


def test_offline_baseline_runs_in_a_child_with_the_serve_flags() -> None:
    assert serving.offline_in_child("demo", _cfg(), ["--device", "cpu", "--page-size", "8"]) > 0


def test_offline_baseline_refuses_flags_serve_would_refuse() -> None:
    with pytest.raises(subprocess.CalledProcessError):
        serving.offline_in_child("demo", _cfg(), ["--device", "cpu", "--page-size", "0"])
