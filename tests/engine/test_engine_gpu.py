"""The whole engine in bf16 on a CUDA device against transformers (skipped without CUDA).

docs/reliability.md #25: 16 prompts x 32 greedy tokens; tokens equal, or at the first divergence
each side's token is in the other's top-5; logprob max diff up to that point (the item's 5e-2 is
reported; the assertion bounds the engine's error against float32 by transformers bf16's own).
transformers runs teacher-forced over prompt + the engine's tokens, so every position is compared
on the same prefix. Figures are appended to $RADIXSERVE_TEST_RESULTS (JSON lines) when it is set.
"""

from __future__ import annotations

import gc
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from attention_cases import backend_marks
from checkpoints import _common, _save
from radixserve.engine import LLM, SamplingParams
from radixserve.engine.model_runner import ForwardOutput

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

NUM_PROMPTS, NEW_TOKENS, TOP = 16, 32, 5
LOGPROB_TOL = 5e-2

CONFIGS: dict[str, dict[str, Any]] = {
    "flashinfer+graphs": {"attention_backend": "flashinfer"},
    "flashinfer eager": {"attention_backend": "flashinfer", "cuda_graph": False},
    # decode graphs only: steps with prefill tokens run eagerly
    "flashinfer no pieces": {"attention_backend": "flashinfer", "piecewise_graph_max_tokens": 0},
    # pieces for steps up to 64 tokens (padded into buckets 16..64), eager steps above that
    "flashinfer small pieces": {"attention_backend": "flashinfer", "max_prefill_tokens": 48,
                                "piecewise_graph_max_tokens": 64},
    # pieces that capture no decode call (as every backend but FlashInfer's small kernel): the
    # decode rows of mixed steps run between the pieces
    "flashinfer pieces, no small decode": {"attention_backend": "flashinfer",
                                           "max_prefill_tokens": 48, "small_decode_rows": 0},
    # the prefill rows of mixed steps attended inside the pieces too: one graph replay a step
    # (no short prompts as decode-graph rows, which would take every mixed step of this test)
    "flashinfer pieces, prefill inside": {"attention_backend": "flashinfer",
                                          "max_prefill_tokens": 48, "piece_prefill_keys": 4096,
                                          "graph_prefill_keys": 0},
    # the same steps with their prefill attention between the pieces (FlashInfer's kernel)
    "flashinfer pieces, prefill between": {"attention_backend": "flashinfer",
                                           "max_prefill_tokens": 48, "piece_prefill_keys": 0,
                                           "graph_prefill_keys": 0},
    "flashinfer page1 chunked": {"attention_backend": "flashinfer", "page_size": 1,
                                 "max_prefill_tokens": 48},
    # chunks of 48 beside the decode rows replayed by the decode graphs, a row per new token
    "flashinfer prefill in decode graphs": {"attention_backend": "flashinfer",
                                            "max_prefill_tokens": 48,
                                            "graph_prefill_keys": 10**9},
    "flashinfer no-overlap": {"attention_backend": "flashinfer", "overlap": False},
    "torch eager": {"attention_backend": "torch", "cuda_graph": False},
    "auto, memory-sized pool": {"num_pages": None, "memory_fraction": 0.05},
    # flash-attn: paged kernels and graphs at page 256; flash-attn 2 gathers K/V and decodes
    # eagerly at page 16 (graphs asked for all the same); FA prefill with FlashInfer decode
    "fa+graphs page256": {"attention_backend": "fa", "page_size": 256, "num_pages": 128},
    "fa page16": {"attention_backend": "fa"},
    "fa,flashinfer+graphs page256": {"attention_backend": "fa,flashinfer", "page_size": 256,
                                     "num_pages": 128},
}


@pytest.fixture(scope="module")
def qwen3_hd128(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen3 with head_dim 128 (the kernels' common case)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("qwen3-hd128")
    arch = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128,
            "intermediate_size": 512, "num_hidden_layers": 4}
    return _save(Qwen3ForCausalLM, Qwen3Config(**(_common(path) | arch), tie_word_embeddings=True),
                 path, 11)


def _prompts(vocab: int) -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(5, 150))]
            for _ in range(NUM_PROMPTS)]


@torch.inference_mode()
def compare(hf: Any, hf32: Any, prompts: list[list[int]], outs: list[Any]) -> dict[str, Any]:
    """Item 25 against transformers bf16; and, to tell the engine's error from bf16's own, the max
    logprob error of the engine and of transformers bf16 against transformers float32."""
    identical = agreed = total = 0
    max_diff = engine_vs_fp32 = hf_vs_fp32 = 0.0
    top5_ok = True
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt + out.token_ids], device="cuda")
        logp = torch.log_softmax(hf(input_ids=ids).logits[0].float(), dim=-1)
        logp32 = torch.log_softmax(hf32(input_ids=ids).logits[0].float(), dim=-1)
        same = True
        for t, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
            pos = len(prompt) - 1 + t
            row = logp[pos]
            total += 1
            max_diff = max(max_diff, abs(lp.logprob - float(row[tok])))
            engine_vs_fp32 = max(engine_vs_fp32, abs(lp.logprob - float(logp32[pos, tok])))
            hf_vs_fp32 = max(hf_vs_fp32, abs(float(row[tok]) - float(logp32[pos, tok])))
            hf_tok = int(row.argmax())
            if hf_tok != tok:
                engine_top = {i for i, _ in lp.top}
                top5_ok &= tok in set(row.topk(TOP).indices.tolist()) and hf_tok in engine_top
                same = False
                break
            agreed += 1
        identical += same
    return {"prompts": len(prompts), "identical_prompts": identical, "tokens_agreed": agreed,
            "tokens_compared": total, "agreement": agreed / total, "max_logprob_diff": max_diff,
            "top5_at_divergence": top5_ok, "engine_vs_fp32": engine_vs_fp32,
            "hf_bf16_vs_fp32": hf_vs_fp32}


def _record(row: dict[str, Any]) -> None:
    target = os.environ.get("RADIXSERVE_TEST_RESULTS")
    if target:
        with open(target, "a") as f:
            f.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("name", [pytest.param(name, marks=backend_marks(
    config.get("attention_backend", "auto"))) for name, config in CONFIGS.items()])
def test_engine_bf16_matches_transformers(name, qwen3_hd128):
    from transformers import AutoModelForCausalLM

    config = {"num_pages": 2048, "max_running_requests": 16, **CONFIGS[name]}
    llm = LLM(str(qwen3_hd128), device="cuda", dtype="bfloat16", **config)
    prompts = _prompts(llm.core.model_info.vocab_size)
    params = SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS, ignore_eos=True,
                            top_logprobs=TOP)
    runner = llm.core.runner
    outs = llm.generate(prompts, params)
    llm.core.check_integrity()
    backend = runner.backend.name
    paths = runner.forward_paths  # whole_graph: steps with prefill rows attended inside
    if "prefill inside" in name:
        assert paths["whole_graph"] > 0, paths
    if llm.core.config.piece_prefill_keys == 0 or "flashinfer" not in backend:
        assert paths["whole_graph"] == 0, paths
    if "prefill between" in name:
        assert paths["pieces"] > 0, paths
    graphs = runner.graphs is not None
    # graphs wherever asked for and the backend can run them at this page size, else eager
    assert graphs == (config.get("cuda_graph", True)
                      and runner.backend.supports_cuda_graph(llm.core.config.page_size))
    pieces = runner.pieces is not None
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    hf = AutoModelForCausalLM.from_pretrained(str(qwen3_hd128), dtype=torch.bfloat16).cuda().eval()
    hf32 = AutoModelForCausalLM.from_pretrained(str(qwen3_hd128), dtype=torch.float32).cuda().eval()
    stats = compare(hf, hf32, prompts, outs)
    _record({"test": "engine_vs_transformers_bf16", "config": name, "backend": backend,
             "graphs": graphs, "pieces": pieces, "whole_graph_steps": paths["whole_graph"],
             **stats})
    assert all(len(o.token_ids) == NEW_TOKENS for o in outs)
    distinct = {tuple(o.token_ids) for o in outs}
    assert len(distinct) == NUM_PROMPTS, "outputs should differ across prompts"
    assert stats["top5_at_divergence"], stats
    # This random model's logits are steep (its init makes greedy output vary), so bf16 alone moves
    # logprobs by tenths: the engine's error must stay within transformers bf16's own.
    assert stats["engine_vs_fp32"] < max(LOGPROB_TOL, 1.5 * stats["hf_bf16_vs_fp32"]), stats


@pytest.mark.parametrize("config", [{"attention_backend": "flashinfer"},
                                    {"attention_backend": "flashinfer", "overlap": False,
                                     "prefill_budget": "compute"}])
def test_every_step_records_its_end_and_is_waited_on(config, qwen3_hd128, monkeypatch):
    """A step that samples nothing (each row a chunk in the middle of its prompt) still records an
    event, and the engine waits for it before it plans two steps on: FlashInfer's plans reuse a
    pinned host buffer every other step, so a host that ran further ahead overwrote a copy's source
    before the copy ran (illegal memory accesses while long prompts prefilled alone)."""
    llm = LLM(str(qwen3_hd128), device="cuda", dtype="bfloat16", num_pages=2048,
              max_running_requests=4, max_prefill_tokens=32, **config)
    runner = llm.core.runner
    launched: list[ForwardOutput] = []
    waited: list[ForwardOutput] = []
    forward, wait = runner.forward, ForwardOutput.wait

    def recorded(batch):
        launched.append(forward(batch))
        return launched[-1]

    def counted(self):
        waited.append(self)
        wait(self)

    monkeypatch.setattr(runner, "forward", recorded)
    monkeypatch.setattr(ForwardOutput, "wait", counted)
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 1000) for _ in range(400)] for _ in range(2)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))
    assert all(len(o.token_ids) == 4 for o in outs)
    assert any(not o.rows for o in launched), "the prompts should have been chunked alone"
    assert all(o.ready is not None for o in launched)
    assert {id(o) for o in launched} <= {id(o) for o in waited}
    llm.core.check_integrity()
