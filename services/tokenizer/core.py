"""Tokenization jobs over a Hugging Face tokenizer, one failure contained per job."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc
import jinja2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncodeText:
    text: str
    add_special_tokens: bool = True


@dataclass(frozen=True)
class EncodeChat:
    messages: tuple[tuple[str, str], ...]  # (role, content)
    add_generation_prompt: bool = True


@dataclass(frozen=True)
class Decode:
    token_ids: tuple[int, ...]
    skip_special_tokens: bool = False


JobKind = EncodeText | EncodeChat | Decode


class JobFailure(NamedTuple):
    code: grpc.StatusCode
    message: str


JobOutcome = list[int] | str | JobFailure


class TokenizerInfo(NamedTuple):
    vocab_size: int
    has_chat_template: bool
    special_token_ids: list[int]


# Exceptions that a bad input (not a bug) raises from tokenizers and chat templates; templates
# signal "unsupported conversation" through raise_exception, which is a jinja2 TemplateError.
_USER_ERRORS = (ValueError, TypeError, KeyError, IndexError, UnicodeError, jinja2.TemplateError)


class TokenizerCore:
    """Runs jobs against one tokenizer. Thread-safe for reads, which is all it does."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.info = TokenizerInfo(
            vocab_size=len(tokenizer),
            has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
            special_token_ids=sorted(set(tokenizer.all_special_ids)),
        )

    @classmethod
    def from_pretrained(cls, model_path: str) -> TokenizerCore:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(model_path))

    def run_batch(self, jobs: list[JobKind]) -> list[JobOutcome]:
        return [self.run(job) for job in jobs]

    def run(self, job: JobKind) -> JobOutcome:
        try:
            if isinstance(job, EncodeText):
                return self._encode_text(job)
            if isinstance(job, EncodeChat):
                return self._encode_chat(job)
            return self._decode(job)
        except _USER_ERRORS as exc:
            return JobFailure(grpc.StatusCode.INVALID_ARGUMENT,
                              f"tokenizer rejected the input: {exc}")
        except Exception as exc:  # a poison input fails only its own job
            log.exception("tokenizer job failed")
            return JobFailure(grpc.StatusCode.INTERNAL, f"tokenizer failed: {type(exc).__name__}")

    def _encode_text(self, job: EncodeText) -> list[int]:
        return list(self._tok.encode(job.text, add_special_tokens=job.add_special_tokens))

    def _encode_chat(self, job: EncodeChat) -> list[int] | JobFailure:
        if not self.info.has_chat_template:
            return JobFailure(grpc.StatusCode.INVALID_ARGUMENT, "the model has no chat template")
        messages = [{"role": role, "content": content} for role, content in job.messages]
        text = self._tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=job.add_generation_prompt
        )
        # The template already wrote any BOS it wants; adding special tokens again would double it.
        return list(self._tok.encode(text, add_special_tokens=False))

    def _decode(self, job: Decode) -> str | JobFailure:
        bad = [t for t in job.token_ids if t >= self.info.vocab_size]
        if bad:
            return JobFailure(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"token id {bad[0]} is outside the vocabulary (size {self.info.vocab_size})",
            )
        return str(self._tok.decode(list(job.token_ids),
                                    skip_special_tokens=job.skip_special_tokens))
