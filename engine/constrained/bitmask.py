"""The per-step token bitmask of constrained rows: filled on the host, applied on the device.

Bit t of row r (word t // 32, bit t % 32) is 1 when token t is allowed. Only constrained rows get a
row of the mask; a batch without one builds nothing, and the sampler skips the step entirely.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
from radixserve.engine.constrained.matcher import GrammarMatcher


class HostGrammarMask(NamedTuple):
    rows: list[int]  # the sampled rows (of the step's logits) that are constrained
    bits: torch.Tensor  # (G, ceil(V / 32)) int32, cpu (pinned on CUDA)


class GrammarMask(NamedTuple):
    rows: torch.Tensor  # (G,) int64, on the device
    bits: torch.Tensor  # (G, ceil(V / 32)) int32, on the device


def fill_grammar_mask(matchers: Sequence[GrammarMatcher | None], vocab_size: int,
                      pin: bool = False) -> HostGrammarMask | None:
    """One mask row per matcher that is not None (one per sampled row); None when all are."""
    rows = [j for j, m in enumerate(matchers) if m is not None]
    if not rows:
        return None
    words = -(-vocab_size // 32)
    bits = torch.empty((len(rows), words), dtype=torch.int32, pin_memory=pin)
    GrammarMatcher.fill_rows([m for m in matchers if m is not None], bits)
    return HostGrammarMask(rows, bits)


def to_device(mask: HostGrammarMask, device: torch.device) -> GrammarMask:
    """The copies do not wait for the host (the bits are pinned on CUDA)."""
    return GrammarMask(torch.tensor(mask.rows, dtype=torch.int64).to(device, non_blocking=True),
                       mask.bits.to(device, non_blocking=True))


def apply_grammar_mask(logits: torch.Tensor, mask: GrammarMask) -> torch.Tensor:
    """logits (S, V) -> a float32 copy where the tokens each constrained row may not take are
    -inf."""
    V = logits.size(1)
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((mask.bits[:, :, None] >> shifts) & 1).bool().flatten(1)[:, :V]  # (G, V)
    out = logits.to(torch.float32, copy=True)
    out[mask.rows] = out[mask.rows].masked_fill(~allowed, float("-inf"))
    return out
