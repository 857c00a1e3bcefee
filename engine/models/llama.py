"""Llama 2/3.x: the shared decoder; llama3 rope scaling is handled by the rotary layer."""

from radixserve.engine.models.base import CausalLM
from radixserve.engine.models.registry import register_model


@register_model("LlamaForCausalLM")
class LlamaForCausalLM(CausalLM):
    qk_norm = False
