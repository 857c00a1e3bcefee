"""FlashInfer prefill called directly (flashinfer_direct.py) against the wrapper's plan and run,
on a CUDA device (skipped elsewhere or without flashinfer).

The direct path must give the wrapper's output bit for bit: the same kernel with the same plan and
arguments. Layouts of several requests: fresh prompts, chunks after cached page-aligned prefixes,
and chunks beside decode rows; page sizes 1 and 16 (on the fa3 backend, page ids become token
offsets once per step instead of once per layer: two layers are checked against one plan). The
decode kernel's bound call (`DecodeCall`) likewise equals the decode wrapper's run.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from attention_cases import LAYER, backend_marks, make_case, reference, rel_error

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              *backend_marks("flashinfer")]

NH, NKV, HD = 16, 8, 128  # Qwen3-0.6B's attention shape
DT = torch.bfloat16
TOL = 1e-2


def _backend(direct: bool = True):
    from radixserve.engine.attention.flashinfer_backend import FlashInferBackend

    return FlashInferBackend(NH, NKV, HD, torch.device("cuda"), DT, direct=direct)


def _case(kind: str, page_size: int, seed: int, with_slots: bool):
    case = make_case(kind, 7, page_size, NH, NKV, HD, DT, torch.device("cuda"), seed=seed)
    case.pool.store(LAYER, case.layout.out_loc, case.k, case.v)
    if with_slots:  # as the model runner builds it: page ids found from host slots
        case = dataclasses.replace(case, layout=dataclasses.replace(case.layout,
                                                                    slot_list=case.slots))
    return case


@pytest.mark.parametrize("with_slots", [True, False])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kind", ["prefill", "chunked", "mixed"])
def test_direct_prefill_equals_wrapper_run(kind, page_size, with_slots):
    direct, wrapped = _backend(), _backend(direct=False)
    first = _case(kind, page_size, 1, with_slots)
    assert direct.prefill_path == "undecided"
    assert direct.prepare(first.layout).call is None  # the first prefill plan: the wrapper's
    assert direct.prefill_path == "direct", "this FlashInfer should take the direct path"
    for seed in range(3):  # fresh layouts, each planned both ways
        case = _case(kind, page_size, 100 + seed, with_slots)
        ours, theirs = direct.prepare(case.layout), wrapped.prepare(case.layout)
        assert ours.call is not None and theirs.call is None
        for layer in (LAYER, 0):  # one plan, two layers
            out = torch.full_like(case.q, float("nan"))
            got = direct.attend(case.q, layer, ours, case.pool, out=out)
            want = wrapped.attend(case.q, layer, theirs, case.pool)
            torch.cuda.synchronize()
            assert got is out
            assert torch.equal(out, want), f"{kind} P={page_size} layer {layer}"
            assert torch.equal(direct.attend(case.q, layer, ours, case.pool), want)  # out=None
        err = rel_error(direct.attend(case.q, LAYER, ours, case.pool), reference(case, HD**-0.5))
        assert err < TOL, f"{kind} P={page_size}: relative error {err:.2e}"


def _check_wrapper_path(b, kind: str = "mixed") -> None:
    for seed in range(2):
        case = _case(kind, 16, 10 + seed, True)
        meta = b.prepare(case.layout)
        assert meta.call is None
        out = torch.empty_like(case.q)
        assert b.attend(case.q, LAYER, meta, case.pool, out=out) is out
        torch.cuda.synchronize()
        assert rel_error(out, reference(case, HD**-0.5)) < TOL


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_call_equals_wrapper_run(page_size):
    """Eager decode steps (and a mixed step's decode rows) run the decode kernel through
    `DecodeCall`: the wrapper's plan, the kernel called with its arguments bound once."""
    direct, wrapped = _backend(), _backend(direct=False)
    for seed in range(3):
        case = _case("decode", page_size, 200 + seed, True)
        ours, theirs = direct.prepare(case.layout), wrapped.prepare(case.layout)
        assert ours.call is not None and theirs.call is None
        for layer in (LAYER, 0):
            out = torch.full_like(case.q, float("nan"))
            assert direct.attend(case.q, layer, ours, case.pool, out=out) is out
            want = wrapped.attend(case.q, layer, theirs, case.pool)
            torch.cuda.synchronize()
            assert torch.equal(out, want), f"decode P={page_size} layer {layer}"
        err = rel_error(direct.attend(case.q, LAYER, ours, case.pool), reference(case, HD**-0.5))
        assert err < TOL, f"decode P={page_size}: relative error {err:.2e}"


def test_fallback_when_forced(caplog):
    b = _backend(direct=False)
    with caplog.at_level(logging.INFO):
        _check_wrapper_path(b)
    assert b.prefill_path == "wrapper"
    assert "directly" not in caplog.text


def test_fallback_when_flashinfer_differs(monkeypatch, caplog):
    """A paged_run of other parameters (another FlashInfer): logged once, the wrapper kept."""
    from radixserve.engine.attention import flashinfer_direct

    monkeypatch.setattr(flashinfer_direct, "PAGED_RUN_PARAMS",
                        flashinfer_direct.PAGED_RUN_PARAMS[:-1])
    b = _backend()
    with caplog.at_level(logging.WARNING):
        _check_wrapper_path(b)
    assert b.prefill_path == "wrapper"
    notes = [r for r in caplog.records if "through the wrapper" in r.getMessage()]
    assert len(notes) == 1 and "paged_run takes" in notes[0].getMessage()


def test_fallback_when_the_plan_check_fails(monkeypatch, caplog):
    """Direct plan inputs that differ from the wrapper's (here: the page ids) keep the wrapper."""
    from radixserve.engine.attention import flashinfer_direct

    real = flashinfer_direct.pages_at
    monkeypatch.setattr(flashinfer_direct, "pages_at", lambda *a: real(*a) + 1)
    b = _backend()
    with caplog.at_level(logging.WARNING):
        _check_wrapper_path(b, "chunked")
    assert b.prefill_path == "wrapper"
    assert "the wrapper's page ids differ" in caplog.text
