"""GrammarCompiler: constraint text -> compiled grammar, against the model's tokenizer, cached.

Thread-safe: the scheduler service compiles on worker threads while the engine thread steps. The
cache is keyed by (kind, text) and bounded (least recently used out); xgrammar's own cache is off
so that this bound is the only one. xgrammar and the tokenizer are loaded on first use.

Two limits keep one constraint from taking the server's compile capacity: a text longer than
`max_bytes` (UTF-8) is refused before anything compiles, and one that takes longer than
`timeout_s` to compile is refused. A text first compiles in a worker process, which is killed at
the limit (workers.py); only a text that compiled there in time is compiled again here, on the
caller's thread, which then takes about as long. Both refusals are InvalidRequestError, whose
message names the limit and the setting that raises it. A text that ran out of time is remembered
(the last TIMED_OUT_KEPT of them) and refused again at once: sent again, it would only take a
worker for another `timeout_s`.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

from radixserve.engine.constrained.workers import (
    COMPILE_WORKERS,
    CompileError,
    CompileTimeout,
    CompileWorkers,
    compile_text,
)
from radixserve.engine.sampling.params import ConstraintKind, InvalidRequestError

GRAMMAR_CACHE_SIZE = 256  # compiled grammars kept; each holds per-state token masks (KBs to MBs)
TIMED_OUT_KEPT = 64  # texts that ran out of time, refused at once when they come again
DEFAULT_MAX_CONSTRAINT_BYTES = 65536
DEFAULT_COMPILE_TIMEOUT_S = 10.0
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
                 cache_size: int = GRAMMAR_CACHE_SIZE,
                 max_bytes: int = DEFAULT_MAX_CONSTRAINT_BYTES,
                 timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S,
                 num_workers: int = COMPILE_WORKERS) -> None:
        try:
            import xgrammar as xgr
        except ImportError as e:
            raise InvalidRequestError("structured output (json_schema, regex, ebnf) needs the "
                                      "xgrammar package, which this server does not have") from e
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=[t for t in eos_ids
                                                                  if t < vocab_size] or None)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.workers = CompileWorkers(info.serialize_json(), num_workers)
        self.max_bytes, self.timeout_s = max_bytes, timeout_s
        self._cache: OrderedDict[tuple[str, str], Grammar] = OrderedDict()
        self._cache_size = cache_size
        self._timed_out: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()  # guards _cache and _timed_out; compiling runs outside it

    def compile(self, kind: ConstraintKind, text: str) -> Grammar:
        """The compiled grammar; raises InvalidRequestError with the compiler's message, or naming
        the limit the text broke."""
        size = len(text.encode())
        if size > self.max_bytes:
            raise InvalidRequestError(
                f"{kind} is {size} bytes long; the limit is {self.max_bytes} (max_constraint_bytes"
                f", server flag --max-constraint-bytes)")
        key = (kind, text)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            if key in self._timed_out:
                raise self._too_slow(kind)
        try:
            self.workers.check(kind, text, self.timeout_s)
        except CompileError as e:
            message = _LOG_PREFIX.sub("", str(e).strip())
            raise InvalidRequestError(f"{kind} does not compile: {message}") from e
        except CompileTimeout as e:
            with self._lock:
                self._timed_out[key] = None
                while len(self._timed_out) > TIMED_OUT_KEPT:
                    self._timed_out.popitem(last=False)
            raise self._too_slow(kind) from e
        grammar = Grammar(kind, text, compile_text(self._compiler, kind, text))
        with self._lock:  # two threads may compile the same text at once: keep the first
            grammar = self._cache.setdefault(key, grammar)
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return grammar

    def _too_slow(self, kind: ConstraintKind) -> InvalidRequestError:
        return InvalidRequestError(
            f"{kind} did not compile within the {self.timeout_s:g} s limit "
            f"(grammar_compile_timeout_s, server flag --grammar-compile-timeout); deep nesting and "
            f"repeating any character many times make a grammar slow to compile")

    def cache_len(self) -> int:
        with self._lock:
            return len(self._cache)

    def close(self) -> None:
        """Stop the worker processes; a compile in flight fails."""
        self.workers.close()
