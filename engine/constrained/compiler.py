"""GrammarCompiler: constraint text -> compiled grammar, against the model's tokenizer, cached.

Thread-safe: the scheduler service compiles on worker threads while the engine thread steps. The
cache is keyed by (kind, text) and bounded (least recently used out); xgrammar's own cache is off
so that this bound is the only one. xgrammar and the tokenizer are loaded on first use.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from radixserve.engine.sampling.params import ConstraintKind, InvalidRequestError

GRAMMAR_CACHE_SIZE = 256  # compiled grammars kept; each holds per-state token masks (KBs to MBs)
# xgrammar's messages start with a time stamp and a C++ source location: "[12:00:00] /x.cc:94: "
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")


class Grammar:
    """A compiled constraint, shared by every request that uses the same (kind, text)."""

    def __init__(self, kind: ConstraintKind, text: str, compiled: Any) -> None:
        self.kind, self.text = kind, text
        self.compiled = compiled  # xgrammar.CompiledGrammar

    @property
    def key(self) -> tuple[ConstraintKind, str]:
        return self.kind, self.text


class GrammarCompiler:
    """Compiles against the tokenizer in `tokenizer_path`. `vocab_size` is the model's (its logits'
    width), which may exceed the tokenizer's: the ids past the tokenizer are never allowed."""

    def __init__(self, tokenizer_path: str, vocab_size: int, eos_ids: tuple[int, ...],
                 cache_size: int = GRAMMAR_CACHE_SIZE) -> None:
        try:
            import xgrammar as xgr
        except ImportError as e:
            raise InvalidRequestError("structured output (json_schema, regex, ebnf) needs the "
                                      "xgrammar package, which this server does not have") from e
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=list(eos_ids) or None)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], Grammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # guards _cache only; compiling runs outside it

    def compile(self, kind: ConstraintKind, text: str) -> Grammar:
        """The compiled grammar; raises InvalidRequestError with the compiler's message."""
        key = (kind, text)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        c = self._compiler
        # JSON is generated compact (no free whitespace): fewer tokens, and a bounded language for
        # a bounded schema.
        compile_fn = {"json_schema": lambda t: c.compile_json_schema(t, any_whitespace=False),
                      "regex": c.compile_regex, "ebnf": c.compile_grammar}[kind]
        try:
            grammar = Grammar(kind, text, compile_fn(text))
        except (RuntimeError, ValueError, TypeError) as e:
            message = _LOG_PREFIX.sub("", str(e).strip())
            raise InvalidRequestError(f"{kind} does not compile: {message}") from e
        with self._lock:  # two threads may compile the same text at once: keep the first
            grammar = self._cache.setdefault(key, grammar)
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return grammar

    def cache_len(self) -> int:
        with self._lock:
            return len(self._cache)
