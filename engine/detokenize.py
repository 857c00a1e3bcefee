"""Incremental detokenization with stop strings, shared by the offline `LLM` and the detokenizer
service. Torch-free on purpose: the detokenizer process must start without loading torch.

Text is produced with the prefix-offset / read-offset technique. Only a short window of ids is
decoded per push, and the part of it already emitted is decoded on its own and cut off:

    ids:  ... emitted long ago | prefix_offset .. read_offset | read_offset .. end
                               |  context, already emitted    |  new, not yet shown

Decoding the context together with the new ids gives the new ids the neighbours a tokenizer needs
to render them right (a sentencepiece leading space, a multi-byte character split over ids). The
window moves forward on every emission, so cost per push is O(window), not O(generated length).

Byte-level BPE tokenizers (GPT-2 style: Qwen, Llama 3, the demo model) decode a sequence by
joining each id's bytes and decoding the result as UTF-8, with U+FFFD for what is invalid. For
them a `ByteTable` (each id's bytes, built by `byte_table`, which checks it against the tokenizer
for every id) replaces the window: a push looks its ids' bytes up and feeds them to a UTF-8
decoder that keeps the bytes of an unfinished character for the next push, so no id is decoded
twice and no tokenizer call is made. The text a push releases is the window's, push for push:
text is held while bytes of a character are missing or the held text ends in U+FFFD (what the
window's "ends in U+FFFD" means in bytes), and `flush` drops trailing U+FFFD as the window does.
No prompt context is needed: a byte is the same byte whatever precedes it, and a prompt that ends
mid-character must not complete with the output's bytes (the window drops such a context too).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from radixserve.engine.byte_table import ByteTable, byte_table, join_bytes

# How many prompt ids to use as decoding context for the first generated ids.
PROMPT_CONTEXT_IDS = 5
# What lossy UTF-8 decoding yields for an incomplete multi-byte character at the end of the text.
REPLACEMENT_CHAR = "\ufffd"
_utf8_decode = codecs.utf_8_decode  # (data, errors, final) -> (text, bytes consumed)


class TextDecoder(Protocol):
    """What we need from a tokenizer: `tokenizers.Tokenizer` and transformers tokenizers both fit.

    With a transformers tokenizer whose `clean_up_tokenization_spaces` is true, decoding windows
    and decoding the whole sequence can differ around punctuation; byte-level BPE models (Qwen,
    Llama 3, the demo model) set it false.
    """

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def fast_decoder(tokenizer: Any) -> TextDecoder:
    """The Rust `tokenizers.Tokenizer` under a transformers fast tokenizer, when decoding through it
    gives the same text; else `tokenizer` itself.

    transformers' `decode` calls the same Rust decoder and then only adds Python work (argument
    conversion, and the clean-up of spaces before punctuation when the tokenizer asks for it, which
    changes the text: such tokenizers keep transformers' decode). Streams decode a short window per
    token, so that Python work dominated the detokenizer: it took about 2.5x the time per token.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return tokenizer
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return tokenizer
    return backend


def stream_decoder(tokenizer: Any) -> TextDecoder:
    """What to give every `IncrementalDetokenizer` of `tokenizer`: its `ByteTable` where one is
    proven to decode as it does, else `fast_decoder(tokenizer)`. Building the table reads and
    checks the whole vocabulary (0.6 s for Qwen3's 151k ids), so call this once per tokenizer."""
    decoder = fast_decoder(tokenizer)
    table = byte_table(decoder)
    return table if table is not None else decoder


class DetokenizeStep(NamedTuple):
    text: str  # newly emitted text; "" when everything new is held back
    stopped: str | None  # the stop string matched by this push, else None


_NOTHING = DetokenizeStep("", None)


class IncrementalDetokenizer:
    """Turns one request's generated ids into text deltas, applying stop strings.

    Text is held back (1) while the decoded window ends in U+FFFD, i.e. a character is still
    incomplete, and (2) while the end of the pending text could be the start of a stop string;
    a stop string is therefore never partly emitted. On a match the text before it (and the stop
    string itself when `include_stop_str`) is emitted, `stopped` names it, and every later
    `push` / `flush` returns nothing.

    Given a `ByteTable` as its tokenizer it decodes through the table (the module docstring says
    how), releasing the same text at the same pushes as the window does with the tokenizer.
    """

    def __init__(
        self,
        tokenizer: TextDecoder,
        prompt_ids: Sequence[int] | None = None,
        stop: Sequence[str] = (),
        include_stop_str: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        if isinstance(stop, str):
            stop = (stop,)
        self._text: _WindowText | _ByteText
        if isinstance(tokenizer, ByteTable):
            self._text = _ByteText(tokenizer.token_bytes(skip_special_tokens))
        else:
            self._text = _WindowText(tokenizer, prompt_ids, skip_special_tokens)
        self._stop = tuple(dict.fromkeys(s for s in stop if s))  # dedup; "" would match anywhere
        self._include_stop_str = include_stop_str
        self._pending = ""  # decoded, not emitted: a suffix that may begin a stop string
        self._chunks: list[str] = []
        self._matched_stop: str | None = None
        self._done = False  # stopped or flushed

    @property
    def full_text(self) -> str:
        """Everything emitted so far (all deltas and flushes joined)."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    @property
    def watches_stops(self) -> bool:
        """Whether the text must be followed token by token (to find a stop string)."""
        return bool(self._stop)

    @property
    def matched_stop(self) -> str | None:
        """The stop string that ended this request's text, if any."""
        return self._matched_stop

    def push(self, token_ids: Sequence[int]) -> DetokenizeStep:
        """Add newly generated ids; return the text they release and any stop string matched."""
        if self._done or not token_ids:
            return _NOTHING
        delta = self._text.push(token_ids)
        if not delta:
            return _NOTHING  # nothing visible yet, or a character is unfinished
        if not self._stop:  # what `_release` does without stop strings, at a fraction of the cost
            self._chunks.append(delta)
            return DetokenizeStep(delta, None)
        return self._release(self._pending + delta, final=False)

    def flush(self) -> str:
        """End of generation: emit the held-back text, except a trailing incomplete character.
        A stop string completed by that text still counts (see `matched_stop`)."""
        if self._done:
            return ""
        step = self._release(self._pending + self._text.flush(), final=True)
        self._done = True
        return step.text

    def _release(self, text: str, *, final: bool) -> DetokenizeStep:
        """Emit what of `text` (pending + new) is safe, keep the rest pending."""
        match = _first_stop(text, self._stop)
        if match is not None:
            start, stop_str = match
            end = start + len(stop_str) if self._include_stop_str else start
            self._matched_stop, self._done, self._pending = stop_str, True, ""
            return self._emit(text[:end], stop_str)
        held = 0 if final else _held_len(text, self._stop)
        self._pending = text[len(text) - held :] if held else ""
        return self._emit(text[: len(text) - held], None)

    def _emit(self, text: str, stopped: str | None) -> DetokenizeStep:
        if text:
            self._chunks.append(text)
        return DetokenizeStep(text, stopped)


class _WindowText:
    """The text of pushed ids through `tokenizer.decode` of a short window (module docstring)."""

    def __init__(self, tokenizer: TextDecoder, prompt_ids: Sequence[int] | None,
                 skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # Only the window is kept: ids before the prefix offset are dropped as it moves, so the
        # prefix offset is always 0 here and `_ids[:_read_offset]` is the context.
        self._ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT_IDS:]) if prompt_ids else []
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        if self._prefix_text.endswith(REPLACEMENT_CHAR):
            # The prompt ends mid-character. Its tail as context would swallow the bytes that
            # complete it; without context they show up as U+FFFD, as a one-shot decode shows them.
            self._ids, self._read_offset, self._prefix_text = [], 0, ""

    def push(self, token_ids: Sequence[int]) -> str:
        """The text the ids release: "" while nothing new shows or a character is unfinished."""
        self._ids.extend(token_ids)
        text = self._decode(self._ids)
        if len(text) <= len(self._prefix_text) or text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = text[len(self._prefix_text) :]
        # The part just released becomes the context of the next decode; the old context is no
        # longer needed, so it is dropped and the read offset rebased.
        del self._ids[: self._read_offset]
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        return delta

    def flush(self) -> str:
        """The text not yet released, less a trailing incomplete character."""
        text = self._decode(self._ids).rstrip(REPLACEMENT_CHAR)
        return text[len(self._prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)


class _ByteText:
    """The text of pushed ids through a `ByteTable` and an incremental UTF-8 decode; releases
    what `_WindowText` releases, push for push (module docstring)."""

    __slots__ = ("_table", "_tail", "_held")

    def __init__(self, table: list[bytes]) -> None:
        self._table = table
        self._tail = b""  # the bytes of an unfinished character, decoded once it completes
        self._held = ""  # decoded, not released: it ends in U+FFFD or `_tail` follows it

    def push(self, token_ids: Sequence[int]) -> str:
        """The text the ids release: "" while nothing new shows or a character is unfinished."""
        table = self._table
        try:  # a push is usually one id: looked up here, saving a call on the hot path
            data = table[token_ids[0]] if len(token_ids) == 1 else join_bytes(table, token_ids)
        except IndexError:
            data = b""  # one id past the vocabulary
        if self._tail:
            data = self._tail + data
        # The codec behind codecs' incremental UTF-8 decoder, without its Python wrapper: it
        # decodes what it can and says how much, leaving an unfinished character's bytes.
        text, used = _utf8_decode(data, "replace", False)
        self._tail = data[used:] if used < len(data) else b""
        if self._held:
            text = self._held + text
        if self._tail or text.endswith(REPLACEMENT_CHAR):
            # The window's decode would end in U+FFFD here: the lossy decode of an unfinished
            # character, an invalid byte, or a U+FFFD of the text itself. It holds all three.
            self._held = text
            return ""
        self._held = ""
        return text

    def flush(self) -> str:
        """The text not yet released, less a trailing incomplete character."""
        text = self._held + _utf8_decode(self._tail, "replace", True)[0]
        return text.rstrip(REPLACEMENT_CHAR)


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """(start, stop) of the match that ends first in `text` (ties: the longer one).

    Ranking by end rather than start makes the result independent of how the text was split
    into pushes: with stops "abcd" and "c", streaming "abc" then "d" stops at "c", so one push of
    "abcd" must too.
    """
    best: tuple[int, int, str] | None = None  # (end, start, stop)
    for stop_str in stops:
        start = text.find(stop_str)
        if start >= 0:
            candidate = (start + len(stop_str), start, stop_str)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
    return None if best is None else (best[1], best[2])


def _held_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string.

    Only prefix lengths k whose last character equals text[-1] can qualify, so they are found with
    rfind instead of trying every k (stop strings may be a few hundred characters long).
    """
    if not text or not stops:
        return 0
    last, best = text[-1], 0
    for stop_str in stops:
        limit = min(len(stop_str) - 1, len(text))  # a full match was handled by _first_stop
        k = stop_str.rfind(last, 0, limit) + 1  # candidate prefix length, 0 if none
        while k > best:
            if text.endswith(stop_str[:k]):
                best = k
                break
            k = stop_str.rfind(last, 0, k - 1) + 1
    return best
