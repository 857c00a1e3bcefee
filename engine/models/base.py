"""The decoder-only transformer that Qwen3, Llama and Qwen2 share; model files pick its options."""

from __future__ import annotations

from typing import ClassVar

import torch
from radixserve.engine.context import get_forward_context
from radixserve.engine.layers.attention import RopeAttention
from radixserve.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from radixserve.engine.layers.mlp import GatedMLP
from radixserve.engine.layers.norm import RMSNorm
from radixserve.engine.layers.rotary import RotaryEmbedding
from radixserve.engine.models.config import ModelArgs
from torch import nn


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int, rotary: RotaryEmbedding,
                 qk_norm: bool) -> None:
        super().__init__()
        self.self_attn = RopeAttention(layer_id, args.hidden_size, args.num_heads,
                                       args.num_kv_heads,
                                       args.head_dim, rotary, args.attention_bias,
                                       args.rms_norm_eps if qk_norm else None)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def before_attention(self, positions: torch.Tensor, x: torch.Tensor,
                         residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output (T, hidden); residual: the stream before it (None at
        layer 0). Returns this layer's queries (T, nh, hd), its k and v stored, and the residual
        stream. Each add into the stream is fused with the norm that follows it, and at a batch of
        1-2 rows the norm with the projection that follows it (one GEMV kernel)."""
        qkv, residual = self.self_attn.qkv_proj.normed(x, residual, self.input_layernorm)
        return self.self_attn.qkv_to_q(positions, qkv), residual

    def after_attention(self, attn_out: torch.Tensor,
                        residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """attn_out (T, nh, hd) -> (the MLP's output (T, hidden), the residual stream)."""
        h = self.self_attn.output(attn_out)
        return self.mlp.normed(h, residual, self.post_attention_layernorm)


class DecoderModel(nn.Module):
    def __init__(self, args: ModelArgs, qk_norm: bool) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(args.vocab_size, args.hidden_size)
        rotary = RotaryEmbedding(args.head_dim, args.max_position_embeddings, args.rope_theta,
                                 args.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(args, i, rotary, qk_norm)
                                    for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    @property
    def num_pieces(self) -> int:
        return len(self.layers) + 1

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: (T,) -> hidden states (T, hidden). The pieces below with the
        attention between them: the piecewise CUDA graphs replay exactly this sequence."""
        ctx = get_forward_context()
        attend, meta, pool = ctx.backend.attend, ctx.metadata, ctx.kv_pool
        x, residual = self.piece(0, input_ids, positions, None, None)
        for i in range(len(self.layers)):
            x, residual = self.piece(i + 1, input_ids, positions, attend(x, i, meta, pool),
                                     residual)
        return x

    def piece(self, k: int, input_ids: torch.Tensor, positions: torch.Tensor,
              attn_out: torch.Tensor | None,
              residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The work between attention k - 1 and attention k, k = 0..L: the embedding (k = 0) or
        layer k - 1's output projection and MLP, then layer k's norm, qkv projection, q/k norms,
        rotary and KV store. Returns (layer k's queries (T, nh, hd), residual (T, hidden)), or at
        k = L (the final hidden states (T, hidden), residual)."""
        if k == 0:
            x, residual = self.embed_tokens(input_ids), None
        else:
            assert attn_out is not None and residual is not None
            x, residual = self.layers[k - 1].after_attention(attn_out, residual)
        if k == len(self.layers):
            return self.norm(x, residual)[0], residual
        return self.layers[k].before_attention(positions, x, residual)


class CausalLM(nn.Module):
    """Base of all models: `forward` gives hidden states, `compute_logits` the (B, vocab) logits."""

    qk_norm: ClassVar[bool] = False
    # checkpoint name fragment -> (our parameter fragment, shard id for its weight_loader)
    packed_modules_mapping: ClassVar[dict[str, tuple[str, str | int]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = DecoderModel(args, self.qk_norm)
        self.lm_head = ParallelLMHead(args.vocab_size, args.hidden_size)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)
