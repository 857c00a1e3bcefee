"""Tokenizer jobs (`services/tokenizer/core.py`): a poison input fails only its own job."""

from __future__ import annotations

from typing import Any

import grpc
from radixserve.services.tokenizer.core import (
    Decode,
    EncodeChat,
    EncodeText,
    JobFailure,
    TokenizerCore,
)


class _PoisonTemplate:
    """A tokenizer whose chat template raises the way a template's raise_exception does."""

    chat_template = "{{ raise_exception('bad role') }}"
    all_special_ids = (0,)

    def __len__(self) -> int:
        return 10

    def apply_chat_template(self, *a: Any, **kw: Any) -> str:
        import jinja2

        raise jinja2.TemplateError("bad role")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if text == "boom":
            raise RuntimeError("tokenizer bug")
        return [1, 2]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "ab"


def test_tokenizer_poison_fails_only_its_job() -> None:
    core = TokenizerCore(_PoisonTemplate())
    out = core.run_batch([EncodeChat((("user", "x"),)), EncodeText("boom"), EncodeText("ok"),
                          Decode((1, 99))])
    assert isinstance(out[0], JobFailure) and out[0].code == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(out[1], JobFailure) and out[1].code == grpc.StatusCode.INTERNAL
    assert out[2] == [1, 2]
    assert isinstance(out[3], JobFailure) and "outside the vocabulary" in out[3].message
