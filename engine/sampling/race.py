"""The seeded draw: argmax over the vocabulary of logits / T + Gumbel noise, noise from a hash.

argmax(l / T + g) with g = -log(-log(u)), u uniform, picks token i with probability
softmax(l / T)_i, so no softmax is needed. u comes from a 32-bit hash of (the row's key, token id):
a seeded request draws the same tokens whatever shares its batch, with no generator state and no
host sync.

On CUDA one Triton program per row walks the vocabulary once, hashing and comparing on the fly;
the torch version below does the same arithmetic through (S, V) int64 temporaries, which at 256
rows x 152k tokens is gigabytes of memory traffic per step.
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

M32 = 0xFFFFFFFF
MIX = 0x45D9F3B
TOKEN_SALT = 0x9E3779B9
_BLOCK = 2048


def mix32(x: torch.Tensor) -> torch.Tensor:
    # Integer avalanche on 32-bit values held in int64 (products stay below 2^59: no overflow).
    x = ((x ^ (x >> 16)) * MIX) & M32
    x = ((x ^ (x >> 16)) * MIX) & M32
    return x ^ (x >> 16)


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
    scores = logits / temperature + torch.where(greedy[:, None], 0.0, gumbel)
    return scores.argmax(dim=-1)


if triton is not None:

    @triton.jit
    def _mix(x):  # mix32 on uint32: the product wraps mod 2^32 as the int64 version's mask does
        x = (x ^ (x >> 16)) * 0x45D9F3B
        x = (x ^ (x >> 16)) * 0x45D9F3B
        return x ^ (x >> 16)

    @triton.jit
    def _race_kernel(logits_ptr, stride, temp_ptr, key_ptr, greedy_ptr, out_ptr, V,
                     BLOCK: tl.constexpr):
        row = tl.program_id(0)
        inv_t = 1.0 / tl.load(temp_ptr + row)
        key = tl.load(key_ptr + row).to(tl.uint32)
        noisy = tl.load(greedy_ptr + row) == 0
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        best_idx = tl.zeros((BLOCK,), tl.int32)
        for start in range(0, V, BLOCK):
            idx = start + tl.arange(0, BLOCK)
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
        tl.store(out_ptr + row, tl.min(tl.where(best == top, best_idx, V), axis=0).to(tl.int64))


def race(logits: torch.Tensor, temperature: torch.Tensor, key: torch.Tensor,
         greedy: torch.Tensor) -> torch.Tensor:
    """(S,) int64 sampled ids; see race_torch for the arguments."""
    if triton is None or not logits.is_cuda or logits.stride(1) != 1:
        return race_torch(logits, temperature, key, greedy)
    S, V = logits.shape
    out = torch.empty(S, dtype=torch.int64, device=logits.device)
    if S:
        _race_kernel[(S,)](logits, logits.stride(0), temperature.reshape(S).contiguous(),
                           key.contiguous(),
                           greedy.to(torch.int8).contiguous(), out, V, BLOCK=_BLOCK, num_warps=8)
    return out
