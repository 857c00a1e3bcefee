"""Turn a step's sampling requests into the device tensors the sampler reads."""

from __future__ import annotations

import torch
from radixserve.engine.constrained.bitmask import GrammarMask
from radixserve.engine.sampling.race import M32
from radixserve.engine.sampling.sampler import Penalties, SamplingBatch
from radixserve.engine.scheduler.batch import Batch


def build_sampling_batch(batch: Batch, rows: list[int], eos_ids: tuple[int, ...],
                         dev: torch.device, grammar: GrammarMask | None = None) -> SamplingBatch:
    reqs = [batch.reqs[i] for i in rows]
    params = [r.params for r in reqs]
    # output index sampled now
    steps = [batch.seq_lens[i] - r.prompt_len for i, r in zip(rows, reqs)]

    def col(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(dev, non_blocking=True)

    greedy = [p.greedy for p in params]
    top_k = [p.top_k if p.top_k > 0 else 1 << 30 for p in params]
    pen_rows = [j for j, p in enumerate(params) if p.has_penalties]
    penalties = None
    if pen_rows:
        penalties = Penalties(
            rows=col(pen_rows, torch.int64),
            slots=col([reqs[j].slot for j in pen_rows], torch.int64),
            prompt_lens=col([reqs[j].prompt_len for j in pen_rows], torch.int64),
            seq_lens=col([batch.seq_lens[rows[j]] for j in pen_rows], torch.int64),
            repetition=col([[params[j].repetition_penalty] for j in pen_rows], torch.float32),
            frequency=col([[params[j].frequency_penalty] for j in pen_rows], torch.float32),
            presence=col([[params[j].presence_penalty] for j in pen_rows], torch.float32),
        )
    # Until min_new_tokens are out, the tokens that would end the request are banned; a constrained
    # row is left to its grammar, which may allow nothing but the end.
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    for j, (p, step) in enumerate(zip(params, steps)):
        if step < p.min_new_tokens and p.constraint is None:
            ids = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids))
            ban_rows += [j] * len(ids)
            ban_ids += sorted(ids)
    return SamplingBatch(
        all_greedy=all(greedy),
        greedy=col(greedy, torch.bool),
        temperature=col([[1.0 if g else p.temperature] for g, p in zip(greedy, params)],
                        torch.float32),
        top_k=col([[k] for k in top_k], torch.int64) if any(p.top_k > 1 for p in params) else None,
        top_p=(col([[p.top_p] for p in params], torch.float32)
               if any(p.top_p < 1 for p in params) else None),
        min_p=(col([[p.min_p] for p in params], torch.float32)
               if any(p.min_p > 0 for p in params) else None),
        seed_lo=col([r.seed & M32 for r in reqs], torch.int64),
        seed_hi=col([(r.seed >> 32) & M32 for r in reqs], torch.int64),
        step=col(steps, torch.int64),
        penalties=penalties,
        suppress=(col(ban_rows, torch.int64), col(ban_ids, torch.int64)) if ban_rows else None,
        grammar=grammar,
        num_top_logprobs=max(p.top_logprobs for p in params),
        want_logprobs=any(p.wants_logprobs for p in params),
    )
