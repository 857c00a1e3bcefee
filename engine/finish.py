"""When a request ends: the rules EngineCore applies to each token the host learns."""

from __future__ import annotations

import logging

from radixserve.engine.request import Req
from radixserve.engine.sampling.params import FinishReason

log = logging.getLogger(__name__)


def finish_reason(req: Req, token: int, eos_ids: tuple[int, ...]) -> FinishReason | None:
    """Why `token`, just appended to `req.output_ids`, ends the request; None if it goes on. A stop
    token is recorded in `req.matched_stop_token`."""
    # The sampler bans these ids until min_new_tokens are out, so no length check is needed.
    p = req.params
    if req.grammar is not None:
        return _grammar_finish(req, token)
    if not p.ignore_eos and token in eos_ids:
        return "eos"
    if token in p.stop_token_ids:
        req.matched_stop_token = token
        return "stop_token"
    if len(req.output_ids) >= req.max_new_tokens:
        return "length"
    return None


def _grammar_finish(req: Req, token: int) -> FinishReason | None:
    """A constrained request ends when its grammar accepts a stop token (EOS or one of
    stop_token_ids; the mask allows them only where the grammar is complete) or on length."""
    g = req.grammar
    assert g is not None
    if not g.accept(token):  # the mask allowed nothing (cannot happen with a sane grammar)
        log.warning("request %s: sampled token %d is outside its grammar", req.rid, token)
        return "aborted"
    assert g.num_accepted == len(req.output_ids), "grammar and outputs out of step"
    if g.terminated:
        if token in req.params.stop_token_ids:
            req.matched_stop_token = token
            return "stop_token"
        return "eos"
    return "length" if len(req.output_ids) >= req.max_new_tokens else None
