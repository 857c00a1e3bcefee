"""`bench resources`: the step's Triton kernels compiled for an H200 on a machine without a GPU.

Triton's interpreter runs the kernels' arithmetic on a CPU (test_paged_prefill.py,
test_small_decode_interpreted.py) but not their compilation: an operand shape the tensor cores do
not take, a layout Triton cannot lower, a tile that does not fit an SM fail only there. These
compile each kernel as the engine launches it, for compute capability 9.0.
"""

import re
from pathlib import Path

import pytest

pytest.importorskip("triton")
from radixserve.bench import resources  # noqa: E402


def _have_cuda_tools() -> bool:
    try:
        resources._tool("cuobjdump")
    except FileNotFoundError:
        return False
    return True


needs_tools = pytest.mark.skipif(not _have_cuda_tools(),
                                 reason="this Triton has no CUDA tools (ptxas, cuobjdump)")


@needs_tools
def test_the_steps_kernels_compile_for_an_h200_within_its_registers() -> None:
    cases = resources.cases(["qwen3-0.6b", "qwen3-8b"])
    # per model: the paged prefill kernel, the small decode kernel at 1, 32 and 256 rows, the GEMV
    # of the four weights of a layer at one row, and the seven others
    assert len(cases) == 30
    # every Triton kernel the engine launches (by name, `_..._kernel[grid](...)`) is among them
    engine = Path(resources.__file__).resolve().parents[1] / "engine"
    launched = {m for f in engine.rglob("*.py")
                for m in re.findall(r"\b(_\w+_kernel)\[", f.read_text())}
    assert launched and launched == {c.fn.__name__ for c in cases}
    for case in cases:
        c = resources.compile_kernel(case.fn, case.types, case.constants, arch=90)
        assert c.instructions > 0, case
        assert c.programs_per_sm() >= 1, case  # its shared memory fits an SM
        # nothing in local memory: each access would go through the L1 to memory (128 keys at
        # four warps, for one, did not fit the paged prefill kernel's tile)
        assert (c.local_bytes, c.spill_stores, c.spill_loads) == (0, 0, 0), (case, c)


def test_programs_per_sm_take_the_scarcest_of_registers_shared_memory_and_warps() -> None:
    def compiled(registers: int, shared: int, warps: int) -> resources.Compiled:
        return resources.Compiled(registers, 0, 0, 0, shared, 1000, warps)

    # 255 registers round up to 256 a thread: 8 warps take all 64K
    assert compiled(255, 32 * 1024, 8).programs_per_sm() == 1
    assert compiled(231, 24 * 1024, 4).programs_per_sm() == 2  # 232 x 32 x 4 = 29,696 a program
    assert compiled(32, 40 * 1024, 4).programs_per_sm() == 5  # 41 KiB of 228 each
    assert compiled(16, 0, 4).programs_per_sm() == 16  # 64 warps an SM
    assert compiled(16, 0, 1).programs_per_sm() == 32  # 32 programs an SM
