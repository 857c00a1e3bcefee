"""Decode rows attended inside the piecewise graphs (`AttentionBackend.piece_decode`), on a CPU.

The flashinfer backend captures its small decode kernel in every piece, over the bucket's first
rows, and runs only the other rows' attention between the pieces. Here a torch stand-in for that
kernel runs in the uncaptured pieces, so the runner's part is checked without a GPU: the call sits
after each layer's KV store, the runner's split of each step (`PiecewiseGraphRunner.prepare`)
reaches it, the rows it leaves (padding, which
the real kernel fills with what it likes) are written over by the calls between the pieces, and
the tokens are those of the eager engine. Steps without decode rows for the call replay the pieces
captured without it. With a prefill call too (the paged prefill kernel's place), a mixed step's
prefill rows are attended inside as well, in the bucket's one graph, where the call takes them.
"""

from __future__ import annotations

import random

import pytest
import torch
from radixserve.engine import SamplingParams
from radixserve.engine.attention.base import StepLayout
from radixserve.engine.attention.hybrid import HybridBackend
from radixserve.engine.attention.mixed import leading_decode_rows
from radixserve.engine.attention.torch_backend import TorchBackend
from radixserve.engine.piecewise_graph import PiecesPlan

GARBAGE = 1e4  # what the stand-in writes into the rows it does not attend


class _DecodeInPieces(TorchBackend):
    """The torch backend with a decode call for the pieces, planned as the flashinfer backend
    plans its small decode kernel: each leading one-token row's slot and length."""

    max_rows = 6

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.planned: list[tuple[int, int]] = []
        self.page_table: torch.Tensor | None = None
        self.calls = 0

    def piece_decode(self, tokens: int):
        width = min(tokens, self.max_rows)
        nkv, hd = self.num_kv_heads, self.head_dim
        group = self.num_heads // nkv

        def call(q, k_pages, v_pages, out) -> None:
            self.calls += 1
            k, v = k_pages.reshape(-1, nkv, hd), v_pages.reshape(-1, nkv, hd)
            out[len(self.planned):width] = GARBAGE
            for row, (slot, n) in enumerate(self.planned):
                loc = self.page_table[slot, :n]
                keys, values = k[loc].transpose(0, 1), v[loc].transpose(0, 1)  # (nkv, n, hd)
                qr = q[row].view(nkv, group, hd)
                w = torch.softmax(qr @ keys.transpose(1, 2) * self.scale, dim=-1)
                out[row] = (w @ values).reshape(-1, hd)

        return width, call

    def plan_piece_decode(self, width: int, decode: StepLayout) -> None:
        assert 0 < len(decode.seq_lens) <= width
        self.planned = list(zip(decode.slot_list, decode.seq_lens))
        self.page_table = decode.page_table


def _prompts() -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, 1000) for _ in range(rng.choice([1, 4, 9, 20, 33]))]
            for _ in range(14)]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from checkpoints import checkpoint

    return checkpoint("qwen3", tmp_path_factory)


def _serve(path, make_llm, monkeypatch, kind: type[_DecodeInPieces], hybrid: bool):
    """The prompts through an engine with pieces of buckets 16, 32 and 48, one arrival a step
    beside the requests decoding, its backend a stand-in of `kind` (alone, or as a hybrid's
    decode backend beside the torch backend's prefill, which offers its decode backend's calls
    to the pieces). Returns the eager engine's tokens, this one's, the stand-in, the engine core
    and each step's (decode rows, plan)."""
    p = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
    prompts = _prompts()
    config = {"max_prefill_tokens": 16, "max_running_requests": 8}
    ref = [o.token_ids for o in make_llm(path, **config).generate(prompts, p)]
    import radixserve.engine.model_runner as model_runner

    made: list[_DecodeInPieces] = []

    def create(name, *args, **kwargs):
        made.append(kind(*args, **kwargs))
        return HybridBackend(TorchBackend(*args, **kwargs), made[0]) if hybrid else made[0]

    monkeypatch.setattr(model_runner, "create_backend", create)
    core = make_llm(path, piecewise_graph_max_tokens=48, **config).core
    pieces = core.runner.pieces
    plans: list[tuple[int, PiecesPlan]] = []
    prepare = pieces.prepare

    def recorded(layout: StepLayout) -> PiecesPlan:
        plans.append((leading_decode_rows(layout), prepare(layout)))
        return plans[-1][1]

    monkeypatch.setattr(pieces, "prepare", recorded)
    tokens: dict[str, list[int]] = {}
    for step in range(400):
        if step < len(prompts):
            core.add_request(f"r{step}", prompts[step], p)
        for out in core.step():
            tokens.setdefault(out.rid, []).extend(out.token_ids)
        if not core.has_work():
            break
    return ref, [tokens[f"r{i}"] for i in range(len(prompts))], made[0], core, plans


@pytest.mark.parametrize("hybrid", [False, True], ids=["one backend", "hybrid"])
def test_decode_rows_in_the_pieces_give_the_eager_engines_tokens(path, make_llm, monkeypatch,
                                                                  hybrid):
    """Pieces of 6 decode rows, and steps of more than 6 decode rows; as one backend and as a
    hybrid's decode backend."""
    ref, got, backend, core, plans = _serve(path, make_llm, monkeypatch, _DecodeInPieces, hybrid)
    assert got == ref
    kinds = {(plan.rows > 0, plan.rest is not None) for _, plan in plans}
    assert kinds == {(True, True), (True, False), (False, True)}  # mixed, decode, prefill
    # steps of more decode rows than the call holds run them all between the pieces
    assert any(d > backend.max_rows and plan.rows == 0 for d, plan in plans)
    # in every piece of the steps with decode rows in the call, and only there: the others
    # replay the pieces captured without it
    with_call = sum(plan.rows > 0 for _, plan in plans)
    assert 0 < with_call < len(plans)
    assert backend.calls == with_call * core.args.num_layers


class _AllInPieces(_DecodeInPieces):
    """Also a prefill call for the pieces, planned as the flashinfer backend plans its paged
    prefill kernel (each prefill row's slot and positions), refusing requests past `max_keys`."""

    max_keys = 24

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prefill_planned: list[tuple[int, int, int]] = []
        self.first_row = 0
        self.prefill_calls = 0

    def piece_prefill(self, tokens: int):
        nkv, hd = self.num_kv_heads, self.head_dim
        group = self.num_heads // nkv

        def call(q, k_pages, v_pages, out) -> None:
            self.prefill_calls += 1
            k, v = k_pages.reshape(-1, nkv, hd), v_pages.reshape(-1, nkv, hd)
            row = self.first_row
            for slot, p, s in self.prefill_planned:
                loc = self.page_table[slot, :s]
                keys, values = k[loc].transpose(0, 1), v[loc].transpose(0, 1)  # (nkv, s, hd)
                for pos in range(p, s):
                    qr = q[row].view(nkv, group, hd)
                    w = torch.softmax(qr @ keys[:, : pos + 1].transpose(1, 2) * self.scale, -1)
                    out[row] = (w @ values[:, : pos + 1]).reshape(-1, hd)
                    row += 1

        return call

    def plan_piece_prefill(self, tokens: int, first_row: int, prefill: StepLayout) -> bool:
        if max(prefill.seq_lens) > self.max_keys:
            return False
        self.first_row = first_row
        self.prefill_planned = list(zip(prefill.slot_list, prefill.prefix_lens, prefill.seq_lens))
        self.page_table = prefill.page_table
        return True


@pytest.mark.parametrize("hybrid", [False, True], ids=["one backend", "hybrid"])
def test_prefill_rows_in_the_pieces_give_the_eager_engines_tokens(path, make_llm, monkeypatch,
                                                                   hybrid):
    """Mixed steps whose prefill rows the prefill call takes replay the bucket's one graph, both
    calls in every layer and none between (the decode call's padding rows, written first, are
    written over); the steps it refuses run their prefill rows between the pieces."""
    ref, got, backend, core, plans = _serve(path, make_llm, monkeypatch, _AllInPieces, hybrid)
    assert got == ref
    pieces = core.runner.pieces
    assert set(pieces.whole_graphs) == set(pieces.decode_graphs) == {16, 32, 48}
    whole = sum(plan.whole for _, plan in plans)
    assert all(plan.rest is None and plan.rows > 0 for _, plan in plans if plan.whole)
    # prompts of 33 tokens attend to more than 24 keys: refused, between the pieces
    refused = sum(plan.rows > 0 and plan.rest is not None for _, plan in plans)
    assert whole > 0 and refused > 0
    assert backend.prefill_calls == whole * core.args.num_layers
    assert backend.calls == sum(plan.rows > 0 for _, plan in plans) * core.args.num_layers
    # the engine's own count of how its forwards ran (radixserve_engine_forwards_total)
    paths = core.stats()["forward_paths"]
    assert paths["whole_graph"] == whole and paths["pieces"] == len(plans) - whole, paths
    assert paths["decode_graph"] == 0  # no decode graphs on a CPU
