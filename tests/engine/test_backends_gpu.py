"""Attention backends, the fused KV store and the whole engine on a CUDA device (skipped elsewhere).

Backends are checked against a float64 reference on fresh random inputs: relative error
||out - ref|| / ||ref|| under 1e-2 in bf16 (NaN never passes), ragged batches, chunked prefill over
cached prefixes, decode, mixed steps (and as the scheduler lays them out, decode rows first: split
between the decode and prefill kernels), page sizes 1, 16 and 256 (flash-attn 2 gathers K/V at the
first two and reads the paged pool at 256). The engine is checked against transformers on a
random-weight checkpoint by the rule of docs/reliability.md #25 (test_engine_gpu.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attention_cases import (
    LAYER,
    assert_bound_layers_match,
    backend_marks,
    check_store,
    make_case,
    reference,
    rel_error,
)
from radixserve.engine.attention import create_backend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BACKENDS = [pytest.param(name, marks=backend_marks(name))
            for name in ("torch", "flashinfer", "fa", "torch,flashinfer", "fa,flashinfer")]
PAGE_SIZES = [1, 16, 256]
NH, NKV, HD = 16, 8, 128  # Qwen3-0.6B's attention shape (GQA group 2)
TOL = 1e-2  # bf16 operands


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("kind", ["prefill", "chunked", "decode", "mixed", "served"])
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
        assert_bound_layers_match(b, case, meta, out)


@pytest.mark.parametrize("backend", BACKENDS[1:3] + [
    pytest.param("flashinfer+small", marks=backend_marks("flashinfer"))])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
# 70 decode rows: a wide graph, whose rows the small kernel does not split up to 2,048 keys, and
# 40 with long rows, which it splits over its spare programs; a served step of 70 requests would
# replay thousands of rows, and its prompts are rows like any other
@pytest.mark.parametrize(("kind", "batch"), [("decode", 5), ("served", 5), ("decode", 70),
                                             ("long", 40)])
def test_graph_decode_matches_float64(backend, page_size, kind, batch):
    """The graph path: plan_graph on a padded batch, captured metadata replayed as a CUDA graph;
    "served": a step with prompts and chunks beside its decode rows, every new token a decode row
    of its own (StepLayout.as_decode_rows), as the engine replays short prompts. "+small": the
    graph's rows through attention/small_decode.py's kernel (small_decode_rows)."""
    backend, small = backend.removesuffix("+small"), backend.endswith("+small")
    dev = torch.device("cuda")
    b = create_backend(backend, NH, NKV, HD, dev, torch.bfloat16)
    if not b.supports_cuda_graph(page_size):
        assert backend == "fa" and b.api.version == 2 and page_size % 256, "who else cannot?"
        pytest.skip(f"flash-attn 2 decodes eagerly at page size {page_size} (the engine knows)")
    case = make_case(kind, batch, page_size, NH, NKV, HD, torch.bfloat16, dev, seed=7)
    layout = dataclasses.replace(case.layout, slot_list=case.slots)
    if kind == "served":
        ext = torch.tensor(layout.extend_lens, device=dev)
        layout = layout.as_decode_rows(torch.repeat_interleave(layout.slots, ext))
    T = len(layout.seq_lens)
    G = T + 3  # padded rows past the real ones
    dummy_page = case.spare_page
    b.init_cuda_graph(G, case.layout.page_table.size(1) // page_size, page_size, dummy_page,
                      case.layout.page_table, G if small else 0)
    assert (getattr(b, "_small", None) is not None) == small
    q = torch.zeros(G, NH, HD, dtype=torch.bfloat16, device=dev)
    k = torch.zeros(G, NKV, HD, dtype=torch.bfloat16, device=dev)
    v = torch.zeros_like(k)
    out_loc = torch.full((G,), dummy_page * page_size, dtype=torch.int64, device=dev)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        meta = b.graph_metadata(G, out_loc)  # its placeholder plan's copies before the warm-up
        b.forward(q, k, v, LAYER, meta, case.pool)  # warm-up outside capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = b.forward(q, k, v, LAYER, meta, case.pool)
        b.plan_graph(G, layout)
        q.normal_(), k.normal_(), v.normal_()
        q[:T], k[:T], v[:T] = case.q, case.k, case.v
        out_loc[:T] = case.layout.out_loc
        graph.replay()
    torch.cuda.synchronize()
    err = rel_error(out[:T], reference(case, HD**-0.5))
    assert err < TOL, f"graph {kind} {backend} P={page_size}: relative error {err:.2e}"
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
