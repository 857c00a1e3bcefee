"""`radixserve bench resources`: what the Triton kernels of a step take of an SM, compiled for a GPU
without one.

Triton compiles a kernel for a named target with no device present: to PTX, then through the
ptxas its wheel carries to a cubin, whose resource use cuobjdump (also in the wheel) reads. So a
kernel change can be checked on a machine without a GPU for what decides much of its speed:

- registers a thread, and from them (and the shared memory) how many programs an SM holds at once
  (`programs_sm`, the occupancy bound; 64K registers and 228 KiB of shared memory an SM, 1 KiB of
  it reserved a program, at most 32 programs and 64 warps);
- local memory a thread (`local_b`): what ptxas could not keep in registers, spilled values or
  arrays indexed at run time. Every access (`stl`, `ldl`: the store and load instructions to it in
  the code) goes through the L1 to memory: a kernel that must stream its keys at the memory's rate
  loses that time twice;
- shared memory a program, and the instructions in the code.

Each kernel is compiled with the engine's own compile-time arguments and launch options (its
module's `kernel_constants`, or the function beside the launch) for the models named, with PDL on
(as on an H200): the paged prefill kernel of the piecewise graphs, the small decode kernel at
graphs of 1, 32 and 256 rows (its two launch shapes), the GEMV of a layer's four weights at one
row, and the step's other kernels (norms, q/k norm + rotary + KV store, SiLU-mul, the plain KV
store, the seeded draw and its pick). `--sweep` also compiles the launch shapes `bench kernels`
times on a GPU. Nothing here is timed: a kernel without local memory can still be slow, and only
the GPU's own timing says which of two shapes is faster.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from typing import Any, NamedTuple

from radixserve.bench.common import print_table, write_json
from radixserve.bench.models import CONFIGS

H200_SMS = 132  # SMs an H200 has (an H100 SXM as many): the GEMV's programs depend on them
# Per SM of compute capability 9.0 (H100, H200)
SM_REGISTERS = 65536
SM_SHARED = 228 * 1024
PROGRAM_RESERVED_SHARED = 1024
SM_PROGRAMS, SM_WARPS = 32, 64
REGISTER_UNIT = 256  # registers are allocated to a warp in units of this many


class Compiled(NamedTuple):
    """One kernel's cubin: what a thread and a program of it take."""

    registers: int  # a thread
    local_bytes: int  # a thread: spilled values and arrays indexed at run time
    spill_stores: int  # store and load instructions to local memory in the code
    spill_loads: int
    shared_bytes: int  # a program
    instructions: int
    warps: int

    def programs_per_sm(self) -> int:
        """How many programs an SM holds at once, by registers, shared memory and warps."""
        per_warp = -(-self.registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
        by_registers = SM_REGISTERS // (per_warp * self.warps)
        by_shared = SM_SHARED // (self.shared_bytes + PROGRAM_RESERVED_SHARED)
        return min(by_registers, by_shared, SM_PROGRAMS, SM_WARPS // self.warps)


def _tool(name: str) -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: this Triton has no CUDA tools (its CUDA backend ships "
                                "ptxas and cuobjdump in its Linux x86_64 wheels)")
    return path


def compile_kernel(fn: Any, types: dict[str, str], constants: dict[str, Any],
                   arch: int = 90) -> Compiled:
    """Compile Triton kernel `fn` for CUDA compute capability `arch` (90: H100, H200) without a
    GPU. types: the Triton type of each pointer and float argument ("*bf16", "*i64", "fp32");
    every other run-time argument is an i32. constants: the kernel's constexpr arguments by name,
    with `num_warps` (and `num_stages`, where the launch names it).

    Every pointer and integer argument that the kernel lets Triton specialize is taken to be a
    multiple of 16, as the engine's are at a launch (torch's allocations; strides of heads of
    64 or 128 and of page-table rows of whole pages). The JIT compiles such a launch with that
    fact, and the loads it vectorizes by it: without it, a tile's loads take an address register
    each element, which alone can exceed a thread's registers."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # Triton's own number of pipeline stages where the launch names none
    options = {"num_warps": constants["num_warps"], "num_stages": constants.get("num_stages", 3)}
    constexprs = {k: v for k, v in constants.items() if k not in options}
    names = fn.arg_names
    unknown = set(constexprs) - set(names)
    assert not unknown, f"{fn.__name__} has no arguments {sorted(unknown)}"
    signature = {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}
    multiples_of_16 = {(p.num,): [["tt.divisibility", 16]] for p in fn.params
                       if signature[p.name] != "constexpr" and not p.do_not_specialize
                       and not signature[p.name].startswith("fp")}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(names.index(k),): v for k, v in constexprs.items()},
                       attrs=multiples_of_16)
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", cubin],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([_tool("cuobjdump"), "--dump-sass", cubin],
                              capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    assert found, f"no resource usage in cuobjdump's output: {usage[-300:]}"
    return Compiled(registers=int(found[1]), local_bytes=int(found[2]),
                    spill_stores=len(re.findall(r"\bSTL(?:\.\w+)*\s", sass)),
                    spill_loads=len(re.findall(r"\bLDL(?:\.\w+)*\s", sass)),
                    shared_bytes=kernel.metadata.shared,
                    instructions=len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", sass, re.M)),
                    warps=constants["num_warps"])


# The kernels' pointer and float arguments (every other run-time argument is an i32): bf16 model
# tensors, int64 indices, fp32 scratch and scales
_BF16, _I64, _F32 = "*bf16", "*i64", "*fp32"
_ATTENTION_TYPES = {"q_ptr": _BF16, "k_ptr": _BF16, "v_ptr": _BF16, "out_ptr": _BF16,
                    "table_ptr": _I64, "sm_scale": "fp32"}
_PARTS_TYPES = {"po_ptr": _F32, "plse_ptr": _F32, "arrivals_ptr": "*i32"}
PREFILL_TYPES = _ATTENTION_TYPES | {"work_ptr": _I64} | _PARTS_TYPES
DECODE_TYPES = _ATTENTION_TYPES | {"rows_ptr": _I64, "work_ptr": _I64} | _PARTS_TYPES
GEMV_TYPES = {name: _BF16 for name in ("x_ptr", "w_ptr", "b_ptr", "out_ptr", "r_ptr",
                                        "r_out_ptr", "nw_ptr")} | {"eps": "fp32"}
NORM_TYPES = {"x_ptr": _BF16, "r_ptr": _BF16, "w_ptr": _BF16, "out_ptr": _BF16, "eps": "fp32"}
ROPE_TYPES = {name: _BF16 for name in ("qkv_ptr", "cos_ptr", "sin_ptr", "qw_ptr", "kw_ptr",
                                       "q_out", "k_out", "v_out")} | {
    "pos_ptr": _I64, "loc_ptr": _I64, "eps": "fp32"}
SILU_MUL_TYPES = {"x_ptr": _BF16, "out_ptr": _BF16}
STORE_TYPES = {"k_ptr": _BF16, "v_ptr": _BF16, "k_cache_ptr": _BF16, "v_cache_ptr": _BF16,
               "loc_ptr": _I64}
# the draw: the seeds' words and steps int64, greedy flags int8, each part's best fp32 and int32
RACE_TYPES = {"logits_ptr": _BF16, "temp_ptr": _F32, "key_ptr": _I64, "lo_ptr": _I64,
              "hi_ptr": _I64, "step_ptr": _I64, "greedy_ptr": "*i8", "best_ptr": _F32,
              "best_idx_ptr": "*i32"}
PICK_TYPES = {"best_ptr": _F32, "best_idx_ptr": "*i32", "out_ptr": _I64, "pool_ptr": _I64,
              "slots_ptr": _I64, "pos_ptr": _I64}


class Case(NamedTuple):
    kernel: str  # what the table calls it
    fn: Any
    types: dict[str, str]
    constants: dict[str, Any]
    shape: str


def cases(models: list[str], sweep: bool = False) -> list[Case]:
    """The attention kernels as the engine launches them for each model's heads, the GEMV at one
    row for each weight of a layer, in the form the layers take at one row, and the other kernels
    of a step: the norms, q/k norm + rotary + KV store, SiLU-mul, the plain KV store, the draw."""
    from radixserve.bench.kernels import PAGED_PREFILL_SHAPES, WIDE_DECODE_SHAPES
    from radixserve.engine.attention import paged_prefill, small_decode
    from radixserve.engine.kvcache import store_kernel
    from radixserve.engine.layers import fused, gemv
    from radixserve.engine.sampling import race

    out, pdl_on = [], {"PDL": True}  # as on an H200
    for model in models:
        cfg = CONFIGS[model]
        nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        hd = cfg.get("head_dim") or cfg["hidden_size"] // nh
        heads = f"{model} {nh}/{nkv}x{hd}"
        # one case per compiled kernel: shapes that differ only in the plan's fields (programs,
        # shares) compile alike, so they are told apart by their compile-time arguments
        prefill = {}
        for shape in [paged_prefill.DEFAULT_SHAPE] + (
                [paged_prefill.PrefillShape(*t) for t in PAGED_PREFILL_SHAPES] if sweep else []):
            constants = paged_prefill.kernel_constants(nh, nkv, hd, shape)
            prefill.setdefault(tuple(sorted(constants.items())), (shape, constants))
        for shape, constants in prefill.values():
            out.append(Case(f"paged prefill, {heads}", paged_prefill._prefill_kernel,
                            PREFILL_TYPES, constants | pdl_on,
                            "{}k w{} s{}".format(*shape) + f" {shape.tile_rows} rows"
                            + (" free blocks" if shape.free_blocks else "")))
        decode = [(rows, small_decode.shape_for(rows)) for rows in (1, 32, 256)]
        if sweep:
            decode += [(256, small_decode.LaunchShape(*t)) for t in WIDE_DECODE_SHAPES
                       if small_decode.LaunchShape(*t) != small_decode.WIDE_SHAPE]
        for rows, shape in decode:
            splits = 1 if shape.spare else small_decode.splits_for(rows, nkv, shape.programs)
            constants = small_decode.kernel_constants(nh, nkv, hd, shape, splits)
            out.append(Case(f"small decode, {heads}, {rows} rows", small_decode._decode_kernel,
                            DECODE_TYPES, constants | pdl_on,
                            f"{shape.block_n}k w{shape.warps} s{shape.stages} splits {splits}"
                            + (f" spare {shape.spare} l{shape.long_tiles} s{shape.share_tiles}"
                               if shape.spare else "")))
        hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
        # (weight, input, N, K, SiLU-mul in the store): the residual add and RMSNorm go into
        # qkv_proj and gate_up_proj, SiLU-mul into gate_up_proj's store
        for name, kind, N, K, swiglu in (("qkv", gemv.NORMED, (nh + 2 * nkv) * hd, hidden, False),
                                         ("o", gemv.PLAIN, hidden, nh * hd, False),
                                         ("gate_up", gemv.NORMED, 2 * inter, hidden, True),
                                         ("down", gemv.PLAIN, hidden, inter, False)):
            blocks = gemv.config(N, K)
            programs, constants = gemv.kernel_constants(
                kind, 1, N, K, blocks, has_bias=False, has_residual=kind == gemv.NORMED,
                swiglu=swiglu, sm_count=H200_SMS)
            out.append(Case(f"gemv {name}, {model}, {N}x{K}, 1 row", gemv._gemv_kernel,
                            GEMV_TYPES, constants | pdl_on,
                            "{}x{} w{} ".format(*blocks[:3]) + f"{programs} programs"))
        vocab = cfg["vocab_size"]
        for kernel, fn, types, constants in (
                ("rms norm", fused._rms_norm_kernel, NORM_TYPES,
                 fused.norm_constants(hidden) | pdl_on),
                ("add + rms norm", fused._add_rms_norm_kernel, NORM_TYPES,
                 fused.norm_constants(hidden) | pdl_on),
                ("q/k norm + rotary + KV store", fused._qk_norm_rope_kernel, ROPE_TYPES,
                 fused.qk_norm_rope_constants(nh, nkv, hd, norm=True, store=True) | pdl_on),
                ("silu mul", fused._silu_mul_kernel, SILU_MUL_TYPES,
                 fused.silu_mul_constants(inter) | pdl_on),
                ("KV store", store_kernel._store_kv_kernel, STORE_TYPES,
                 store_kernel.kernel_constants(nkv * hd)),
                ("draw, seeded", race._race_kernel, RACE_TYPES, race.race_constants(derive=True)),
                ("draw's pick, into the pool", race._pick_kernel, PICK_TYPES,
                 race.pick_constants(vocab, store=True))):
            shape = " ".join(f"{k}={v}" for k, v in constants.items()
                             if k not in ("PDL", "num_warps") and not isinstance(v, bool))
            out.append(Case(f"{kernel}, {model}", fn, types, constants,
                            f"{shape} w{constants['num_warps']}"))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench resources", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen3-0.6b,qwen3-8b",
                    help="comma-separated names from bench/models.py: their shapes")
    ap.add_argument("--arch", type=int, default=90,
                    help="CUDA compute capability x 10 to compile for (90: H100, H200)")
    ap.add_argument("--sweep", action="store_true",
                    help="also the launch shapes `bench kernels` sweeps on a GPU")
    ap.add_argument("--json", default=None, help="also write the table to this JSON file")
    a = ap.parse_args(argv)
    import triton

    table = []
    for case in cases(a.models.split(","), a.sweep):
        c = compile_kernel(case.fn, case.types, case.constants, a.arch)
        table.append({"kernel": case.kernel, "shape": case.shape, "regs": c.registers,
                      "local_b": c.local_bytes, "stl": c.spill_stores, "ldl": c.spill_loads,
                      "shared_kib": c.shared_bytes / 1024, "programs_sm": c.programs_per_sm(),
                      "instructions": c.instructions})
    title = f"compiled for sm_{a.arch} by Triton {triton.__version__} (no GPU: nothing timed)"
    print_table(title, table)
    write_json(a.json, {"part": "resources", "arch": a.arch, "triton": triton.__version__,
                        "rows": table})


if __name__ == "__main__":
    main()
