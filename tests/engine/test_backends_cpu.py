"""CPU checks of the attention plumbing: page ids from the token-level table, the float64 reference
against the torch backend, the `fa` backend's index math against a torch stand-in of the
flash-attn API (the real library needs a GPU; test_backends_gpu.py runs it where installed), and
what each backend states about page sizes and CUDA graphs, as the engine reads it at start."""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from attention_cases import (
    LAYER,
    LAYERS,
    assert_bound_layers_match,
    check_store,
    make_case,
    reference,
    rel_error,
)
from radixserve.engine.attention import StepLayout, create_backend, resolve_backend_name
from radixserve.engine.attention.base import page_indices, pages_per_request
from radixserve.engine.attention.mixed import MixedMetadata, split_layout
from radixserve.engine.config import EngineConfig
from radixserve.engine.cuda_graph import graph_batch_sizes
from radixserve.engine.kvcache.pool import KVCachePool
from radixserve.engine.model_runner import ModelRunner

CPU = torch.device("cpu")
NH, NKV, HD = 4, 2, 16
KINDS = ["prefill", "chunked", "decode", "mixed", "served"]


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_page_indices_follow_the_token_table(page_size):
    case = make_case("mixed", 6, page_size, NH, NKV, HD, torch.float32, CPU, seed=3)
    lay = case.layout
    npages = pages_per_request(lay.seq_lens, page_size)
    got = page_indices(lay.page_table, lay.slots, npages, page_size).tolist()
    want = [int(lay.page_table[s, j * page_size]) // page_size
            for s, n in zip(case.slots, npages) for j in range(n)]
    assert got == want
    assert len(set(got)) == len(got), "requests share no page in these cases"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("page_size", [1, 16])
def test_torch_backend_matches_float64(kind, page_size):
    b = create_backend("torch", NH, NKV, HD, CPU, torch.float32)
    case = make_case(kind, 5, page_size, NH, NKV, HD, torch.float32, CPU, seed=11)
    out = b.forward(case.q, case.k, case.v, LAYER, b.prepare(case.layout), case.pool)
    assert rel_error(out, reference(case, HD**-0.5)) < 1e-5
    check_store(case)


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_step_of_decodes_and_prefill_splits_at_its_last_leading_decode_row(page_size):
    """A hybrid splits a served step: its decode rows to the decode backend, the rest to the
    prefill one, each into its own rows of the output; kept whole, the prefill backend takes
    all. Both equal the float64 reference."""
    case = make_case("served", 7, page_size, NH, NKV, HD, torch.float32, CPU, seed=5)
    assert case.layout.extend_lens[:4] == [1] * 4 and min(case.layout.extend_lens[4:]) >= 1
    d, p = split_layout(case.layout)
    assert (d.seq_lens, p.seq_lens) == (case.seq_lens[:4], case.seq_lens[4:])
    assert torch.equal(torch.cat([d.out_loc, p.out_loc]), case.layout.out_loc)
    assert (d.slot_list, p.slot_list) == (None, None)
    for keep in (True, False):
        b = create_backend("torch,torch", NH, NKV, HD, CPU, torch.float32)
        b.keep_split_mixed(keep)
        meta = b.prepare(case.layout)
        assert isinstance(meta, MixedMetadata) == keep
        if keep:
            assert meta.rows == 4 and meta.decode_backend is b.decode
            assert meta.prefill_backend is b.prefill
        out = b.forward(case.q, case.k, case.v, LAYER, meta, case.pool)
        assert rel_error(out, reference(case, HD**-0.5)) < 1e-5
        check_store(case)
        assert_bound_layers_match(b, case, meta, out)
    for kind in ("prefill", "decode", "mixed"):  # nothing to split: no leading decode rows, or
        lay = make_case(kind, 5, page_size, NH, NKV, HD, torch.float32, CPU, seed=6).layout
        assert split_layout(lay) is None  # no prefill after them


@pytest.mark.parametrize("kind", ["prefill", "chunked", "mixed", "served"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_prefill_as_decode_rows_matches_float64(kind, page_size):
    """A step with prefill tokens laid out as decode rows, one per new token (what the decode
    graphs replay for short prompts), attends exactly as the step itself: token i of a prompt
    sees the tokens stored before it in the same layer, and nothing after it."""
    case = make_case(kind, 5, page_size, NH, NKV, HD, torch.float32, CPU, seed=13)
    lay = dataclasses.replace(case.layout, slot_list=case.slots)
    row_slots = torch.repeat_interleave(lay.slots, torch.tensor(lay.extend_lens))
    rows = lay.as_decode_rows(row_slots)
    T = sum(lay.extend_lens)
    assert rows.is_decode and len(rows.seq_lens) == T == len(rows.slot_list)
    assert rows.slot_list == row_slots.tolist()
    assert [s - 1 for s in rows.seq_lens] == rows.prefix_lens
    assert rows.prefill_keys == 0
    assert lay.prefill_keys == sum(sum(range(p + 1, s + 1)) for p, s in
                                   zip(lay.prefix_lens, lay.seq_lens) if s - p > 1)
    b = create_backend("torch", NH, NKV, HD, CPU, torch.float32)
    out = b.forward(case.q, case.k, case.v, LAYER, b.prepare(rows), case.pool)
    assert rel_error(out, reference(case, HD**-0.5)) < 1e-5
    check_store(case)


def test_auto_is_torch_without_cuda_or_16_bit():
    assert resolve_backend_name("auto", CPU, torch.bfloat16) == "torch"
    assert resolve_backend_name("auto", torch.device("cuda"), torch.float32) == "torch"


def test_graph_batch_sizes():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = graph_batch_sizes(256)
    assert sizes[-1] == 256 and sizes == sorted(set(sizes))
    assert all(b / a <= 2 for a, b in zip(sizes, sizes[1:]))


# -- a torch stand-in for the flash-attn API (semantics as documented by flash-attn 2 and 3) -------
def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q (m, nh, hd), k/v (n, nkv, hd); causal, queries aligned with the end of the keys."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    m, n = q.size(0), k.size(0)
    s = s.masked_fill(torch.arange(n)[None, :] > torch.arange(n - m, n)[:, None], -math.inf)
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v).to(q.dtype)


def _varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False, block_table=None,
            **_):
    """Request i's queries are q[cu_q[i]:cu_q[i + 1]]. Without block_table its keys are rows
    cu_k[i]:cu_k[i + 1] of k and v (total_k, nkv, hd). With one (flash-attn 2), k and v are pages
    (num_blocks, block_size, nkv, hd), block_size a multiple of 256, and cu_k only counts keys:
    request i's key j sits at page block_table[i, j // block_size], slot j % block_size."""
    assert causal and q.dtype == k.dtype
    B = len(cu_q) - 1
    q_lens, k_lens = (cu_q[1:] - cu_q[:-1]).tolist(), (cu_k[1:] - cu_k[:-1]).tolist()
    assert len(k_lens) == B and max(q_lens) <= max_q and max(k_lens) <= max_k
    if block_table is None:
        assert k.dim() == 3 and v.shape == k.shape
        keys = [(k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]]) for i in range(B)]
    else:
        assert k.dim() == 4 and v.shape == k.shape and k.size(1) % 256 == 0
        assert block_table.dtype == torch.int32 and block_table.size(0) == B
        assert block_table.stride(-1) == 1
        keys = [(_paged_keys(k, block_table[i], n), _paged_keys(v, block_table[i], n))
                for i, n in enumerate(k_lens)]
    return torch.cat([_attend(q[cu_q[i] : cu_q[i + 1]], *keys[i], softmax_scale) for i in range(B)])


def _varlen_fa3(*args, **kwargs):
    assert "block_table" not in kwargs, "flash-attn 3's varlen call takes no block table"
    return _varlen(*args, **kwargs)


def _paged_keys(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> torch.Tensor:
    P = cache.size(1)
    assert table_row.numel() >= -(-n // P), "the block table must cover every key"
    pages = table_row[: -(-n // P)].long()
    return cache[pages].reshape(-1, cache.size(2), cache.size(3))[:n]


def _with_kvcache_fa2(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None,
                      causal=False, **_):
    assert causal and block_table is not None and k_cache.size(1) % 256 == 0
    outs = [_attend(q[i], _paged_keys(k_cache, block_table[i], int(n)),
                    _paged_keys(v_cache, block_table[i], int(n)),
                    softmax_scale) for i, n in enumerate(cache_seqlens)]
    return torch.stack(outs)  # (B, q_len, nh, hd)


def _with_kvcache_fa3(q, k_cache, v_cache, cache_seqlens=None, page_table=None, cu_seqlens_q=None,
                      max_seqlen_q=None, softmax_scale=None, causal=False, **_):
    assert causal and page_table is not None and cu_seqlens_q is not None
    cu = cu_seqlens_q
    outs = [_attend(q[cu[i] : cu[i + 1]], _paged_keys(k_cache, page_table[i], int(n)),
                    _paged_keys(v_cache, page_table[i], int(n)), softmax_scale)
            for i, n in enumerate(cache_seqlens)]
    return torch.cat(outs)


def _install_flash_attn(monkeypatch: pytest.MonkeyPatch, version: int) -> None:
    from radixserve.engine.attention import fa_backend

    name = "flash_attn" if version == 2 else "flash_attn_interface"
    module = types.ModuleType(name)
    module.flash_attn_varlen_func = _varlen if version == 2 else _varlen_fa3
    module.flash_attn_with_kvcache = _with_kvcache_fa2 if version == 2 else _with_kvcache_fa3
    for other in ("flash_attn", "flash_attn_interface", "sgl_kernel", "sgl_kernel.flash_attn"):
        monkeypatch.setitem(sys.modules, other, None)  # None makes import fail: only ours is seen
    monkeypatch.setitem(sys.modules, name, module)
    fa_backend.load_flash_attn.cache_clear()  # the fixtures clear it again when they end


@pytest.fixture(params=[2, 3])
def fake_flash_attn(request, monkeypatch):
    from radixserve.engine.attention import fa_backend

    _install_flash_attn(monkeypatch, request.param)
    yield request.param
    fa_backend.load_flash_attn.cache_clear()


@pytest.fixture
def fake_fa2(monkeypatch):
    from radixserve.engine.attention import fa_backend

    _install_flash_attn(monkeypatch, 2)
    yield 2
    fa_backend.load_flash_attn.cache_clear()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("page_size", [1, 16, 256])
def test_fa_backend_index_math(fake_flash_attn, kind, page_size):
    b = create_backend("fa", NH, NKV, HD, CPU, torch.float32)
    assert b.api.version == fake_flash_attn
    case = make_case(kind, 5, page_size, NH, NKV, HD, torch.float32, CPU, seed=21)
    out = b.forward(case.q, case.k, case.v, LAYER, b.prepare(case.layout), case.pool)
    assert rel_error(out, reference(case, HD**-0.5)) < 1e-5
    check_store(case)


@pytest.mark.parametrize("page_size", [16, 256])
def test_fa_graph_metadata_decode(fake_flash_attn, page_size):
    b = create_backend("fa", NH, NKV, HD, CPU, torch.float32)
    case = make_case("decode", 3, page_size, NH, NKV, HD, torch.float32, CPU, seed=5)
    width = case.layout.page_table.size(1) // page_size
    assert b.supports_cuda_graph(page_size) == (fake_flash_attn == 3 or page_size % 256 == 0)
    if not b.supports_cuda_graph(page_size):
        with pytest.raises(NotImplementedError):
            b.init_cuda_graph(4, width, page_size, case.spare_page)
        return
    b.init_cuda_graph(4, width, page_size, case.spare_page)
    out_loc = torch.full((4,), case.spare_page * page_size, dtype=torch.int64)
    meta = b.graph_metadata(4, out_loc)
    b.plan_graph(4, case.layout)
    out_loc[:3] = case.layout.out_loc
    q = torch.cat([case.q, torch.randn(1, NH, HD)])
    k = torch.cat([case.k, torch.randn(1, NKV, HD)])
    v = torch.cat([case.v, torch.randn(1, NKV, HD)])
    out = b.forward(q, k, v, LAYER, meta, case.pool)
    assert rel_error(out[:3], reference(case, HD**-0.5)) < 1e-5


def _repaged(case, page_size: int):
    """The same step with every request's context moved into shuffled pages of `page_size`."""
    lay, P = case.layout, page_size
    need = sum(-(-s // P) for s in case.seq_lens)
    order = torch.randperm(need + 1, generator=torch.Generator().manual_seed(0))
    table = torch.zeros(lay.page_table.size(0), -(-max(case.seq_lens) // P) * P, dtype=torch.int64)
    pool = KVCachePool(LAYERS, need + 1, P, NKV, HD, torch.float32, CPU)
    used = 0
    for slot, s in zip(case.slots, case.seq_lens):
        n = -(-s // P)
        table[slot, : n * P] = (order[used : used + n, None] * P + torch.arange(P)).flatten()
        used += n
        pool.k[:, table[slot, :s]] = case.pool.k[:, lay.page_table[slot, :s]]
        pool.v[:, table[slot, :s]] = case.pool.v[:, lay.page_table[slot, :s]]
    out_loc = torch.cat([table[s, p:e] for s, p, e in zip(case.slots, case.prefix_lens,
                                                           case.seq_lens)])
    layout = StepLayout(lay.slots, case.prefix_lens, case.seq_lens, out_loc, table, P)
    return dataclasses.replace(case, layout=layout, pool=pool, spare_page=int(order[need]))


@pytest.mark.parametrize("kind", ["prefill", "chunked", "mixed"])
def test_fa2_prefill_reads_pages_of_256_and_gathers_smaller_ones(fake_fa2, kind):
    b = create_backend("fa", NH, NKV, HD, CPU, torch.float32)
    paged = make_case(kind, 5, 256, NH, NKV, HD, torch.float32, CPU, seed=31)
    gathered = _repaged(paged, 16)
    outs = []
    for case in (paged, gathered):
        meta = b.prepare(case.layout)
        # page 256: one varlen call over the pool's pages; page 16: K/V copied out per request
        assert (meta.block_table is not None, meta.kv_loc is None) == ((case is paged,) * 2)
        outs.append(b.forward(case.q, case.k, case.v, LAYER, meta, case.pool))
        check_store(case)
    assert rel_error(outs[0], reference(paged, HD**-0.5)) < 1e-5
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-6, atol=1e-6)


def test_fa_states_graph_support_per_page_size(fake_flash_attn):
    b = create_backend("fa", NH, NKV, HD, CPU, torch.float32)
    assert b.name == "fa"
    for P in (256, 512):
        assert b.supports_cuda_graph(P) and b.check_page_size(P) == ""
    if fake_flash_attn == 3:  # a page table at any page size
        assert b.supports_cuda_graph(16) and b.check_page_size(16) == ""
        return
    assert not b.supports_cuda_graph(16) and not b.supports_cuda_graph(1)
    note = b.check_page_size(16)
    assert "page size 16" in note and "--page-size 256" in note and "CUDA graphs" in note


def test_hybrid_graphs_follow_its_decode_backend(fake_fa2):
    fa_prefill = create_backend("fa,torch", NH, NKV, HD, CPU, torch.float32)
    fa_decode = create_backend("torch,fa", NH, NKV, HD, CPU, torch.float32)
    assert fa_prefill.name == "fa,torch" and fa_decode.name == "torch,fa"
    assert not fa_prefill.supports_cuda_graph(256)  # torch decodes: never in graphs
    assert fa_decode.supports_cuda_graph(256) and not fa_decode.supports_cuda_graph(16)
    for hybrid in (fa_prefill, fa_decode):  # fa's note whatever its role
        assert hybrid.check_page_size(256) == ""
        assert "--page-size 256" in hybrid.check_page_size(16)


@pytest.mark.parametrize("backend", ["fa,torch", "torch,fa"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("page_size", [16, 256])
def test_fa2_hybrids_match_float64(fake_fa2, backend, kind, page_size):
    b = create_backend(backend, NH, NKV, HD, CPU, torch.float32)
    case = make_case(kind, 5, page_size, NH, NKV, HD, torch.float32, CPU, seed=41)
    meta = b.prepare(case.layout)
    out = b.forward(case.q, case.k, case.v, LAYER, meta, case.pool)
    assert rel_error(out, reference(case, HD**-0.5)) < 1e-5
    check_store(case)
    assert_bound_layers_match(b, case, meta, out)


def _graph_sizes(backend, page_size: int, **config: int) -> list[int]:
    """What ModelRunner would capture on a CUDA device for this backend and page size."""
    engine = EngineConfig("unused", page_size=page_size, max_running_requests=8, **config)
    return ModelRunner._graph_sizes(SimpleNamespace(device=torch.device("cuda"), config=engine,
                                                    backend=backend))


def test_engine_captures_graphs_only_where_the_backend_can_run_them(fake_fa2, caplog):
    """Up to cuda_graph_max_batch rows, which steps with short prompts fill beyond the request
    slots (graph_prefill_keys); without those, up to the slots."""
    fa = create_backend("fa", NH, NKV, HD, CPU, torch.float32)
    hybrid = create_backend("fa,torch", NH, NKV, HD, CPU, torch.float32)
    assert _graph_sizes(fa, 256) == graph_batch_sizes(256)
    assert _graph_sizes(fa, 256, cuda_graph_max_batch=64) == graph_batch_sizes(64)
    assert _graph_sizes(fa, 256, graph_prefill_keys=0) == graph_batch_sizes(8)
    with caplog.at_level(logging.WARNING, logger="radixserve.engine.model_runner"):
        assert _graph_sizes(fa, 16) == [] and _graph_sizes(hybrid, 256) == []
    assert "fa cannot run in CUDA graphs at page size 16" in caplog.text
    assert "fa,torch cannot run in CUDA graphs at page size 256" in caplog.text


@pytest.mark.parametrize("page_size", [16, 256])
def test_engine_on_fa2_matches_the_torch_backend(fake_fa2, page_size, ckpt, make_llm, caplog):
    """An engine on flash-attn 2 starts at any page size (with a warning below 256) and generates
    what the torch backend does: chunked prefill over cached prefixes, then decode."""
    from radixserve.engine import SamplingParams

    prompts = [[(7 * i + 3 * j) % 900 + 3 for j in range(n)] for i, n in enumerate((5, 40, 300))]
    prompts.append(prompts[2][:260] + [11, 12])  # a cached prefix of a page and more
    params = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    config = {"page_size": page_size, "max_prefill_tokens": 256}
    want = [o.token_ids for o in make_llm(ckpt("qwen3"), attention_backend="torch", **config)
            .generate(prompts, params)]
    with caplog.at_level(logging.WARNING, logger="radixserve.engine.model_runner"):
        llm = make_llm(ckpt("qwen3"), attention_backend="fa", **config)
    assert ("--page-size 256" in caplog.text) == (page_size % 256 != 0)
    got = [o.token_ids for o in llm.generate(prompts[:3], params)]
    got += [o.token_ids for o in llm.generate(prompts[3:], params)]  # hits the cached prefix
    assert got == want


def test_engine_start_refuses_a_page_size_its_backend_cannot_serve(monkeypatch, ckpt, make_llm):
    from radixserve.engine import attention
    from radixserve.engine.attention.torch_backend import TorchBackend

    class Pages64(TorchBackend):
        def check_page_size(self, page_size: int) -> str:
            if page_size % 64:
                raise ValueError(f"attention backend {self.name} cannot serve page size "
                                 f"{page_size}; use --page-size 64")
            return ""

    monkeypatch.setitem(attention._BACKENDS, "pages64", lambda: Pages64)
    with pytest.raises(ValueError, match="pages64 cannot serve page size 16; use --page-size 64"):
        make_llm(ckpt("qwen3"), attention_backend="pages64", page_size=16)
    make_llm(ckpt("qwen3"), attention_backend="pages64", page_size=64)
