"""The attention backend interface: plan once per step, then run for every layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from radixserve.engine.kvcache.pool import KVCachePool


@dataclass
class StepLayout:
    """Where a step's tokens sit. Requests are laid out back to back in the flat token axis.

    For request i: its new tokens are positions [prefix_lens[i], seq_lens[i]) of its sequence, and
    its KV locations for positions [0, seq_lens[i]) are page_table[slots[i], :seq_lens[i]].
    """

    slots: torch.Tensor  # (B,) int64, device
    prefix_lens: list[int]  # host
    seq_lens: list[int]  # host
    out_loc: torch.Tensor  # (T,) int64 KV locations of the new tokens, device
    page_table: torch.Tensor  # (max_slots, width) int64, device
    page_size: int

    @property
    def extend_lens(self) -> list[int]:
        return [s - p for s, p in zip(self.seq_lens, self.prefix_lens)]

    @property
    def is_decode(self) -> bool:
        return all(e == 1 for e in self.extend_lens)


class AttentionMetadata:
    """Backend-specific per-step state built by `prepare`."""


class AttentionBackend(ABC):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, device: torch.device) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.device = device

    @abstractmethod
    def prepare(self, layout: StepLayout) -> AttentionMetadata:
        """Build per-step metadata once; every layer reuses it."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                meta: AttentionMetadata, kv_pool: KVCachePool) -> torch.Tensor:
        """Store k/v at meta's out_loc, then causal attention of q over each request's whole context.

        Shapes: q (T, nh, hd), k and v (T, nkv, hd) -> (T, nh, hd).
        """
