"""Steps with prefill tokens replayed from CUDA graphs piece by piece, attention eager in between.

A step that carries prefill tokens has ragged attention, which a graph captured for one layout
cannot plan for, so the decode graphs (cuda_graph.py) never run it. Eagerly, its host work (~0.36 ms
per layer of Triton and cuBLAS launches) exceeds the device work of steps up to a few thousand
tokens on a small model, and every running stream waits for it. Here the forward is cut at every
attention call: the L + 1 pieces between the calls (`DecoderModel.piece`: norms, projections,
rotary, the KV store, the MLP) are captured once per token-count bucket, and a step replays them
with the backend's attention, planned for the real tokens only, run eagerly in between.

Where the backend has a decode call that plans from each row's slot and length alone
(`AttentionBackend.piece_decode`: the small decode kernel), each bucket's pieces are captured twice:
as they are, and each also holding that call, for its layer and the bucket's first rows. A step
with decode rows replays the second set: its decode rows are attended inside the graph, and only
the other rows' attention runs between the pieces. On an H200 the eager decode call and its plan
were about a millisecond of host time in every step that admits a prompt beside running streams.
A step without decode rows (or with more than the call holds) replays the first set: the call over
padding rows alone cost 0.9 ms of device time a step on Qwen3-0.6B (28 layers of about 33 us).

Where the backend also has a prefill call planned by a work list on the device
(`AttentionBackend.piece_prefill`: attention/paged_prefill.py), a bucket with a decode call is
captured a third time, as one graph: every piece with both calls after its KV store. A step with
decode rows whose prefill rows that call takes (`plan_piece_prefill`) replays it once, with no
call between the pieces.

Every piece reads and writes static buffers: token ids, positions and KV locations in, queries,
residual stream and attention output between pieces, final hidden states out. A step of T tokens
runs in the smallest bucket >= T; padded tokens write their K/V into a dummy page that no request
owns, and rows are independent outside attention, so padding never reaches a real token.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from typing import NamedTuple

import torch
from radixserve.engine.attention import AttentionBackend, AttentionMetadata, StepLayout
from radixserve.engine.attention.base import LayerCall
from radixserve.engine.attention.mixed import leading_decode_rows, split_layout
from radixserve.engine.context import ForwardContext, forward_context
from radixserve.engine.kvcache.pool import KVCachePool
from radixserve.engine.memory import piece_buffer_bytes
from radixserve.engine.models.base import CausalLM

log = logging.getLogger(__name__)


def token_buckets(max_tokens: int) -> list[int]:
    """Steps of 16 to 256, then eight per doubling, and max_tokens last: padding stays under
    12.5% past 256 tokens."""
    sizes = list(range(16, 257, 16))
    while sizes[-1] < max_tokens:
        power = 1 << (sizes[-1].bit_length() - 1)  # the power of two at or below
        sizes.append(sizes[-1] + power // 8)
    return [s for s in sizes if s < max_tokens] + [max_tokens]


class PiecesPlan(NamedTuple):
    """A step's attention in the pieces (`PiecewiseGraphRunner.prepare`)."""

    rows: int  # D: the leading rows that the decode call captured in the pieces attends
    rest: AttentionMetadata | None  # the other rows', for the calls between pieces; None: none
    whole: bool = False  # the other rows are the prefill call's: the bucket's one graph runs


class _Eager:
    """Stands in for a captured graph where there is no CUDA (tests of the buffer plumbing)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self.replay = fn


class PiecewiseGraphRunner:
    def __init__(self, model: CausalLM, backend: AttentionBackend, kv_pool: KVCachePool,
                 buckets: list[int], dummy_page: int, stream: torch.cuda.Stream | None,
                 capture_error_mode: str = "global") -> None:
        assert buckets, "no token buckets to capture"
        self.model, self.backend, self.kv_pool, self.stream = model.model, backend, kv_pool, stream
        self.capture_error_mode = capture_error_mode
        self.args = model.args
        self.buckets = sorted(buckets)
        self.max_tokens = self.buckets[-1]
        self.dummy_loc = dummy_page * kv_pool.page_size
        attn = self.model.layers[0].self_attn
        dev, dtype = kv_pool.k.device, kv_pool.k.dtype
        G, H = self.max_tokens, model.args.hidden_size
        self.ids = torch.zeros(G, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(G, dtype=torch.int64, device=dev)
        self.out_loc = torch.full((G,), self.dummy_loc, dtype=torch.int64, device=dev)
        self.q = torch.zeros(G, attn.num_heads, attn.head_dim, dtype=dtype, device=dev)
        self.attn_out = torch.zeros_like(self.q)
        self.residual = torch.zeros(G, H, dtype=dtype, device=dev)
        self.hidden = torch.zeros(G, H, dtype=dtype, device=dev)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph | _Eager]] = {}  # per bucket: its pieces
        # per bucket, where the backend has one: the decode call over the pieces' first `width`
        # rows (`AttentionBackend.piece_decode`), and the pieces captured with it
        self.decodes: dict[int, tuple[int, LayerCall]] = {}
        self.decode_graphs: dict[int, list[torch.cuda.CUDAGraph | _Eager]] = {}
        # per bucket with a decode call, where the backend has one: its prefill call over the
        # bucket's rows (`AttentionBackend.piece_prefill`), and all the pieces with both calls,
        # as one graph (a list of one, so a replay walks it as it walks the others)
        self.prefills: dict[int, LayerCall] = {}
        self.whole_graphs: dict[int, list[torch.cuda.CUDAGraph | _Eager]] = {}

    @property
    def buffer_bytes(self) -> int:
        return piece_buffer_bytes(self.args, self.max_tokens, self.q.dtype)

    def capture(self, progress: bool = True) -> int:
        """Capture every bucket's pieces (largest first; one memory pool for all: replays run one
        at a time on one stream and pieces keep nothing alive in it). Without CUDA the pieces are
        kept as plain calls. Returns the bytes taken."""
        from tqdm import tqdm

        if self.stream is None:
            for T in self.buckets:
                self._plan_calls(T)
                for decode, into in self._variants(T):
                    into[T] = [_Eager(lambda k=k, T=T, d=decode: self._piece(k, T, d))
                               for k in range(self.model.num_pieces)]
                if T in self.prefills:
                    self.whole_graphs[T] = [_Eager(lambda T=T: self._whole(T))]
            return self.buffer_bytes
        dev = self.q.device
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_reserved(dev)
        pool = torch.cuda.graph_pool_handle()
        for T in tqdm(list(reversed(self.buckets)), desc="Capturing piecewise graphs",
                      disable=not progress, unit="bucket"):
            with torch.cuda.stream(self.stream):  # warm-up outside capture: JIT builds, autotuning
                self._plan_calls(T)  # their placeholder plans' copies go before the warm-up
                for k in range(self.model.num_pieces):
                    self._piece(k, T, decode=T in self.decodes, prefill=T in self.prefills)
            self.stream.synchronize()
            for decode, into in self._variants(T):
                graphs: list[torch.cuda.CUDAGraph | _Eager] = []
                for k in range(self.model.num_pieces):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=self.stream,
                                          capture_error_mode=self.capture_error_mode):
                        self._piece(k, T, decode)
                    graphs.append(graph)
                into[T] = graphs
            if T in self.prefills:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=self.stream,
                                      capture_error_mode=self.capture_error_mode):
                    self._whole(T)
                self.whole_graphs[T] = [graph]
        torch.cuda.synchronize(dev)
        used = torch.cuda.memory_reserved(dev) - before
        log.info("captured piecewise graphs for %d token buckets (%d..%d), %d pieces each, "
                 "%d of them also with decode rows, %d also whole with prefill rows, %.0f MiB",
                 len(self.buckets), self.buckets[0], self.max_tokens, self.model.num_pieces,
                 len(self.decode_graphs), len(self.whole_graphs), used / 2**20)
        return used + self.buffer_bytes

    def _plan_calls(self, T: int) -> None:
        """The calls bucket T captures in its pieces, planned for padding: the decode call, and
        where there is one, the prefill call."""
        found = self.backend.piece_decode(T)
        if found is None:
            return
        self.decodes[T] = found
        prefill = self.backend.piece_prefill(T)
        if prefill is not None:
            self.prefills[T] = prefill

    def _variants(self, T: int) -> list[tuple[bool, dict[int, list]]]:
        """The sets of pieces bucket T is captured into: (with the decode call, the set)."""
        return [(False, self.graphs)] + ([(True, self.decode_graphs)] if T in self.decodes else [])

    @torch.inference_mode()
    def _whole(self, T: int) -> None:
        """Every piece of bucket T with both its calls: the whole forward of a step whose rows are
        all attended inside."""
        for k in range(self.model.num_pieces):
            self._piece(k, T, decode=True, prefill=True)

    @torch.inference_mode()
    def _piece(self, k: int, T: int, decode: bool, prefill: bool = False) -> None:
        """Piece k over the first T rows of the static buffers; then, with `decode`, the bucket's
        decode call of layer k over its first rows (their KV was just stored), and with `prefill`
        its prefill call over the rows after them (written after the decode call, which fills the
        rows past its own as it likes)."""
        last = k == self.model.num_pieces - 1
        meta = AttentionMetadata(self.out_loc[:T])  # the KV store reads only the locations
        with forward_context(ForwardContext(self.backend, meta, self.kv_pool)):
            out, residual = self.model.piece(k, self.ids[:T], self.positions[:T], self.attn_out[:T],
                                             self.residual[:T] if k else None)
        (self.hidden if last else self.q)[:T].copy_(out)
        if not last and residual is not None and residual.data_ptr() != self.residual.data_ptr():
            self.residual[:T].copy_(residual)  # the fused add+norm updates the buffer in place
        if decode and not last:
            width, call = self.decodes[T]
            k_pages, v_pages = self.kv_pool.pages[k]
            call(self.q[:width], k_pages, v_pages, self.attn_out[:width])
            if prefill:
                self.prefills[T](self.q[:T], k_pages, v_pages, self.attn_out[:T])

    def bucket(self, num_tokens: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, num_tokens)]

    def prepare(self, layout: StepLayout) -> PiecesPlan:
        """The backend's plan of a step for these pieces: its leading one-token rows for the call
        captured in them where the bucket has one, the rest for the bucket's prefill call where it
        has one that takes them (the whole graph), else for the calls between the pieces. Where
        the step has no such rows, or more than the call holds, it replays the pieces without the
        call and every row runs between them."""
        T = self.bucket(len(layout.out_loc))
        found = self.decodes.get(T)
        d = leading_decode_rows(layout) if found is not None else 0
        if d == 0 or d > found[0]:
            return PiecesPlan(0, self.backend.prepare(layout))
        width = found[0]
        parts = split_layout(layout, d)
        if parts is None:  # decode rows only
            self.backend.plan_piece_decode(width, layout)
            return PiecesPlan(d, None)
        self.backend.plan_piece_decode(width, parts[0])
        if T in self.prefills and self.backend.plan_piece_prefill(T, d, parts[1]):
            return PiecesPlan(d, None, whole=True)
        return PiecesPlan(d, self.backend.prepare(parts[1]))

    def can_run(self, num_tokens: int) -> bool:
        return 0 < num_tokens <= self.max_tokens

    def run(self, ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor,
            plan: PiecesPlan) -> torch.Tensor:
        """ids, positions, out_loc: (T,) on the device; plan: `prepare`'s for this step. Returns
        the final hidden states (T, hidden), a view of a static buffer: read it before the next
        step. Call on the model runner's stream."""
        T = ids.size(0)
        bucket = self.bucket(T)
        self.ids[:T].copy_(ids)
        self.positions[:T].copy_(positions)
        self.out_loc[:T].copy_(out_loc)
        self.out_loc[T:bucket].fill_(self.dummy_loc)  # padded rows write into the dummy page
        d, rest, whole = plan  # rows [0, d) are attended inside the pieces; all, where whole
        pieces = (self.whole_graphs if whole else self.decode_graphs if d else self.graphs)[bucket]
        if rest is None:
            for piece in pieces:
                piece.replay()
            return self.hidden[:T]
        # straight into the buffer the next piece reads, after what the piece wrote there
        attend = self.backend.bind_layers(self.q[d:T], self.attn_out[d:T], rest, self.kv_pool)
        for i in range(len(pieces) - 1):
            pieces[i].replay()
            attend(i)
        pieces[-1].replay()
        return self.hidden[:T]
