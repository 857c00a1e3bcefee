"""Triton kernels run by Triton's interpreter, for CPU-only machines (where a GPU is present it
runs the kernels itself, in the GPU tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

cpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                              reason="the GPU runs the kernels itself (the GPU tests); the "
                                     "interpreter stands in for it on CPU-only machines")


def run_interpreted(code: str) -> str:
    """Run `code` in a fresh Python with TRITON_INTERPRET=1 (Triton reads it where kernels are
    defined, so not in this process, which has imported them); its stdout. Fails the test where
    it does not exit 0."""
    pytest.importorskip("triton")
    here = Path(__file__).resolve().parent
    root = here.parents[1]
    # the test modules' own imports (tests/engine helpers) resolve there too
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(root), str(here), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
