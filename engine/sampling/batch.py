"""Turn a step's sampling requests into the device tensors the sampler reads: host columns first
(`sampling_columns`), added to the step's one upload, then the batch from their device views
(`sampling_batch`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

import torch
from radixserve.engine.constrained.bitmask import HostGrammarMask, to_device
from radixserve.engine.sampling.sampler import Penalties, SamplingBatch
from radixserve.engine.scheduler.batch import Batch


@dataclass
class HostSampling:
    """A step's sampling options before their upload: named host columns, and what the sampler
    reads on the host."""

    columns: dict[str, tuple[Sequence, torch.dtype]]
    all_greedy: bool
    num_top_logprobs: int
    want_logprobs: bool


def constrained_rows(batch: Batch, rows: list[int]) -> list[int]:
    """Indices into `rows` of the rows a grammar constrains. Decided by the step's mask where it
    has one (tensor-parallel followers get the mask, not the constraint), else by the requests."""
    if batch.grammar is not None:
        return batch.grammar.rows
    return [j for j, i in enumerate(rows) if batch.reqs[i].grammar is not None]


def sampling_columns(batch: Batch, rows: list[int], eos_ids: tuple[int, ...],
                     constrained: Collection[int]) -> HostSampling:
    """The host columns of the sampled `rows`; `constrained`: those a grammar constrains."""
    reqs = [batch.reqs[i] for i in rows]
    params = [r.params for r in reqs]
    # output index sampled now
    steps = [batch.seq_lens[i] - r.prompt_len for i, r in zip(rows, reqs)]
    (greedy, temperature, top_k, uses_top_k, top_p, uses_top_p, min_p, uses_min_p, has_penalties,
     min_new_tokens, top_logprobs, wants_logprobs, seed_lo, seed_hi) = zip(
        *[r.sampler_options for r in reqs])
    # Optional columns only when a row uses them.
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
    # row is left to its grammar, which may allow nothing but the end.
    ban_rows: list[int] = []
    ban_ids: list[int] = []
    constrained = set(constrained)
    for j in [j for j, (s, m) in enumerate(zip(steps, min_new_tokens)) if s < m]:
        p = params[j]
        if j not in constrained:
            ids = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids))
            ban_rows += [j] * len(ids)
            ban_ids += sorted(ids)
    if ban_rows:
        cols.update(ban_rows=(ban_rows, torch.int64), ban_ids=(ban_ids, torch.int64))
    return HostSampling(cols, all(greedy), max(top_logprobs), any(wants_logprobs))


def sampling_batch(host: HostSampling, views: list[torch.Tensor],
                   grammar: HostGrammarMask | None, dev: torch.device) -> SamplingBatch:
    """The batch from `views`, the device copies of `host.columns` in their order."""
    d = dict(zip(host.columns, views))
    penalties = None
    if "pen_rows" in d:
        penalties = Penalties(rows=d["pen_rows"], slots=d["pen_slots"],
                              prompt_lens=d["pen_prompt_lens"], seq_lens=d["pen_seq_lens"],
                              repetition=d["repetition"][:, None],
                              frequency=d["frequency"][:, None], presence=d["presence"][:, None])
    return SamplingBatch(
        all_greedy=host.all_greedy,
        greedy=d["greedy"],
        temperature=d["temperature"][:, None],
        top_k=d["top_k"][:, None] if "top_k" in d else None,
        top_p=d["top_p"][:, None] if "top_p" in d else None,
        min_p=d["min_p"][:, None] if "min_p" in d else None,
        seed_lo=d["seed_lo"],
        seed_hi=d["seed_hi"],
        step=d["step"],
        penalties=penalties,
        suppress=(d["ban_rows"], d["ban_ids"]) if "ban_rows" in d else None,
        grammar=to_device(grammar, dev) if grammar is not None else None,
        num_top_logprobs=host.num_top_logprobs,
        want_logprobs=host.want_logprobs,
    )
