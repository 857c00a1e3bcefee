"""ModelRunner: one step's device work: gather inputs from the device tables, run the model, sample.

Nothing here waits for the host: inputs come from the token pool / page table on the device, and
sampled ids go back into the token pool before an async copy brings them to pinned host memory.

On CUDA every step runs on one dedicated compute stream, while the host goes on to schedule the
next step; an event per step marks when its sampled ids have reached the host. Keeping *all* device
work of the engine (table writes, forward, sampling) on that one stream is what makes freeing KV
pages early safe: pages of a request that finished in step N are handed out again only to a later
step, whose writes the stream orders after every read of the steps still in flight.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
from radixserve.engine import pdl
from radixserve.engine.attention import StepLayout, create_backend
from radixserve.engine.config import EngineConfig
from radixserve.engine.constrained.bitmask import fill_grammar_mask
from radixserve.engine.context import ForwardContext, forward_context
from radixserve.engine.cuda_graph import CudaGraphRunner, graph_batch_sizes
from radixserve.engine.distributed import get_comm
from radixserve.engine.host_buffers import HostBuffers
from radixserve.engine.kvcache.pool import KVCachePool
from radixserve.engine.kvcache.table import TableManager
from radixserve.engine.memory import (
    graph_reserve_bytes,
    kv_page_bytes,
    piece_buffer_bytes,
    plan_kv_pages,
    profile_activation_bytes,
)
from radixserve.engine.models.config import ModelArgs
from radixserve.engine.models.dummy import init_dummy_model
from radixserve.engine.models.loader import load_model
from radixserve.engine.piecewise_graph import PiecewiseGraphRunner, token_buckets
from radixserve.engine.sampling.batch import constrained_rows, sampling_batch, sampling_columns
from radixserve.engine.sampling.sampler import SampleOutput, Sampler
from radixserve.engine.scheduler.batch import Batch
from radixserve.engine.upload import Upload

log = logging.getLogger(__name__)


class StepColumns(NamedTuple):
    """A step's per-row and per-sample indices on the device (int64), from one upload."""

    num_tokens: int  # T, host
    slots: torch.Tensor  # (B,) request slot of each row
    offsets: torch.Tensor  # (B,) prefix_len minus the row's first token index in the flat axis
    ext: torch.Tensor  # (B,) new tokens of each row
    rows: torch.Tensor  # (S,) rows that sample
    last: torch.Tensor  # (S,) flat index of each sampling row's last token
    sample_slots: torch.Tensor  # (S,) where each sampled id goes in the token pool: slot,
    sample_pos: torch.Tensor  # (S,) and position (the row's seq_len)


def step_columns(batch: Batch, slots: list[int], rows: list[int],
                 upload: Upload) -> tuple[int, slice]:
    """The step's index columns, built from the batch's host lists and added to `upload`: the
    step's token count T, and their part of it (`StepColumns(T, *upload.views(part))`).

        row:        0           1        2
        ext:        [ 3 tokens ][ 1 ][ 2 tokens ]      flat token axis of T = 6
        starts:     0           3    4            (the row's first flat index)
        positions:  prefix_lens[i] + (flat index - starts[i]) = offsets[i] + flat index
    """
    prefix, seq = batch.prefix_lens, batch.seq_lens
    ext = [s - p for s, p in zip(seq, prefix)]
    ends = list(itertools.accumulate(ext))  # ends[i] = starts[i] + ext[i]
    offsets = [p - (e - x) for p, e, x in zip(prefix, ends, ext)]
    i64 = torch.int64
    return ends[-1] if ends else 0, upload.add([
        (slots, i64), (offsets, i64), (ext, i64), (rows, i64), ([ends[i] - 1 for i in rows], i64),
        ([slots[i] for i in rows], i64), ([seq[i] for i in rows], i64)])


def _comm_capturable() -> bool:
    """Whether the layers' collectives may be captured (NCCL may; gloo runs on the host)."""
    comm = get_comm()
    if comm.supports_cuda_graph:
        return True
    log.warning("communicator %s cannot run inside CUDA graphs; every step runs eagerly",
                type(comm).__name__)
    return False


@dataclass
class ForwardOutput:
    """Sampled results of one step, on the host once `ready` has completed.

    On CUDA every step records `ready`, a step that samples nothing included, and its caller waits
    for step N - 1, and reads its `sample`, before it plans step N + 1 (EngineCore with overlap,
    the TP followers). Host buffers that a step's asynchronous copies read or write are reused on
    that promise, two steps later (host_buffers.py): the step's upload, its sampled ids, the decode
    graph's inputs and FlashInfer's plans. Without a wait, a run of steps that only prefill chunks
    of long prompts let the host run steps ahead of the device, and a plan overwrote a buffer whose
    copy had not run yet."""

    rows: list[int]  # batch rows that sampled, in order
    # host tensors (copied asynchronously), views of a buffer the step after next writes again
    sample: SampleOutput
    ready: torch.cuda.Event | None

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()

    def done(self) -> bool:
        """Whether `wait` would return at once."""
        return self.ready is None or self.ready.query()


# How a step's forward ran (ModelRunner.forward_paths): replayed as decode-graph rows, as the
# piecewise graphs' one graph with every row attended inside (piece_prefill_keys), as the pieces
# with attention calls between them, or eagerly.
FORWARD_PATHS = ("decode_graph", "whole_graph", "pieces", "eager")


class ModelRunner:
    def __init__(self, config: EngineConfig, args: ModelArgs, device: torch.device,
                 dtype: torch.dtype, eos_ids: tuple[int, ...]) -> None:
        self.config, self.args, self.device, self.dtype = config, args, device, dtype
        self.eos_ids = eos_ids
        cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if cuda else None
        self.uses_pdl = pdl.configure(config.pdl, device)  # before any kernel is built or captured
        if config.load_format == "dummy":
            self.model = init_dummy_model(config.model_path, dtype, device, config.seed)
        else:
            self.model = load_model(config.model_path, dtype, device)
        attn = self.model.model.layers[0].self_attn
        self.max_context = config.max_context or args.max_position_embeddings
        self.table = TableManager(config.max_running_requests, self.max_context, config.page_size,
                                  device)
        self.backend = create_backend(config.attention_backend, attn.num_heads, attn.num_kv_heads,
                                      args.head_dim, device, dtype)
        self.backend.keep_split_mixed(config.split_mixed_attention)
        note = self.backend.check_page_size(config.page_size)  # raises if it cannot serve it
        if note:
            log.warning("attention backend %s: %s", self.backend.name, note)
        self.sampler = Sampler()
        # host sides of the step's one upload and of its sampled ids' copy back (host_buffers.py)
        self.upload_buffers, self.output_buffers = HostBuffers(cuda), HostBuffers(cuda)
        self.grammar_mask_s, self.grammar_mask_steps = 0.0, 0  # host time filling masks, summed
        self.forward_paths = dict.fromkeys(FORWARD_PATHS, 0)  # steps run each way, summed
        graph_sizes = self._graph_sizes()
        piece_buckets = self._piece_buckets()
        # TP ranks must agree on the pool size (free memory differs per GPU): take the smallest.
        self.num_pages = config.num_pages or get_comm().min_over_ranks(
            self._auto_num_pages(attn.num_kv_heads, graph_sizes, piece_buckets))
        # One page past the allocator's range belongs to no request: padded graph rows write there.
        self.kv_pool = KVCachePool(args.num_layers, self.num_pages + 1, config.page_size,
                                   attn.num_kv_heads, args.head_dim, dtype, device)
        if self.stream is not None:  # weights, tables and pool were written on the default stream
            self.stream.wait_stream(torch.cuda.current_stream(device))
        self.graphs: CudaGraphRunner | None = None
        self.graph_bytes = 0
        comm = get_comm()
        # Under TP, NCCL's own threads query events of earlier collectives while this thread
        # captures; "global" mode would count those calls against the capture and invalidate it.
        mode = "thread_local" if comm.world_size > 1 else "global"
        if graph_sizes and self.stream is not None:
            self.graphs = CudaGraphRunner(self.model, self.backend, self.kv_pool, self.table,
                                          graph_sizes, self.num_pages, self.stream, mode,
                                          config.small_decode_rows, config.piece_prefill_keys)
            self.graph_bytes = self.graphs.capture(progress=comm.rank == 0)
        self.pieces: PiecewiseGraphRunner | None = None
        if piece_buckets:
            self.pieces = PiecewiseGraphRunner(self.model, self.backend, self.kv_pool,
                                               piece_buckets, self.num_pages, self.stream, mode)
            self.graph_bytes += self.pieces.capture(progress=comm.rank == 0)

    def _graph_sizes(self) -> list[int]:
        c = self.config
        if self.device.type != "cuda" or not c.cuda_graph or not _comm_capturable():
            return []
        if not self.backend.supports_cuda_graph(c.page_size):
            log.warning("attention backend %s cannot run in CUDA graphs at page size %d; decoding "
                        "eagerly", self.backend.name, c.page_size)
            return []
        if c.graph_prefill_keys:  # steps with prefill tokens have more rows than requests
            return graph_batch_sizes(c.cuda_graph_max_batch)
        return graph_batch_sizes(min(c.cuda_graph_max_batch, c.max_running_requests))

    def _piece_buckets(self) -> list[int]:
        """Token buckets of the piecewise graphs: by default up to the largest step the scheduler
        issues (a prefill budget's chunk beside a decode token per running request), on CUDA with
        graphs on. An explicit limit also runs the pieces on CPU, uncaptured (tests)."""
        c = self.config
        limit = c.piecewise_graph_max_tokens
        if limit == 0 or (self.device.type == "cuda" and not _comm_capturable()):
            return []
        if limit is None:
            if self.device.type != "cuda" or not c.cuda_graph:
                return []
            limit = c.max_prefill_tokens + c.max_running_requests
        return token_buckets(limit)

    def _auto_num_pages(self, num_kv_heads: int, graph_sizes: list[int],
                        piece_buckets: list[int]) -> int:
        c = self.config
        P = c.page_size
        if self.device.type != "cuda":
            return max(2, c.cpu_kv_tokens // P)
        page_bytes = kv_page_bytes(self.args.num_layers, P, num_kv_heads, self.args.head_dim,
                                   self.dtype)
        activations = profile_activation_bytes(self.model, self.backend,
                                               c.max_prefill_tokens + c.max_running_requests,
                                               c.max_running_requests, P, self.dtype, self.device)
        graphs = graph_reserve_bytes(graph_sizes, self.args.vocab_size, self.dtype,
                                     self.table.width // P)
        if piece_buckets:  # the pieces' own pool holds at most an eager step's activations
            graphs += activations + piece_buffer_bytes(self.args, max(piece_buckets), self.dtype)
        return plan_kv_pages(page_bytes, c.memory_fraction, activations, graphs,
                             self.device).num_pages

    def _on_stream(self) -> contextlib.AbstractContextManager[object]:
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)

    @torch.inference_mode()
    def forward(self, batch: Batch) -> ForwardOutput:
        with self._on_stream():
            return self._forward(batch)

    def _forward(self, batch: Batch) -> ForwardOutput:
        dev, table = self.device, self.table
        slot_list = [r.slot for r in batch.reqs]
        rows = [i for i, s in enumerate(batch.sample) if s]
        # The table's writes, the step's indices and its sampling options: one copy to the device.
        upload = Upload(dev, self.upload_buffers)
        writes = table.stage_flush(upload)
        T, step_part = step_columns(batch, slot_list, rows, upload)
        sampling = None
        if rows:
            sampling = sampling_columns(batch, rows, self.eos_ids, constrained_rows(batch, rows))
            sampling_part = upload.add(list(sampling.columns.values()))
        upload.send()
        table.apply_flush(writes, upload)
        cols = StepColumns(T, *upload.views(step_part))
        graph_layout = self._graph_layout(batch, slot_list, cols)
        if graph_layout is not None:
            assert self.graphs is not None
            self.forward_paths["decode_graph"] += 1
            logits = self.graphs.replay(graph_layout)  # (T, V): every row one new token
            if sampling is None:
                return self._no_samples()
            if len(rows) < T:
                logits = logits[cols.last]
        else:
            # Expanded to one entry per token on the device: on CPU tensors repeat_interleave takes
            # milliseconds at 8k tokens, host time that every prefill step paid.
            slot_tok_d = torch.repeat_interleave(cols.slots, cols.ext, output_size=T)
            # (T,) absolute positions
            pos_d = torch.repeat_interleave(cols.offsets, cols.ext, output_size=T)
            pos_d += torch.arange(T, device=dev)
            input_ids = table.token_pool[slot_tok_d, pos_d]
            out_loc = table.page_table[slot_tok_d, pos_d]
            layout = StepLayout(cols.slots, batch.prefix_lens, batch.seq_lens, out_loc,
                                table.page_table, self.config.page_size, slot_list)
            if self.pieces is not None and self.pieces.can_run(T):
                plan = self.pieces.prepare(layout)
                self.forward_paths["whole_graph" if plan.whole else "pieces"] += 1
                hidden = self.pieces.run(input_ids, pos_d, out_loc, plan)
            else:
                self.forward_paths["eager"] += 1
                meta = self.backend.prepare(layout)
                with forward_context(ForwardContext(self.backend, meta, self.kv_pool)):
                    hidden = self.model(input_ids, pos_d)
            if sampling is None:
                return self._no_samples()
            logits = self.model.compute_logits(hidden[cols.last])
        # The host fills constrained rows' masks while the device runs the forward just launched.
        mask = batch.grammar  # filled already under tensor parallelism (EngineCore.step)
        if mask is None:
            fill_start = time.perf_counter()
            mask = fill_grammar_mask([batch.reqs[i].grammar for i in rows], self.args.vocab_size,
                                     pin=self.stream is not None)
            if mask is not None:
                self.grammar_mask_s += time.perf_counter() - fill_start
                self.grammar_mask_steps += 1
        sb = sampling_batch(sampling, upload.views(sampling_part), mask, dev)
        # logits (S, V) in the model's dtype; the ids also written into the token pool
        out = self.sampler(logits, sb, table.token_pool, cols.sample_slots, cols.sample_pos)
        return self._to_host(rows, out)

    def _graph_layout(self, batch: Batch, slot_list: list[int],
                      cols: StepColumns) -> StepLayout | None:
        """The step as rows of one new token each, for the decode graphs; None where they cannot
        run it. A step with prefill tokens becomes a row per token (`StepLayout.as_decode_rows`)
        where those attend to at most `graph_prefill_keys` keys: one replay then does what the
        piecewise graphs do with two attention calls per layer between the pieces, whose host work
        made a step that admits a short prompt several times a decode step's length."""
        graphs = self.graphs
        if graphs is None:
            return None
        # out_loc: a placeholder, the graphs gather the KV locations themselves
        layout = StepLayout(cols.slots, batch.prefix_lens, batch.seq_lens, cols.slots,
                            self.table.page_table, self.config.page_size, slot_list)
        T = cols.num_tokens
        if T != len(slot_list):
            if T > graphs.max_batch or layout.prefill_keys > self.config.graph_prefill_keys:
                return None
            layout = layout.as_decode_rows(
                torch.repeat_interleave(cols.slots, cols.ext, output_size=T))
        return layout if graphs.can_run(layout) else None

    def _no_samples(self) -> ForwardOutput:
        """A step that samples no row (every row a chunk that does not end its prompt)."""
        return ForwardOutput([], SampleOutput(torch.empty(0, dtype=torch.int64), None, None, None),
                             self._step_done())

    def _to_host(self, rows: list[int], out: SampleOutput) -> ForwardOutput:
        # asynchronous copies into one host buffer of the runner's; the event says when they ran
        copies = iter(self.output_buffers.receive([t for t in out if t is not None]))
        host = SampleOutput(*(next(copies) if t is not None else None for t in out))
        return ForwardOutput(rows, host, self._step_done())

    def _step_done(self) -> torch.cuda.Event | None:
        """An event after the step's last work on the stream (CUDA); see ForwardOutput."""
        if self.device.type != "cuda":
            return None
        ready = torch.cuda.Event()
        ready.record()
        return ready
