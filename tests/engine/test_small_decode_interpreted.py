"""The small-batch decode kernels (engine/attention/small_decode.py) run by Triton's interpreter
on a CPU, against softmax attention in float64: rows that fit one program and rows split over
several (merged by the last of their programs, which leaves the count at 0 for the next call), rows
of one key, a tile boundary and past it, pages in shuffled order, padded rows, and a group of
query heads that is not a power of two. On a GPU, tests/engine/test_backends_gpu.py runs them
in CUDA graphs."""

from __future__ import annotations

from triton_interpreter import cpu_only, run_interpreted

_INTERPRETED = """
import torch
from radixserve.engine.attention.small_decode import BLOCK_N, SmallBatchDecode, splits_for

torch.manual_seed(0)
HD, P, PAGES = 64, 16, 300
# (query heads, KV heads, lengths): groups of 4, and of 3 (not a power of two)
for NH, NKV, lens in ((8, 2, [1]), (8, 2, [BLOCK_N, BLOCK_N + 1]),
                      (8, 2, [5, 300, 2 * BLOCK_N, 1000]), (6, 2, [5, 1000])):
    k_pages = torch.randn(PAGES, P, NKV, HD)
    v_pages = torch.randn(PAGES, P, NKV, HD)
    B = len(lens)
    width = 1024
    table = torch.zeros(B + 2, width, dtype=torch.int64)
    order = torch.randperm(PAGES)
    for slot in range(B + 2):  # each slot's pages somewhere in the pool, not in order
        pages = order[(slot * 40) % PAGES:][: width // P].repeat(2)[: width // P]
        table[slot] = (pages[:, None] * P + torch.arange(P)).reshape(-1)[:width]
    slots = [B + 1 - i for i in range(B)]
    small = SmallBatchDecode(NH, NKV, HD, HD ** -0.5, max_rows=B + 2, page_table=table)
    small.plan(B + 2, slots, lens)  # two padded rows
    q = torch.randn(B + 2, NH, HD)
    out = torch.full((B + 2, NH, HD), float("nan"))
    small.bind(B + 2)(q, k_pages, v_pages, out)
    # the arrival counts are back at 0, so the next layer (here: the same call) merges again
    assert not small._arrivals.any()
    again = torch.full_like(out, float("nan"))
    small.bind(B + 2)(q, k_pages, v_pages, again)
    assert torch.equal(again[:B], out[:B])
    kf, vf = k_pages.reshape(-1, NKV, HD).double(), v_pages.reshape(-1, NKV, HD).double()
    for i, (slot, n) in enumerate(zip(slots, lens)):
        loc = table[slot, :n]
        k = kf[loc].repeat_interleave(NH // NKV, dim=1)  # (n, NH, HD)
        v = vf[loc].repeat_interleave(NH // NKV, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].double(), k) * HD ** -0.5
        ref = torch.einsum("hn,nhd->hd", s.softmax(-1), v)
        err = ((out[i].double() - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (lens, n, err, splits_for(B + 2, NKV))
print("small decode matches")
"""

# The kernel from the fused projection: q/k norms and rotary at each row's position, the new k and v
# stored at the row's location and used in this very call; padded rows store at a dummy location.
# Also the rotary kernel (layers/fused.py) that the same norm and rotary code serves, on one row.
_INTERPRETED_QKV = """
import torch
from radixserve.engine.attention.base import RopeInputs
from radixserve.engine.attention.small_decode import BLOCK_N, SmallBatchDecode
from radixserve.engine.layers import fused
from radixserve.engine.layers.rotary import RotaryEmbedding

torch.manual_seed(1)
HD, P, PAGES, EPS = 64, 16, 200, 1e-6
rotary = RotaryEmbedding(HD, 4096, 10000.0, None)


def normed(x, w):  # per-head RMSNorm, (..., HD)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


for NH, NKV, lens, norm in ((8, 2, [1, BLOCK_N + 1, 700], True), (6, 2, [3, 130], False)):
    B = len(lens)
    # 4 slots of 800 positions, every location of the pool in one of them, shuffled
    table = torch.randperm(PAGES * P, dtype=torch.int64).view(4, 800)
    k_pages, v_pages = torch.randn(PAGES, P, NKV, HD), torch.randn(PAGES, P, NKV, HD)
    before_k, before_v = k_pages.clone(), v_pages.clone()
    slots = list(range(B))
    dummy = PAGES * P - 1  # no row's table holds it below
    table[table == dummy] = table[B, 0]
    out_loc = torch.tensor([table[s, n - 1] for s, n in zip(slots, lens)] + [dummy])
    qkv = torch.randn(B + 1, (NH + 2 * NKV) * HD)
    qw, kw = (torch.rand(HD) + 0.5, torch.rand(HD) + 0.5) if norm else (None, None)
    rope = RopeInputs(rotary.cos, rotary.sin, qw, kw, EPS)
    small = SmallBatchDecode(NH, NKV, HD, HD ** -0.5, max_rows=B + 1, page_table=table)
    small.plan(B + 1, slots, lens)  # one padded row
    out = torch.full((B + 1, NH, HD), float("nan"))
    small.bind_qkv(B + 1, out_loc)(qkv, rope, k_pages, v_pages, out)
    # the reference: norms and rotary in torch, the new k and v stored, softmax attention
    q, k, v = qkv.view(B + 1, -1, HD).split([NH, NKV, NKV], dim=1)
    if norm:
        q, k = normed(q, qw), normed(k, kw)
    pos = torch.tensor([n - 1 for n in lens] + [0])
    q, k = rotary(pos, q, k)
    kf, vf = before_k.reshape(-1, NKV, HD).clone(), before_v.reshape(-1, NKV, HD).clone()
    kf[out_loc], vf[out_loc] = k, v
    stored = k_pages.reshape(-1, NKV, HD)
    assert torch.allclose(stored, kf, atol=1e-5), "the new keys stored at their locations"
    assert torch.equal(v_pages.reshape(-1, NKV, HD), vf), "the new values stored"
    for i, (slot, n) in enumerate(zip(slots, lens)):
        loc = table[slot, :n]
        kk = kf[loc].double().repeat_interleave(NH // NKV, dim=1)  # (n, NH, HD)
        vv = vf[loc].double().repeat_interleave(NH // NKV, dim=1)
        sc = torch.einsum("hd,nhd->hn", q[i].double(), kk) * HD ** -0.5
        ref = torch.einsum("hn,nhd->hd", sc.softmax(-1), vv)
        err = ((out[i].double() - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (NH, lens, n, err)
    # the rotary kernel on the first row, storing its k and v at a location of its own
    kc, vc = torch.zeros(4, NKV, HD), torch.zeros(4, NKV, HD)
    q0, _ = fused.qk_norm_rope(qkv[:1], pos[:1], rotary.cos, rotary.sin, qw, kw, EPS, NH, NKV, HD,
                               (kc, vc, torch.tensor([2])))
    assert torch.allclose(q0[0], q[0], atol=1e-5) and torch.allclose(kc[2], k[0], atol=1e-5)
    assert torch.equal(vc[2], v[0]) and not kc[[0, 1, 3]].any()
print("fused small decode matches")
"""


@cpu_only
def test_small_batch_decode_in_the_triton_interpreter():
    assert "small decode matches" in run_interpreted(_INTERPRETED)


@cpu_only
def test_small_batch_decode_from_the_fused_projection_in_the_triton_interpreter():
    assert "fused small decode matches" in run_interpreted(_INTERPRETED_QKV)
