"""Qwen3: the shared decoder with per-head q/k RMSNorm and no attention bias."""

from radixserve.engine.models.base import CausalLM
from radixserve.engine.models.registry import register_model


@register_model("Qwen3ForCausalLM")
class Qwen3ForCausalLM(CausalLM):
    qk_norm = True
