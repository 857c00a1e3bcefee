"""The layers' Triton kernels run by Triton's interpreter on a CPU (where no GPU runs them itself:
tests/engine/test_fused_gpu.py does there). The GEMV reads its first slab of weights before it
waits for the kernels before it (engine/pdl.py), then the rest in its loop: its three input forms
and its SwiGLU output, over one slab and over several, one block of outputs per program or several,
give torch's products."""

from __future__ import annotations

from triton_interpreter import cpu_only, run_interpreted

_INTERPRETED = """
import torch
import torch.nn.functional as F
from radixserve.engine.layers import fused, gemv

torch.manual_seed(0)
cases = [(1, 64, 96, 128), (2, 48, 2100, 1024), (3, 32, 5000, 2048)]
# per_sm 2: two programs (one "SM" here) take the 2-4 blocks of outputs in turns, one of them
# an odd block more than the other
runs = [(c, p) for c in cases for p in (0, 2)] + [((1, 40, 300, 128), 2)]
for (M, N, K, block_k), per_sm in runs:
    blocks = gemv.Blocks(16, block_k, 4, stream=K >= 2048, per_sm=per_sm)
    x, w, b = torch.randn(M, K), torch.randn(N, K), torch.randn(N)
    tol = 1e-6 * K
    assert torch.allclose(gemv.gemv(x, w, b, blocks), x @ w.T + b, atol=tol), "plain"
    gate_up = torch.randn(M, 2 * K)
    g, u = gate_up.chunk(2, dim=-1)
    assert torch.allclose(gemv.gated_gemv(gate_up, w, None, blocks), (F.silu(g) * u) @ w.T,
                          atol=tol), "gated"
    r, nw = torch.randn(M, K), torch.randn(K)
    y, s = gemv.normed_gemv(x, r, nw, 1e-6, w, None, blocks)
    h = x + r
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * nw
    assert torch.equal(s, h) and torch.allclose(y, normed @ w.T, atol=tol), "normed"
    # swiglu: w as a [gate | up] of N / 2 features, 8 a block (the last case's last block half
    # full)
    g, u = (x @ w.T + b).chunk(2, dim=-1)
    # products of two sums of K terms: errors relative to the largest output
    close = lambda y, ref: (y - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert close(gemv.gemv(x, w, b, blocks, swiglu=True), F.silu(g) * u), "swiglu"
    y, _ = gemv.normed_gemv(x, r, nw, 1e-6, w, b, blocks, swiglu=True)
    g, u = (normed @ w.T + b).chunk(2, dim=-1)
    assert close(y, F.silu(g) * u), "normed swiglu"
x, r, nw = torch.randn(5, 128), torch.randn(5, 128), torch.randn(128)
out, _ = fused.add_rms_norm(x, r.clone(), nw, 1e-6)
h = x + r
assert torch.allclose(out, h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * nw,
                      atol=1e-5), "add_rms_norm"
gate_up = torch.randn(3, 2048)
assert torch.allclose(fused.silu_and_mul(gate_up),
                      F.silu(gate_up[:, :1024]) * gate_up[:, 1024:], atol=1e-6), "silu_and_mul"
print("interpreted kernels match")
"""


@cpu_only
def test_gemv_and_fused_kernels_in_the_triton_interpreter():
    assert "interpreted kernels match" in run_interpreted(_INTERPRETED)
