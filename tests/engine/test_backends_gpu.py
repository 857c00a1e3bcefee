"""Attention backends, the fused KV store and the whole engine on a CUDA device (skipped elsewhere).

Backends are checked against a float64 reference on fresh random inputs: relative error
||out - ref|| / ||ref|| under 1e-2 in bf16 (NaN never passes), ragged batches, chunked prefill over
cached prefixes, decode, mixed steps, page sizes 1 and 16. The engine is checked against
transformers on a random-weight checkpoint by the rule of docs/reliability.md #25.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from attention_cases import LAYER, check_store, make_case, reference, rel_error
from radixserve.engine.attention import create_backend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
HAS_FA = any(importlib.util.find_spec(m) is not None
             for m in ("flash_attn_interface", "flash_attn"))
BACKENDS = [
    "torch",
    pytest.param("flashinfer",
                 marks=pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer missing")),
    pytest.param("fa", marks=pytest.mark.skipif(not HAS_FA, reason="flash-attn missing")),
    pytest.param("torch,flashinfer",
                 marks=pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer missing")),
]
NH, NKV, HD = 16, 8, 128  # Qwen3-0.6B's attention shape (GQA group 2)
TOL = 1e-2  # bf16 operands


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["prefill", "chunked", "decode", "mixed"])
@pytest.mark.parametrize("batch", [1, 7])
def test_backend_matches_float64(backend, page_size, kind, batch):
    dev = torch.device("cuda")
    b = create_backend(backend, NH, NKV, HD, dev, torch.bfloat16)
    for seed in range(2):  # fresh inputs each round, the plan reused across layers and rounds
        case = make_case(kind, batch, page_size, NH, NKV, HD, torch.bfloat16, dev,
                         seed=1000 * batch + seed)
        meta = b.prepare(case.layout)
        out = b.forward(case.q, case.k, case.v, LAYER, meta, case.pool)
        torch.cuda.synchronize()
        assert out.shape == case.q.shape
        err = rel_error(out, reference(case, HD**-0.5))
        assert err < TOL, f"{backend} {kind} P={page_size} B={batch}: relative error {err:.2e}"
        check_store(case)


@pytest.mark.parametrize("backend", BACKENDS[1:3])
@pytest.mark.parametrize("page_size", [1, 16])
def test_graph_decode_matches_float64(backend, page_size):
    """The graph path: plan_graph on a padded batch, captured metadata replayed as a CUDA graph."""
    dev = torch.device("cuda")
    b = create_backend(backend, NH, NKV, HD, dev, torch.bfloat16)
    case = make_case("decode", 5, page_size, NH, NKV, HD, torch.bfloat16, dev, seed=7)
    dummy_page = case.spare_page
    b.init_cuda_graph(8, case.layout.page_table.size(1) // page_size, page_size, dummy_page)
    q = torch.zeros(8, NH, HD, dtype=torch.bfloat16, device=dev)
    k = torch.zeros(8, NKV, HD, dtype=torch.bfloat16, device=dev)
    v = torch.zeros_like(k)
    out_loc = torch.full((8,), dummy_page * page_size, dtype=torch.int64, device=dev)
    meta = b.graph_metadata(8, out_loc)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        b.forward(q, k, v, LAYER, meta, case.pool)  # warm-up outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = b.forward(q, k, v, LAYER, meta, case.pool)
        b.plan_graph(8, case.layout)
        q.normal_(), k.normal_(), v.normal_()
        q[:5], k[:5], v[:5] = case.q, case.k, case.v
        out_loc[:5] = case.layout.out_loc
        graph.replay()
    torch.cuda.synchronize()
    err = rel_error(out[:5], reference(case, HD**-0.5))
    assert err < TOL, f"graph decode {backend} P={page_size}: relative error {err:.2e}"
    check_store(case)


@pytest.mark.parametrize("num_tokens", [1, 37, 4096])
def test_fused_kv_store_matches_index_copy(num_tokens):
    from radixserve.engine.kvcache import store_kernel
    from radixserve.engine.kvcache.pool import KVCachePool

    pytest.importorskip("triton")
    dev = torch.device("cuda")
    pools = [KVCachePool(2, 600, 16, NKV, HD, torch.bfloat16, dev) for _ in range(2)]
    pools[1].fused_store = False
    loc = torch.randperm(600 * 16, device=dev)[:num_tokens]
    kv = torch.randn(num_tokens, 3 * NKV * HD, device=dev, dtype=torch.bfloat16)
    k = kv[:, : NKV * HD].view(num_tokens, NKV, HD)  # strided rows, as out of the QKV projection
    v = kv[:, NKV * HD : 2 * NKV * HD].view(num_tokens, NKV, HD)
    assert store_kernel.packed(k) and (num_tokens == 1 or not k.is_contiguous())
    pools[0].fused_store = True
    for pool in pools:
        pool.store(1, loc, k, v)
    torch.cuda.synchronize()
    assert torch.equal(pools[0].k, pools[1].k) and torch.equal(pools[0].v, pools[1].v)
