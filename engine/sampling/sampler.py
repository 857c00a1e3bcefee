"""Batched sampling on the device: penalties, temperature, top-k / top-p / min-p, seeded draws.

Random draws are counter-based: the noise for (seed, output index, token id) is a hash, so a seeded
request samples the same tokens whatever else shares its batch, with no generator state and no host
sync. The draw itself (race.py) is a Gumbel-max over the tempered logits; top-k / top-p / min-p
only ban tokens (-inf) before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from radixserve.engine.constrained.bitmask import GrammarMask, apply_grammar_mask
from radixserve.engine.sampling.race import PoolWrite, RowSeeds, race_seeded


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
    grammar: GrammarMask | None  # what constrained rows' grammars allow; None: no such row
    num_top_logprobs: int  # host; 0 = none
    want_logprobs: bool  # host


class SampleOutput(NamedTuple):
    tokens: torch.Tensor  # (S,) int64
    logprobs: torch.Tensor | None  # (S,) logprob of each sampled token
    top_ids: torch.Tensor | None  # (S, n)
    top_logprobs: torch.Tensor | None  # (S, n)


class Sampler:
    def __call__(self, logits: torch.Tensor, sb: SamplingBatch, token_pool: torch.Tensor,
                 slots: torch.Tensor, positions: torch.Tensor) -> SampleOutput:
        """logits: (S, V) in the model's dtype, not modified. They are cast to float32 only where a
        step changes them or wants logprobs: the draw and a greedy argmax read them as they are
        (the cast of (256, 152k) logits cost as much as the draw itself). The sampled ids also go
        into token_pool[slots, positions] ((S,) each), where the next step reads its inputs: on
        CUDA the seeded draw's last kernel writes them there."""
        raw = logits
        if sb.grammar is not None:  # first, so that no later step can make a banned token win
            logits = apply_grammar_mask(logits, sb.grammar)  # a float32 copy
        elif sb.penalties is not None or sb.suppress is not None:
            logits = logits.float()  # a copy
        if sb.penalties is not None:
            self._apply_penalties(logits, sb.penalties, token_pool)
        if sb.suppress is not None:
            logits[sb.suppress[0], sb.suppress[1]] = float("-inf")
        into = PoolWrite(token_pool, slots, positions)
        if sb.all_greedy:
            tokens = logits.argmax(dim=-1)
            into.write(tokens)
        else:
            tokens = self._draw(logits, sb, into)
        if not sb.want_logprobs:
            return SampleOutput(tokens, None, None, None)
        logp = torch.log_softmax(raw.float(), dim=-1)  # logprobs of the model's own distribution
        chosen = logp.gather(1, tokens[:, None]).squeeze(1)
        if sb.num_top_logprobs == 0:
            return SampleOutput(tokens, chosen, None, None)
        top = logp.topk(sb.num_top_logprobs, dim=-1)
        return SampleOutput(tokens, chosen, top.indices, top.values)

    def _draw(self, logits: torch.Tensor, sb: SamplingBatch, into: PoolWrite) -> torch.Tensor:
        if sb.min_p is not None or sb.top_k is not None or sb.top_p is not None:
            logits = logits.float()
            logits = logits.masked_fill(~self._kept(logits, sb), float("-inf"))
        # one noise stream per (seed, output index), keyed inside the draw
        return race_seeded(logits, sb.temperature, RowSeeds(sb.seed_lo, sb.seed_hi, sb.step),
                           sb.greedy, into)

    @staticmethod
    def _kept(logits: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
        """(S, V) bool: the tokens top-k, top-p and min-p leave in the tempered distribution."""
        probs = torch.softmax(logits / sb.temperature, dim=-1)
        keep = torch.ones_like(probs, dtype=torch.bool)
        if sb.min_p is not None:
            keep &= probs >= sb.min_p * probs.max(dim=-1, keepdim=True).values
            probs = probs * keep
        if sb.top_k is not None or sb.top_p is not None:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = torch.zeros_like(sorted_p, dtype=torch.bool)
            if sb.top_k is not None:
                drop |= torch.arange(probs.size(1), device=probs.device)[None, :] >= sb.top_k
                sorted_p = sorted_p.masked_fill(drop, 0.0)
            if sb.top_p is not None:
                # Keep the smallest head whose mass reaches top_p of what is left (>= 1 token).
                csum = sorted_p.cumsum(dim=-1)
                drop |= csum - sorted_p > sb.top_p * csum[:, -1:]
            keep &= ~drop.scatter(1, order, drop)
        return keep

    @staticmethod
    def _apply_penalties(logits: torch.Tensor, pen: Penalties, token_pool: torch.Tensor) -> None:
        L = int(pen.seq_lens.max())
        toks = token_pool[pen.slots, :L]  # (R, L)
        pos = torch.arange(L, device=toks.device)[None, :]
        seen = pos < pen.seq_lens[:, None]
        out = seen & (pos >= pen.prompt_lens[:, None])
        V = logits.size(1)
        toks = toks.clamp(0, V - 1)
        zeros = lambda: torch.zeros(len(pen.rows), V, device=logits.device)
        counts = zeros().scatter_add_(1, toks, out.float())
        present = zeros().scatter_add_(1, toks, seen.float()) > 0
        sub = logits[pen.rows]
        sub = torch.where(present, torch.where(sub > 0, sub / pen.repetition, sub * pen.repetition),
                          sub)
        sub = sub - pen.frequency * counts - pen.presence * (counts > 0).float()
        logits[pen.rows] = sub
