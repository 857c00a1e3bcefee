"""The offline API: `LLM(model_path, **config).generate(prompts, sampling_params)`."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from radixserve.engine.config import EngineConfig
from radixserve.engine.core import EngineCore, TokenLogprobs
from radixserve.engine.sampling.params import FinishReason, SamplingParams


@dataclass
class GenerationOutput:
    prompt: str | list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    matched_stop: str | int | None = None


def resolve_model_path(model_path: str) -> str:
    if model_path == "demo":
        from radixserve.engine.demo import demo_model_path

        return str(demo_model_path())
    if not (Path(model_path) / "config.json").exists():
        raise FileNotFoundError(f"{model_path} is not a Hugging Face model folder (no config.json)")
    return model_path


class LLM:
    def __init__(self, model_path: str = "demo", **config: Any) -> None:
        from radixserve.engine.detokenize import stream_decoder
        from transformers import AutoTokenizer

        path = resolve_model_path(model_path)
        self.core = EngineCore(EngineConfig(model_path=path, **config))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # Built once (a byte-level tokenizer's table reads the whole vocabulary), shared by every
        # request's detokenizer.
        self._decoder = stream_decoder(self.tokenizer)
        self._ids = itertools.count()

    def generate(self, prompts: Sequence[str] | Sequence[Sequence[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[GenerationOutput]:
        from radixserve.engine.detokenize import IncrementalDetokenizer

        if isinstance(prompts, str):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = ([params] * len(prompts) if isinstance(params, SamplingParams)
                       else list(params))
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        outputs: dict[str, GenerationOutput] = {}
        detoks: dict[str, IncrementalDetokenizer] = {}
        try:
            for prompt, p in zip(prompts, params_list):
                ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
                rid = f"offline-{next(self._ids)}"
                self.core.add_request(rid, ids, p)
                outputs[rid] = GenerationOutput(prompt if isinstance(prompt, str) else list(prompt))
                detoks[rid] = IncrementalDetokenizer(self._decoder, ids, stop=p.stop,
                                                     include_stop_str=p.include_stop_str)
        except BaseException:
            for rid in outputs:  # all or nothing: a bad prompt leaves no request behind
                self.core.abort(rid)
            raise
        pending = set(outputs)
        while pending:
            for step in self.core.step():
                out, detok = outputs[step.rid], detoks[step.rid]
                out.token_ids += step.token_ids
                out.prompt_tokens, out.cached_tokens = step.prompt_tokens, step.cached_tokens
                out.logprobs += step.logprobs or []
                if detok.watches_stops:  # text is needed now only to spot a stop string
                    delta = detok.push(step.token_ids)
                    out.text += delta.text
                    if delta.stopped is not None:  # a stop string ends the request here
                        self.core.abort(step.rid)
                        out.finish_reason, out.matched_stop = "stop_string", delta.stopped
                if out.finish_reason is None and step.finish_reason is not None:
                    out.finish_reason = step.finish_reason
                    out.matched_stop = step.matched_stop_token
                    if not detok.watches_stops:  # one decode at the end instead of one per token
                        out.text = detok.push(out.token_ids).text
                    out.text += detok.flush()
                    if detok.matched_stop is not None:  # held-back text completed a stop string
                        out.finish_reason, out.matched_stop = "stop_string", detok.matched_stop
                if out.finish_reason is not None:
                    pending.discard(step.rid)
        while self.core.has_work():  # retire the step still in flight (its rows are all finished)
            self.core.step()
        return list(outputs.values())

    def stats(self) -> dict[str, int]:
        return self.core.stats()

    def close(self) -> None:
        """Release the engine's worker processes (tensor parallelism); a no-op on one rank."""
        self.core.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
