"""Decode steps replayed from CUDA graphs, one captured per padded batch size at start-up.
(Steps with a few prefill tokens run here too, each token a decode row: ModelRunner._graph_layout.)

A decode step launches a few hundred small kernels; replaying them as one graph removes the host's
launch cost. Each graph reads static buffers only: the rows' slots and positions (input ids and KV
locations are gathered from the device tables inside the graph) and the backend's decode metadata,
which `plan_graph` rewrites before each replay. A batch of B rows runs in the smallest captured size
>= B; padded rows read slot 0 and write their K/V into a dummy page that no request owns.
"""

from __future__ import annotations

import bisect
import logging

import torch
from radixserve.engine.attention import AttentionBackend, AttentionMetadata, StepLayout
from radixserve.engine.context import ForwardContext, forward_context
from radixserve.engine.host_buffers import HostBuffers
from radixserve.engine.kvcache.pool import KVCachePool
from radixserve.engine.kvcache.table import TableManager
from radixserve.engine.models.base import CausalLM

log = logging.getLogger(__name__)


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 to 64, of 16 to 256, of 32 beyond.

    Padding waste stays under 20% past 8."""
    sizes = ([1, 2, 4, 8] + list(range(16, 65, 8)) + list(range(80, 257, 16))
             + list(range(288, 1025, 32)))
    out = [s for s in sizes if s < max_batch]
    return out + [max_batch] if max_batch >= 1 else out


class CudaGraphRunner:
    def __init__(self, model: CausalLM, backend: AttentionBackend, kv_pool: KVCachePool,
                 table: TableManager, batch_sizes: list[int], dummy_page: int,
                 stream: torch.cuda.Stream, capture_error_mode: str = "global",
                 small_decode_rows: int = 0, piece_prefill_keys: int = 0) -> None:
        assert batch_sizes, "no batch sizes to capture"
        self.model, self.backend, self.kv_pool, self.table = model, backend, kv_pool, table
        self.sizes = sorted(batch_sizes)
        self.max_batch = self.sizes[-1]
        self.stream, self.capture_error_mode = stream, capture_error_mode
        self.dummy_loc = dummy_page * kv_pool.page_size
        dev = table.page_table.device
        G = self.max_batch
        # The graph of bs rows reads rows slot, position and valid of bs each from inputs[:3 * bs]:
        # contiguous, so a replay's inputs are one plain copy (into a strided (3, G) slice, torch
        # copies through a temporary and a second kernel)
        self.inputs = torch.zeros(3 * G, dtype=torch.int64, device=dev)
        self._host = HostBuffers(pin=True)  # the inputs' host side, one replay a step
        self.out_loc = torch.full((G,), self.dummy_loc, dtype=torch.int64, device=dev)
        P = kv_pool.page_size
        backend.init_cuda_graph(G, table.width // P, P, dummy_page, table.page_table,
                                small_decode_rows, piece_prefill_keys)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}  # (bs, V) outputs, owned by the graph pool

    def capture(self, progress: bool = True) -> int:
        """Capture every size (largest first: smaller ones reuse its pool). Returns bytes taken."""
        from tqdm import tqdm

        dev = self.inputs.device
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_reserved(dev)
        pool = torch.cuda.graph_pool_handle()
        sizes = list(reversed(self.sizes))
        for bs in tqdm(sizes, desc="Capturing CUDA graphs", disable=not progress, unit="graph"):
            with torch.cuda.stream(self.stream):
                # on the stream the warm-up runs on: its placeholder plan's copies come first
                meta = self.backend.graph_metadata(bs, self.out_loc[:bs])
                for _ in range(2):  # warm-up outside capture: lazy inits, autotuning, JIT loads
                    self._body(bs, meta)
            self.stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=self.stream,
                                  capture_error_mode=self.capture_error_mode):
                self.logits[bs] = self._body(bs, meta)
            self.graphs[bs] = graph
        torch.cuda.synchronize(dev)
        used = torch.cuda.memory_reserved(dev) - before
        log.info("captured %d CUDA graphs (batch %d..%d), %.0f MiB", len(sizes), self.sizes[0],
                 self.max_batch, used / 2**20)
        return used

    @torch.inference_mode()
    def _body(self, bs: int, meta: AttentionMetadata) -> torch.Tensor:
        slots, positions, valid = self.inputs[: 3 * bs].view(3, bs)
        ids = self.table.token_pool[slots, positions]  # (bs,)
        loc = self.table.page_table[slots, positions]
        self.out_loc[:bs].copy_(torch.where(valid > 0, loc, self.dummy_loc))
        with forward_context(ForwardContext(self.backend, meta, self.kv_pool)):
            hidden = self.model(ids, positions)
        return self.model.compute_logits(hidden)  # (bs, V)

    def can_run(self, layout: StepLayout) -> bool:
        return len(layout.seq_lens) <= self.max_batch and layout.is_decode

    def replay(self, layout: StepLayout) -> torch.Tensor:
        """Run a decode layout of B rows (its slots on the host) from its graph; returns (B, V)
        logits (graph-owned: read them before the next replay). Call on the model runner's
        stream."""
        assert layout.slot_list is not None, "a replay takes the rows' slots from the host"
        B = len(layout.slot_list)
        bs = self.sizes[bisect.bisect_left(self.sizes, B)]
        # rows slot, position (of the one new token) and valid; padded rows read slot 0
        host = self._host.pack_rows([layout.slot_list, layout.prefix_lens, [1] * B], bs, (0, 0, 0))
        self.inputs[: 3 * bs].copy_(host.view(-1), non_blocking=True)
        self.backend.plan_graph(bs, layout)
        self.graphs[bs].replay()
        return self.logits[bs][:B]
