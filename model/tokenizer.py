"""A byte-level tokenizer: a token is one byte of the text's UTF-8 encoding (ids 0..255).

Every text round-trips exactly (`decode(encode(s)) == s`), needs no vocabulary file, and fits
any K31 model (`K31Config.vocab_size >= 256`). A model with random weights emits arbitrary byte
sequences, so decoding is tolerant: an invalid UTF-8 sequence becomes U+FFFD, and so does an
id the byte table does not have (>= 256 when vocab_size is larger). `Detokenizer` does the same
incrementally, for printing tokens as they come without splitting a multi-byte character.
"""
from __future__ import annotations

import codecs
from typing import Iterable

from k31dsl.dsl.errors import K31Error

VOCAB = 256
REPLACEMENT = "\ufffd"


def encode(text: str) -> list[int]:
    """The UTF-8 bytes of `text` as token ids."""
    if not isinstance(text, str):
        raise K31Error(f"tokenizer: encode takes a str, got {type(text).__name__}")
    return list(text.encode("utf-8"))


def _byte_runs(ids: Iterable[int]) -> Iterable[bytes | None]:
    """Consecutive byte ids as one bytes object; None for each id outside 0..255."""
    run = bytearray()
    for i in ids:
        i = int(i)
        if 0 <= i < VOCAB:
            run.append(i)
            continue
        if run:
            yield bytes(run)
            run = bytearray()
        yield None
    if run:
        yield bytes(run)


def decode(ids: Iterable[int]) -> str:
    """Text of the ids; invalid UTF-8 and ids >= 256 (or < 0) read as U+FFFD."""
    return "".join(REPLACEMENT if run is None else run.decode("utf-8", errors="replace")
                   for run in _byte_runs(ids))


class Detokenizer:
    """Incremental decode: `push(ids)` returns the text completed so far, holding back the first
    bytes of a character until the rest arrive; `flush()` returns what is left (U+FFFD for an
    unfinished character). Concatenated, the pieces equal `decode(all ids)`."""

    def __init__(self):
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Iterable[int]) -> str:
        out = []
        for run in _byte_runs(ids):
            if run is None:     # an out-of-table id ends any pending character, then stands for U+FFFD
                out.append(self._dec.decode(b"", final=True) + REPLACEMENT)
                self._dec.reset()
            else:
                out.append(self._dec.decode(run))
        return "".join(out)

    def flush(self) -> str:
        text = self._dec.decode(b"", final=True)
        self._dec.reset()
        return text


def printable(text: str) -> str:
    """`text` safe for a terminal: control characters other than newline and tab (a random model
    emits ESC and friends) shown as \\xNN escapes, so they cannot move the cursor or recolour."""
    out = []
    for ch in text:
        o = ord(ch)
        if (o < 32 and ch not in "\n\t") or 0x7F <= o < 0xA0:
            out.append(f"\\x{o:02x}")
        else:
            out.append(ch)
    return "".join(out)
