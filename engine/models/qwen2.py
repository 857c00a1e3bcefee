"""Qwen2 / Qwen2.5: the shared decoder with q/k/v biases (ModelArgs.attention_bias)."""

from radixserve.engine.models.base import CausalLM
from radixserve.engine.models.registry import register_model


@register_model("Qwen2ForCausalLM")
class Qwen2ForCausalLM(CausalLM):
    qk_norm = False
