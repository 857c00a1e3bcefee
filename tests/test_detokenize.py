"""IncrementalDetokenizer: streamed deltas add up to a one-shot decode, UTF-8 stays whole, and
stop strings cut the text exactly where a one-shot search would. The byte path (a `ByteTable`)
releases what the window path releases, push for push, and its table is checked before use."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radixserve.engine import byte_table as table_module
from radixserve.engine.byte_table import ByteTable, byte_table
from radixserve.engine.demo import train_tokenizer
from radixserve.engine.demo_corpus import CORPUS
from radixserve.engine.detokenize import IncrementalDetokenizer, fast_decoder, stream_decoder
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)
from transformers import PreTrainedTokenizerFast

TOK = train_tokenizer()
VOCAB = TOK.get_vocab_size()
# Characters whose UTF-8 forms are 1 to 4 bytes; the demo vocabulary has whole and partial tokens
# for several of them.
ALPHABET = "abcde .,\n\té你好谢東京🙂🎂☀️"
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sentencepiece_style() -> Tokenizer:
    """A Llama-2-like tokenizer (metaspace, byte fallback, a decoder that strips the leading
    space), where decoding an id alone loses its space: the case the context window exists for."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    space = "▁"  # U+2581, sentencepiece's visible space
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend(space), normalizers.Replace(" ", space)]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=space, prepend_scheme="never")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace(space, " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<unk>", "</s>", *byte_tokens], show_progress=False
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    return tok


SP_TOK = _sentencepiece_style()


def byte_ids(data: bytes) -> list[int]:
    """One id per byte, via the byte-level alphabet (printable latin-1 bytes stand for themselves,
    the others are shifted to U+0100 and up in byte order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    char = {b: chr(b) for b in printable} | {b: chr(0x100 + i) for i, b in enumerate(others)}
    return [TOK.token_to_id(char[b]) for b in data]


def stream(detok: IncrementalDetokenizer, ids: list[int], cuts: list[int]) -> list[str]:
    """Push `ids` in pieces split at `cuts`, then flush; return every delta."""
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    deltas = [detok.push(ids[a:b]).text for a, b in itertools.pairwise(bounds)]
    return [*deltas, detok.flush()]


def expected_with_stops(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    """One-shot reference: the match that ends first (ties: longest) cuts the text."""
    found = [(text.find(s) + len(s), -len(s), s) for s in stops if s and s in text]
    if not found:
        return text, None
    end, neg_len, stop_str = min(found)
    return text[: end if include else end + neg_len], stop_str


@FAST
@given(
    ids=st.lists(st.integers(0, VOCAB - 1), max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=8),
    skip=st.booleans(),
    prompt=st.lists(st.integers(0, VOCAB - 1), max_size=8),
)
def test_deltas_join_to_full_decode(ids, cuts, skip, prompt):
    detok = IncrementalDetokenizer(TOK, prompt_ids=prompt, skip_special_tokens=skip)
    deltas = stream(detok, ids, cuts)
    expected = TOK.decode(ids, skip_special_tokens=skip).rstrip("\ufffd")
    assert "".join(deltas) == expected == detok.full_text


@FAST
@given(text=st.text(alphabet=ALPHABET, max_size=30), cuts=st.lists(st.integers(0, 60), max_size=8))
def test_multibyte_text_never_splits_a_character(text, cuts):
    ids = TOK.encode(text).ids
    deltas = stream(IncrementalDetokenizer(TOK), ids, cuts)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


@FAST
@given(
    text=st.text(alphabet="ab xy.\n", max_size=30),
    prompt=st.text(alphabet="ab xy.", max_size=10),
    cuts=st.lists(st.integers(0, 60), max_size=8),
)
def test_sentencepiece_style_keeps_leading_spaces(text, prompt, cuts):
    prompt_ids = SP_TOK.encode(prompt).ids if prompt else None
    ids = SP_TOK.encode(prompt + text).ids[len(prompt_ids or []) :]
    reference = SP_TOK.decode((prompt_ids or []) + ids)
    # Deltas must reproduce the one-shot decode of the generated part in its prompt's context.
    prefix = SP_TOK.decode(prompt_ids) if prompt_ids else ""
    deltas = stream(IncrementalDetokenizer(SP_TOK, prompt_ids=prompt_ids), ids, cuts)
    assert prefix + "".join(deltas) == reference


def test_emoji_split_into_single_byte_ids_is_held_until_complete():
    detok = IncrementalDetokenizer(TOK)
    ids = byte_ids("x🙂".encode())
    assert [detok.push([i]).text for i in ids] == ["x", "", "", "", "🙂"]
    assert detok.push(byte_ids("你".encode())[:2]).text == ""
    assert detok.flush() == ""  # the unfinished character is dropped, not emitted as U+FFFD
    assert detok.full_text == "x🙂"


@FAST
@given(
    text=st.text(alphabet=ALPHABET, max_size=40),
    stops=st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=6), max_size=3),
    picks=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6)), max_size=2),
    include=st.booleans(),
    cuts=st.lists(st.integers(0, 80), max_size=10),
)
def test_stop_strings_match_one_shot_reference(text, stops, picks, include, cuts):
    # Most random stops never occur, so also take some straight from the text.
    stops = stops + [text[a : a + n] for a, n in picks if text[a : a + n]]
    ids = TOK.encode(text).ids
    detok = IncrementalDetokenizer(TOK, stop=stops, include_stop_str=include)
    emitted, stopped_by = "", []
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    for a, b in itertools.pairwise(bounds):
        step = detok.push(ids[a:b])
        emitted += step.text
        stopped_by += [step.stopped] if step.stopped else []
    emitted += detok.flush()
    want_text, want_stop = expected_with_stops(text, stops, include)
    assert emitted == want_text == detok.full_text
    assert detok.matched_stop == want_stop
    assert len(stopped_by) <= 1 and (stopped_by[0] if stopped_by else None) in (None, want_stop)


def test_stop_string_spanning_tokens_is_never_partly_emitted():
    stop = " clicked off"
    ids = TOK.encode("The kettle clicked off just as").ids
    detok = IncrementalDetokenizer(TOK, stop=[stop])
    steps = [detok.push([i]) for i in ids]
    texts = [s.text for s in steps]
    assert "".join(texts) == "The kettle"
    assert [s.stopped for s in steps if s.stopped] == [stop]
    assert not any(t and stop.startswith(t) for t in texts[2:])  # no piece of the stop leaked
    assert detok.push(TOK.encode(" more").ids) == ("", None)  # stopped: later pushes are empty
    assert detok.flush() == ""


def test_stop_at_the_very_first_token_and_include_stop_str():
    ids = TOK.encode("The kettle").ids  # "The", " ke", "ttle"
    assert IncrementalDetokenizer(TOK, stop=["The"]).push(ids[:1]) == ("", "The")
    assert IncrementalDetokenizer(TOK, stop=["he"]).push(ids[:1]) == ("T", "he")
    detok = IncrementalDetokenizer(TOK, stop=["e k"], include_stop_str=True)
    assert [detok.push([i]) for i in ids] == [("Th", None), ("e k", "e k"), ("", None)]
    assert detok.matched_stop == "e k" and detok.full_text == "The k"


def test_held_prefix_is_released_when_it_stops_matching_or_at_flush():
    detok = IncrementalDetokenizer(TOK, stop=[" world peace"])
    assert "".join(detok.push([i]).text for i in TOK.encode("hello world").ids) == "hello"
    assert detok.push(TOK.encode(" cup").ids).text == " world cup"  # no longer a stop prefix
    detok = IncrementalDetokenizer(TOK, stop=[" world peace"])
    assert "".join(detok.push([i]).text for i in TOK.encode("hello world").ids) == "hello"
    assert detok.flush() == " world"
    assert detok.matched_stop is None


def test_decode_window_stays_short():
    lengths: list[int] = []

    class Counting:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            lengths.append(len(ids))
            return TOK.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = TOK.encode(CORPUS).ids
    detok = IncrementalDetokenizer(Counting(), stop=["never appears"])
    deltas = [detok.push([i]).text for i in ids] + [detok.flush()]
    assert "".join(deltas) == CORPUS
    assert len(ids) > 1000 and max(lengths) <= 16


def test_transformers_tokenizer_works_too(tmp_path):
    transformers = pytest.importorskip("transformers")
    from radixserve.engine.demo import save_tokenizer

    save_tokenizer(tmp_path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ids = hf_tok.encode("<|im_start|>assistant\nCafé 🙂 and 你好<|im_end|>")
    for skip in (True, False):
        deltas = stream(IncrementalDetokenizer(hf_tok, skip_special_tokens=skip), ids, [3, 7])
        assert "".join(deltas) == hf_tok.decode(ids, skip_special_tokens=skip)


def test_module_does_not_import_torch():
    code = "import sys, radixserve.engine.detokenize; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


HF_TOK = PreTrainedTokenizerFast(tokenizer_object=TOK, clean_up_tokenization_spaces=False)


def test_fast_decoder_uses_the_rust_tokenizer_only_where_text_is_the_same():
    assert fast_decoder(HF_TOK) is HF_TOK.backend_tokenizer
    cleaning = PreTrainedTokenizerFast(tokenizer_object=TOK, clean_up_tokenization_spaces=True)
    assert fast_decoder(cleaning) is cleaning  # its clean-up edits the text: keep its own decode
    assert fast_decoder(TOK) is TOK  # already a Rust tokenizer


@FAST
@given(ids=st.lists(st.integers(0, VOCAB - 1), max_size=40), skip=st.booleans(),
       cuts=st.lists(st.integers(0, 40), max_size=8))
def test_fast_decoder_streams_what_the_transformers_tokenizer_streams(ids, skip, cuts):
    fast = stream(IncrementalDetokenizer(fast_decoder(HF_TOK), skip_special_tokens=skip), ids, cuts)
    slow = stream(IncrementalDetokenizer(HF_TOK, skip_special_tokens=skip), ids, cuts)
    assert fast == slow
    assert "".join(fast) == HF_TOK.decode(ids, skip_special_tokens=skip).rstrip("\ufffd")


TABLE = byte_table(TOK)
SPECIAL_IDS = [0, 1, 2]  # the demo's <|endoftext|>, <|im_start|>, <|im_end|>
# Bytes that leave or break a UTF-8 character: continuation bytes, leads of 2 to 4 bytes, leads
# whose next byte has a narrower range (E0, ED, F0, F4), bytes never valid (C0, F5, FF).
ODD_BYTES = [0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC3, 0xE0, 0xE4, 0xED, 0xF0, 0xF4, 0xF5,
             0xFF]
# Ids a stream may carry: any token, single odd bytes, special tokens, an id past the vocabulary.
ANY_ID = st.one_of(st.integers(0, VOCAB - 1), st.sampled_from(byte_ids(bytes(ODD_BYTES))),
                   st.sampled_from([*SPECIAL_IDS, VOCAB + 3]))


def test_byte_table_is_built_only_where_it_decodes_as_the_tokenizer():
    assert isinstance(TABLE, ByteTable) and len(TABLE) == VOCAB
    assert isinstance(byte_table(fast_decoder(HF_TOK)), ByteTable)  # transformers over TOK
    assert byte_table(SP_TOK) is None  # not byte-level: its decoder strips, fuses, falls back
    cleaning = PreTrainedTokenizerFast(tokenizer_object=TOK, clean_up_tokenization_spaces=True)
    # transformers edits the text after the Rust decode: its own decode must be used
    assert fast_decoder(cleaning) is cleaning and byte_table(cleaning) is None
    assert isinstance(stream_decoder(HF_TOK), ByteTable)
    assert stream_decoder(SP_TOK) is SP_TOK and stream_decoder(cleaning) is cleaning
    ids = TOK.encode("<|im_start|>assistant\nCafé 🙂 and 你好<|im_end|>").ids
    for skip in (True, False):
        assert TABLE.decode(ids, skip) == TOK.decode(ids, skip_special_tokens=skip)
    assert TABLE.decode(ids) == "assistant\nCafé 🙂 and 你好"


def test_byte_table_follows_the_decoder_on_added_tokens():
    """The ByteLevel decoder maps an added token through the byte alphabet like any other token
    when all its characters are in it ("<é>" decodes to "<" 0xE9 ">", invalid UTF-8), and writes
    one with a character outside it (a space, "ß") as its UTF-8."""
    tok = train_tokenizer()
    tok.add_tokens([AddedToken("<é>"), AddedToken("a ß")])
    tok.add_special_tokens([AddedToken("<tool é>", special=True)])
    table = byte_table(tok)
    assert table is not None
    ids = [tok.token_to_id(t) for t in ("<é>", "a ß", "<tool é>")]
    assert table.decode(ids[:1]) == tok.decode(ids[:1]) == "<\ufffd>"
    assert table.decode(ids, False) == tok.decode(ids, skip_special_tokens=False) == \
        "<\ufffd>a ß<tool é>"
    assert table.decode(ids, True) == "<\ufffd>a ß"


def test_a_table_that_decodes_otherwise_is_refused(monkeypatch):
    """The check at construction is what makes the table safe: a wrong entry, a special token not
    marked as one, or ids joined otherwise than by concatenation each refuse the table."""
    real = table_module._bytes_of_token
    monkeypatch.setattr(table_module, "_bytes_of_token",
                        lambda t: b"?" if t == "Ġthe" else real(t))
    assert byte_table(TOK) is None
    monkeypatch.setattr(table_module, "_bytes_of_token", real)
    real_table = table_module.ByteTable
    monkeypatch.setattr(table_module, "ByteTable",
                        lambda token_bytes, special: real_table(token_bytes, list(special)[1:]))
    assert byte_table(TOK) is None
    monkeypatch.setattr(table_module, "ByteTable", real_table)
    # One id at a time decodes right; only the sequences of several ids can tell.
    monkeypatch.setattr(table_module, "join_bytes",
                        lambda table, ids: b" ".join([table[i] for i in ids if i < len(table)]))
    assert byte_table(TOK) is None
    monkeypatch.undo()
    assert isinstance(byte_table(TOK), ByteTable)


def _steps(detok: IncrementalDetokenizer, ids: list[int], cuts: list[int]) -> list[tuple]:
    """Every push's (text, stopped) for `ids` split at `cuts`, then the flush and the end state."""
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    steps = [tuple(detok.push(ids[a:b])) for a, b in itertools.pairwise(bounds)]
    return [*steps, (detok.flush(), detok.matched_stop, detok.full_text)]


@FAST
@given(
    ids=st.lists(ANY_ID, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=8),
    skip=st.booleans(),
    prompt=st.lists(ANY_ID, max_size=8),
)
def test_byte_path_releases_what_the_window_releases(ids, cuts, skip, prompt):
    by_bytes = _steps(IncrementalDetokenizer(TABLE, prompt, skip_special_tokens=skip), ids, cuts)
    by_window = _steps(IncrementalDetokenizer(TOK, prompt, skip_special_tokens=skip), ids, cuts)
    assert by_bytes == by_window
    expected = TOK.decode([i for i in ids if i < VOCAB], skip_special_tokens=skip)
    assert by_bytes[-1][2] == expected.rstrip("\ufffd")


@FAST
@given(data=st.binary(max_size=24), cuts=st.lists(st.integers(0, 24), max_size=8))
def test_byte_path_decodes_any_bytes_as_the_tokenizer(data, cuts):
    """One id per byte: Python's UTF-8 decoding, fed piecewise, replaces invalid bytes exactly as
    the tokenizer's one-shot decode does."""
    ids = byte_ids(data)
    by_bytes = _steps(IncrementalDetokenizer(TABLE), ids, cuts)
    assert by_bytes == _steps(IncrementalDetokenizer(TOK), ids, cuts)
    assert by_bytes[-1][2] == TOK.decode(ids).rstrip("\ufffd")


@FAST
@given(
    text=st.text(alphabet=ALPHABET, max_size=40),
    extra=st.lists(ANY_ID, max_size=6),
    stops=st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=6), max_size=3),
    picks=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6)), max_size=2),
    include=st.booleans(),
    cuts=st.lists(st.integers(0, 80), max_size=10),
)
def test_byte_path_stops_where_the_window_stops(text, extra, stops, picks, include, cuts):
    stops = stops + [text[a : a + n] for a, n in picks if text[a : a + n]]
    ids = TOK.encode(text).ids
    ids = ids[: len(ids) // 2] + extra + ids[len(ids) // 2 :]  # odd bytes amid the text
    by_bytes = _steps(IncrementalDetokenizer(TABLE, stop=stops, include_stop_str=include), ids,
                      cuts)
    by_window = _steps(IncrementalDetokenizer(TOK, stop=stops, include_stop_str=include), ids,
                       cuts)
    assert by_bytes == by_window


def test_byte_path_never_decodes_a_window():
    class NoWindows(ByteTable):
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            raise AssertionError("the byte path decodes bytes, not id windows")

    ids = TOK.encode(CORPUS).ids
    table = NoWindows(TABLE.token_bytes(False), SPECIAL_IDS)
    detok = IncrementalDetokenizer(table, prompt_ids=ids[:9], stop=["never appears"])
    assert "".join([detok.push([i]).text for i in ids] + [detok.flush()]) == CORPUS
