"""Batched sampling on the device: penalties, temperature, top-k / top-p / min-p, seeded draws.

Random draws are counter-based: the noise for (seed, output index, token id) is a hash, so a seeded
request samples the same tokens whatever else shares its batch, with no generator state and no host
sync. A draw is the "exponential race": argmax(p / E) with E ~ Exp(1) picks token i with prob p_i.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # Integer avalanche on 32-bit values held in int64 (products stay below 2^59: no overflow).
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & M32
    return x ^ (x >> 16)


@dataclass
class Penalties:
    rows: torch.Tensor  # (R,) rows of the logits that carry penalties
    slots: torch.Tensor  # (R,) token-pool rows of those requests
    prompt_lens: torch.Tensor  # (R,)
    seq_lens: torch.Tensor  # (R,) tokens before the position being sampled
    repetition: torch.Tensor  # (R, 1)
    frequency: torch.Tensor  # (R, 1)
    presence: torch.Tensor  # (R, 1)


@dataclass
class SamplingBatch:
    """Per-step sampling inputs for S rows (device tensors unless noted)."""

    all_greedy: bool
    greedy: torch.Tensor  # (S,) bool
    temperature: torch.Tensor  # (S, 1), 1.0 where greedy
    top_k: torch.Tensor | None  # (S, 1) int64, vocab size where disabled; None if no row uses it
    top_p: torch.Tensor | None  # (S, 1)
    min_p: torch.Tensor | None  # (S, 1)
    seed_lo: torch.Tensor  # (S,) int64
    seed_hi: torch.Tensor  # (S,) int64
    step: torch.Tensor  # (S,) int64 output index being sampled
    penalties: Penalties | None
    suppress: tuple[torch.Tensor, torch.Tensor] | None  # (rows, token ids) banned this step
    num_top_logprobs: int  # host; 0 = none
    want_logprobs: bool  # host


class SampleOutput(NamedTuple):
    tokens: torch.Tensor  # (S,) int64
    logprobs: torch.Tensor | None  # (S,) logprob of each sampled token
    top_ids: torch.Tensor | None  # (S, n)
    top_logprobs: torch.Tensor | None  # (S, n)


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self._token_hash = _mix32(torch.arange(vocab_size, dtype=torch.int64, device=device) + 0x9E3779B9)

    def __call__(self, logits: torch.Tensor, sb: SamplingBatch, token_pool: torch.Tensor) -> SampleOutput:
        """logits: (S, V) float32 (not modified in place when logprobs are wanted)."""
        raw = logits
        if sb.penalties is not None or sb.suppress is not None:
            logits = logits.clone()
        if sb.penalties is not None:
            self._apply_penalties(logits, sb.penalties, token_pool)
        if sb.suppress is not None:
            logits[sb.suppress[0], sb.suppress[1]] = float("-inf")
        tokens = logits.argmax(dim=-1)
        if not sb.all_greedy:
            tokens = torch.where(sb.greedy, tokens, self._draw(logits, sb))
        if not sb.want_logprobs:
            return SampleOutput(tokens, None, None, None)
        logp = torch.log_softmax(raw, dim=-1)  # logprobs of the model's own distribution
        chosen = logp.gather(1, tokens[:, None]).squeeze(1)
        if sb.num_top_logprobs == 0:
            return SampleOutput(tokens, chosen, None, None)
        top = logp.topk(sb.num_top_logprobs, dim=-1)
        return SampleOutput(tokens, chosen, top.indices, top.values)

    def _draw(self, logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
        probs = torch.softmax(logits / sb.temperature, dim=-1)
        if sb.min_p is not None:
            probs = probs.masked_fill(probs < sb.min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
        if sb.top_k is not None or sb.top_p is not None:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            if sb.top_k is not None:
                rank = torch.arange(probs.size(1), device=probs.device)[None, :]
                sorted_p = sorted_p.masked_fill(rank >= sb.top_k, 0.0)
            if sb.top_p is not None:
                # Keep the smallest head whose mass reaches top_p of what is left (at least one token).
                csum = sorted_p.cumsum(dim=-1)
                sorted_p = sorted_p.masked_fill(csum - sorted_p > sb.top_p * csum[:, -1:], 0.0)
            probs = probs.scatter(1, order, sorted_p)
        h = _mix32(sb.seed_lo ^ _mix32(sb.seed_hi + 0x632BE5AB))
        h = _mix32(h ^ (sb.step & M32))
        noise = _mix32(h[:, None] ^ self._token_hash[None, :])  # (S, V) uniform 32-bit integers
        exp = -torch.log((noise.to(torch.float32) + 0.5) * (1.0 / 4294967296.0))
        return (probs / exp).argmax(dim=-1)

    @staticmethod
    def _apply_penalties(logits: torch.Tensor, pen: Penalties, token_pool: torch.Tensor) -> None:
        L = int(pen.seq_lens.max())
        toks = token_pool[pen.slots, :L]  # (R, L)
        pos = torch.arange(L, device=toks.device)[None, :]
        seen = pos < pen.seq_lens[:, None]
        out = seen & (pos >= pen.prompt_lens[:, None])
        V = logits.size(1)
        toks = toks.clamp(0, V - 1)
        counts = torch.zeros(len(pen.rows), V, device=logits.device).scatter_add_(1, toks, out.float())
        present = torch.zeros(len(pen.rows), V, device=logits.device).scatter_add_(1, toks, seen.float()) > 0
        sub = logits[pen.rows]
        sub = torch.where(present, torch.where(sub > 0, sub / pen.repetition, sub * pen.repetition), sub)
        sub = sub - pen.frequency * counts - pen.presence * (counts > 0).float()
        logits[pen.rows] = sub
