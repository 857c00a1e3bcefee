"""The decoder-only transformer that Qwen3, Llama and Qwen2 share; model files pick its options."""

from __future__ import annotations

from typing import ClassVar

import torch
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

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous sublayer's output (T, hidden); residual: the stream before it (None at
        layer 0). Each add into the stream is fused with the norm that follows it, and at a batch
        of 1-2 rows the norm with the projection that follows it (one GEMV kernel)."""
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = attn.qkv_proj.normed(x, residual, self.input_layernorm)
        h = attn.attend(positions, qkv)
        gate_up, residual = mlp.gate_up_proj.normed(h, residual, self.post_attention_layernorm)
        return mlp.down(gate_up), residual


class DecoderModel(nn.Module):
    def __init__(self, args: ModelArgs, qk_norm: bool) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(args.vocab_size, args.hidden_size)
        rotary = RotaryEmbedding(args.head_dim, args.max_position_embeddings, args.rope_theta,
                                 args.rope_scaling)
        self.layers = nn.ModuleList(DecoderLayer(args, i, rotary, qk_norm)
                                    for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions: (T,) -> hidden states (T, hidden)."""
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]


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
