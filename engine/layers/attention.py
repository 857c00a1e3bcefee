"""Self-attention with rotary embeddings; the attention math itself is the backend's."""

from __future__ import annotations

import torch
from radixserve.engine.context import get_forward_context
from radixserve.engine.layers import fused
from radixserve.engine.layers.linear import QKVParallelLinear, RowParallelLinear
from radixserve.engine.layers.norm import RMSNorm
from radixserve.engine.layers.rotary import RotaryEmbedding
from torch import nn


class RopeAttention(nn.Module):
    def __init__(self, layer_id: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rotary: RotaryEmbedding, qkv_bias: bool, qk_norm_eps: float | None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.qkv_proj = QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads, qkv_bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.head_dim = head_dim
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden, bias=False)
        self.rotary = rotary
        # Qwen3 normalises each head's q and k before the rotation.
        self.q_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(head_dim, qk_norm_eps) if qk_norm_eps is not None else None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """positions: (T,); x: (T, hidden) -> (T, hidden)."""
        q = self.qkv_to_q(positions, self.qkv_proj(x))
        ctx = get_forward_context()
        return self.output(ctx.backend.attend(q, self.layer_id, ctx.metadata, ctx.kv_pool))

    def qkv_to_q(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        """Everything between the projection and the attention: q/k norms, rotary, and the store of
        the step's k and v into the KV cache. qkv (T, (nh + 2 nkv) * hd) -> q (T, nh, hd)."""
        T = qkv.size(0)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        ctx = get_forward_context()
        pool, loc = ctx.kv_pool, ctx.metadata.out_loc
        if fused.usable(qkv) and fused.rope_supported(self.head_dim) and qkv.stride(-1) == 1:
            # q/k norm, rotary and the KV store in one kernel
            qn, kn = self.q_norm, self.k_norm
            q, _ = fused.qk_norm_rope(qkv, positions, self.rotary.cos, self.rotary.sin,
                                      qn.weight if qn else None, kn.weight if kn else None,
                                      qn.eps if qn else 0.0, self.num_heads, self.num_kv_heads,
                                      self.head_dim,
                                      (pool.k[self.layer_id], pool.v[self.layer_id], loc))
            return q
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        pool.store(self.layer_id, loc, k, v)
        return q

    def output(self, attn_out: torch.Tensor) -> torch.Tensor:
        """The output projection: attention output (T, nh, hd) -> (T, hidden)."""
        return self.o_proj(attn_out.reshape(attn_out.size(0), self.num_heads * self.head_dim))
