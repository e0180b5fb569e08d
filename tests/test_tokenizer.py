"""The byte-level tokenizer (model/tokenizer.py): exact round trips of random text, tolerance of
invalid UTF-8 and out-of-table ids, the incremental decoder agreeing with the one-shot decode
however the ids are split, and terminal-safe printing."""
from __future__ import annotations

import pytest

from k31dsl.dsl.errors import K31Error
from k31dsl.model import tokenizer as tok


def _random_text(rng, n: int) -> str:
    # ASCII, Latin-1, CJK, emoji (4-byte UTF-8): every UTF-8 length; no lone surrogates (not encodable).
    pools = [(0x20, 0x7F), (0xA0, 0x800), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF), (0, 0x20)]
    out = []
    for _ in range(n):
        lo, hi = pools[int(rng.integers(len(pools)))]
        out.append(chr(int(rng.integers(lo, hi))))
    return "".join(out)


def test_round_trip_random_text(rng):
    for _ in range(20):
        text = _random_text(rng, int(rng.integers(0, 60)))
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8"))
        assert all(0 <= i < 256 for i in ids)
        assert tok.decode(ids) == text


def test_decode_is_tolerant_of_invalid_bytes_and_ids(rng):
    ids = [int(i) for i in rng.integers(0, 256, 200)]
    assert tok.decode(ids) == bytes(ids).decode("utf-8", errors="replace")
    # a lone continuation byte, a truncated 3-byte character, an overlong encoding
    assert tok.decode([0x80]) == "\ufffd"
    assert tok.decode([0xE2, 0x82]) == "\ufffd"
    assert tok.decode([0xC0, 0xAF, 0x41]) == "\ufffd\ufffdA"
    # ids outside the byte table (a model with vocab_size > 256) read as U+FFFD, the rest decodes
    assert tok.decode([72, 300, 105]) == "H\ufffdi"
    assert tok.decode([0xE2, 0x82, 999, 0xAC]) == "\ufffd\ufffd\ufffd"
    assert tok.decode([]) == ""


@pytest.mark.parametrize("valid", [True, False])
def test_detokenizer_matches_decode_for_any_split(rng, valid):
    for _ in range(20):
        if valid:
            ids = tok.encode(_random_text(rng, int(rng.integers(1, 40))))
        else:
            ids = [int(i) for i in rng.integers(0, 260, int(rng.integers(1, 60)))]
        d = tok.Detokenizer()
        pieces, i = [], 0
        while i < len(ids):
            n = int(rng.integers(1, 4))
            pieces.append(d.push(ids[i:i + n]))
            i += n
        pieces.append(d.flush())
        assert "".join(pieces) == tok.decode(ids)


def test_detokenizer_holds_back_partial_characters():
    d = tok.Detokenizer()
    euro = tok.encode("€")                    # 3 bytes
    assert d.push(euro[:1]) == "" and d.push(euro[1:2]) == ""
    assert d.push(euro[2:]) == "€"
    assert d.push(euro[:2]) == "" and d.flush() == "\ufffd"


def test_printable_escapes_control_characters():
    assert tok.printable("a\x1b[31mb\nc\td\x7f\x85é") == "a\\x1b[31mb\nc\td\\x7f\\x85é"
    assert tok.printable("plain text") == "plain text"


def test_encode_rejects_non_text():
    with pytest.raises(K31Error, match="encode takes a str"):
        tok.encode(b"bytes")
