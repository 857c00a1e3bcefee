"""Each token id's bytes, for byte-level BPE tokenizers (GPT-2 style: Qwen, Llama 3, the demo
model), whose decode joins its ids' bytes and decodes them as UTF-8 with U+FFFD for what is
invalid. With such a table the incremental detokenizer (`detokenize.py`) needs no tokenizer call
a token. A table is built only where it is checked to decode as the tokenizer does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from typing import Any


class ByteTable:
    """The bytes of each token id, for a tokenizer whose decode joins its ids' bytes and decodes
    them as UTF-8, invalid bytes becoming U+FFFD. Immutable; one table serves every request.

    Ids without a token (above the vocabulary, as a model's padded embedding rows are) have no
    bytes, as the tokenizer skips them. Ids must not be negative (the tokenizer refuses them).
    """

    def __init__(self, token_bytes: Sequence[bytes], special_ids: Iterable[int] = ()) -> None:
        self._keep = list(token_bytes)
        self._skip = list(self._keep)  # special tokens decode to "" when they are skipped
        for i in special_ids:
            self._skip[i] = b""

    def __len__(self) -> int:
        return len(self._keep)

    def token_bytes(self, skip_special_tokens: bool) -> list[bytes]:
        """Each id's bytes, indexed by id; shared, not to be modified."""
        return self._skip if skip_special_tokens else self._keep

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        data = join_bytes(self.token_bytes(skip_special_tokens), ids)
        return data.decode("utf-8", "replace")


def join_bytes(table: list[bytes], ids: Sequence[int]) -> bytes:
    """The bytes of `ids` in order, per `ByteTable.token_bytes`."""
    try:
        return table[ids[0]] if len(ids) == 1 else b"".join([table[i] for i in ids])
    except IndexError:  # an id past the vocabulary: rare, so not checked on the common path
        return b"".join([table[i] if i < len(table) else b"" for i in ids])


# The tokenizers that `byte_table` accepts decode with exactly this one decoder (its options only
# shape encoding: offsets and the prefix space).
_BYTE_LEVEL = "ByteLevel"
_VERIFY_CHUNK = 16384  # ids decoded per batch while checking a table
_VERIFY_RUNS, _VERIFY_RUN_LEN = 64, 48  # random multi-id sequences checked as well


def _byte_level_alphabet() -> dict[int, int | str]:
    """A `str.translate` table that turns a byte-level token into latin-1 text of its bytes.

    GPT-2's alphabet writes bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF as the characters of those
    code points and the other 68 bytes, in order, as U+0100 to U+0143. The characters of those 68
    code points are not in the alphabet: they become U+FFFF, which latin-1 cannot encode.
    """
    shown = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    hidden = [b for b in range(256) if b not in shown]
    table: dict[int, int | str] = {0x100 + n: b for n, b in enumerate(hidden)}
    table.update({b: "\uffff" for b in hidden})
    return table


_ALPHABET = _byte_level_alphabet()


def _bytes_of_token(token: str | None) -> bytes:
    if token is None:
        return b""
    try:
        return token.translate(_ALPHABET).encode("latin-1")
    except UnicodeEncodeError:
        # The ByteLevel decoder writes a token with a character outside the alphabet (an added
        # token such as "<a b>") as that token's UTF-8 whole; one inside it (such as "<é>", added
        # tokens included) goes through the alphabet like any other.
        return token.encode("utf-8")


def byte_table(rust: Any) -> ByteTable | None:
    """The `ByteTable` of a byte-level BPE tokenizer given as what `detokenize.fast_decoder`
    returns for it, or None where decoding through the table could give other text than `rust`'s
    own decode (which is then to be used).

    The table is checked, not trusted: every id alone and some random id sequences, with and
    without special tokens skipped, must decode to the tokenizer's text. So any decoder option,
    added token or version difference that the table does not model refuses the table.
    """
    from tokenizers import Tokenizer

    if not isinstance(rust, Tokenizer) or rust.decoder is None:
        return None
    if json.loads(rust.decoder.__getstate__()).get("type") != _BYTE_LEVEL:
        return None
    vocab = rust.get_vocab(with_added_tokens=True)
    added = rust.get_added_tokens_decoder()
    tokens: list[str | None] = [None] * (max(vocab.values(), default=-1) + 1)
    for token, i in vocab.items():
        tokens[i] = token
    for i, added_token in added.items():  # decoding takes an added token over a model token
        tokens[i] = added_token.content
    table = ByteTable([_bytes_of_token(t) for t in tokens],
                      [i for i, t in added.items() if t.special])
    return table if _decodes_like(table, rust, list(added)) else None


def _decodes_like(table: ByteTable, rust: Any, added_ids: Sequence[int]) -> bool:
    """Whether `table` decodes as `rust` does: each id alone, then random sequences of ids, a
    quarter of them added tokens or ids past the vocabulary (where joining tokens could differ)."""
    rng = random.Random(0)  # the same sequences every time: a refusal is reproducible
    rare = [*added_ids, len(table) + 7]
    runs = [[rng.choice(rare) if rng.random() < 0.25 else rng.randrange(len(table))
             for _ in range(_VERIFY_RUN_LEN)] for _ in range(_VERIFY_RUNS)]
    for skip in (False, True):
        texts = [b.decode("utf-8", "replace") for b in table.token_bytes(skip)]
        for a in range(0, len(table), _VERIFY_CHUNK):
            # One-id ranges rather than lists: ranges are not tracked by the cycle collector, and
            # 150k new lists set off full collections that cost more than the decoding.
            ids = [range(i, i + 1) for i in range(a, min(a + _VERIFY_CHUNK, len(table)))]
            if rust.decode_batch(ids, skip_special_tokens=skip) != texts[a : a + _VERIFY_CHUNK]:
                return False
        expected = rust.decode_batch(runs, skip_special_tokens=skip)
        if expected != [table.decode(run, skip) for run in runs]:
            return False
    return True
