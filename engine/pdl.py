"""Programmatic dependent launch (PDL) for the Triton kernels of a step (CUDA, compute 9.0+).

At a small batch a decode step is a chain of about 200 kernels of a few microseconds each, replayed
from a CUDA graph, and each one's start-up and last wave leave most SMs idle: at one row the GEMVs
of Qwen3-0.6B stream their weights at about 1.5 TB/s. A kernel launched with PDL may start while
the kernel before it is still running, so its start-up overlaps that kernel's tail.

What keeps the chain ordered as without PDL: every kernel launched with PDL waits (`gdc_wait`)
before its first read of anything a kernel of the step writes and before its first write. When it
completes, the kernel before it has completed, and so, by the same rule, has every kernel before
that. Before its wait a kernel reads only what no kernel launched with PDL writes in the step:
weights, and the inputs the step writes before its first such kernel (positions, KV locations; that
kernel launches after they are written, and every later one after it). The GEMV streams its first
slab of weights there (layers/gemv.py), and the rotary kernel reads its position's cos and sin and
its KV location (layers/fused.py). The decode attention does not read its keys there: at one row
that cost Qwen3-0.6B 8 % a step (docs/benchmarks.md, "GPU, fourteenth round"). Right after its wait
each kernel lets the next one launch (`gdc_launch_dependents`). Kernels launched without PDL
(cuBLAS, torch) wait for the whole grid before them, as always; FlashInfer's decode kernel takes
part on its own (`enable_pdl`), and so does the small-batch decode kernel
(attention/small_decode.py).

`configure` is called by the model runner at start-up (EngineConfig.pdl); each launch passes
`launch_kwargs()`, and graph captures keep what it said then.
"""

from __future__ import annotations

from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

_enabled = False

if triton is not None:

    @triton.jit
    def wait_for_step_data(PDL: tl.constexpr):
        """In a kernel launched with `launch_kwargs()` (PDL True): wait until the kernels before
        this one have completed, then let the next one launch."""
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()


def supported(device: torch.device) -> bool:
    """PDL needs a CUDA device of compute capability 9.0 or later and a Triton that has it."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return True


def configure(on: bool, device: torch.device) -> bool:
    """Launch the step's Triton kernels with PDL from now on, where `on` and the device allows;
    returns whether they will."""
    global _enabled
    _enabled = on and supported(device)
    return _enabled


def launch_kwargs() -> dict[str, Any]:
    """What a kernel that takes part is launched with: its `PDL: tl.constexpr` argument (passed
    on to `wait_for_step_data`) and, while PDL is on, Triton's launch option (left out while off,
    so Triton's interpreter, which has no such option, never sees one)."""
    return {"PDL": True, "launch_pdl": True} if _enabled else {"PDL": False}
