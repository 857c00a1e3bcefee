"""The seeded draw: argmax over the vocabulary of logits / T + Gumbel noise, noise from a hash.

argmax(l / T + g) with g = -log(-log(u)), u uniform, picks token i with probability
softmax(l / T)_i, so no softmax is needed. u comes from a 32-bit hash of (the row's key, token id),
and the key from a hash of (the request's seed, the output index sampled): a seeded request draws
the same tokens whatever shares its batch, with no generator state and no host sync.

On CUDA a Triton kernel derives each row's key and walks the vocabulary once, hashing and comparing
on the fly, in logits of any float dtype. Each row's vocabulary is split over several programs
where rows are few (a row alone in one program took 85 us on an H200), and a second kernel picks
each row's winner among its parts. The torch version below does the same arithmetic through (S, V)
int64 temporaries, which at 256 rows x 152k tokens is gigabytes of memory traffic per step.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

M32 = 0xFFFFFFFF
MIX = 0x45D9F3B
TOKEN_SALT = 0x9E3779B9
SEED_SALT = 0x632BE5AB
_BLOCK = 2048
_PROGRAMS_PER_SM = 4  # parts of the vocabulary in flight per SM when rows are few


class PoolWrite(NamedTuple):
    """Where the sampled ids go besides the result: pool[slots[i], positions[i]] = token of row i
    (the token pool the next step reads its inputs from)."""

    pool: torch.Tensor  # (slots, width) int64
    slots: torch.Tensor  # (S,) int64
    positions: torch.Tensor  # (S,) int64

    def write(self, tokens: torch.Tensor) -> None:
        """The write where no kernel does it (a greedy argmax, the torch draw)."""
        self.pool[self.slots, self.positions] = tokens


class RowSeeds(NamedTuple):
    """What a row's key derives from (device tensors, (S,) int64 each)."""

    lo: torch.Tensor  # the low 32 bits of the request's seed
    hi: torch.Tensor  # its high 32 bits
    step: torch.Tensor  # the output index being sampled


def mix32(x: torch.Tensor) -> torch.Tensor:
    # Integer avalanche on 32-bit values held in int64 (products stay below 2^59: no overflow).
    x = ((x ^ (x >> 16)) * MIX) & M32
    x = ((x ^ (x >> 16)) * MIX) & M32
    return x ^ (x >> 16)


def row_keys(seeds: RowSeeds) -> torch.Tensor:
    """(S,) int64 < 2^32: one noise stream per (seed, output index)."""
    key = mix32(seeds.lo ^ mix32(seeds.hi + SEED_SALT))
    return mix32(key ^ (seeds.step & M32))


@functools.cache
def _token_hash(vocab: int, device: torch.device) -> torch.Tensor:
    """(V,) the per-token half of the hash; the same for every row and step, so built once."""
    return mix32(torch.arange(vocab, dtype=torch.int64, device=device) + TOKEN_SALT)


# The largest float32 below 1. A 32-bit noise value within 128 of 2^32 rounds to 1.0 in float32,
# whose Gumbel noise is +inf: a banned token's -inf logit then scores NaN, which argmax picks.
U_MAX = 1.0 - 2.0**-24


def _uniform(noise: torch.Tensor) -> torch.Tensor:
    # in (0, 1), never 0 or 1
    return ((noise.to(torch.float32) + 0.5) * (1.0 / 4294967296.0)).clamp_(max=U_MAX)


def race_torch(logits: torch.Tensor, temperature: torch.Tensor, key: torch.Tensor,
               greedy: torch.Tensor) -> torch.Tensor:
    """logits (S, V) float, -inf where banned; temperature (S, 1); key (S,) int64 < 2^32;
    greedy (S,)."""
    token_hash = _token_hash(logits.size(1), logits.device)
    gumbel = -torch.log(-torch.log(_uniform(mix32(key[:, None] ^ token_hash[None, :]))))
    scores = logits.float() / temperature + torch.where(greedy[:, None], 0.0, gumbel)
    return scores.argmax(dim=-1)


if triton is not None:

    @triton.jit
    def _mix(x):  # mix32 on uint32: the product wraps mod 2^32 as the int64 version's mask does
        x = (x ^ (x >> 16)) * 0x45D9F3B
        x = (x ^ (x >> 16)) * 0x45D9F3B
        return x ^ (x >> 16)

    @triton.jit
    def _row_key(key_ptr, lo_ptr, hi_ptr, step_ptr, row, DERIVE: tl.constexpr):
        if DERIVE:  # row_keys, in registers
            hi = tl.load(hi_ptr + row) + 0x632BE5AB  # SEED_SALT: up to 2^33 in int64
            # mix32's first product keeps 32 bits, which depend only on the low 32 bits of
            # hi ^ (hi >> 16): the carry of the salted sum reaches them through the shift.
            h = (hi ^ (hi >> 16)).to(tl.uint32) * 0x45D9F3B
            h = (h ^ (h >> 16)) * 0x45D9F3B
            h = h ^ (h >> 16)
            key = _mix(tl.load(lo_ptr + row).to(tl.uint32) ^ h)
            key = _mix(key ^ tl.load(step_ptr + row).to(tl.uint32))
        else:
            key = tl.load(key_ptr + row).to(tl.uint32)
        return key

    @triton.jit(do_not_specialize=["parts", "blocks"])
    def _race_kernel(logits_ptr, stride, temp_ptr, key_ptr, lo_ptr, hi_ptr, step_ptr, greedy_ptr,
                     best_ptr, best_idx_ptr, V, parts, blocks, BLOCK: tl.constexpr,
                     DERIVE: tl.constexpr):
        """Program (row, part): the best score of the part's `blocks` blocks of columns and its
        first column, into best_ptr / best_idx_ptr[row * parts + part]."""
        row = tl.program_id(0)
        part = tl.program_id(1)
        inv_t = 1.0 / tl.load(temp_ptr + row)
        key = _row_key(key_ptr, lo_ptr, hi_ptr, step_ptr, row, DERIVE)
        noisy = tl.load(greedy_ptr + row) == 0
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        best_idx = tl.zeros((BLOCK,), tl.int32)
        first = part * blocks * BLOCK
        for b in range(0, blocks):
            idx = first + b * BLOCK + tl.arange(0, BLOCK)
            mask = idx < V
            s = tl.load(logits_ptr + row * stride + idx, mask=mask,
                        other=float("-inf")).to(tl.float32) * inv_t
            salted = (idx.to(tl.int64) + 0x9E3779B9).to(tl.uint32)  # TOKEN_SALT
            u = (_mix(key ^ _mix(salted)).to(tl.float32) + 0.5) * (1.0 / 4294967296.0)
            u = tl.minimum(u, 0.99999994)  # U_MAX: never 1.0, whose noise would be +inf
            s += tl.where(noisy, -tl.log(-tl.log(u)), 0.0)
            take = s > best  # strict: each lane keeps its first maximum, as argmax does
            best = tl.where(take, s, best)
            best_idx = tl.where(take, idx, best_idx)
        top = tl.max(best, axis=0)
        tl.store(best_ptr + row * parts + part, top)
        tl.store(best_idx_ptr + row * parts + part,
                 tl.min(tl.where(best == top, best_idx, V), axis=0))

    @triton.jit(do_not_specialize=["parts"])
    def _pick_kernel(best_ptr, best_idx_ptr, out_ptr, parts, pool_ptr, slots_ptr, pos_ptr,
                     pool_stride, PARTS: tl.constexpr, STORE: tl.constexpr):
        """Each row's winner among its parts: the best score, the first column among equals;
        with STORE also into the token pool at the row's slot and position (`PoolWrite`)."""
        row = tl.program_id(0)
        offs = tl.arange(0, PARTS)
        mask = offs < parts
        s = tl.load(best_ptr + row * parts + offs, mask=mask, other=float("-inf"))
        i = tl.load(best_idx_ptr + row * parts + offs, mask=mask, other=2147483647)
        top = tl.max(s, axis=0)
        token = tl.min(tl.where(s == top, i, 2147483647), axis=0).to(tl.int64)
        tl.store(out_ptr + row, token)
        if STORE:
            slot = tl.load(slots_ptr + row)
            tl.store(pool_ptr + slot * pool_stride + tl.load(pos_ptr + row), token)


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _parts(rows: int, vocab: int, device: torch.device) -> tuple[int, int]:
    """(parts, blocks): how many programs share a row's vocabulary, and how many blocks of
    _BLOCK columns each takes."""
    blocks = -(-vocab // _BLOCK)
    want = max(1, -(-_PROGRAMS_PER_SM * _num_sms(device) // rows))
    per_part = -(-blocks // min(want, blocks))
    return -(-blocks // per_part), per_part


# The two kernels' compile-time arguments and launch options (`bench resources` compiles the
# kernels with these too)
def race_constants(derive: bool) -> dict[str, int]:
    """`_race_kernel`'s: DERIVE, each row's key from its seed's words and step (seeded draws)."""
    return {"BLOCK": _BLOCK, "DERIVE": derive, "num_warps": 8}


def pick_constants(vocab: int, store: bool) -> dict[str, int]:
    """`_pick_kernel`'s: one build per vocabulary size, whatever the parts (a new build mid-serve
    would stall a step), and per STORE: the write into the pool rides in it, where an index_put
    was a launch a step."""
    return {"PARTS": triton.next_power_of_2(triton.cdiv(vocab, _BLOCK)), "STORE": store,
            "num_warps": 1}


def _launch(logits: torch.Tensor, temperature: torch.Tensor, greedy: torch.Tensor,
            key: torch.Tensor | None, seeds: RowSeeds | None,
            into: PoolWrite | None = None) -> torch.Tensor:
    S, V = logits.shape
    dev = logits.device
    out = torch.empty(S, dtype=torch.int64, device=dev)
    if not S:
        return out
    parts, blocks = _parts(S, V, dev)
    best = torch.empty(S * parts, dtype=torch.float32, device=dev)
    best_idx = torch.empty(S * parts, dtype=torch.int32, device=dev)
    if seeds is not None:
        key_args = (seeds.lo, seeds.lo.contiguous(), seeds.hi.contiguous(),
                    seeds.step.contiguous())
    else:
        assert key is not None
        k = key.contiguous()
        key_args = (k, k, k, k)
    # bool and int8 share a size: a view, where a cast was a kernel and an allocation a step
    flags = greedy.contiguous()
    flags = flags.view(torch.int8) if flags.dtype == torch.bool else flags.to(torch.int8)
    _race_kernel[(S, parts)](logits, logits.stride(0), temperature.reshape(S).contiguous(),
                             *key_args, flags, best, best_idx, V, parts, blocks,
                             **race_constants(derive=seeds is not None))
    pool = (into.pool, into.slots.contiguous(), into.positions.contiguous(), into.pool.stride(0)) \
        if into is not None else (out, out, out, 0)
    _pick_kernel[(S,)](best, best_idx, out, parts, *pool,
                       **pick_constants(V, store=into is not None))
    return out


def _on_triton(logits: torch.Tensor) -> bool:
    return triton is not None and logits.is_cuda and logits.stride(1) == 1


def race(logits: torch.Tensor, temperature: torch.Tensor, key: torch.Tensor,
         greedy: torch.Tensor) -> torch.Tensor:
    """(S,) int64 sampled ids; see race_torch for the arguments."""
    if not _on_triton(logits):
        return race_torch(logits, temperature, key, greedy)
    return _launch(logits, temperature, greedy, key, None)


def race_seeded(logits: torch.Tensor, temperature: torch.Tensor, seeds: RowSeeds,
                greedy: torch.Tensor, into: PoolWrite | None = None) -> torch.Tensor:
    """`race` with the keys `row_keys(seeds)`, which the kernel derives itself (on a CPU, a dozen
    elementwise ops; on CUDA they were as many kernel launches per step); the ids also written
    `into` the token pool where given."""
    if not _on_triton(logits):
        tokens = race_torch(logits, temperature, row_keys(seeds), greedy)
        if into is not None:
            into.write(tokens)
        return tokens
    return _launch(logits, temperature, greedy, None, seeds, into)
