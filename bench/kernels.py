"""Kernel micro-benchmarks on the GPU: the two ceilings (copy bandwidth, bf16 matmul rate), the
fused KV store against two index_copy_ calls, FlashInfer paged decode (through our backend, and
the bare wrapper under different plan options), the small-batch GEMV, prefill attention of
each backend side by side (attention_prefill), and the piecewise graphs' paged prefill kernel
against FlashInfer's (paged_prefill). Medians of triton.testing.do_bench, or of CUDA
events; inputs random, rotated over several buffers where caches could help."""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from typing import Any

import torch


def _bench(fn: Any) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))  # ms


def ceilings() -> list[dict[str, Any]]:
    x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    y = torch.empty_like(x)
    ms = _bench(lambda: y.copy_(x))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm = _bench(lambda: a @ b)
    return [{"kernel": "copy 2 GiB", "ms": ms, "TB_s": 2 * x.numel() * 2 / ms / 1e9},
            {"kernel": "bf16 matmul 8192^3", "ms": mm, "TFLOP_s": 2 * 8192**3 / mm / 1e9}]


def kv_store() -> list[dict[str, Any]]:
    from radixserve.engine.kvcache.pool import KVCachePool

    rows = []
    nkv, hd = 8, 128
    pool = KVCachePool(1, 1 << 14, 16, nkv, hd, torch.bfloat16, torch.device("cuda"))
    for T in (1, 64, 256, 8192):
        loc = torch.randperm(pool.k.size(1), device="cuda")[:T]
        kv = torch.randn(T, 2 * nkv * hd + 2048, device="cuda", dtype=torch.bfloat16)
        k = kv[:, : nkv * hd].reshape(T, nkv, hd).contiguous()
        v = kv[:, nkv * hd : 2 * nkv * hd].view(T, nkv, hd)  # strided, as from the QKV projection
        times, graphed = {}, {}
        for fused in (True, False):
            pool.fused_store = fused
            times[fused] = _bench(lambda: pool.store(0, loc, k, v)) * 1e3
            graph = torch.cuda.CUDAGraph()  # device time alone, launch cost removed
            with torch.cuda.graph(graph):
                pool.store(0, loc, k, v)
            graphed[fused] = _bench(graph.replay) * 1e3
        rows.append({"kernel": f"kv store T={T}", "fused_us": times[True],
                     "index_copy_us": times[False],
                     "fused_graph_us": graphed[True], "index_copy_graph_us": graphed[False]})
    return rows


def _token_table(pages: torch.Tensor, P: int) -> torch.Tensor:
    """pages (B, n) page ids of each row, in order -> (B, n * P) their token locations, the page
    table's form (StepLayout)."""
    return (pages[:, :, None] * P + torch.arange(P, device=pages.device)).view(pages.size(0), -1)


def flashinfer_decode() -> list[dict[str, Any]]:
    from radixserve.engine.attention import StepLayout, create_backend
    from radixserve.engine.kvcache.pool import KVCachePool

    rows = []
    for nh, B, ctx, P in ((16, 64, 1024, 16), (32, 64, 1024, 16), (16, 256, 1024, 16),
                          (16, 64, 1024, 1)):
        b = create_backend("flashinfer", nh, 8, 128, torch.device("cuda"), torch.bfloat16)
        pages = B * ctx // P
        pool = KVCachePool(1, pages, P, 8, 128, torch.bfloat16, torch.device("cuda"))
        pool.k.normal_(), pool.v.normal_()
        table = _token_table(torch.randperm(pages, device="cuda").view(B, -1), P)
        lay = StepLayout(torch.arange(B, device="cuda"), [ctx - 1] * B, [ctx] * B,
                         table[:, -1].contiguous(), table, P)
        meta = b.prepare(lay)
        q = torch.randn(B, nh, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, 8, 128, device="cuda", dtype=torch.bfloat16)
        us = _bench(lambda: b.forward(q, k, k, 0, meta, pool)) * 1e3
        gb = 2 * B * ctx * 8 * 128 * 2 / 1e9
        rows.append({"kernel": f"flashinfer decode nh={nh} B={B} ctx={ctx} P={P}", "us": us,
                     "TB_s": gb / us * 1e3})
    return rows


# (label, use_tensor_cores, plan options). FlashInfer 0.5.3's plan() accepts disable_split_kv for
# both kernels but hands it only to the tensor-core (prefill-kernel) scheduler; the CUDA-core decode
# scheduler ignores it, so "no_split" should time as "default" and "tc_no_split" shows the option.
DECODE_VARIANTS: list[tuple[str, bool, dict[str, Any]]] = [
    ("default", False, {}), ("no_split", False, {"disable_split_kv": True}),
    ("tensor_cores", True, {}), ("tc_no_split", True, {"disable_split_kv": True})]
DECODE_NKV, DECODE_HD, DECODE_P = 8, 128, 16


def decode_variants() -> list[dict[str, Any]]:
    """FlashInfer's paged decode wrapper as our CUDA graphs use it, under each of DECODE_VARIANTS:
    device time per call, KV read rate, and the largest difference from the default plan's output.
    nh 16 / 32 with 8 KV heads are Qwen3-0.6B / Qwen3-8B."""
    import flashinfer

    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")  # as the backend's
    return [_decode_shape(flashinfer, workspace, nh, B, ctx)
            for nh in (16, 32) for B in (1, 4, 16, 64, 256) for ctx in (256, 1024)]


def _decode_shape(fi: Any, workspace: torch.Tensor, nh: int, B: int, ctx: int) -> dict[str, Any]:
    nkv, hd, P = DECODE_NKV, DECODE_HD, DECODE_P
    pages = B * ctx // P
    kv_bytes = 2 * B * ctx * nkv * hd * 2  # K and V, bf16: what one call reads
    # Enough KV copies (one per captured call) that the 50 MB L2 cannot serve the small batches.
    copies = max(1, min(128, (512 << 20) // kv_bytes))
    kv = torch.randn(copies, 2, pages, P, nkv, hd, device="cuda", dtype=torch.bfloat16)
    caches = [(kv[i, 0], kv[i, 1]) for i in range(copies)]  # each (pages, P, nkv, hd), NHD
    q = torch.randn(B, nh, hd, device="cuda", dtype=torch.bfloat16)
    plan_args = (torch.arange(B + 1, dtype=torch.int32) * (ctx // P),  # host indptr, as the backend
                 torch.randperm(pages, device="cuda").int(), torch.full((B,), P, dtype=torch.int32))
    accepted = set(inspect.signature(fi.BatchDecodeWithPagedKVCacheWrapper.plan).parameters)
    row: dict[str, Any] = {"kernel": f"decode variants nh={nh} nkv={nkv} B={B} ctx={ctx} P={P}",
                           "calls_per_graph": copies}
    ref: torch.Tensor | None = None
    for label, tensor_cores, opts in DECODE_VARIANTS:
        unknown = sorted(set(opts) - accepted)
        if unknown:
            row[f"{label}_skipped"] = f"plan() takes no {', '.join(unknown)}"
            continue
        try:
            us, out = _graphed_decode(fi, workspace, tensor_cores, opts, q, caches, plan_args)
        # one variant, not the part
        except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
            row[f"{label}_skipped"] = f"{type(e).__name__}: {e}"[:200]
            continue
        ref = out if label == "default" else ref
        row[f"{label}_us"], row[f"{label}_TB_s"] = us, kv_bytes / us / 1e6
        row[f"{label}_maxdiff"] = (float((out.float() - ref.float()).abs().max()) if ref is not None
                                   else float("nan"))
    timed = [k for k in row if k.endswith("_us")]
    row["best"] = min(timed, key=lambda k: row[k]).removesuffix("_us") if timed else None
    return row


def _graphed_decode(fi: Any, workspace: torch.Tensor, tensor_cores: bool, opts: dict[str, Any],
                    q: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]],
                    plan_args: tuple[torch.Tensor, ...]) -> tuple[float, torch.Tensor]:
    """Device us per call of one wrapper variant (one captured call per KV copy, as `_graphed_us`
    times the GEMVs), and its output on the first copy."""
    indptr, indices, last = plan_args
    B = len(last)
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
        paged_kv_indptr_buffer=torch.empty(B + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buffer=torch.empty(len(indices), dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buffer=torch.empty(B, dtype=torch.int32, device="cuda"))
    wrapper.plan(indptr, indices, last, q.size(1), DECODE_NKV, DECODE_HD, DECODE_P,
                 q_data_type=q.dtype, kv_data_type=q.dtype, **opts)
    # (B, nh, hd); also the first JIT load, outside any capture
    out = wrapper.run(q, caches[0]).clone()
    return _graphed_us(lambda cache: wrapper.run(q, cache), caches), out


# attention/small_decode.py's launch shapes (keys per tile, programs aimed at, warps, pipeline
# stages, spare programs, long_tiles, share_tiles); the first of each list is its default for
# those rows. Past 32 rows every row is one program a KV head whatever the programs aimed at, and
# rows past long_tiles tiles share out over the spare programs, so the wide graphs sweep those.
SMALL_DECODE_SHAPES = [(64, 512, 4, 3), (64, 256, 4, 3), (64, 1024, 4, 3), (32, 512, 4, 3),
                       (128, 512, 8, 3), (64, 512, 8, 3)]
WIDE_DECODE_SHAPES = [(128, 512, 4, 3, 64, 16, 4), (128, 512, 4, 3, 0),
                      (128, 512, 4, 3, 64, 16, 16), (128, 512, 4, 3, 64, 16, 2),
                      (128, 512, 4, 3, 64, 16, 8),
                      (128, 512, 4, 3, 128, 16, 4), (128, 512, 4, 3, 32, 16, 4),
                      (64, 512, 4, 3, 64, 32, 8), (128, 512, 8, 3, 64, 16, 4)]
SMALL_DECODE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def small_decode(rows: str = "") -> list[dict[str, Any]]:
    """Decode attention in CUDA graphs at 1-256 rows (the graphs that small_decode_rows gives the
    Triton kernel): attention/small_decode.py's kernels against FlashInfer's graph-mode decode
    (plan as the backend's), both launched with programmatic dependent launch as in a served
    step; device us per call, and the largest difference. Past 32 rows contexts of up to 2,048
    keys (the KV of 256 rows of 2,048 keys is 2 GB), a ragged case: lengths uniform in
    [100, 2,048], as late in the offline workload, "long": the ragged rows with 8 of them at
    16,384 keys, and "one long": rows of 128-384 keys, one of them at 16,384 (a long prompt
    decoding beside short chats, as in `bench long`). rows: comma-separated row counts, all if
    empty."""
    import flashinfer
    from radixserve.engine import pdl
    from radixserve.engine.attention.small_decode import LaunchShape, SmallBatchDecode

    dev = torch.device("cuda")
    pdl.configure(True, dev)
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
    nkv, hd, P = DECODE_NKV, DECODE_HD, DECODE_P
    g = torch.Generator().manual_seed(0)
    out_rows = []
    for nh in (16, 32):
        for B in [int(b) for b in rows.split(",")] if rows else SMALL_DECODE_ROWS:
            wide = B > 32
            for ctx in (("ragged", "long", "one long", 512, 2048) if wide
                        else (128, 512, 2048, 8192)):
                if ctx == "one long":
                    lens = [16384] + torch.randint(128, 385, (B - 1,), generator=g).tolist()
                elif ctx in ("ragged", "long"):
                    lens = torch.randint(100, 2049, (B,), generator=g).tolist()
                    if ctx == "long":
                        for i in range(8):
                            lens[i * B // 8] = 16384
                else:
                    lens = [int(ctx)] * B
                width = -(-max(lens) // P)  # pages a row
                pages = B * width
                kv_bytes = 2 * sum(lens) * nkv * hd * 2
                copies = max(1, min(64, (512 << 20) // (2 * pages * P * nkv * hd * 2)))
                kv = torch.randn(copies, 2, pages, P, nkv, hd, device=dev, dtype=torch.bfloat16)
                caches = [(kv[i, 0], kv[i, 1]) for i in range(copies)]
                q = torch.randn(B, nh, hd, device=dev, dtype=torch.bfloat16)
                perm = torch.randperm(pages, device=dev).view(B, width)
                used = [-(-n // P) for n in lens]
                plan_args = (torch.tensor([0] + used).cumsum(0).int(),
                             torch.cat([perm[i, :u] for i, u in enumerate(used)]).int(),
                             torch.tensor([n - (u - 1) * P for n, u in zip(lens, used)],
                                          dtype=torch.int32))
                fi_us, ref = _graphed_decode(flashinfer, workspace, False, {}, q, caches, plan_args)
                table = _token_table(perm, P)
                row: dict[str, Any] = {"kernel": f"small decode nh={nh} B={B} ctx={ctx}",
                                       "flashinfer_us": fi_us, "maxdiff": 0.0}
                for shape in (LaunchShape(*t)
                              for t in (WIDE_DECODE_SHAPES if wide else SMALL_DECODE_SHAPES)):
                    small = SmallBatchDecode(nh, nkv, hd, hd**-0.5, B, table, shape)
                    small.plan(B, list(range(B)), lens)
                    call = small.bind(B)
                    out = torch.empty_like(q)

                    def ours(cache: tuple[torch.Tensor, torch.Tensor]) -> None:
                        call(q, cache[0], cache[1], out)  # noqa: B023 (timed in this iteration)

                    ours(caches[0])
                    row["maxdiff"] = max(row["maxdiff"],
                                         float((out.float() - ref.float()).abs().max()))
                    name = "{}x{}w{}s{}".format(*shape) + (
                        "p{}l{}s{}".format(*shape[4:]) if shape.spare else "") + "_us"
                    row[name] = _graphed_us(ours, caches)
                best = min((k for k in row if k.endswith("_us") and k != "flashinfer_us"),
                           key=lambda k: row[k])
                row["best"], row["best_TB_s"] = best, kv_bytes / row[best] / 1e6
                row["flashinfer_TB_s"] = kv_bytes / fi_us / 1e6
                out_rows.append(row)
                del kv, caches
    return out_rows


# (name, N, K): the linear layers of Qwen3-0.6B and Qwen3-8B (qkv, o, gate_up, down, lm_head).
GEMV_SHAPES = [("0.6b qkv", 4096, 1024), ("0.6b o", 1024, 2048), ("0.6b gate_up", 6144, 1024),
               ("0.6b down", 1024, 3072), ("0.6b lm_head", 151936, 1024), ("8b qkv", 6144, 4096),
               ("8b o", 4096, 4096), ("8b gate_up", 24576, 4096), ("8b down", 4096, 12288),
               ("8b lm_head", 151936, 4096)]
# (block_n, block_k, warps, stream, per_sm): small slabs for the small matrices; whole 8 KiB rows
# per slab (more bytes in flight per program), with the evict-first hint, for the large ones; one
# program per block of outputs (per_sm 0) or per_sm programs per SM, each walking several blocks
GEMV_BLOCKS = [(2, 1024, 4, False, 0), (4, 1024, 8, False, 0), (8, 1024, 8, False, 0),
               (16, 512, 8, False, 0), (8, 1024, 8, False, 4), (4, 1024, 8, False, 8),
               (4, 4096, 8, False, 0), (2, 4096, 8, True, 0), (4, 4096, 8, True, 0),
               (8, 2048, 8, True, 0), (4, 4096, 8, True, 2), (4, 4096, 8, True, 4),
               (4, 4096, 8, True, 8), (2, 4096, 8, True, 4), (2, 4096, 8, True, 8),
               (4, 4096, 4, True, 4), (4, 4096, 4, True, 8), (8, 2048, 8, True, 4)]


def gemv() -> list[dict[str, Any]]:
    """The small-batch GEMV against cuBLAS (F.linear), device time from CUDA graphs, M = 1, 2, 4.
    Weights rotate over enough copies that the 50 MB L2 cannot serve them."""
    from radixserve.engine.layers import gemv as g

    rows = []
    for name, N, K in GEMV_SHAPES:
        copies = max(1, (256 << 20) // (N * K * 2))
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(min(copies, 8))]
        for M in (1, 2, 4):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            ref = (x.double() @ ws[0].double().T)
            err = float((g.gemv(x, ws[0]).double() - ref).norm() / ref.norm())
            configs: dict[str, Any] = {"heuristic": None}
            for bn, bk, nw, stream, per_sm in GEMV_BLOCKS:
                label = f"{bn}x{bk}w{nw}{'s' if stream else ''}{f'p{per_sm}' if per_sm else ''}"
                configs[label] = g.Blocks(bn, bk, nw, stream, per_sm)
            row: dict[str, Any] = {"kernel": f"gemv {name} N={N} K={K} M={M}", "rel_err": err}
            row["cublas_us"] = _graphed_us(lambda w: torch.nn.functional.linear(x, w), ws)
            for label, blocks in configs.items():
                row[f"{label}_us"] = _graphed_us(lambda w, b=blocks: g.gemv(x, w, blocks=b), ws)
            best = min((k for k in row if k.endswith("_us") and k != "cublas_us"),
                       key=lambda k: row[k])
            row["best"], row["GB_s_best"] = best, N * K * 2 / row[best] / 1e3
            row["GB_s_cublas"] = N * K * 2 / row["cublas_us"] / 1e3
            rows.append(row)
    return rows


# Policies for gemv_layers: (a Blocks tuple for every matrix, or None for the engine's own,
# gemv.config; fold RMSNorm into qkv and gate_up; where SiLU-mul runs: "up" in gate_up's store,
# "down" in down's input, "apart" as a kernel of its own), a None doing what the engine does
# (gemv.normed_usable: the norm folded and SiLU-mul in gate_up, for Qwen3-8B at one row)
GEMV_LAYER_POLICIES: dict[str, Any] = {
    "engine": (None, None, None), "nothing folded": (None, False, "apart"),
    "norm folded": (None, True, "apart"), "norm folded, SiLU-mul in down": (None, True, "down"),
    **{f"{bn}x{bk}w{nw}p{p}": ((bn, bk, nw, True, p), None, None)
       for bn, bk, nw, p in [(4, 4096, 8, 0), (4, 4096, 8, 2), (4, 4096, 8, 4), (8, 2048, 8, 2),
                             (4, 4096, 4, 2)]}}


def gemv_layers() -> list[dict[str, Any]]:
    """Qwen3-8B's projections at one row, chained as a decode step chains them (RMSNorm, qkv, o,
    RMSNorm, gate_up, SiLU-mul, down; attention left out), over 8 layers of distinct weights
    (3 GB: no layer's weights are in the L2 when it runs) in one CUDA graph, with programmatic
    dependent launch on and off: microseconds per layer and the weights' TB/s under each policy,
    next to cuBLAS doing the four products alone."""
    from radixserve.engine import pdl
    from radixserve.engine.layers import fused
    from radixserve.engine.layers import gemv as g

    H, inter, qkv_n, layers, eps = 4096, 12288, 6144, 8, 1e-6
    dev = torch.device("cuda")

    def weight(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, device=dev) / k**0.5).bfloat16()

    ws = [(weight(qkv_n, H), weight(H, H), weight(2 * inter, H), weight(H, inter))
          for _ in range(layers)]
    layer_bytes = sum(w.numel() * 2 for w in ws[0])
    nw = torch.ones(H, device=dev, dtype=torch.bfloat16)
    x = torch.randn(1, H, device=dev).bfloat16()
    residual = torch.zeros(1, H, device=dev, dtype=torch.bfloat16)

    def chain(shape: Any, fold_norm: bool | None, silu: str | None) -> Any:
        b = None if shape is None else g.Blocks(*shape)

        def normed(h: torch.Tensor, res: torch.Tensor, w: torch.Tensor, swiglu: bool) -> Any:
            if g.normed_usable(h, w) if fold_norm is None else fold_norm:
                return g.normed_gemv(h, res, nw, eps, w, blocks=b, swiglu=swiglu)
            n, res = fused.add_rms_norm(h, res, nw, eps)
            return g.gemv(n, w, blocks=b, swiglu=swiglu), res

        def run() -> None:
            h, res = x, residual
            for wq, wo, wgu, wd in ws:
                qkv, res = normed(h, res, wq, False)
                o = g.gemv(qkv[:, :H], wo, blocks=b)
                where = silu or ("up" if g.normed_usable(o, wgu) else "apart")
                gu, res = normed(o, res, wgu, where == "up")
                if where == "down":
                    h = g.gated_gemv(gu, wd, blocks=b)
                else:
                    h = g.gemv(gu if where == "up" else fused.silu_and_mul(gu), wd, blocks=b)
        return run

    def cublas() -> None:
        h = x
        for wq, wo, wgu, wd in ws:
            torch.nn.functional.linear(h, wq)
            torch.nn.functional.linear(h, wo)
            gu = torch.nn.functional.linear(h, wgu)
            h = torch.nn.functional.linear(gu[:, :inter], wd)

    rows = []
    for on in (True, False):
        pdl.configure(on, dev)
        for label, policy in [("cublas", None), *GEMV_LAYER_POLICIES.items()]:
            fn = cublas if policy is None else chain(*policy)
            us = _graphed_us(lambda _: fn(), [None]) / layers
            rows.append({"kernel": f"gemv layers 8b {label}", "pdl": on, "us_per_layer": us,
                         "TB_s": layer_bytes / us / 1e6})
    pdl.configure(False, dev)
    return rows


def _graphed_us(fn: Any, weights: list[torch.Tensor]) -> float:
    for w in weights:
        fn(w)  # compile / pick algorithms outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(w)
    return _bench(graph.replay) * 1e3 / len(weights)


# (model, num_heads, num_kv_heads), head_dim 128: the attention of Qwen3-0.6B and Qwen3-8B
PREFILL_SHAPES = [("qwen3-0.6b", 16, 8), ("qwen3-8b", 32, 8)]
PREFILL_PROMPTS = [[8192], [2048] * 4]  # fresh prompts' lengths, one prefill step each
# (column, backend, page size): both backends read pages of 256; "fa_p16" shows flash-attn 2's
# gather below 256 (flash-attn 3 pages there too)
PREFILL_RUNS = [("flashinfer", "flashinfer", 256), ("fa", "fa", 256), ("fa_p16", "fa", 16)]


def attention_prefill() -> list[dict[str, Any]]:
    """The attention call alone (`attend`, planned once by `prepare`; the KV store excluded) of one
    prefill step of fresh prompts, bf16, causal: each backend installed, side by side. ms is the
    median of 20 CUDA-event-timed calls; TFLOP/s counts the causal half of QK^T and PV,
    2 * nh * hd * sum(L^2). `fa_vs_flashinfer` is the relative difference of their outputs."""
    rows = []
    for model, nh, nkv in PREFILL_SHAPES:
        for lens in PREFILL_PROMPTS:
            row: dict[str, Any] = {"kernel": f"attention prefill {model} nh={nh} nkv={nkv} hd=128 "
                                             f"prompts={len(lens)}x{lens[0]}"}
            flops = 2 * nh * 128 * sum(n * n for n in lens)
            outs = {}
            for column, backend, P in PREFILL_RUNS:
                try:
                    ms, outs[column] = _prefill_ms(backend, nh, nkv, lens, P)
                except (ImportError, RuntimeError, ValueError, TypeError) as e:  # one run, not all
                    row[f"{column}_skipped"] = f"{type(e).__name__}: {e}"[:200]
                    continue
                row[f"{column}_ms"], row[f"{column}_TFLOP_s"] = ms, flops / ms / 1e9
            if "fa" in outs and "flashinfer" in outs:
                ref = outs["flashinfer"].float()
                row["fa_vs_flashinfer"] = float((outs["fa"].float() - ref).norm() / ref.norm())
            rows.append(row)
    return rows


def _prefill_ms(backend: str, nh: int, nkv: int, lens: list[int],
                P: int) -> tuple[float, torch.Tensor]:
    from radixserve.engine.attention import StepLayout, create_backend
    from radixserve.engine.kvcache.pool import KVCachePool

    dev, hd, B = torch.device("cuda"), 128, len(lens)
    b = create_backend(backend, nh, nkv, hd, dev, torch.bfloat16)
    g = torch.Generator(device=dev).manual_seed(0)  # the same problem for every backend
    width = -(-max(lens) // P) * P
    pages = B * width // P
    pool = KVCachePool(1, pages, P, nkv, hd, torch.bfloat16, dev)
    pool.k.normal_(generator=g), pool.v.normal_(generator=g)
    # (B, width) token locations: each request on shuffled pages of its own
    table = _token_table(torch.randperm(pages, device=dev, generator=g).view(B, -1), P)
    out_loc = torch.cat([table[i, :n] for i, n in enumerate(lens)])
    layout = StepLayout(torch.arange(B, device=dev), [0] * B, list(lens), out_loc, table, P)
    q = torch.randn(sum(lens), nh, hd, device=dev, dtype=torch.bfloat16, generator=g)
    meta = b.prepare(layout)
    out = b.attend(q, 0, meta, pool)
    return _event_ms(lambda: b.attend(q, 0, meta, pool)), out


# About 1 ms of a spinning kernel at an H100's or H200's clock: longer than any call here takes the
# host to issue, so the device waits on nothing the host does while a timed call is queued
_BUSY_CYCLES = 2_000_000


def _event_ms(fn: Any, calls: int = 20, device_only: bool = False) -> float:
    """Median ms of `calls` CUDA-event-timed calls, after 3 untimed (JIT loads, allocations).
    As issued, a call's time includes whatever the device idled while the host launched it (a
    Triton launch from Python takes tens of microseconds, more than a small kernel runs);
    `device_only` queues each call behind a spinning kernel, so that only its device time counts,
    as where a CUDA graph replays it."""
    for _ in range(3):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(calls)]
    for start, end in events:
        if device_only:
            torch.cuda._sleep(_BUSY_CYCLES)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


# A step's prefill rows, (prefix, new tokens) per request, as steps that admit beside running
# streams carry them: a short prompt, one and two of 512 tokens, and 512-token chunks deep into a
# long prompt (whose walks the paged kernel splits into shares)
PAGED_PREFILL_STEPS = [[(0, 128)], [(0, 512)], [(0, 512), (0, 512)], [(1536, 512)], [(3584, 512)]]
# (keys per iteration, warps, stages, programs the shares aim at, a share's least iterations,
# rows of a tile's operand, the blocks every token sees walked unmasked), the kernel's default
# (DEFAULT_SHAPE) among them; programs 0: every tile walks its keys whole
PAGED_PREFILL_SHAPES = [(64, 4, 3, 256, 4, 64, True), (64, 4, 3, 256, 4, 64, False),
                        (64, 4, 3, 0, 4, 64, True), (64, 4, 3, 512, 4, 64, True),
                        (64, 4, 3, 256, 2, 64, True), (64, 4, 3, 256, 8, 64, True),
                        (32, 4, 3, 256, 4, 64, True), (64, 4, 2, 256, 4, 64, True),
                        (64, 8, 3, 256, 4, 128, True)]


def paged_prefill() -> list[dict[str, Any]]:
    """The piecewise graphs' paged prefill kernel (attention/paged_prefill.py) against FlashInfer's
    prefill call (`attend`, planned once) on the same prefill rows, bf16, pages of 16: ms, the
    median of 20 CUDA-event-timed calls of one layer on the device alone (`_event_ms`'s
    device_only: the graphs replay the paged kernel without a launch from the host), for each
    launch shape of PAGED_PREFILL_SHAPES (`paged_K_wW_sS_pX_shareY_rR[_free]_ms`; `paged_ms` the
    default's); FlashInfer's call also as the pieces issue it, between two replays
    (`flashinfer_issued_ms`: its launch from the host included); and the largest relative
    difference of the outputs from FlashInfer's over the shapes."""
    from radixserve.engine.attention import StepLayout, create_backend
    from radixserve.engine.attention.paged_prefill import DEFAULT_SHAPE, PagedPrefill, PrefillShape
    from radixserve.engine.kvcache.pool import KVCachePool

    dev, hd, P, bf16 = torch.device("cuda"), 128, 16, torch.bfloat16
    shapes = [PrefillShape(*t) for t in PAGED_PREFILL_SHAPES]
    assert DEFAULT_SHAPE in shapes, "paged_ms times the default launch shape"
    rows = []
    for model, nh, nkv in PREFILL_SHAPES:
        fi = create_backend("flashinfer", nh, nkv, hd, dev, bf16)  # one per shape: every step
        for step in PAGED_PREFILL_STEPS:
            B, prefix = len(step), [p for p, _ in step]
            seq = [p + n for p, n in step]
            g = torch.Generator(device=dev).manual_seed(0)
            pages = B * -(-max(seq) // P)
            pool = KVCachePool(1, pages, P, nkv, hd, bf16, dev)
            pool.k.normal_(generator=g), pool.v.normal_(generator=g)
            table = _token_table(torch.randperm(pages, device=dev, generator=g).view(B, -1), P)
            out_loc = torch.cat([table[i, p:s] for i, (p, s) in enumerate(zip(prefix, seq))])
            layout = StepLayout(torch.arange(B, device=dev), prefix, seq, out_loc, table, P,
                                list(range(B)))
            T = len(out_loc)
            q = torch.randn(T, nh, hd, device=dev, dtype=bf16, generator=g)
            meta = fi.prepare(layout)
            ref, out = fi.attend(q, 0, meta, pool), torch.empty_like(q)
            row: dict[str, Any] = {"kernel": f"paged prefill {model} nh={nh} nkv={nkv} hd=128 "
                                             f"step={step}",
                                   "rel_diff": 0.0}
            for key, device_only in (("flashinfer_ms", True), ("flashinfer_issued_ms", False)):
                row[key] = _event_ms(lambda: fi.attend(q, 0, meta, pool, ref),  # noqa: B023
                                     device_only=device_only)
            for shape in shapes:
                paged = PagedPrefill(nh, nkv, hd, hd ** -0.5, table, max(seq), shape)
                assert paged.plan(T, 0, layout)
                call, (k, v) = paged.bind(T), pool.pages[0]
                ms = _event_ms(lambda: call(q, k, v, out),  # noqa: B023 (timed right here)
                               device_only=True)
                name = "paged_{}_w{}_s{}_p{}_share{}_r{}".format(*shape)
                row[name + ("_free" if shape.free_blocks else "") + "_ms"] = ms
                if shape == DEFAULT_SHAPE:
                    row["paged_ms"] = ms
                row["rel_diff"] = max(row["rel_diff"], float(
                    (out.float() - ref.float()).norm() / ref.float().norm()))
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench kernels", description=__doc__)
    ap.add_argument("--out", default="kernels.jsonl")
    # decode_variants is opt-in: on a fresh machine it JIT-compiles FlashInfer's tensor-core decode,
    # which took longer than the whole 300 s kernels stage of gpu_check.sh.
    ap.add_argument("--parts", default="ceilings,kv_store,flashinfer_decode,gemv",
                    help="comma-separated; also decode_variants, attention_prefill, small_decode, "
                    "gemv_layers, paged_prefill")
    ap.add_argument("--rows", default="",
                    help="small_decode: comma-separated row counts (default: 1 to 256)")
    a = ap.parse_args(argv)
    for part in (globals()[p] for p in a.parts.split(",")):
        try:
            rows = part(a.rows) if part is small_decode else part()
        except Exception as e:  # report and go on: each part is independent
            rows = [{"kernel": part.__name__, "error": f"{type(e).__name__}: {e}"[:300]}]
        for row in rows:
            row = {"part": "kernels", "device": torch.cuda.get_device_name(0),
                   "date": time.strftime("%Y-%m-%d %H:%M"), **row}
            print(json.dumps(row), flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
