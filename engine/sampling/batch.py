"""Turn a step's sampling requests into the device tensors the sampler reads."""

from __future__ import annotations

from typing import Sequence

import torch
from radixserve.engine.constrained.bitmask import HostGrammarMask, to_device
from radixserve.engine.sampling.sampler import Penalties, SamplingBatch
from radixserve.engine.scheduler.batch import Batch
from radixserve.engine.upload import upload_columns


def build_sampling_batch(batch: Batch, rows: list[int], eos_ids: tuple[int, ...],
                         dev: torch.device, grammar: HostGrammarMask | None = None
                         ) -> SamplingBatch:
    reqs = [batch.reqs[i] for i in rows]
    params = [r.params for r in reqs]
    # output index sampled now
    steps = [batch.seq_lens[i] - r.prompt_len for i, r in zip(rows, reqs)]
    (greedy, temperature, top_k, uses_top_k, top_p, uses_top_p, min_p, uses_min_p, has_penalties,
     min_new_tokens, top_logprobs, wants_logprobs, seed_lo, seed_hi) = zip(
        *[r.sampler_options for r in reqs])
    # Every column goes to the device in one copy (upload_columns); optional ones only when a row
    # uses them.
    cols: dict[str, tuple[Sequence, torch.dtype]] = {
        "greedy": (greedy, torch.bool),
        "temperature": (temperature, torch.float32),
        "seed_lo": (seed_lo, torch.int64),
        "seed_hi": (seed_hi, torch.int64),
        "step": (steps, torch.int64),
    }
    if any(uses_top_k):
        cols["top_k"] = (top_k, torch.int64)
    if any(uses_top_p):
        cols["top_p"] = (top_p, torch.float32)
    if any(uses_min_p):
        cols["min_p"] = (min_p, torch.float32)
    pen_rows = [j for j, pen in enumerate(has_penalties) if pen]
    if pen_rows:
        cols.update(
            pen_rows=(pen_rows, torch.int64),
            pen_slots=([reqs[j].slot for j in pen_rows], torch.int64),
            pen_prompt_lens=([reqs[j].prompt_len for j in pen_rows], torch.int64),
            pen_seq_lens=([batch.seq_lens[rows[j]] for j in pen_rows], torch.int64),
            repetition=([params[j].repetition_penalty for j in pen_rows], torch.float32),
            frequency=([params[j].frequency_penalty for j in pen_rows], torch.float32),
            presence=([params[j].presence_penalty for j in pen_rows], torch.float32),
        )
    # Until min_new_tokens are out, the tokens that would end the request are banned; a constrained
    # row is left to its grammar, which may allow nothing but the end. (Decided by the mask, which
    # tensor-parallel followers get too, not by the params, whose constraint they do not see.)
    constrained = set(grammar.rows) if grammar is not None else set()
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    for j in [j for j, (s, m) in enumerate(zip(steps, min_new_tokens)) if s < m]:
        p = params[j]
        if j not in constrained:
            ids = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids))
            ban_rows += [j] * len(ids)
            ban_ids += sorted(ids)
    if ban_rows:
        cols.update(ban_rows=(ban_rows, torch.int64), ban_ids=(ban_ids, torch.int64))
    d = dict(zip(cols, upload_columns(list(cols.values()), dev)))
    penalties = None
    if pen_rows:
        penalties = Penalties(rows=d["pen_rows"], slots=d["pen_slots"],
                              prompt_lens=d["pen_prompt_lens"], seq_lens=d["pen_seq_lens"],
                              repetition=d["repetition"][:, None],
                              frequency=d["frequency"][:, None], presence=d["presence"][:, None])
    return SamplingBatch(
        all_greedy=all(greedy),
        greedy=d["greedy"],
        temperature=d["temperature"][:, None],
        top_k=d["top_k"][:, None] if "top_k" in d else None,
        top_p=d["top_p"][:, None] if "top_p" in d else None,
        min_p=d["min_p"][:, None] if "min_p" in d else None,
        seed_lo=d["seed_lo"],
        seed_hi=d["seed_hi"],
        step=d["step"],
        penalties=penalties,
        suppress=(d["ban_rows"], d["ban_ids"]) if ban_rows else None,
        grammar=to_device(grammar, dev) if grammar is not None else None,
        num_top_logprobs=max(top_logprobs),
        want_logprobs=any(wants_logprobs),
    )
