"""IncrementalDetokenizer: streamed deltas add up to a one-shot decode, UTF-8 stays whole, and
stop strings cut the text exactly where a one-shot search would."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radixserve.engine.demo import train_tokenizer
from radixserve.engine.demo_corpus import CORPUS
from radixserve.engine.detokenize import IncrementalDetokenizer, fast_decoder
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
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
