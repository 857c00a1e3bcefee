"""Device work for one step: gather inputs from the device tables, run the model, sample.

Nothing here waits for the host: inputs come from the token pool / page table on the device, and
sampled ids go back into the token pool before an async copy brings them to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.engine.attention import StepLayout, create_backend
from radixserve.engine.config import EngineConfig
from radixserve.engine.context import ForwardContext, forward_context
from radixserve.engine.distributed import get_comm
from radixserve.engine.kvcache.pool import KVCachePool
from radixserve.engine.kvcache.table import TableManager
from radixserve.engine.models.config import ModelArgs
from radixserve.engine.models.loader import load_model
from radixserve.engine.sampling.batch import build_sampling_batch
from radixserve.engine.sampling.sampler import Sampler, SampleOutput
from radixserve.engine.scheduler.batch import Batch


@dataclass
class ForwardOutput:
    """Sampled results of one step, on the host once `ready` has completed."""

    rows: list[int]  # batch rows that sampled, in order
    sample: SampleOutput  # host tensors (copied asynchronously)
    ready: torch.cuda.Event | None

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()


class Engine:
    def __init__(self, config: EngineConfig, args: ModelArgs, device: torch.device, dtype: torch.dtype,
                 eos_ids: tuple[int, ...]) -> None:
        self.config, self.args, self.device, self.dtype = config, args, device, dtype
        self.eos_ids = eos_ids
        self.model = load_model(config.model_path, dtype, device)
        attn = self.model.model.layers[0].self_attn
        # TP ranks must agree on the pool size (free memory differs per GPU): take the smallest.
        self.num_pages = config.num_pages or get_comm().min_over_ranks(
            self._auto_num_pages(attn.num_kv_heads))
        self.kv_pool = KVCachePool(args.num_layers, self.num_pages, config.page_size, attn.num_kv_heads,
                                   args.head_dim, dtype, device)
        self.max_context = config.max_context or args.max_position_embeddings
        self.table = TableManager(config.max_running_requests, self.max_context, config.page_size, device)
        self.backend = create_backend(config.attention_backend, attn.num_heads, attn.num_kv_heads,
                                      args.head_dim, device)
        self.sampler = Sampler(args.vocab_size, device)

    def _auto_num_pages(self, num_kv_heads: int) -> int:
        P = self.config.page_size
        per_page = 2 * self.args.num_layers * P * num_kv_heads * self.args.head_dim * self.dtype.itemsize
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return max(2, int(free * self.config.memory_fraction) // per_page)
        return max(2, self.config.cpu_kv_tokens // P)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> ForwardOutput:
        dev, table = self.device, self.table
        table.flush()
        prefix = torch.tensor(batch.prefix_lens, dtype=torch.int64)
        seq = torch.tensor(batch.seq_lens, dtype=torch.int64)
        ext = seq - prefix
        slots = torch.tensor([r.slot for r in batch.reqs], dtype=torch.int64)
        T = int(ext.sum())
        starts = torch.cumsum(ext, 0) - ext
        pos = torch.repeat_interleave(prefix - starts, ext) + torch.arange(T)  # (T,) absolute positions
        slot_tok = torch.repeat_interleave(slots, ext)
        pos_d, slot_tok_d = pos.to(dev, non_blocking=True), slot_tok.to(dev, non_blocking=True)
        input_ids = table.token_pool[slot_tok_d, pos_d]
        out_loc = table.page_table[slot_tok_d, pos_d]
        layout = StepLayout(slots.to(dev, non_blocking=True), batch.prefix_lens, batch.seq_lens, out_loc,
                            table.page_table, self.config.page_size)
        meta = self.backend.prepare(layout)
        with forward_context(ForwardContext(self.backend, meta, self.kv_pool)):
            hidden = self.model(input_ids, pos_d)
        rows = [i for i, s in enumerate(batch.sample) if s]
        if not rows:
            return ForwardOutput(rows, SampleOutput(torch.empty(0, dtype=torch.int64), None, None, None), None)
        last = (starts + ext - 1)[rows].to(dev, non_blocking=True)
        logits = self.model.compute_logits(hidden[last]).float()  # (S, V)
        sb = build_sampling_batch(batch, rows, self.eos_ids, dev)
        out = self.sampler(logits, sb, table.token_pool)
        sample_slots = slots[rows].to(dev, non_blocking=True)
        sample_pos = seq[rows].to(dev, non_blocking=True)
        table.token_pool[sample_slots, sample_pos] = out.tokens
        return self._to_host(rows, out)

    def _to_host(self, rows: list[int], out: SampleOutput) -> ForwardOutput:
        host = SampleOutput(*(t.to("cpu", non_blocking=True) if t is not None else None for t in out))
        ready = None
        if self.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        return ForwardOutput(rows, host, ready)
