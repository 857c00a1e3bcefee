"""The fused Triton layer kernels against float64 references on fresh random inputs (CUDA only)."""

from __future__ import annotations

import pytest
import torch
from attention_cases import rel_error

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOL = 1e-2  # bf16 outputs


def _rms64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("rows,dim", [(1, 1024), (37, 4096), (513, 128)])
def test_rms_norm(rows, dim):
    from radixserve.engine.layers import fused

    x = (torch.randn(rows, dim, device="cuda") * 3).bfloat16()
    w = (1 + 0.1 * torch.randn(dim, device="cuda")).bfloat16()
    out = fused.rms_norm(x, w, 1e-6)
    assert rel_error(out, _rms64(x, w, 1e-6)) < TOL


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("tokens,nh,nkv,hd", [(1, 16, 8, 128), (300, 32, 8, 128), (5, 4, 2, 32)])
def test_qk_norm_rope(norm, tokens, nh, nkv, hd):
    from radixserve.engine.layers import fused
    from radixserve.engine.layers.rotary import RotaryEmbedding

    rot = RotaryEmbedding(hd, 4096, 1e6, None).cuda()
    # strided rows
    qkv = torch.randn(tokens, (nh + 2 * nkv) * hd + 16, device="cuda").bfloat16()[:, :-16]
    pos = torch.randint(0, 4096, (tokens,), device="cuda")
    qw = (1 + 0.1 * torch.randn(hd, device="cuda")).bfloat16() if norm else None
    kw = (1 + 0.1 * torch.randn(hd, device="cuda")).bfloat16() if norm else None
    q, k = fused.qk_norm_rope(qkv, pos, rot.cos, rot.sin, qw, kw, 1e-6, nh, nkv, hd)
    ref_q = qkv[:, : nh * hd].reshape(tokens, nh, hd).double()
    ref_k = qkv[:, nh * hd : (nh + nkv) * hd].reshape(tokens, nkv, hd).double()
    if norm:
        ref_q, ref_k = _rms64(ref_q, qw, 1e-6), _rms64(ref_k, kw, 1e-6)
    cos, sin = rot.cos[pos].double()[:, None], rot.sin[pos].double()[:, None]

    def rope(x: torch.Tensor) -> torch.Tensor:
        half = hd // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    assert rel_error(q, rope(ref_q)) < TOL and rel_error(k, rope(ref_k)) < TOL
    # The same kernel with the KV store folded in: same q, k and v land at their locations only.
    k_cache = torch.zeros(4 * tokens + 8, nkv, hd, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    loc = torch.randperm(k_cache.size(0), device="cuda")[:tokens]
    q2, none = fused.qk_norm_rope(qkv, pos, rot.cos, rot.sin, qw, kw, 1e-6, nh, nkv, hd,
                                  (k_cache, v_cache, loc))
    assert none is None and torch.equal(q2, q) and torch.equal(k_cache[loc], k)
    assert torch.equal(v_cache[loc], qkv[:, (nh + nkv) * hd :].reshape(tokens, nkv, hd))
    untouched = torch.ones(k_cache.size(0), dtype=torch.bool, device="cuda")
    untouched[loc] = False
    assert not k_cache[untouched].any() and not v_cache[untouched].any()


@pytest.mark.parametrize("rows,inter", [(1, 3072), (129, 12288), (7, 100)])
def test_silu_and_mul(rows, inter):
    from radixserve.engine.layers import fused

    x = (torch.randn(rows, 2 * inter, device="cuda") * 2).bfloat16()
    g, u = x.double().chunk(2, -1)
    assert rel_error(fused.silu_and_mul(x), torch.nn.functional.silu(g) * u) < TOL


@pytest.mark.parametrize("rows,dim", [(1, 1024), (37, 4096), (5, 100)])
def test_add_rms_norm(rows, dim):
    from radixserve.engine.layers import fused

    # strided rows, as sublayer outputs
    x = torch.randn(rows, dim + 8, device="cuda").bfloat16()[:, :dim]
    res = (torch.randn(rows, dim, device="cuda") * 3).bfloat16()
    w = (1 + 0.1 * torch.randn(dim, device="cuda")).bfloat16()
    total = x.double() + res.double()
    out, new_res = fused.add_rms_norm(x, res.clone(), w, 1e-6)
    assert rel_error(new_res, total) < TOL and rel_error(out, _rms64(total, w, 1e-6)) < TOL


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k,bias",
                         [(1024, 2048, False), (1000, 3000, True), (1024, 3072, False),
                          (7, 33, True)])
def test_gemv(rows, n, k, bias):
    from radixserve.engine.layers import gemv

    x = torch.randn(rows, k + 4, device="cuda").bfloat16()[:, :k]  # strided rows
    w = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
    b = torch.randn(n, device="cuda").bfloat16() if bias else None
    assert gemv.usable(x, w)
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    out = gemv.gemv(x, w, b)
    assert out.shape == (rows, n) and not out.isnan().any()
    assert rel_error(out, ref) < TOL


@pytest.mark.parametrize("n,k,bias", [(5000, 4100, False), (4096, 12288, True)])
def test_gemv_one_row_of_a_large_matrix(n, k, bias):
    """Past 16M weights the kernel takes one row only (whole-row slabs, evict-first), where it
    streams faster than cuBLAS; two rows go to cuBLAS."""
    from radixserve.engine.layers import gemv

    x = torch.randn(1, k, device="cuda").bfloat16()
    w = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
    b = torch.randn(n, device="cuda").bfloat16() if bias else None
    assert gemv.usable(x, w) and not gemv.usable(torch.cat([x, x]), w)
    assert gemv.config(n, k).stream
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    out = gemv.linear(x, w, b)
    assert out.shape == (1, n) and rel_error(out, ref) < TOL


@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("n,k", [(1024, 3072), (500, 300)])
def test_gated_gemv(rows, n, k):
    """down_proj with SiLU-mul folded in, against silu(gate) * up rounded as eager layers round."""
    from radixserve.engine.layers import fused, gemv

    gate_up = (torch.randn(rows, 2 * k, device="cuda") * 2).bfloat16()
    w = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
    assert gemv.gated_usable(gate_up, w)
    ref = fused.silu_and_mul(gate_up).double() @ w.double().T
    assert rel_error(gemv.gated_gemv(gate_up, w), ref) < TOL


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("n,k,bias", [(4096, 1024, False), (6144, 1024, False), (300, 1000, True),
                                      (3000, 4096, True)])  # K >= 2048: programs walk blocks
@pytest.mark.parametrize("with_residual", [True, False])
def test_normed_gemv(rows, n, k, bias, with_residual):
    """qkv / gate_up with the residual add and RMSNorm folded in: the product and the new residual
    stream match add_rms_norm + F.linear; the residual passed in is not written."""
    from radixserve.engine.layers import gemv

    # strided rows, as sublayer outputs
    x = torch.randn(rows, k + 8, device="cuda").bfloat16()[:, :k]
    res = (torch.randn(rows, k, device="cuda") * 3).bfloat16() if with_residual else None
    res_before = res.clone() if res is not None else None
    nw = (1 + 0.1 * torch.randn(k, device="cuda")).bfloat16()
    w = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
    b = torch.randn(n, device="cuda").bfloat16() if bias else None
    assert gemv.normed_usable(x, w)
    y, stream = gemv.normed_gemv(x, res, nw, 1e-6, w, b)
    total = x.double() + (res.double() if res is not None else 0)
    ref = _rms64(total, nw, 1e-6) @ w.double().T + (b.double() if bias else 0)
    assert rel_error(y, ref) < TOL and rel_error(stream, total) < TOL
    if res is not None:
        assert torch.equal(res, res_before)


@pytest.mark.parametrize("rows,n,k,bias", [(1, 6144, 1024, False), (2, 6144, 1024, False),
                                           (1, 600, 1000, True), (2, 3000, 4096, False),
                                           (1, 24576, 4096, False)])  # Qwen3-8B's gate_up
@pytest.mark.parametrize("normed", [True, False])
def test_swiglu_gemv(rows, n, k, bias, normed):
    """gate_up with SiLU-mul folded into its store: silu(gate) * up from one kernel matches the
    projection followed by fused.silu_and_mul, each rounding to bf16 where the layers do; wide
    matrices fold the norm at one row only."""
    from radixserve.engine.layers import fused, gemv

    x = torch.randn(rows, k + 8, device="cuda").bfloat16()[:, :k]
    res = (torch.randn(rows, k, device="cuda") * 3).bfloat16()
    nw = (1 + 0.1 * torch.randn(k, device="cuda")).bfloat16()
    w = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
    b = torch.randn(n, device="cuda").bfloat16() if bias else None
    if normed:
        assert gemv.normed_usable(x, w)
        if n * k > gemv.MAX_WEIGHT_ELEMENTS:
            assert not gemv.normed_usable(torch.cat([x, x]), w)
        y, stream = gemv.normed_gemv(x, res, nw, 1e-6, w, b, swiglu=True)
        total = x.double() + res.double()
        assert rel_error(stream, total) < TOL
        gate_up = _rms64(total, nw, 1e-6) @ w.double().T
    else:
        y = gemv.gemv(x, w, b, swiglu=True)
        gate_up = x.double() @ w.double().T
    gate_up = (gate_up + (b.double() if bias else 0)).bfloat16()
    assert y.shape == (rows, n // 2)
    assert rel_error(y, fused.silu_and_mul(gate_up)) < TOL
