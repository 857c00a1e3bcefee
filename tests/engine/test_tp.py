"""Tensor parallelism on CPU over gloo: TP=2 and TP=4 give TP=1's tokens (batched, chunked,
prefix-cached, sampled), each rank reads only its shard, bad shapes are refused before any
process starts, and a dead or stuck rank ends the run with an error instead of a hang.

The test checkpoints have 4 heads and 2 KV heads, so TP=4 replicates each KV head on two ranks.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_pool import register_engine
from radixserve.engine import LLM, SamplingParams
from radixserve.engine.config import EngineConfig
from radixserve.engine.core import EngineCore
from radixserve.engine.cuda_graph import graph_batch_sizes
from radixserve.engine.distributed import Communicator, SingleRankComm, TPGroupError, comm_scope
from radixserve.engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
from radixserve.engine.model_runner import ModelRunner
from radixserve.engine.models import loader

BASE = {"device": "cpu", "dtype": "float32", "page_size": 4, "tp_timeout_s": 60.0}
CONFIGS = {"batched": {}, "chunked": {"max_prefill_tokens": 16},
           # the plans over gloo broadcasts instead of the shared-memory ring (what several hosts
           # would need)
           "chunked-gloo": {"max_prefill_tokens": 16, "tp_control": "gloo"},
           # prefill through the pieces of the piecewise graphs (uncaptured on CPU): the
           # collectives of each piece as a captured graph would run them
           "pieces": {"piecewise_graph_max_tokens": 64}}
GREEDY = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)


def prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(n)] for n in (3, 5, 9, 17, 23, 40)]


def cached_prompts() -> list[list[int]]:
    """Repeats and extensions of `prompts()`: their first pages come from the prefix cache."""
    first = prompts()
    return [first[5], first[4] + [7, 8, 9], first[3], first[5][:30] + [11, 12]]


def sampled() -> list[SamplingParams]:
    return [SamplingParams(temperature=0.8, top_p=0.9, repetition_penalty=1.3, max_new_tokens=8,
                           ignore_eos=True, seed=100 + i) for i in range(3)]


def run(path: Path, tp: int, config: dict[str, Any]) -> dict[str, Any]:
    with LLM(str(path), tp_size=tp, **BASE, **config) as llm:
        register_engine(llm.core)  # the pool invariant is checked after the test
        first = llm.generate(prompts(), GREEDY)
        second = llm.generate(cached_prompts(), GREEDY)
        draws = llm.generate(prompts(1)[:3], sampled())
        workers = llm.core.tp.workers if llm.core.tp else []
        pieces = llm.core.runner.pieces is not None
        assert llm.core.tp is None or not llm.core.tp.comm.supports_cuda_graph  # gloo: host-run
    assert [p.returncode for p in workers] == [0] * len(workers), "a worker did not leave cleanly"
    return {"pieces": pieces, "batched": [o.token_ids for o in first],
            "cached": [o.token_ids for o in second],
            "cached_tokens": [o.cached_tokens for o in second],
            "sampled": [o.token_ids for o in draws]}


@pytest.fixture(scope="module")
def single_rank(ckpt):
    results: dict[tuple[str, str], dict[str, Any]] = {}

    def get(kind: str, config: str) -> dict[str, Any]:
        if (kind, config) not in results:
            results[kind, config] = run(ckpt(kind), 1, CONFIGS[config])
        return results[kind, config]

    return get


# Each run is batched (six prompts share steps) and prefix-cached (its second batch reuses pages);
# the chunked one also splits prompts over steps. TP=4 runs chunked only, to keep the file quick.
@pytest.mark.parametrize("tp, config", [(2, "batched"), (2, "chunked"), (4, "chunked"),
                                        (2, "chunked-gloo"), (2, "pieces")])
@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_tp_matches_single_rank(kind, tp, config, ckpt, single_rank):
    ref = single_rank(kind, config)
    got = run(ckpt(kind), tp, CONFIGS[config])
    assert all(n > 0 for n in got["cached_tokens"]), got["cached_tokens"]
    assert got["pieces"] == (config == "pieces")
    assert got == ref


def test_tp_under_kv_pressure_matches_single_rank(ckpt):
    """A pool with room for about two requests: admission waits (or retracts) on rank 0 alone,
    and the followers still replay exactly what ran."""
    batch = [[(i * 37 + j) % 900 + 3 for j in range(20 + i)] for i in range(8)]
    results = []
    for tp, pages in ((1, None), (2, 24)):
        with LLM(str(ckpt("llama")), tp_size=tp, num_pages=pages, **BASE) as llm:
            results.append([o.token_ids for o in llm.generate(batch, GREEDY)])
            register_engine(llm.core)
    assert results[0] == results[1]


def test_one_tp_engine_at_a_time_per_process(ckpt):
    """A second engine while the first is open is refused with what to do, and leaves the first
    unharmed; after `with` or close() the next one builds and gives the same tokens."""
    path, batch = str(ckpt("llama")), prompts()[:3]
    with LLM(path, tp_size=2, **BASE) as first:
        register_engine(first.core)
        ref = [o.token_ids for o in first.generate(batch, GREEDY)]
        with pytest.raises(RuntimeError, match=r"already running in this process.*close it first"):
            LLM(path, tp_size=2, **BASE)
        assert [o.token_ids for o in first.generate(batch, GREEDY)] == ref
    for _ in range(2):  # after the with block, then after close()
        again = LLM(path, tp_size=2, **BASE)
        register_engine(again.core)
        try:
            assert [o.token_ids for o in again.generate(batch, GREEDY)] == ref
        finally:
            again.close()


# -- sharded loading ----------------------------------------------------------------------------
class FakeComm(Communicator):
    """Rank `rank` of `world_size`, for building and loading a shard without a group."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("loading needs no collectives")

    all_gather = all_reduce  # type: ignore[assignment]


class CountingFile:
    """A safe_open handle whose slices count the elements they hand out."""

    def __init__(self, handle: Any, counter: list[int]) -> None:
        self.handle, self.counter = handle, counter

    def keys(self) -> list[str]:
        return list(self.handle.keys())

    def get_slice(self, name: str) -> Any:
        source, counter = self.handle.get_slice(name), self.counter

        class Counting:
            def __getitem__(self, index: Any) -> torch.Tensor:
                t = source[index]
                counter[0] += t.numel()
                return t

        return Counting()


def load_counting(path: Path, comm: Communicator, monkeypatch) -> tuple[Any, int]:
    counter = [0]
    real = loader.safe_open

    class Open:
        def __init__(self, *a: Any, **kw: Any) -> None:
            self.cm = real(*a, **kw)

        def __enter__(self) -> CountingFile:
            return CountingFile(self.cm.__enter__(), counter)

        def __exit__(self, *exc: object) -> None:
            self.cm.__exit__(*exc)

    monkeypatch.setattr(loader, "safe_open", Open)
    with comm_scope(comm):
        model = loader.load_model(path, torch.float32, torch.device("cpu"))
    monkeypatch.setattr(loader, "safe_open", real)
    return model, counter[0]


@pytest.mark.parametrize("kind, tp", [("llama", 2), ("llama", 4), ("qwen3", 2)])
def test_each_rank_reads_only_its_shard(kind, tp, ckpt, monkeypatch):
    path = ckpt(kind)
    full, _ = load_counting(path, SingleRankComm(), monkeypatch)
    V, kv, hd = full.args.vocab_size, full.args.num_kv_heads, full.args.head_dim
    f = dict(full.named_parameters())
    shards = []
    for rank in range(tp):
        model, n_read = load_counting(path, FakeComm(rank, tp), monkeypatch)
        emb = model.model.embed_tokens
        pad_rows = emb.shard - max(0, min(emb.shard, V - emb.start))
        heads = 1 if full.args.tie_word_embeddings else 2
        held = sum(p.numel() for p in model.parameters()) - pad_rows * emb.weight.size(1) * heads
        assert n_read == held, f"rank {rank} read {n_read} elements for {held} it holds"
        shards.append(dict(model.named_parameters()))
    # Putting the shards back together gives the full weights.
    cat = lambda name, dim: torch.cat([s[name] for s in shards], dim)
    layer = "model.layers.1."
    assert torch.equal(cat(layer + "self_attn.o_proj.weight", 1),
                       f[layer + "self_attn.o_proj.weight"])
    assert torch.equal(cat(layer + "mlp.down_proj.weight", 1), f[layer + "mlp.down_proj.weight"])
    assert torch.equal(cat("model.embed_tokens.weight", 0)[:V], f["model.embed_tokens.weight"])
    gate_up = [s[layer + "mlp.gate_up_proj.weight"].chunk(2) for s in shards]
    assert torch.equal(torch.cat([g for g, _ in gate_up] + [u for _, u in gate_up]),
                       f[layer + "mlp.gate_up_proj.weight"])
    qkv_name = layer + "self_attn.qkv_proj.weight"
    q_rows, kv_local = full.args.num_heads * hd // tp, max(1, kv // tp)
    assert torch.equal(torch.cat([s[qkv_name][:q_rows] for s in shards]),
                       f[qkv_name][: q_rows * tp])
    k_full = f[qkv_name][q_rows * tp : q_rows * tp + kv * hd]
    for rank, s in enumerate(shards):  # each rank's K heads are the ones its query heads use
        first = rank * kv // tp
        assert torch.equal(s[qkv_name][q_rows : q_rows + kv_local * hd],
                           k_full[first * hd : (first + kv_local) * hd])


# -- shapes that do not split -------------------------------------------------------------------
@pytest.mark.parametrize("tp, change, message", [
    (3, {}, "num_attention_heads (4) is not divisible"),
    (2, {"num_attention_heads": 12, "num_key_value_heads": 3},
     "num_key_value_heads (3) is neither"),
    (4, {"intermediate_size": 250}, "intermediate_size (250) is not divisible"),
])
def test_shapes_that_do_not_split_are_rejected_before_spawning(tp, change, message, ckpt, tmp_path):
    cfg = json.loads((ckpt("llama") / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineCore(EngineConfig(model_path=str(tmp_path), device="cpu", tp_size=tp))


def test_layers_refuse_uneven_shards():
    with comm_scope(FakeComm(0, 3)), pytest.raises(ValueError, match=r"attention heads \(4\)"):
        QKVParallelLinear(64, 16, 4, 2, bias=False)
    with comm_scope(FakeComm(0, 4)), pytest.raises(ValueError, match=r"exceeds the KV heads \(3\)"):
        QKVParallelLinear(64, 16, 12, 3, bias=False)
    with comm_scope(FakeComm(0, 4)), pytest.raises(ValueError, match="merged part 0"):
        MergedColumnParallelLinear(64, [6, 6])


# -- on two GPUs: NCCL, graphs captured with the collectives inside ------------------------------
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
GPU = {"device": "cuda", "tp_timeout_s": 60.0}


def _agree(a: Any, b: Any) -> bool:
    """Greedy outputs agree: equal, or at the first divergence each token is in the other's top-5
    (bf16 kernels of different shapes may round a near tie either way; docs/reliability.md #25)."""
    for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)):
        if x != y:
            return (x in {t for t, _ in b.logprobs[i].top}
                    and y in {t for t, _ in a.logprobs[i].top})
    return len(a.token_ids) == len(b.token_ids)


@TWO_GPUS
def test_tp_on_two_gpus_in_float32_with_captured_pieces_matches_single_rank(ckpt):
    """float32 with the torch backend: no decode graphs, so every step replays the piecewise
    graphs, whose captured all-reduces must leave TP=1's tokens."""
    cfg = {**GPU, "dtype": "float32", "attention_backend": "torch", "page_size": 4}
    results = []
    for tp in (1, 2):
        with LLM(str(ckpt("qwen3")), tp_size=tp, **cfg) as llm:
            register_engine(llm.core)
            assert llm.core.runner.pieces is not None
            results.append([o.token_ids for o in llm.generate(prompts(), GREEDY)])
    assert results[0] == results[1]


@TWO_GPUS
def test_tp_on_two_gpus_with_decode_graphs_agrees_with_eager(ckpt):
    """bf16 FlashInfer at TP=2: decode graphs (all-reduces and the LM head's all-gather inside)
    and pieces agree with the same group run eagerly, batch sizes padded or not."""
    params = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True, top_logprobs=5)
    outs = []
    for graphs in (True, False):
        with LLM(str(ckpt("qwen3")), tp_size=2, cuda_graph=graphs,
                 **{**GPU, "attention_backend": "flashinfer"}) as llm:
            register_engine(llm.core)
            assert (llm.core.runner.graphs is not None) == graphs
            outs.append([llm.generate(prompts()[:n], params) for n in (1, 3, 6)])
    for with_graphs, eager in zip(*outs):
        assert all(_agree(a, b) for a, b in zip(with_graphs, eager))


# -- CUDA graphs --------------------------------------------------------------------------------
class CapturableComm(FakeComm):
    supports_cuda_graph = True  # as NCCL's: enqueued on the capturing stream


class AnyPageSize:
    name = "test"

    def supports_cuda_graph(self, page_size: int) -> bool:
        return True


@pytest.mark.parametrize("device, comm, captured", [
    ("cuda", CapturableComm(0, 2), True),
    ("cuda", FakeComm(0, 2), False),  # as gloo's: the host runs the collective
    ("cpu", CapturableComm(0, 2), False),  # CPU never captures
])
def test_graphs_at_tp_only_with_a_capturable_communicator(device, comm, captured, tmp_path):
    """Which decode batch sizes and prefill token buckets a TP rank would capture."""
    runner = ModelRunner.__new__(ModelRunner)  # the choice alone, no model or device needed
    runner.config = EngineConfig(model_path=str(tmp_path), tp_size=2, max_running_requests=8,
                                 max_prefill_tokens=64)
    runner.device, runner.backend = torch.device(device), AnyPageSize()
    with comm_scope(comm):
        sizes, buckets = runner._graph_sizes(), runner._piece_buckets()
    # decode graphs to cuda_graph_max_batch: steps with short prompts have rows beyond the slots
    want = graph_batch_sizes(EngineConfig.cuda_graph_max_batch)
    assert (sizes == want and buckets[-1] == 72) if captured else (sizes == buckets == [])


# -- failures -----------------------------------------------------------------------------------
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig, message", [
    pytest.param(signal.SIGKILL, "worker rank 1 exited with code -9", id="killed"),
    pytest.param(signal.SIGSTOP, "worker rank 1 sent no heartbeat", id="stopped"),
])
@pytest.mark.parametrize("control, device", [
    ("shm", "cpu"), ("gloo", "cpu"),
    # NCCL notices no dead peer by itself: the watchdog's abort ends rank 0's wait
    pytest.param("shm", "cuda", marks=TWO_GPUS),
])
def test_dead_or_stuck_worker_mid_generation_raises_naming_it(sig, message, control, device,
                                                              ckpt):
    """A follower killed or stopped while requests decode: rank 0 raises TPGroupError naming it in
    seconds (the watchdog aims at 5 s), not at tp_timeout_s (300 s by default)."""
    llm = LLM(str(ckpt("qwen3")), tp_size=2, tp_control=control,
              **{**BASE, "device": device, "tp_timeout_s": 300.0})
    core, worker = llm.core, llm.core.tp.workers[0]
    try:
        long = SamplingParams(temperature=0, max_new_tokens=200, ignore_eos=True)
        for i, ids in enumerate(prompts()):
            core.add_request(f"r{i}", ids, long)
        for _ in range(4):  # every prompt prefilled, decoding under way
            core.step()
        os.kill(worker.pid, sig)
        start = time.monotonic()
        with pytest.raises(TPGroupError, match=re.escape(message)):
            while core.has_work():
                core.step()
        elapsed = time.monotonic() - start
        print(f"{control} {signal.Signals(sig).name}: TPGroupError after {elapsed:.2f} s")
        assert elapsed < 10, f"took {elapsed:.1f} s"  # generous: a loaded 2-core machine
        with pytest.raises(TPGroupError):  # the group stays failed
            core.step()
    finally:
        llm.close()  # kills a stopped worker too
    assert worker.returncode is not None


def _alive(pid: int) -> bool:
    try:  # a zombie (state Z) has exited; only its parent's reaping is left
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(90)
def test_workers_exit_when_rank0_dies(ckpt):
    script = ("import time\nfrom radixserve.engine.config import EngineConfig\n"
              "from radixserve.engine.core import EngineCore\n"
              f"core = EngineCore(EngineConfig(model_path={str(ckpt('llama'))!r}, device='cpu', "
              "tp_size=2))\n"
              "print(core.tp.workers[0].pid, flush=True)\ntime.sleep(60)\n")
    rank0 = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(rank0.stdout.readline())
    finally:
        rank0.kill()
        rank0.wait()
    deadline = time.monotonic() + 15
    while _alive(pid):
        assert time.monotonic() < deadline, f"worker {pid} outlived rank 0"
        time.sleep(0.1)
