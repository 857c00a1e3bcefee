"""A model-free engine for measuring the serving plane: `RADIXSERVE_SYNTHETIC_STEP_MS=MS`.

With the variable set, `radixserve scheduler` runs this engine instead of the model. It steps every
MS milliseconds, the rhythm of a GPU's decode step, and emits one token per running request. It
waits for the next tick with the GIL released, as a real engine does while the device works. The
tokenizer, the detokenizer (with the model folder's real tokenizer) and the gateways work as
usual. The services' per-token and per-step work can then be loaded to a GPU's rate on any
machine: `radixserve bench serving --launch` under the variable reports each service's CPU time
per output token. A CPU run of the real model cannot: its steps are far too slow to load the
plane.

It admits up to `--max-running-requests` at once, in arrival order, and finishes each request on
its length. It has no prefix cache, no KV pool, no prefill cost and no sampling: tokens are a
per-request pseudo-random walk over the vocabulary that avoids EOS ids. Never set it in production.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixserve.engine.core import ModelInfo, StepOutput
from radixserve.engine.models.config import ModelArgs, read_eos_ids
from radixserve.engine.sampling.params import InvalidRequestError, SamplingParams

STEP_MS_ENV = "RADIXSERVE_SYNTHETIC_STEP_MS"


@dataclass
class _Request:
    rid: str
    prompt_len: int
    max_new: int
    token: int  # the last one emitted (the prompt's last id at first)
    produced: int = 0


class SyntheticEngine:
    """The `EngineLike` surface of EngineCore (services/scheduler/loop.py), without a model."""

    def __init__(self, model_path: str, step_s: float, max_running: int) -> None:
        folder = Path(model_path)
        args = ModelArgs.from_folder(folder)
        eos = read_eos_ids(folder)
        self.model_info = ModelInfo(folder.name, args.architecture, args.vocab_size,
                                    args.max_position_embeddings, eos, "synthetic")
        self._eos = frozenset(eos)
        self._step_s = step_s
        self._max_running = max_running
        self._waiting: deque[_Request] = deque()
        self._running: dict[str, _Request] = {}
        self._next_step = time.monotonic()
        self.prompt_tokens_total = 0

    def compile_grammar(self, params: SamplingParams) -> Any:
        if params.constraint is not None:
            raise InvalidRequestError("the synthetic engine takes no constraints")
        return None

    def add_request(self, rid: str, prompt_ids: list[int], params: SamplingParams,
                    after: str | None = None, grammar: Any = None) -> None:
        info = self.model_info
        if not prompt_ids:
            raise InvalidRequestError("prompt is empty")
        if any(rid == r.rid for r in self._waiting) or rid in self._running:
            raise InvalidRequestError(f"request id {rid!r} is already running")
        n = len(prompt_ids)
        max_new = (params.max_new_tokens if params.max_new_tokens is not None
                   else info.max_context - n)
        if n + max_new > info.max_context:
            raise InvalidRequestError(f"{n} tokens in prompt, {max_new} requested, limit "
                                      f"{info.max_context}")
        self._waiting.append(_Request(rid, n, max(1, max_new), prompt_ids[-1]))

    def abort(self, rid: str) -> bool:
        if self._running.pop(rid, None) is not None:
            return True
        for req in self._waiting:
            if req.rid == rid:
                self._waiting.remove(req)
                return True
        return False

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def step(self, launched_hook: Callable[..., None] | None = None) -> list[StepOutput]:
        # Steps start at least step_s apart, as steps of a device that takes step_s each; host
        # work between them overlaps that time, as under the real engine's overlap scheduling.
        if launched_hook is not None:  # as the engine's, once the device has work
            launched_hook()
        # The device's time (the GIL is free for the other threads), spent as the engine spends
        # it: waiting for commands through the hook, which applies each as it comes.
        while (wait := self._next_step - time.monotonic()) > 0:
            if launched_hook is None:
                time.sleep(wait)
                break
            launched_hook(wait)
        self._next_step = time.monotonic() + self._step_s
        while self._waiting and len(self._running) < self._max_running:
            req = self._waiting.popleft()
            self._running[req.rid] = req
            self.prompt_tokens_total += req.prompt_len
        outputs = []
        for rid, req in list(self._running.items()):
            req.token = self._next_token(req.token)
            req.produced += 1
            done = req.produced >= req.max_new
            if done:
                del self._running[rid]
            outputs.append(StepOutput(rid, [req.token], None, "length" if done else None, None,
                                      req.prompt_len, 0))
        return outputs

    def _next_token(self, token: int) -> int:
        vocab = self.model_info.vocab_size
        token = (token * 1103515245 + 12345) % vocab
        while token in self._eos:
            token = (token + 1) % vocab
        return token

    def stats(self) -> dict[str, Any]:
        return {"running_requests": len(self._running), "waiting_requests": len(self._waiting),
                "kv_pages_total": 0, "kv_pages_free": 0, "kv_pages_evictable": 0,
                "kv_pages_protected": 0, "page_size": 1, "cached_tokens_total": 0,
                "prompt_tokens_total": self.prompt_tokens_total}

    def check_integrity(self) -> None:
        assert not self._running and not self._waiting, "idle synthetic engine holds requests"


def factory_from_env(model_path: str, max_running: int) -> Callable[[], SyntheticEngine] | None:
    """A factory of synthetic engines when RADIXSERVE_SYNTHETIC_STEP_MS is set, else None."""
    value = os.environ.get(STEP_MS_ENV)
    if not value:
        return None
    try:
        step_ms = float(value)
    except ValueError:
        raise ValueError(f"{STEP_MS_ENV}={value!r}: expected milliseconds per step") from None
    if step_ms < 0:
        raise ValueError(f"{STEP_MS_ENV}={value!r}: expected milliseconds per step >= 0")
    return lambda: SyntheticEngine(model_path, step_ms / 1000, max_running)
