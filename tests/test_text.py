"""Stop strings and streaming text, on a byte tokenizer (one token per byte)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinymodels import byte_tokenizer
from specdec.core.text import StopStrings, TextStream

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


def _holdback_by_brute_force(text, stops):
    """The old quadratic rule: for each stop, the longest proper prefix that ``text`` ends with."""
    best = 0
    for s in stops:
        for j in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:j]):
                best = max(best, j)
                break
    return best


@settings(max_examples=300, deadline=None)
@given(st.text("ab", max_size=30), st.lists(st.text("ab", min_size=1, max_size=12), min_size=1, max_size=4))
def test_linear_holdback_matches_the_definition(text, stops):
    assert StopStrings(TOK, stops).holdback(text) == _holdback_by_brute_force(text, stops)


def test_holdback_of_a_periodic_stop():
    s = StopStrings(TOK, ["aab" * 50, "abab"])
    assert s.holdback("x" + "aab" * 49 + "aa") == 149
    assert s.holdback("ababa") == 3
    assert s.holdback("xyz") == 0


def test_lone_surrogates_are_refused_with_a_clear_error():
    from specdec.errors import SpecdecError
    from specdec.core.text import encode_prompt

    with pytest.raises(SpecdecError, match=r"stop string 1 holds a lone surrogate \('\\ud800'\)"):
        StopStrings(TOK, ["ok", "x\ud800"])
    with pytest.raises(SpecdecError, match="the prompt holds a lone surrogate"):
        encode_prompt(TOK, "hi \udcff", chat=False)
    with pytest.raises(SpecdecError, match="message 0's content holds a lone surrogate"):
        encode_prompt(TOK, [{"role": "user", "content": "\ud800"}])


def test_tokenizer_and_template_errors_become_specdec_errors():
    from specdec.errors import SpecdecError
    from specdec.core.text import tokenizer_call

    def template(*a, **k):
        from jinja2.exceptions import TemplateError

        raise TemplateError("Conversation roles must alternate user/assistant/user/assistant/...")

    with pytest.raises(SpecdecError, match="^the chat template refused the messages: Conversation roles must alternate"):
        tokenizer_call("the chat template refused the messages", template)
    with pytest.raises(SpecdecError, match="^the tokenizer refused the prompt: bad"):
        tokenizer_call("the tokenizer refused the prompt", lambda: (_ for _ in ()).throw(TypeError("bad\nmore")))
    with pytest.raises(RuntimeError):  # not an input error: a bug keeps its traceback
        tokenizer_call("x", lambda: (_ for _ in ()).throw(RuntimeError("boom")))
