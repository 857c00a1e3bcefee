"""How many KV pages fit: free memory after weights, minus activations and CUDA graphs.

Activations are measured, not guessed: one eager forward at the largest step the scheduler can
issue (max_prefill_tokens tokens, logits and a sort for every running request, as the sampler may
do) with a throwaway one-request pool. CUDA graphs are not captured yet when the pool is sized (they
read the pool), so their memory is estimated from what they hold: one logits buffer per captured
batch size plus each decode wrapper's workspace.
"""

from __future__ import annotations

import gc
import logging
from typing import NamedTuple

import torch
from radixserve.engine.attention import AttentionBackend, StepLayout
from radixserve.engine.context import ForwardContext, forward_context
from radixserve.engine.kvcache.pool import KVCachePool
from radixserve.engine.models.base import CausalLM
from radixserve.engine.models.config import ModelArgs

log = logging.getLogger(__name__)

GRAPH_WRAPPER_BYTES = 8 << 20  # FlashInfer's per-wrapper int workspace
GRAPH_SLACK_BYTES = 256 << 20  # decode activations inside graphs, allocator rounding


class MemoryPlan(NamedTuple):
    free_bytes: int  # free after weights and backend workspaces
    activation_bytes: int
    graph_bytes: int
    kv_bytes: int
    num_pages: int


def kv_page_bytes(num_layers: int, page_size: int, num_kv_heads: int, head_dim: int,
                  dtype: torch.dtype) -> int:
    return 2 * num_layers * page_size * num_kv_heads * head_dim * dtype.itemsize


@torch.inference_mode()
def profile_activation_bytes(model: CausalLM, backend: AttentionBackend, num_tokens: int,
                             num_logit_rows: int,
                             page_size: int, dtype: torch.dtype, device: torch.device) -> int:
    args = model.args
    attn = model.model.layers[0].self_attn
    T, S = num_tokens, min(num_logit_rows, num_tokens)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    pool = KVCachePool(args.num_layers, -(-T // page_size), page_size, attn.num_kv_heads,
                       args.head_dim, dtype, device)
    locs = torch.arange(T, device=device)
    layout = StepLayout(torch.zeros(1, dtype=torch.int64, device=device), [0], [T], locs,
                        locs.view(1, T), page_size)
    ids = torch.randint(0, args.vocab_size, (T,), device=device)
    positions = locs % args.max_position_embeddings  # only rotary reads them
    with forward_context(ForwardContext(backend, backend.prepare(layout), pool)):
        hidden = model(ids, positions)
    logits = model.compute_logits(hidden[:S]).float()  # (S, V) as the sampler sees them
    torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base - pool.bytes
    del pool, hidden, logits
    torch.cuda.empty_cache()
    return max(0, peak)


def graph_reserve_bytes(batch_sizes: list[int], vocab_size: int, dtype: torch.dtype,
                        max_pages_per_req: int) -> int:
    if not batch_sizes:
        return 0
    logits = sum(batch_sizes) * vocab_size * dtype.itemsize
    return (logits + len(batch_sizes) * GRAPH_WRAPPER_BYTES
            + max(batch_sizes) * max_pages_per_req * 4 + GRAPH_SLACK_BYTES)


def piece_buffer_bytes(args: ModelArgs, max_tokens: int, dtype: torch.dtype) -> int:
    """The piecewise graphs' static buffers (piecewise_graph.py): ids, positions and locations,
    queries and attention output, residual stream and hidden states, for max_tokens rows."""
    q = args.num_heads * args.head_dim  # unsharded: piecewise graphs run without TP
    return max_tokens * (3 * 8 + (2 * q + 2 * args.hidden_size) * dtype.itemsize)


def plan_kv_pages(page_bytes: int, memory_fraction: float, activation_bytes: int, graph_bytes: int,
                  device: torch.device) -> MemoryPlan:
    """The pool takes memory_fraction of what is free after weights, less activations and graphs."""
    gc.collect()  # an engine dropped just before (tests, benchmarks) may sit in a reference cycle
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    kv = int(free * memory_fraction) - activation_bytes - graph_bytes
    pages = kv // page_bytes
    if pages < 2:
        raise RuntimeError(f"no room for the KV cache: {free / 2**30:.1f} GiB free, activations "
                           f"{activation_bytes / 2**30:.2f} GiB, graphs {graph_bytes / 2**30:.2f} "
                           "GiB")
    plan = MemoryPlan(free, activation_bytes, graph_bytes, pages * page_bytes, pages)
    log.info("KV pool: %d pages, %.2f GiB (free %.2f GiB, activations %.2f GiB, graphs %.2f GiB)",
             pages,
             plan.kv_bytes / 2**30, free / 2**30, activation_bytes / 2**30, graph_bytes / 2**30)
    return plan
