"""Bad input to ``specdec serve`` gets OpenAI's error shape and a 4xx status, never a 500; the API key."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import specdec  # noqa: E402
from specdec.server import Limits, create_app, serve_in_thread  # noqa: E402

MAX_BODY = 4096
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


@pytest.fixture(scope="module")
def tiny_server_pair(tiny_dirs):
    target, draft = tiny_dirs
    return specdec.load(str(target), draft=str(draft), dtype="float32", device="cpu", progress=False)


@pytest.fixture(scope="module")
def url(tiny_server_pair):
    app = create_app(tiny_server_pair, {"max_new_tokens": 8}, limits=Limits(max_tokens=64, max_body_bytes=MAX_BODY))
    with serve_in_thread(app) as base:
        yield base


@pytest.fixture(scope="module")
def keyed(tiny_server_pair):
    app = create_app(tiny_server_pair, {"max_new_tokens": 4}, api_key="sekret", model_name="tiny")
    with serve_in_thread(app) as base:
        yield SimpleNamespace(url=base)


def assert_error(r, status: int, param: str | None = "-"):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param != "-":
        assert body["error"]["param"] == param, body
    return body["error"]


MSG = [{"role": "user", "content": "hi"}]
BAD = {  # name: (path, body (dict, or raw bytes), expected param; "-" = not checked)
    "malformed json": (COMP, b'{"prompt": "x",', None),
    "json not an object": (COMP, b'["x"]', None),
    "empty body": (COMP, b"", None),
    "prompt missing": (COMP, {"max_tokens": 4}, "prompt"),
    "prompt wrong type": (COMP, {"prompt": 5}, "prompt"),
    "prompt empty": (COMP, {"prompt": ""}, "prompt"),
    "prompt list of two": (COMP, {"prompt": ["a", "b"]}, "prompt"),
    "prompt token id outside the vocabulary": (COMP, {"prompt": [1, 10**7]}, "-"),
    "prompt two token-id lists": (COMP, {"prompt": [[1, 2], [3]]}, "prompt"),
    "prompt empty token-id list": (COMP, {"prompt": [[]]}, "prompt"),
    "prompt over the context": (COMP, {"prompt": "x" * 600}, "prompt"),
    "chat over the context": (CHAT, {"messages": [{"role": "user", "content": "x" * 600}]}, "messages"),
    "messages not a list": (CHAT, {"messages": "hi"}, "messages"),
    "messages empty": (CHAT, {"messages": []}, "messages"),
    "message without role": (CHAT, {"messages": [{"content": "hi"}]}, "messages.0.role"),
    "image content part": (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content"),
    "max_tokens a string": (COMP, {"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    "max_tokens a float": (COMP, {"prompt": "x", "max_tokens": 5.5}, "max_tokens"),
    "max_tokens zero": (COMP, {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    "max_tokens over the limit": (COMP, {"prompt": "x", "max_tokens": 65}, "max_tokens"),
    "max_completion_tokens over the limit": (CHAT, {"messages": MSG, "max_completion_tokens": 1000}, "max_tokens"),
    "temperature a string": (COMP, {"prompt": "x", "temperature": "hot"}, "temperature"),
    "temperature negative": (COMP, {"prompt": "x", "temperature": -0.5}, "temperature"),
    "temperature NaN": (COMP, b'{"prompt": "x", "temperature": NaN}', "temperature"),
    "top_p zero": (COMP, {"prompt": "x", "top_p": 0}, "top_p"),
    "top_k negative": (COMP, {"prompt": "x", "top_k": -1}, "top_k"),
    "seed too large": (COMP, {"prompt": "x", "seed": 2**70}, "seed"),
    "stream not a bool": (COMP, {"prompt": "x", "stream": "yes"}, "stream"),
    "stop a number": (COMP, {"prompt": "x", "stop": 3}, "stop"),
    "stop empty string": (COMP, {"prompt": "x", "stop": [""]}, "stop"),
    "n two": (COMP, {"prompt": "x", "n": 2}, "n"),
    "n two (chat)": (CHAT, {"messages": MSG, "n": 2}, "n"),
    "logprobs": (COMP, {"prompt": "x", "logprobs": 1}, "logprobs"),
    "echo": (COMP, {"prompt": "x", "echo": True}, "echo"),
    "unknown policy": (COMP, {"prompt": "x", "speculative": {"policy": "nope"}}, "speculative.policy"),
    "unknown drafter": (COMP, {"prompt": "x", "speculative": {"drafter": "nope"}}, "-"),
    "policy not a string": (COMP, {"prompt": "x", "speculative": {"policy": 3}}, "speculative.policy"),
    "k zero": (COMP, {"prompt": "x", "speculative": {"k": 0}}, "speculative.k"),
    "k a string": (COMP, {"prompt": "x", "speculative": {"k": "5"}}, "speculative.k"),
    "unknown rule parameter": (COMP, {"prompt": "x", "speculative": {"theta": 0.5}}, "speculative"),
    "sampling field inside speculative": (COMP, {"prompt": "x", "speculative": {"temperature": 1}}, "speculative.temperature"),
    "rule parameter infinite": (COMP, b'{"prompt": "x", "speculative": {"policy": "fly", "theta": Infinity}}',
                                "speculative.theta"),
    "speculative not an object": (COMP, {"prompt": "x", "speculative": "fast"}, "speculative"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_a_400(url, name):
    path, body, param = BAD[name]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url + path, content=content, headers={"content-type": "application/json"})
    err = assert_error(r, 400, param)
    assert err["type"] == "invalid_request_error"


def test_body_too_large_by_content_length(url):
    r = httpx.post(url + COMP, json={"prompt": "x" * (MAX_BODY + 10)})
    assert assert_error(r, 413)["code"] == "request_too_large"


def test_body_too_large_chunked(url):
    def chunks():  # no Content-Length: transfer-encoding chunked
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    r = httpx.post(url + COMP, content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, 413)


def test_unknown_path_and_method(url):
    assert assert_error(httpx.get(url + "/v1/nope"), 404)["type"] == "not_found_error"
    assert_error(httpx.get(url + COMP), 405)
    assert_error(httpx.get(url + "/v1/models/other-model"), 404, "model")


def test_any_model_name_is_accepted(url):
    r = httpx.post(url + COMP, json={"prompt": "abc", "model": "gpt-4o", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["model"] == "gpt-4o"


def test_openai_client_raises_bad_request(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="x", max_tokens=4, extra_body={"speculative": {"policy": "nope"}})
    assert "unknown policy" in info.value.message


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(
    st.sampled_from(["prompt", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n", "stream",
                     "speculative", "echo", "logprobs", "model"]),
    st.recursive(st.none() | st.booleans() | st.integers(-3, 70) | st.floats(-2, 2) | st.text(max_size=5),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                     st.sampled_from(["policy", "drafter", "k", "theta", "ngram_max"]), inner, max_size=3),
                 max_leaves=6),
    max_size=6))
def test_fuzzed_requests_never_500(url, body):
    r = httpx.post(url + COMP, json=body, timeout=60)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert_error(r, 400)
    elif body.get("stream") is True:
        assert r.text.endswith("data: [DONE]\n\n") and "server_error" not in r.text
    else:
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_full_queue_is_a_429(tiny_server_pair):
    import threading

    app = create_app(tiny_server_pair, limits=Limits(max_tokens=500, max_queue=1))
    with serve_in_thread(app) as base:
        done = {}
        long = threading.Thread(target=lambda: done.update(r=httpx.post(
            base + COMP, json={"prompt": "def f(x):", "max_tokens": 480}, timeout=60)))
        long.start()
        deadline = time.monotonic() + 10
        while httpx.get(base + "/health").json()["running"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        assert assert_error(httpx.post(base + COMP, json={"prompt": "abc"}), 429)["type"] == "rate_limit_error"
        long.join(60)
        assert done["r"].status_code == 200


def test_still_serving_after_bad_input(url):
    r = httpx.post(url + COMP, json={"prompt": "abc", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert httpx.get(url + "/health").json()["status"] == "ok"


# ------------------------------------------------------------------------------- API key
@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": "sekret"}],
                         ids=["no key", "wrong key", "no Bearer"])
def test_api_key_required(keyed, headers):
    r = httpx.post(keyed.url + COMP, json={"prompt": "abc"}, headers=headers)
    assert assert_error(r, 401)["code"] == "invalid_api_key"
    assert_error(httpx.get(keyed.url + "/v1/models", headers=headers), 401)


def test_api_key_accepted(keyed):
    r = httpx.post(keyed.url + COMP, json={"prompt": "abc"}, headers={"authorization": "Bearer sekret"})
    assert r.status_code == 200
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key="sekret", max_retries=0)
    assert client.chat.completions.create(model="tiny", messages=MSG).choices[0].message.role == "assistant"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(keyed.url + "/health").status_code == 200  # health and metrics stay open
    assert 'specdec_errors_total{status="401"}' in httpx.get(keyed.url + "/metrics").text
