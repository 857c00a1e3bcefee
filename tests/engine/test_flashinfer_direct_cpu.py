"""The direct FlashInfer prefill path's plumbing on CPU, against a stand-in FlashInfer (and the
decode kernel's bound call, `DecodeCall`, against a stand-in decode wrapper).

The stand-in's wrapper plans as BatchPrefillWithPagedKVCacheWrapper.plan does for the backend's one
configuration, and its `paged_run` computes causal paged attention from the arguments it is given,
read by parameter name, with the fa2 (page ids) or fa3 (token offsets) meaning. So a value passed at
the wrong position, a wrong indptr or wrong page ids give a wrong output or fail an assertion here;
whether the real FlashInfer agrees is test_flashinfer_direct_gpu.py's business.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import types

import numpy as np
import pytest
import torch
from attention_cases import LAYER, make_case, reference, rel_error
from radixserve.engine.attention import flashinfer_direct
from radixserve.engine.attention.base import page_cells, page_indices, pages_at, pages_per_request
from radixserve.engine.attention.flashinfer_direct import (
    DECODE_RUN_PARAMS,
    PAGED_RUN_PARAMS,
    DecodeCall,
    DirectPrefill,
    Unsupported,
)

CPU = torch.device("cpu")
NH, NKV, HD = 4, 2, 16
DT = torch.float32


class MaskMode(enum.Enum):
    NON_CAUSAL = 0
    CAUSAL = 1


class TensorLayout(enum.Enum):
    NHD = 0
    HND = 1


def _to_offsets(block_sparse_indices, block_sparse_indptr, vector_sparse_offsets,
                vector_sparse_indptr, kv_lens, stride_block, stride_n, block_size):
    """flashinfer.page's conversion (its CUDA kernel's loop, on the host)."""
    if block_size == 1 and stride_block == 1:
        return block_sparse_indices
    for b in range(block_sparse_indptr.numel() - 1):
        for pos in range(int(kv_lens[b])):
            page = block_sparse_indices[int(block_sparse_indptr[b]) + pos // block_size]
            vector_sparse_offsets[int(vector_sparse_indptr[b]) + pos] = (
                page * stride_block + pos % block_size * stride_n)
    return vector_sparse_offsets


class FakeModule:
    """The planned module: plan records its arguments, paged_run attends from its arguments."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.plans: list[tuple] = []
        self.runs = 0

        def paged_run(*args):
            self._paged_run(*args)

        paged_run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
             for n in PAGED_RUN_PARAMS])
        self.paged_run = paged_run

    def plan(self, *args):
        self.plans.append(args)
        pinned, qo, kv, kv_lens = args[2], args[3], args[4], args[5]
        staged = torch.cat([qo, kv, kv_lens]).view(torch.uint8)  # the "schedule"
        pinned[: staged.numel()] = staged
        expected = 19 if self.backend == "fa2" else 16
        assert len(args) == expected, f"{self.backend} plan takes {expected} arguments"
        return [int(args[6]), int(args[7]), int(args[10]), int(args[14]), int(kv[-1])]

    def _paged_run(self, *args):
        a = dict(zip(PAGED_RUN_PARAMS, args))
        assert len(args) == len(PAGED_RUN_PARAMS)
        assert a["mask_mode"] == MaskMode.CAUSAL.value and a["layout"] == TensorLayout.NHD.value
        assert a["window_left"] == -1 and a["logits_soft_cap"] == 0.0 and a["maybe_lse"] is None
        assert a["maybe_custom_mask"] is None and a["maybe_prefix_len_ptr"] is None
        assert (a["rope_scale"], a["rope_theta"]) == (1.0, 1e4)
        q, k, v, o = a["q"], a["paged_k_cache"], a["paged_v_cache"], a["o"]
        P = k.size(1)
        assert a["page_size"] == P and a["num_qo_heads"] == q.size(1)
        qo, indptr = a["qo_indptr"].tolist(), a["paged_kv_indptr"].tolist()
        idx = a["paged_kv_indices"].long()
        k_flat, v_flat = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
        for b in range(len(qo) - 1):
            if self.backend == "fa3":  # token offsets, indptr over tokens
                locs = idx[indptr[b] : indptr[b + 1]]
            else:  # page ids, indptr over pages, the last page partly filled
                pages = idx[indptr[b] : indptr[b + 1]]
                n = (len(pages) - 1) * P + int(a["paged_kv_last_page_len"][b])
                locs = (pages[:, None] * P + torch.arange(P)).flatten()[:n]
            K, V = k_flat[locs].double(), v_flat[locs].double()
            group = q.size(1) // K.size(1)
            K, V = K.repeat_interleave(group, 1), V.repeat_interleave(group, 1)
            Q = q[qo[b] : qo[b + 1]].double()
            s = torch.einsum("qhd,khd->hqk", Q, K) * a["sm_scale"]
            qpos = torch.arange(len(locs) - len(Q), len(locs))[:, None]
            s = s.masked_fill(torch.arange(len(locs))[None, :] > qpos, float("-inf"))
            o[qo[b] : qo[b + 1]] = torch.einsum("hqk,khd->qhd", s.softmax(-1), V).to(o.dtype)
        self.runs += 1


class FakeWrapper:
    """BatchPrefillWithPagedKVCacheWrapper's state after plan(), for causal NHD steps."""

    def __init__(self, backend: str) -> None:
        self._backend, self._jit_module, self._use_cuda_graph = backend, None, False
        self._kv_layout, self.device = "NHD", CPU
        self._cached_module = FakeModule(backend)
        self._float_workspace_buffer = torch.zeros(1024, dtype=torch.uint8)
        self._workspace_size = 1024
        self._int_workspace_buffer = torch.zeros(4096, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.zeros(4096, dtype=torch.uint8)
        self._kv_lens_buffer = torch.zeros(4096, dtype=torch.int32)
        self._vector_sparse_indptr_buffer = torch.zeros(4096, dtype=torch.int32)
        self._vector_sparse_indices_buffer = torch.zeros(1 << 16, dtype=torch.int32)

    def plan(self, qo_indptr, kv_indptr, indices, last, nh, nkv, hd, P):
        kv_lens = torch.clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0) * P + last
        B = len(last)
        self._kv_lens_buffer[:B] = kv_lens
        self._qo_indptr_buf, self._paged_kv_indptr_buf = qo_indptr.clone(), kv_indptr.clone()
        self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf = indices, last.clone()
        plan_kv = kv_indptr
        if self._backend == "fa3" and P != 1:
            plan_kv = torch.cat([torch.zeros(1, dtype=torch.int32),
                                 torch.cumsum(kv_lens, 0, dtype=torch.int32)])
            self._vector_sparse_indptr_buffer[: B + 1] = plan_kv
        args = [self._float_workspace_buffer, self._int_workspace_buffer,
                self._pin_memory_int_workspace_buffer, qo_indptr, plan_kv, kv_lens,
                int(qo_indptr[-1]), B, nh, nkv, P, False, hd, hd, True, -1]
        if self._backend == "fa2":
            args += [-1, False, 0]
        self._plan_info = self._cached_module.plan(*args)


@pytest.fixture
def fake_flashinfer(monkeypatch):
    utils = types.SimpleNamespace(MaskMode=MaskMode, TensorLayout=TensorLayout,
                                  device_support_pdl=lambda dev: False,
                                  _get_cache_alibi_slopes_buf=lambda n, dev: torch.ones(n))
    page = types.SimpleNamespace(block_sparse_indices_to_vector_sparse_offsets=_to_offsets)
    monkeypatch.setitem(sys.modules, "flashinfer.utils", utils)
    monkeypatch.setitem(sys.modules, "flashinfer.page", page)


def _case(kind: str, page_size: int, seed: int, with_slots: bool = True):
    case = make_case(kind, 5, page_size, NH, NKV, HD, DT, CPU, seed=seed)
    case.pool.store(LAYER, case.layout.out_loc, case.k, case.v)
    if with_slots:
        case = dataclasses.replace(case, layout=dataclasses.replace(case.layout,
                                                                    slot_list=case.slots))
    return case


def _wrapper_plan(w: FakeWrapper, layout) -> None:
    P, seq = layout.page_size, layout.seq_lens
    npages = pages_per_request(seq, P)
    i32 = torch.int32
    w.plan(torch.tensor([0, *np.cumsum(layout.extend_lens)], dtype=i32),
           torch.tensor([0, *np.cumsum(npages)], dtype=i32),
           page_indices(layout.page_table, layout.slots, npages, P),
           torch.tensor([s - (n - 1) * P for s, n in zip(seq, npages)], dtype=i32), NH, NKV, HD, P)


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["prefill", "chunked", "mixed"])
@pytest.mark.parametrize("with_slots", [True, False])
def test_direct_call_attends_from_its_arguments(fake_flashinfer, backend, page_size, kind,
                                                with_slots):
    w = FakeWrapper(backend)
    first = _case(kind, page_size, 1)
    _wrapper_plan(w, first.layout)
    direct = DirectPrefill(w, NH, NKV, HD, HD**-0.5)
    direct.verify(w, first.layout)  # the plan made here matches the wrapper's
    case = _case(kind, page_size, 2, with_slots)
    call = direct.plan(case.layout, torch.zeros(4096, dtype=torch.uint8))
    for layer in (LAYER, 0):  # one plan, every layer
        out = torch.full_like(case.q, float("nan"))
        k, v = case.pool.pages[layer]
        call(case.q, k, v, out)
        if layer == LAYER:
            assert rel_error(out, reference(case, HD**-0.5)) < 1e-5
    assert w._cached_module.runs == 2


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_verify_rejects_a_plan_that_differs(fake_flashinfer, monkeypatch, backend):
    w = FakeWrapper(backend)
    case = _case("chunked", 16, 3)
    _wrapper_plan(w, case.layout)
    direct = DirectPrefill(w, NH, NKV, HD, HD**-0.5)
    real = flashinfer_direct.pages_at
    monkeypatch.setattr(flashinfer_direct, "pages_at", lambda *a: real(*a) + 1)
    with pytest.raises(Unsupported, match="page ids differ"):
        direct.verify(w, case.layout)
    monkeypatch.setattr(flashinfer_direct, "pages_at", real)
    w._plan_info = w._plan_info[:-1] + [-1]
    with pytest.raises(Unsupported, match="plan info"):
        direct.verify(w, case.layout)


def test_unsupported_flashinfer(fake_flashinfer):
    for change, match in [(("_backend", "cudnn"), "cudnn"), (("_jit_module", object()), "JIT"),
                          (("_use_cuda_graph", True), "CUDA graph"),
                          (("_kv_layout", "HND"), "HND")]:
        w = FakeWrapper("fa3")
        setattr(w, *change)
        with pytest.raises(Unsupported, match=match):
            DirectPrefill(w, NH, NKV, HD, 1.0)
    w = FakeWrapper("fa2")
    w._cached_module.paged_run = lambda *args: None
    with pytest.raises(Unsupported, match="paged_run takes"):
        DirectPrefill(w, NH, NKV, HD, 1.0)
    w = FakeWrapper("fa3")
    del w._vector_sparse_indices_buffer
    with pytest.raises(Unsupported, match="_vector_sparse_indices_buffer"):
        DirectPrefill(w, NH, NKV, HD, 1.0)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["prefill", "mixed"])
def test_page_cells_find_the_page_ids(kind, page_size):
    lay = _case(kind, page_size, 4).layout
    npages = pages_per_request(lay.seq_lens, page_size)
    cells = page_cells(lay.slot_list, npages, lay.page_table.size(1), page_size)
    got = pages_at(lay.page_table, torch.from_numpy(cells), page_size)
    assert torch.equal(got, page_indices(lay.page_table, lay.slots, npages, page_size))


class FakeDecodeWrapper:
    """BatchDecodeWithPagedKVCacheWrapper's state after plan() (CUDA cores, NHD); its module's
    run attends from its arguments, read by parameter name."""

    def __init__(self) -> None:
        self._backend, self._use_tensor_cores, self._jit_module = "fa2", False, None
        self._kv_layout, self.device = "NHD", CPU
        self._float_workspace_buffer = torch.zeros(64, dtype=torch.uint8)
        self._int_workspace_buffer = torch.zeros(64, dtype=torch.uint8)
        self.runs = 0

        def run(*args):
            a = dict(zip(DECODE_RUN_PARAMS, args, strict=True))
            assert a["float_workspace_buffer"] is self._float_workspace_buffer
            assert a["int_workspace_buffer"] is self._int_workspace_buffer
            assert a["plan_info_vec"] is self._plan_info and a["maybe_lse"] is None
            assert a["kv_layout_code"] == TensorLayout.NHD.value and a["window_left"] == -1
            assert a["logits_soft_cap"] == 0.0 and (a["rope_scale"], a["rope_theta"]) == (1.0, 1e4)
            q, k, v, o = a["q"], a["paged_k_cache"], a["paged_v_cache"], a["o"]
            P, indptr = k.size(1), a["paged_kv_indptr"].tolist()
            k_flat, v_flat = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
            for b in range(q.size(0)):
                pages = a["paged_kv_indices"][indptr[b] : indptr[b + 1]].long()
                n = (len(pages) - 1) * P + int(a["paged_kv_last_page_len"][b])
                locs = (pages[:, None] * P + torch.arange(P)).flatten()[:n]
                group = q.size(1) // k.size(2)
                K = k_flat[locs].double().repeat_interleave(group, 1)
                V = v_flat[locs].double().repeat_interleave(group, 1)
                s = torch.einsum("hd,khd->hk", q[b].double(), K) * a["sm_scale"]
                o[b] = torch.einsum("hk,khd->hd", s.softmax(-1), V).to(o.dtype)
            self.runs += 1

        run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
             for n in DECODE_RUN_PARAMS])
        self._cached_module = types.SimpleNamespace(run=run)

    def plan(self, layout) -> None:
        P, seq = layout.page_size, layout.seq_lens
        npages = pages_per_request(seq, P)
        self._paged_kv_indptr_buf = torch.tensor([0, *np.cumsum(npages)], dtype=torch.int32)
        self._paged_kv_indices_buf = page_indices(layout.page_table, layout.slots, npages, P)
        self._paged_kv_last_page_len_buf = torch.tensor(
            [s - (n - 1) * P for s, n in zip(seq, npages)], dtype=torch.int32)
        self._plan_info = [len(seq)]


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_call_attends_from_the_wrappers_plan(fake_flashinfer, page_size):
    w = FakeDecodeWrapper()
    call = DecodeCall(w, NH, HD**-0.5)
    for seed in (1, 2):  # each plan bound anew: the second call reads the second plan's buffers
        case = _case("decode", page_size, seed)
        w.plan(case.layout)
        out = torch.full_like(case.q, float("nan"))
        k, v = case.pool.pages[LAYER]
        call.bind()(case.q, k, v, out)
        assert rel_error(out, reference(case, HD**-0.5)) < 1e-5
    assert w.runs == 2


def test_decode_call_refuses_what_it_does_not_mirror(fake_flashinfer):
    for change, match in [(("_use_tensor_cores", True), "tensor cores"),
                          (("_jit_module", object()), "JIT"), (("_kv_layout", "HND"), "HND")]:
        w = FakeDecodeWrapper()
        setattr(w, *change)
        with pytest.raises(Unsupported, match=match):
            DecodeCall(w, NH, 1.0)
    w = FakeDecodeWrapper()
    call = DecodeCall(w, NH, 1.0)
    w._cached_module = types.SimpleNamespace(run=lambda q, out: None)
    with pytest.raises(Unsupported, match="decode module's run takes"):
        call.bind()
