"""Stop strings and streaming text, on a byte tokenizer (one token per byte)."""

import pytest

from specdec.testing import byte_tokenizer
from specdec.text import StopStrings, TextStream

TOK = byte_tokenizer()


def ids(text):
    return TOK.encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
    "text, stops, keep_text, final",
    [
        ("hello END world", ["END"], "hello END", "hello "),
        ("a\n```b", ["\n```"], "a\n```", "a"),
        ("no stop here", ["zzz"], None, "no stop here"),
        ("xxcd", ["abcd", "cd"], "xxcd", "xx"),  # the earliest stop wins
    ],
)
def test_stop_strings(text, stops, keep_text, final):
    s = StopStrings(TOK, stops)
    tokens = ids(text)
    keep = s(tokens, len(tokens))
    assert (None if keep is None else TOK.decode(tokens[:keep])) == keep_text
    assert s.final_text(tokens) == final


@pytest.mark.parametrize("stops", [[], ["END"], ["abcd", "cx"], ["\n```"]])
@pytest.mark.parametrize("text", ["hello END world", "xxabcabcx", "déjà vu ✓ done", "a\n``b\n```c"])
def test_stream_deltas_never_retract_and_add_up(text, stops):
    s = StopStrings(TOK, stops)
    stream = TextStream(s)
    tokens = ids(text)
    pieces, shown = [], ""
    for n in range(1, len(tokens) + 1):
        delta = stream.push(tokens[:n])
        pieces.append(delta)
        shown += delta
        assert "\ufffd" not in delta  # never half a UTF-8 character
        assert s.final_text(tokens).startswith(shown) or s.find(TOK.decode(tokens[:n])) is None
    shown += stream.flush(tokens)
    assert shown == s.final_text(tokens)


def test_stream_holds_back_a_possible_stop_prefix():
    s = StopStrings(TOK, ["abcd", "cx"])
    stream = TextStream(s)
    assert stream.push(ids("xxabc")) == "xx"  # "abc" may still become "abcd"
    assert stream.push(ids("xxabcq")) == "abcq"
