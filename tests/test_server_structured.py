"""Structured output through ``specdec serve``: OpenAI's ``response_format``, vLLM's
``structured_outputs`` object and its older ``guided_*`` fields, on both endpoints, streaming and
not, with tiny models over the byte tokenizer; every bad constraint is a 400 naming its field before
anything is queued or streamed."""

from __future__ import annotations

import json
import re
import sys
import threading

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from serving import tiny_server  # noqa: E402
from specdec.core.constrain import KINDS, MAX_TEXT  # noqa: E402
from specdec.frontends.server import Limits, create_app, serve_in_thread  # noqa: E402
from specdec.frontends.server.worker import pair_lock  # noqa: E402

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "A user record, please."}]
PROMPT = "A user record:"
# compact JSON of at most 20 characters: any greedy or sampled text ends well within 40 tokens
SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["ab", "cd"]}},
    "required": ["id", "tag"], "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA, "strict": True}}
REGEX = r"[a-c]{2,5}(-[0-9]{1,2}){1,3}"
CHOICES = ["yes", "no", "maybe"]
LARK = 'start: "a" ("b" | "c")+ "d"'


@pytest.fixture(scope="module")
def served(tiny_dirs):
    with tiny_server(*tiny_dirs) as running:
        yield running


@pytest.fixture(scope="module")
def eager(served):
    """A server whose streaming requests get their headers at once (``stream_wait_seconds=0``): an
    error found once the request reached the engine would arrive as an error event in a 200."""
    app = create_app(served.pair, {"k": 4, "max_new_tokens": 16},
                     limits=Limits(max_tokens=500, stream_wait_seconds=0.0), model_name="tiny")
    with serve_in_thread(app) as url:
        yield url


def body_for(path: str, **fields) -> dict:
    base = {"messages": MSG} if path == CHAT else {"prompt": PROMPT}
    return {**base, "max_tokens": 40, "temperature": 0, **fields}


def text_of(path: str, answer: dict) -> str:
    choice = answer["choices"][0]
    return choice["message"]["content"] if path == CHAT else choice["text"]


def generate(url: str, path: str, **fields) -> tuple[str, str]:
    """``(text, finish_reason)`` of one request, streamed (SSE, joined) or not."""
    body = body_for(path, **fields)
    if not body.get("stream"):
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        return text_of(path, r.json()), r.json()["choices"][0]["finish_reason"]
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert all("error" not in c for c in chunks), chunks
    key = "delta" if path == CHAT else None
    text = "".join((c["choices"][0][key].get("content") or "") if key else c["choices"][0]["text"] for c in chunks)
    return text, chunks[-1]["choices"][0]["finish_reason"]


def local(pair, prompt, **kw):
    """The in-process path, while the server is idle."""
    with pair_lock(pair):
        return pair.generate(prompt, **kw)


# --------------------------------------------------------------------------- constrained answers


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT, COMP])
def test_json_schema_answers_parse_and_validate(served, path, stream):
    text, finish = generate(served.url, path, response_format=RESPONSE_FORMAT, stream=stream)
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT, COMP])
def test_regex_and_choice_answers_match(served, path, stream):
    text, finish = generate(served.url, path, guided_regex=REGEX, stream=stream)
    assert finish == "stop" and re.fullmatch(REGEX, text), text
    text, finish = generate(served.url, path, structured_outputs={"choice": CHOICES}, stream=stream)
    assert finish == "stop" and text in CHOICES, text


def test_token_trees_follow_the_grammar(served):
    text, finish = generate(served.url, COMP, guided_regex=REGEX, speculative={"drafter": "tree", "k": 3})
    assert finish == "stop" and re.fullmatch(REGEX, text), text


def test_sampled_answers_follow_the_schema(served):
    for seed in range(3):
        text, finish = generate(served.url, COMP, guided_json=SCHEMA, temperature=1.0, seed=seed)
        assert finish == "stop", text
        jsonschema.validate(json.loads(text), SCHEMA)


def test_unconstrained_text_is_not_in_the_grammar(served):
    """The constraint really acts: the same request without it does not match."""
    text, _ = generate(served.url, COMP)
    assert re.fullmatch(REGEX, text) is None and text not in CHOICES


SPELLINGS = {  # one constraint, each way a request may give it
    "schema": [{"response_format": RESPONSE_FORMAT}, {"structured_outputs": {"json": SCHEMA}},
               {"structured_outputs": {"json": json.dumps(SCHEMA)}}, {"guided_json": SCHEMA},
               {"guided_json": json.dumps(SCHEMA)},
               {"response_format": RESPONSE_FORMAT, "guided_decoding_backend": "xgrammar"}],  # accepted, ignored
    "json_object": [{"response_format": {"type": "json_object"}}, {"structured_outputs": {"json_object": True}}],
    "regex": [{"guided_regex": REGEX}, {"structured_outputs": {"regex": REGEX}}],
    "choice": [{"guided_choice": CHOICES}, {"structured_outputs": {"choice": CHOICES}}],
    "grammar": [{"guided_grammar": LARK}, {"structured_outputs": {"grammar": LARK}}],
}
LIBRARY = {"schema": {"json_schema": SCHEMA}, "json_object": {"response_format": {"type": "json_object"}},
           "regex": {"regex": REGEX}, "choice": {"choice": CHOICES}, "grammar": {"grammar": LARK}}


@pytest.mark.parametrize("kind", list(SPELLINGS))
def test_spellings_are_equivalent_and_match_the_library(served, kind):
    """Greedy, each spelling gives the same text on both endpoints; on completions, the library's
    constrained plain decoding gives it too (lossless speculation is exact under a grammar)."""
    for path in (COMP, CHAT):
        texts = {generate(served.url, path, max_tokens=24, **fields)[0] for fields in SPELLINGS[kind]}
        assert len(texts) == 1, texts
    ref = local(served.pair, PROMPT, chat=False, policy="ar", max_new_tokens=24, temperature=0.0, **LIBRARY[kind])
    assert generate(served.url, COMP, max_tokens=24, **SPELLINGS[kind][0])[0] == ref.text


def test_response_format_text_is_unconstrained(served):
    assert generate(served.url, COMP, response_format={"type": "text"}) == generate(served.url, COMP)


def test_the_openai_client(served):
    r = served.client.chat.completions.create(model="tiny", messages=MSG, max_tokens=40, temperature=0,
                                              response_format=RESPONSE_FORMAT)
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    r = served.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=0,
                                         extra_body={"structured_outputs": {"choice": CHOICES}})
    assert r.choices[0].text in CHOICES
    chunks = served.client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
                                              extra_body={"guided_regex": REGEX})
    assert re.fullmatch(REGEX, "".join(c.choices[0].text for c in chunks))
    with pytest.raises(openai.BadRequestError) as info:
        served.client.chat.completions.create(model="tiny", messages=MSG, max_tokens=4,
                                              response_format={"type": "json_schema", "json_schema": {
                                                  "name": "x", "schema": {"type": "nonsense"}}})
    assert "invalid JSON schema" in info.value.message and info.value.param == "response_format"


def test_the_model_card_lists_the_constraint_kinds(served):
    card = httpx.get(served.url + "/v1/models", timeout=60).json()["data"][0]
    assert card["structured_outputs"] == list(KINDS)


# --------------------------------------------------------------------------- bad input: 400 naming the field

BAD = {  # name: (fields, param, words in the message)
    "invalid JSON schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}}, "response_format", "invalid JSON schema"),
    "invalid schema (structured_outputs)": ({"structured_outputs": {"json": {"type": 5}}}, "structured_outputs.json",
                                            "invalid JSON schema"),
    "guided_json not JSON": ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    "guided_json not an object": ({"guided_json": [1, 2]}, "guided_json", "JSON schema (an object)"),
    "response_format unknown type": ({"response_format": {"type": "xml"}}, "response_format", "type must be"),
    "response_format without a schema": ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                                         "response_format", "needs"),
    "response_format not an object": ({"response_format": "json"}, "response_format", "-"),
    "invalid regex": ({"guided_regex": "(ab"}, "guided_regex", "invalid regex"),
    "invalid regex (structured_outputs)": ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs.regex",
                                           "invalid regex"),
    "empty regex": ({"guided_regex": ""}, "guided_regex", "non-empty string"),
    "empty choice list": ({"guided_choice": []}, "guided_choice", "empty list"),
    "empty choice list (structured_outputs)": ({"structured_outputs": {"choice": []}}, "structured_outputs.choice",
                                               "empty list"),
    "an empty choice": ({"guided_choice": ["a", ""]}, "guided_choice", "non-empty string"),
    "choice not a list": ({"structured_outputs": {"choice": "yes"}}, "structured_outputs.choice", "list of strings"),
    "grammar that does not parse": ({"guided_grammar": "start: (("}, "guided_grammar", "invalid Lark grammar"),
    "GBNF grammar": ({"guided_grammar": 'root ::= "a" | "b"'}, "guided_grammar", "EBNF/GBNF is not accepted"),
    "grammar that does not parse (structured_outputs)": ({"structured_outputs": {"grammar": "start: (("}},
                                                         "structured_outputs.grammar", "invalid Lark grammar"),
    "regex too large": ({"guided_regex": "a" * (MAX_TEXT + 1)}, "guided_regex", "more than the"),
    "schema too large": ({"guided_json": {"type": "object", "description": "x" * MAX_TEXT}}, "guided_json",
                         "more than the"),
    "regex admitting no token": ({"guided_regex": "()"}, "guided_regex", "admits no token"),
    "grammar admitting no token": ({"guided_grammar": 'start: ""'}, "guided_grammar", "admits no token"),
    "grammar admitting no token (structured_outputs)": ({"structured_outputs": {"grammar": 'start: ""'}},
                                                        "structured_outputs.grammar", "admits no token"),
    "two constraints": ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice",
                        "guided_regex and guided_choice"),
    "response_format and guided_json": ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA},
                                        "guided_json", "response_format and guided_json"),
    "response_format and structured_outputs": ({"response_format": RESPONSE_FORMAT, "structured_outputs": {
        "regex": "a"}}, "structured_outputs.regex", "response_format and structured_outputs.regex"),
    "two in structured_outputs": ({"structured_outputs": {"regex": "a", "json": SCHEMA}}, "structured_outputs.regex",
                                  "structured_outputs.json and structured_outputs.regex"),
    "structured_outputs with none": ({"structured_outputs": {}}, "structured_outputs", "names no constraint"),
    "structured_outputs unknown key": ({"structured_outputs": {"rgx": "a"}}, "structured_outputs", "unknown key"),
    "structured_outputs json_object false": ({"structured_outputs": {"json_object": False}},
                                             "structured_outputs.json_object", "must be true"),
    "structured_outputs option": ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}},
                                  "structured_outputs.disable_any_whitespace", "not supported"),
    "structured_outputs structural_tag": ({"structured_outputs": {"structural_tag": "{}"}},
                                          "structured_outputs.structural_tag", "not supported"),
    "guided_whitespace_pattern": ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "not supported"),
}


def assert_400(r: httpx.Response, param: str, words: str) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    assert "\n" not in err["message"] and (words == "-" or words in err["message"]), err["message"]
    return err["message"]


@pytest.mark.parametrize("name", list(BAD))
def test_bad_constraints_are_a_400_naming_the_field(served, name):
    fields, param, words = BAD[name]
    calls = served.pair.target.forward_calls
    for path in (CHAT, COMP):
        assert_400(httpx.post(served.url + path, json=body_for(path, **fields), timeout=60), param, words)
    assert served.pair.target.forward_calls == calls  # refused before any work


@pytest.mark.parametrize("name", ["invalid JSON schema", "invalid regex", "empty choice list", "GBNF grammar",
                                  "regex too large", "regex admitting no token", "grammar admitting no token",
                                  "two constraints"])
@pytest.mark.parametrize("path", [CHAT, COMP])
def test_a_streaming_request_gets_a_400_not_an_error_event(eager, path, name):
    """Even where a stream's headers go out at once, a constraint that cannot serve is a status."""
    fields, param, words = BAD[name]
    with httpx.stream("POST", eager + path, json=body_for(path, stream=True, **fields), timeout=60) as r:
        r.read()
    assert_400(r, param, words)
    text, finish = generate(eager, path, stream=True, guided_choice=CHOICES)  # and a good one streams
    assert text in CHOICES and finish == "stop"


def test_llguidance_missing_is_a_400_naming_the_extra(served, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)
    for fields, param in (({"guided_regex": "a+"}, "guided_regex"),
                          ({"response_format": RESPONSE_FORMAT}, "response_format"),
                          ({"structured_outputs": {"choice": CHOICES}}, "structured_outputs.choice")):
        message = assert_400(httpx.post(served.url + COMP, json=body_for(COMP, **fields), timeout=60), param, "-")
        assert "pip install 'specdec-rules[structured]'" in message
    assert httpx.get(served.url + "/v1/models", timeout=60).json()["data"][0]["structured_outputs"] == []
    r = httpx.post(served.url + COMP, json=body_for(COMP, max_tokens=4, response_format={"type": "text"}), timeout=60)
    assert r.status_code == 200  # unconstrained requests never ask for it


def test_bad_constraints_leave_the_server_serving(served):
    """Many refused compiles in a row, then concurrent good requests: all answered."""
    for _ in range(5):
        assert httpx.post(served.url + COMP, json=body_for(COMP, guided_regex="()"), timeout=60).status_code == 400
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(generate(served.url, COMP, guided_choice=CHOICES)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 3 and all(text in CHOICES for text, _ in results)
    assert httpx.get(served.url + "/health", timeout=60).json()["status"] == "ok"
