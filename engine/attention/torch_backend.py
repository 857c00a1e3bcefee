"""The reference backend: pad the ragged batch, gather paged K/V, masked SDPA. CPU and GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from radixserve.engine.attention.base import AttentionBackend, AttentionMetadata, StepLayout

if TYPE_CHECKING:
    from radixserve.engine.kvcache.pool import KVCachePool


@dataclass
class TorchMetadata(AttentionMetadata):
    kv_index: torch.Tensor  # (B, L) KV locations, padded with a valid location
    q_index: torch.Tensor  # (B, Q) flat token index of each padded query row
    mask: torch.Tensor  # (B, 1, Q, L) True where query may attend
    flat_index: torch.Tensor  # (T,) position of each real token in the (B*Q) padded layout


class TorchBackend(AttentionBackend):
    def prepare(self, layout: StepLayout) -> TorchMetadata:
        dev = self.device
        seq = torch.tensor(layout.seq_lens, dtype=torch.int64)
        pre = torch.tensor(layout.prefix_lens, dtype=torch.int64)
        ext = seq - pre
        B, L, Q = len(layout.seq_lens), int(seq.max()), int(ext.max())
        starts = torch.cumsum(ext, 0) - ext  # flat offset of each request's first new token
        qpos = torch.arange(Q)
        q_valid = qpos[None, :] < ext[:, None]  # (B, Q)
        q_index = torch.where(q_valid, starts[:, None] + qpos[None, :], 0)
        kpos = torch.arange(L)
        # Query t of request b sits at absolute position pre[b] + t and sees keys at <= that.
        mask = ((kpos[None, None, :] <= (pre[:, None, None] + qpos[None, :, None]))
                & (kpos[None, None, :] < seq[:, None, None]))
        mask[:, :, 0] |= ~q_valid  # padded query rows see one key, so softmax stays finite
        kv_index = layout.page_table[layout.slots, :L]  # (B, L) on device
        flat_index = (torch.arange(B)[:, None] * Q + qpos[None, :])[q_valid]
        return TorchMetadata(layout.out_loc, kv_index, q_index.to(dev), mask.unsqueeze(1).to(dev),
                             flat_index.to(dev))

    def attend(self, q: torch.Tensor, layer_id: int, meta: AttentionMetadata,
               kv_pool: KVCachePool, out: torch.Tensor | None = None) -> torch.Tensor:
        assert isinstance(meta, TorchMetadata)
        B, Q = meta.q_index.shape
        qp = q[meta.q_index].transpose(1, 2)  # (B, nh, Q, hd)
        kp = kv_pool.k[layer_id][meta.kv_index].to(q.dtype).transpose(1, 2)  # (B, nkv, L, hd)
        vp = kv_pool.v[layer_id][meta.kv_index].to(q.dtype).transpose(1, 2)
        o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=meta.mask, scale=self.scale,
                                           enable_gqa=self.num_heads != self.num_kv_heads)
        o = o.transpose(1, 2).reshape(B * Q, self.num_heads, self.head_dim)  # (B*Q, nh, hd)
        if out is None:
            return o[meta.flat_index]
        return torch.index_select(o, 0, meta.flat_index, out=out)
