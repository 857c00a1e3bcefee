"""Runs the libFuzzer + ASan/UBSan target (the radix tree) for a bounded time; any finding fails
the test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

RUN_SH = Path(__file__).resolve().parents[2] / "native" / "fuzz" / "run.sh"
SECONDS = 18


@pytest.mark.skipif(shutil.which("clang++") is None, reason="clang not installed (.ci/run-deps)")
def test_fuzz_targets_find_nothing(tmp_path: Path) -> None:
    done = subprocess.run(  # noqa: PLW1510 - the return code is asserted below
        ["bash", str(RUN_SH), str(SECONDS)],
        env={**os.environ, "FUZZ_OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=SECONDS + 180,  # the compile plus libFuzzer's own shutdown
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert done.stderr.count("Done") == 1  # the target ran to its time limit
