"""Kernel micro-benchmarks on the GPU: the two ceilings (copy bandwidth, bf16 matmul rate), the
fused KV store against two index_copy_ calls, and FlashInfer paged decode. Medians of
triton.testing.do_bench; inputs random, rotated over several buffers where caches could help."""

from __future__ import annotations

import argparse
import json
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
        rows.append({"kernel": f"kv store T={T}", "fused_us": times[True], "index_copy_us": times[False],
                     "fused_graph_us": graphed[True], "index_copy_graph_us": graphed[False]})
    return rows


def flashinfer_decode() -> list[dict[str, Any]]:
    from radixserve.engine.attention import StepLayout, create_backend
    from radixserve.engine.kvcache.pool import KVCachePool

    rows = []
    for nh, B, ctx, P in ((16, 64, 1024, 16), (32, 64, 1024, 16), (16, 256, 1024, 16), (16, 64, 1024, 1)):
        b = create_backend("flashinfer", nh, 8, 128, torch.device("cuda"), torch.bfloat16)
        pages = B * ctx // P
        pool = KVCachePool(1, pages, P, 8, 128, torch.bfloat16, torch.device("cuda"))
        pool.k.normal_(), pool.v.normal_()
        table = torch.randperm(pages, device="cuda").view(B, -1)
        table = (table[:, :, None] * P + torch.arange(P, device="cuda")).view(B, ctx)
        lay = StepLayout(torch.arange(B, device="cuda"), [ctx - 1] * B, [ctx] * B, table[:, -1].contiguous(), table, P)
        meta = b.prepare(lay)
        q = torch.randn(B, nh, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, 8, 128, device="cuda", dtype=torch.bfloat16)
        us = _bench(lambda: b.forward(q, k, k, 0, meta, pool)) * 1e3
        gb = 2 * B * ctx * 8 * 128 * 2 / 1e9
        rows.append({"kernel": f"flashinfer decode nh={nh} B={B} ctx={ctx} P={P}", "us": us, "TB_s": gb / us * 1e3})
    return rows


# (name, N, K): the linear layers of Qwen3-0.6B and Qwen3-8B (qkv, o, gate_up, down, lm_head).
GEMV_SHAPES = [("0.6b qkv", 4096, 1024), ("0.6b o", 1024, 2048), ("0.6b gate_up", 6144, 1024),
               ("0.6b down", 1024, 3072), ("0.6b lm_head", 151936, 1024), ("8b qkv", 6144, 4096),
               ("8b o", 4096, 4096), ("8b gate_up", 24576, 4096), ("8b down", 4096, 12288)]


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
            configs = {"heuristic": None, **{f"{bn}x{bk}w{nw}": (bn, bk, nw) for bn, bk, nw in
                                            ((1, 1024, 4), (2, 1024, 4), (4, 1024, 8), (8, 512, 4),
                                             (8, 1024, 8), (16, 512, 8), (4, 2048, 8), (32, 256, 4))}}
            row: dict[str, Any] = {"kernel": f"gemv {name} N={N} K={K} M={M}", "rel_err": err}
            row["cublas_us"] = _graphed_us(lambda w: torch.nn.functional.linear(x, w), ws)
            for label, blocks in configs.items():
                row[f"{label}_us"] = _graphed_us(lambda w, b=blocks: g.gemv(x, w, blocks=b), ws)
            best = min((k for k in row if k.endswith("_us") and k != "cublas_us"), key=lambda k: row[k])
            row["best"], row["GB_s_best"] = best, N * K * 2 / row[best] / 1e3
            rows.append(row)
    return rows


def _graphed_us(fn: Any, weights: list[torch.Tensor]) -> float:
    for w in weights:
        fn(w)  # compile / pick algorithms outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(w)
    return _bench(graph.replay) * 1e3 / len(weights)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="radixserve bench kernels", description=__doc__)
    ap.add_argument("--out", default="kernels.jsonl")
    ap.add_argument("--parts", default="ceilings,kv_store,flashinfer_decode,gemv")
    a = ap.parse_args(argv)
    for part in (globals()[p] for p in a.parts.split(",")):
        try:
            rows = part()
        except Exception as e:  # report and go on: each part is independent
            rows = [{"kernel": part.__name__, "error": f"{type(e).__name__}: {e}"[:300]}]
        for row in rows:
            row = {"part": "kernels", "device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M"), **row}
            print(json.dumps(row), flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
