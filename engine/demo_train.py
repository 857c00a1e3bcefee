"""Training of the demo weights on the demo corpus, so that greedy output is made of words.

A few seconds of next-token training on CPU, bit-for-bit reproducible for a given seed: one
thread, deterministic algorithms, a fixed number of steps and windows drawn from a seeded
generator. The forward pass is a plain-PyTorch Qwen3 written against the HF parameter names (the
engine's model classes need a KV pool and a step batch; transformers costs seconds to import);
`tests/test_demo_train.py` holds it to transformers' Qwen3ForCausalLM logit for logit.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from radixserve.engine.demo import DEMO_ARCH

if TYPE_CHECKING:
    import torch

# Enough steps to learn the corpus' words and common phrases, few enough that the model has not
# memorised every line into one fixed loop (tests/test_demo.py checks both ends with greedy output).
TRAIN_STEPS = 200
BATCH_SIZE = 8
WINDOW_LEN = 32
LEARNING_RATE = 1e-2
WARMUP_STEPS = 20
# The demo init (demo.py) is tuned for random weights that wander; its logits are so sharp (a loss
# near 37 nats) that a few hundred steps cannot undo them. Training starts from the same draw with
# every matrix scaled down (loss near 13); the norm weights keep their jitter.
INIT_SCALE = 0.3

# The thread count and the deterministic flag are process-wide: concurrent builds take turns.
_TRAIN_LOCK = threading.Lock()


def train_weights(tensors: dict[str, torch.Tensor], token_ids: list[int], *, seed: int) -> None:
    """Train `tensors` (HF Qwen3 names, tied embeddings, float32 on CPU) in place on `token_ids`,
    the tokenized corpus, with AdamW and a warmup-cosine learning rate."""
    import torch

    with _TRAIN_LOCK, _reproducible():
        data = torch.tensor(token_ids, dtype=torch.long)  # (num_tokens,) cpu tensor
        gen = torch.Generator().manual_seed(seed)
        params = {
            name: (t if "norm" in name else INIT_SCALE * t).detach().clone().requires_grad_(True)
            for name, t in tensors.items()
        }
        opt = torch.optim.AdamW(params.values(), lr=LEARNING_RATE, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_factor)
        offsets = torch.arange(WINDOW_LEN + 1)
        for _ in range(TRAIN_STEPS):
            starts = torch.randint(0, len(data) - WINDOW_LEN - 1, (BATCH_SIZE, 1), generator=gen)
            window = data[starts + offsets]  # (batch, window_len + 1)
            logits = qwen3_logits(params, window[:, :-1])  # (batch, window_len, vocab)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        with torch.no_grad():
            for name, t in tensors.items():
                t.copy_(params[name])


def _lr_factor(step: int) -> float:
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, TRAIN_STEPS - WARMUP_STEPS)
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))


@contextlib.contextmanager
def _reproducible() -> Iterator[None]:
    """One thread and deterministic kernels, restored afterwards (the engine runs with more)."""
    import torch

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)


def qwen3_logits(params: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """Causal Qwen3 forward of the demo sizes: `ids` (batch, seq) -> logits (batch, seq, vocab)."""
    import torch
    from torch.nn import functional as F

    a = DEMO_ARCH
    num_heads, num_kv, head_dim = a.num_attention_heads, a.num_key_value_heads, a.head_dim
    batch, seq = ids.shape
    inv_freq = 1.0 / a.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    freqs = torch.arange(seq).float()[:, None] * inv_freq  # (seq, head_dim / 2)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + a.rms_norm_eps) * params[name]

    def rope(x: torch.Tensor) -> torch.Tensor:  # (batch, heads, seq, head_dim)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:  # HF weight layout: (out, in)
        return x @ params[name].T

    def heads(x: torch.Tensor, num: int) -> torch.Tensor:  # -> (batch, num, seq, head_dim)
        return x.view(batch, seq, num, head_dim).transpose(1, 2)

    h = params["model.embed_tokens.weight"][ids]  # (batch, seq, hidden)
    for i in range(a.num_hidden_layers):
        p = f"model.layers.{i}.self_attn."
        x = norm(h, f"model.layers.{i}.input_layernorm.weight")
        q = norm(heads(linear(x, p + "q_proj.weight"), num_heads), p + "q_norm.weight")
        k = norm(heads(linear(x, p + "k_proj.weight"), num_kv), p + "k_norm.weight")
        v = heads(linear(x, p + "v_proj.weight"), num_kv)
        k, v = (t.repeat_interleave(num_heads // num_kv, dim=1) for t in (k, v))
        attn = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        h = h + linear(attn.transpose(1, 2).reshape(batch, seq, -1), p + "o_proj.weight")
        p = f"model.layers.{i}.mlp."
        x = norm(h, f"model.layers.{i}.post_attention_layernorm.weight")
        gated = F.silu(linear(x, p + "gate_proj.weight")) * linear(x, p + "up_proj.weight")
        h = h + linear(gated, p + "down_proj.weight")
    return norm(h, "model.norm.weight") @ params["model.embed_tokens.weight"].T
