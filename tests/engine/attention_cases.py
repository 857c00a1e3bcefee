"""Random paged-attention problems and a float64 reference, shared by the backend tests, and the
skip marks of backends whose optional packages are missing.

A case scatters each request's KV over shuffled pages of a pool filled with random values, so a
backend that reads the wrong page, slot or position cannot match the reference by luck.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Literal

import pytest
import torch
from radixserve.engine.attention import StepLayout
from radixserve.engine.kvcache.pool import KVCachePool

# "mixed" alternates chunks and decode rows; "served" lays a step out as the scheduler does: its
# decode rows first, then prompts and chunks; "long": decode rows, every eighth of 2,100-6,000
# keys (long prompts decoding beside short ones)
Kind = Literal["prefill", "chunked", "decode", "mixed", "served", "long"]
LAYERS, LAYER = 2, 1  # run layer 1 of 2, so a backend that ignores layer_id reads the wrong slice

# backend -> (the modules it can import, what the skip reason calls it)
OPTIONAL = {"flashinfer": (("flashinfer",), "flashinfer"),
            "fa": (("flash_attn_interface", "flash_attn"), "flash-attn")}


def backend_marks(backend: str) -> list[pytest.MarkDecorator]:
    """Skip marks for what a backend name ("fa", "fa,flashinfer", ...) needs and lacks here."""
    marks = []
    for part in backend.split(","):
        modules, label = OPTIONAL.get(part, ((), ""))
        if modules and not any(importlib.util.find_spec(m) is not None for m in modules):
            marks.append(pytest.mark.skip(reason=f"{label} missing"))
    return marks


@dataclass
class Case:
    layout: StepLayout
    pool: KVCachePool
    q: torch.Tensor  # (T, nh, hd)
    k: torch.Tensor  # (T, nkv, hd)
    v: torch.Tensor  # (T, nkv, hd)
    slots: list[int]
    prefix_lens: list[int]
    seq_lens: list[int]
    spare_page: int  # a page no request uses (a dummy page for padded rows)


def _lengths(kind: Kind, batch: int, page_size: int,
             g: torch.Generator) -> tuple[list[int], list[int]]:
    def rnd(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    prefix, ext = [], []
    for i in range(batch):
        row = kind
        if kind == "mixed":
            row = "decode" if i % 2 else "chunked"
        elif kind == "served":
            row = "decode" if i < (batch + 1) // 2 or batch == 1 else ("prefill", "chunked")[i % 2]
        elif kind == "long":
            row = "decode" if i % 8 else "long"
        if row == "long":
            prefix.append(rnd(2100, 6000)), ext.append(1)
        elif row == "prefill":
            prefix.append(0), ext.append(rnd(1, 160))
        elif row == "decode":
            prefix.append(rnd(0, 300)), ext.append(1)
        else:  # a chunk after a cached, page-aligned prefix (or an earlier chunk)
            prefix.append(rnd(0, 300 // page_size) * page_size), ext.append(rnd(1, 96))
    return prefix, ext


def make_case(kind: Kind, batch: int, page_size: int, num_heads: int, num_kv_heads: int,
              head_dim: int, dtype: torch.dtype, device: torch.device, seed: int) -> Case:
    g = torch.Generator().manual_seed(seed)
    P = page_size
    prefix, ext = _lengths(kind, batch, P, g)
    seq = [p + e for p, e in zip(prefix, ext)]
    max_slots = batch + 3
    slots = torch.randperm(max_slots, generator=g)[:batch].tolist()
    width = -(-max(seq) // P) * P
    need = sum(-(-s // P) for s in seq)
    num_pages = need + 7  # spare pages keep random garbage that must never be read
    order = torch.randperm(num_pages, generator=g)
    page_table = torch.zeros(max_slots, width, dtype=torch.int64)
    used = 0
    for slot, s in zip(slots, seq):
        n = -(-s // P)
        pages = order[used : used + n]
        used += n
        page_table[slot, : n * P] = (pages[:, None] * P + torch.arange(P)).flatten()
    pool = KVCachePool(LAYERS, num_pages, P, num_kv_heads, head_dim, dtype, device)
    pool.k.copy_(torch.randn(pool.k.shape, generator=g))
    pool.v.copy_(torch.randn(pool.v.shape, generator=g))
    T = sum(ext)
    q = torch.randn(T, num_heads, head_dim, generator=g).to(device, dtype)
    # v as a strided view, the way the fused QKV projection hands it over
    kv = torch.randn(T, 2 * num_kv_heads * head_dim + 8, generator=g).to(device, dtype)
    k = kv[:, : num_kv_heads * head_dim].reshape(T, num_kv_heads, head_dim).contiguous()
    v = kv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(T, num_kv_heads, head_dim)
    out_loc = torch.cat([page_table[s, p:e] for s, p, e in zip(slots, prefix, seq)])
    page_table = page_table.to(device)
    layout = StepLayout(torch.tensor(slots, device=device), prefix, seq, out_loc.to(device),
                        page_table, P)
    return Case(layout, pool, q, k, v, slots, prefix, seq, int(order[need]))


def reference(case: Case, scale: float) -> torch.Tensor:
    """float64 causal attention over each request's whole context, the new K/V included."""
    k_all = case.pool.k[LAYER].double().clone()
    v_all = case.pool.v[LAYER].double().clone()
    loc = case.layout.out_loc
    k_all[loc], v_all[loc] = case.k.double(), case.v.double()
    nh, nkv = case.q.size(1), case.k.size(1)
    outs, start = [], 0
    for slot, p, s in zip(case.slots, case.prefix_lens, case.seq_lens):
        locs = case.layout.page_table[slot, :s]
        K = k_all[locs].repeat_interleave(nh // nkv, dim=1)  # (s, nh, hd)
        V = v_all[locs].repeat_interleave(nh // nkv, dim=1)
        Q = case.q[start : start + s - p].double()  # (e, nh, hd)
        scores = torch.einsum("qhd,khd->hqk", Q, K) * scale
        qpos = torch.arange(p, s, device=Q.device)[:, None]
        scores = scores.masked_fill(torch.arange(s, device=Q.device)[None, :] > qpos, -math.inf)
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), V))
        start += s - p
    return torch.cat(outs)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; NaN or Inf anywhere gives inf, so it never passes."""
    out = out.double()
    if not torch.isfinite(out).all():
        return math.inf
    return float((out - ref).norm() / ref.norm())


def check_store(case: Case) -> None:
    """The backend wrote this step's K/V at out_loc (layer LAYER only)."""
    loc = case.layout.out_loc
    torch.testing.assert_close(case.pool.k[LAYER][loc], case.k.to(case.pool.k.dtype), rtol=0,
                               atol=0)
    torch.testing.assert_close(case.pool.v[LAYER][loc], case.v.to(case.pool.v.dtype), rtol=0,
                               atol=0)


def assert_bound_layers_match(backend, case: Case, meta, out: torch.Tensor) -> None:
    """`bind_layers` (the piecewise graphs' way: q and the output bound once a step) writes what
    `attend` returned, at the layer it is called for: layer 0 holds nothing of this step, so a
    call that ignores its layer_id reads the wrong keys."""
    q = case.q.contiguous().clone()
    got = torch.full_like(out, float("nan"))
    call = backend.bind_layers(q, got, meta, case.pool)
    call(LAYER)
    torch.testing.assert_close(got, out, rtol=0, atol=0)
    q.mul_(0.5)  # the bound call reads the buffer's contents when called, not when bound
    call(LAYER)
    torch.testing.assert_close(got, backend.attend(q, LAYER, meta, case.pool), rtol=0, atol=0)
