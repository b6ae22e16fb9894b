"""Bad input to ``specdec serve`` gets OpenAI's error shape and a 4xx status, never a 500; the API
key; the Host, Origin and Content-Type checks; a dead worker and the request timeout."""

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
from specdec.frontends.server import Limits, create_app, serve_in_thread  # noqa: E402

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
    "n zero": (COMP, {"prompt": "x", "n": 0}, "n"),
    "n over the limit (chat)": (CHAT, {"messages": MSG, "n": 17}, "n"),
    "n two with stream": (COMP, {"prompt": "x", "n": 2, "stream": True}, "n"),
    "unknown policy": (COMP, {"prompt": "x", "speculative": {"policy": "nope"}}, "speculative.policy"),
    "unknown drafter": (COMP, {"prompt": "x", "speculative": {"drafter": "nope"}}, "-"),
    "policy not a string": (COMP, {"prompt": "x", "speculative": {"policy": 3}}, "speculative.policy"),
    "k zero": (COMP, {"prompt": "x", "speculative": {"k": 0}}, "speculative.k"),
    "k a string": (COMP, {"prompt": "x", "speculative": {"k": "5"}}, "speculative.k"),
    "unknown rule parameter": (COMP, {"prompt": "x", "speculative": {"theta": 0.5}}, "speculative"),
    "exact prefix negative": (COMP, {"prompt": "x", "speculative": {"policy": "mars", "exact_prefix": -1}},
                              "speculative.exact_prefix"),
    "fuzzy threshold past ln 2": (COMP, {"prompt": "x", "speculative": {"policy": "fuzzy", "threshold": 0.8}},
                                  "speculative.threshold"),
    "sampling field inside speculative": (COMP, {"prompt": "x", "speculative": {"temperature": 1}}, "speculative.temperature"),
    "rule parameter infinite": (COMP, b'{"prompt": "x", "speculative": {"policy": "fly", "theta": Infinity}}',
                                "speculative.theta"),
    "speculative not an object": (COMP, {"prompt": "x", "speculative": "fast"}, "speculative"),
    # lone surrogates: valid JSON escapes, not Unicode text (a TypeError in the tokenizer or a
    # UnicodeEncodeError writing the answer gave a 500)
    "prompt with a lone surrogate": (COMP, {"prompt": "a\ud800b"}, "prompt"),
    "prompt list with a lone surrogate": (COMP, {"prompt": ["\udfff"]}, "prompt.0"),
    "chat content with a lone surrogate": (CHAT, {"messages": [{"role": "user", "content": "\ud800"}]},
                                           "messages.0.content"),
    "chat role with a lone surrogate": (CHAT, {"messages": [{"role": "\udc80", "content": "hi"}]}, "messages.0.role"),
    "content part with a lone surrogate": (CHAT, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "\ud800"}]}]}, "messages.0.content.0.text"),
    "model with a lone surrogate": (COMP, {"prompt": "x", "model": "\ud800"}, "model"),
    "chat model with a lone surrogate": (CHAT, {"messages": MSG, "model": "m\udbff"}, "model"),
    "stop with a lone surrogate": (COMP, {"prompt": "x", "stop": ["ok", "\ud800"]}, "stop.1"),
    "speculative key with a lone surrogate": (COMP, {"prompt": "x", "speculative": {"\ud800": 1}}, "-"),
    "policy with a lone surrogate": (COMP, {"prompt": "x", "speculative": {"policy": "\ud800"}}, "speculative.policy"),
    "unknown field with a lone surrogate": (COMP, {"prompt": "x", "\ud800": "y"}, "-"),
    # stop strings: at most 16, of at most 256 characters each
    "stop string too long": (COMP, {"prompt": "x", "stop": ["y" * 257]}, "stop"),
    "seventeen stop strings": (COMP, {"prompt": "x", "stop": [f"s{i}" for i in range(17)]}, "stop"),
}


def post(url: str, body, **headers) -> httpx.Response:
    """POST ``body`` (a dict as ASCII JSON, so lone surrogates travel as escapes; or raw bytes)."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url, content=content, headers={"content-type": "application/json", **headers}, timeout=60)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_a_400(url, name):
    path, body, param = BAD[name]
    err = assert_error(post(url + path, body), 400, param)
    assert err["type"] == "invalid_request_error"
    assert "\n" not in err["message"] and len(err["message"]) < 400  # one line


@pytest.mark.parametrize("body", [
    {"prompt": "abc", "temperature": 1e-300}, {"prompt": "abc", "temperature": 5e-324},
    {"prompt": "abc", "temperature": 1.0, "top_p": 1e-46}, {"prompt": "abc", "temperature": 1.0, "top_p": 5e-324},
    {"prompt": "abc", "temperature": 1e-300, "top_p": 1e-46, "seed": 1},
    {"prompt": "abc", "temperature": 1e-300, "speculative": {"policy": "mars", "k": 3}},
], ids=["T 1e-300", "T 5e-324", "top_p 1e-46", "top_p 5e-324", "both", "T 1e-300 mars"])
def test_tiny_temperature_and_top_p_are_answered(url, body):
    """Below the 1e-5 floor a temperature is greedy; any top_p keeps the top token (these gave a
    500: inf logits, then NaN in multinomial)."""
    r = post(url + COMP, {**body, "max_tokens": 4})
    assert r.status_code == 200, r.text
    if body["temperature"] < 1e-5:
        greedy = post(url + COMP, {"prompt": "abc", "max_tokens": 4, "temperature": 0,
                                   "speculative": body.get("speculative", {})})
        if "speculative" not in body:
            greedy = post(url + COMP, {"prompt": "abc", "max_tokens": 4, "temperature": 0})
        assert r.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]


def test_stop_strings_at_the_caps_pass(url):
    r = post(url + COMP, {"prompt": "abc", "max_tokens": 4, "stop": ["y" * 256] + [f"s{i}" for i in range(15)]})
    assert r.status_code == 200, r.text
    assert post(url + COMP, {"prompt": "abc", "max_tokens": 2, "stop": []}).status_code == 200  # was a 500 mid-fix


def test_tokenize_bad_input_is_a_400(url):
    assert_error(post(url + "/tokenize", {"prompt": "a\ud800"}), 400, "prompt")
    assert_error(post(url + "/tokenize", {"messages": [{"role": "user", "content": "\udfff"}]}), 400,
                 "messages.0.content")
    assert_error(post(url + "/tokenize", {"prompt": "x" * 5000}), 413)  # over this server's body cap
    r = post(url + "/tokenize", {"prompt": "abc"})
    assert r.status_code == 200 and r.json()["count"] >= 3  # the connection and the server are fine


def test_tokenize_length_cap(tiny_server_pair):
    app = create_app(tiny_server_pair, limits=Limits(max_tokenize_chars=100))
    with serve_in_thread(app) as base:
        assert post(base + "/tokenize", {"prompt": "x" * 100}).status_code == 200
        assert "at most 100" in assert_error(post(base + "/tokenize", {"prompt": "x" * 101}), 400, "prompt")["message"]
        assert_error(post(base + "/tokenize", {"messages": [{"role": "user", "content": "x" * 101}]}), 400, "messages")
        assert_error(post(base + "/detokenize", {"tokens": [1] * 101}), 400, "tokens")


def test_tokenize_runs_off_the_event_loop(url, tiny_server_pair, monkeypatch):
    """A slow tokenization (a 2 MB prompt took 4.6 s) must not hold up /health."""
    import threading

    release, entered = threading.Event(), threading.Event()
    encode = tiny_server_pair.tokenizer.encode

    def slow_encode(*args, **kwargs):
        entered.set()
        release.wait(30)
        return encode(*args, **kwargs)

    monkeypatch.setattr(tiny_server_pair.tokenizer, "encode", slow_encode)
    done = {}
    t = threading.Thread(target=lambda: done.update(r=post(url + "/tokenize", {"prompt": "hello"})))
    t.start()
    try:
        assert entered.wait(30)
        assert httpx.get(url + "/health", timeout=5).status_code == 200  # answered while encode is blocked
    finally:
        release.set()
        t.join(60)
    assert done["r"].status_code == 200 and done["r"].json()["count"] == 5


def test_template_errors_are_a_400(url, tiny_server_pair, monkeypatch):
    from jinja2.exceptions import TemplateError

    def refuse(*args, **kwargs):
        raise TemplateError("Conversation roles must alternate user/assistant/user/assistant/...")

    monkeypatch.setattr(tiny_server_pair.tokenizer, "apply_chat_template", refuse)
    err = assert_error(post(url + "/tokenize", {"messages": MSG}), 400, "messages")
    assert "roles must alternate" in err["message"]
    err = assert_error(post(url + CHAT, {"messages": MSG}), 400, "messages")
    assert err["message"].startswith("the chat template refused the messages: Conversation roles")


# --------------------------------------------------------- content type, Host and Origin
@pytest.mark.parametrize("headers", [{}, {"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"},
                                     {"content-type": "multipart/form-data; boundary=x"}],
                         ids=["none", "text/plain", "form", "multipart"])
def test_a_body_that_is_not_json_is_a_415(url, headers):
    """The "simple" requests any web page can make a browser send, without a CORS preflight."""
    r = httpx.post(url + COMP, content=b'{"prompt": "abc", "max_tokens": 2}', headers=headers)
    assert assert_error(r, 415)["code"] == "unsupported_media_type"
    assert_error(httpx.post(url + "/tokenize", content=b'{"prompt": "abc"}', headers=headers), 415)


def test_json_content_types_pass(url):
    for ctype in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"):
        r = httpx.post(url + COMP, content=b'{"prompt": "abc", "max_tokens": 2}', headers={"content-type": ctype})
        assert r.status_code == 200, (ctype, r.text)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", "192.168.1.10"])
def test_a_foreign_host_is_refused(url, host):
    """DNS rebinding: a page whose name now points at 127.0.0.1 sends its own name as Host."""
    for r in (httpx.get(url + "/health", headers={"host": host}),
              httpx.get(url + "/v1/models", headers={"host": host}),
              post(url + COMP, {"prompt": "abc"}, host=host)):
        assert assert_error(r, 400)["code"] == "host_not_allowed"


def test_loopback_hosts_pass(url):
    port = url.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
        assert httpx.get(url + "/health", headers={"host": host}).status_code == 200, host


def test_a_cross_site_origin_is_refused(url):
    for origin in ("https://evil.example", "null", "http://localhost:3000"):
        r = post(url + COMP, {"prompt": "abc", "max_tokens": 2}, origin=origin)
        assert assert_error(r, 403)["code"] == "origin_not_allowed"
    r = post(url + COMP, {"prompt": "abc", "max_tokens": 2}, origin=url)  # its own origin
    assert r.status_code == 200


def test_allowed_hosts_and_origins_are_configurable(tiny_server_pair):
    app = create_app(tiny_server_pair, {"max_new_tokens": 2}, allowed_hosts=["api.example"],
                     allow_origins=["https://ui.example"])
    with serve_in_thread(app) as base:
        assert httpx.get(base + "/health", headers={"host": "api.example:443"}).status_code == 200
        assert_error(httpx.get(base + "/health"), 400)  # 127.0.0.1 is not in the list any more
        ok = post(base + COMP, {"prompt": "abc"}, host="api.example", origin="https://ui.example")
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://ui.example"
        assert_error(post(base + COMP, {"prompt": "abc"}, host="api.example", origin="https://evil.example"), 403)
        pre = httpx.options(base + COMP, headers={"host": "api.example", "origin": "https://ui.example",
                                                  "access-control-request-method": "POST",
                                                  "access-control-request-headers": "content-type,authorization"})
        assert pre.status_code == 200 and "POST" in pre.headers["access-control-allow-methods"]


def test_default_hosts_follow_the_bound_address():
    from specdec.frontends.server.origins import default_hosts

    assert default_hosts("127.0.0.1") == ["localhost", "127.0.0.1", "::1"]
    assert default_hosts("localhost") == ["localhost", "127.0.0.1", "::1"]
    assert default_hosts("10.0.0.5") == ["10.0.0.5", "localhost", "127.0.0.1", "::1"]
    assert default_hosts("0.0.0.0") == ["*"] and default_hosts("::") == ["*"]


# ------------------------------------------------------------ dead worker, timeout, bugs
def test_a_dead_worker_is_replaced_and_its_request_answered(tiny_server_pair):
    """An injected death (an exception that is not an Exception) left later requests hanging."""
    app = create_app(tiny_server_pair, {"max_new_tokens": 3})
    worker = app.state.worker
    run = worker._run

    def die_once(job):
        worker._run = run
        raise SystemExit("injected")

    with serve_in_thread(app) as base:
        worker._run = die_once
        t0 = time.monotonic()
        r = post(base + COMP, {"prompt": "abc"})
        assert assert_error(r, 503)["type"] == "server_error" and time.monotonic() - t0 < 30
        assert "worker failed" in r.json()["error"]["message"]
        assert post(base + COMP, {"prompt": "abc"}).status_code == 200  # a new thread took over
        health = httpx.get(base + "/health").json()
        assert health["status"] == "ok" and health["worker_restarts"] == 1


def test_queued_requests_survive_a_dead_worker(tiny_server_pair):
    import threading

    app = create_app(tiny_server_pair, {"max_new_tokens": 3})
    worker = app.state.worker
    run, gate = worker._run, threading.Event()

    def die_after_gate(job):
        gate.wait(30)
        worker._run = run
        raise SystemExit("injected")

    with serve_in_thread(app) as base:
        worker._run = die_after_gate
        results: dict = {}
        first = threading.Thread(target=lambda: results.update(a=post(base + COMP, {"prompt": "abc"})))
        first.start()
        deadline = time.monotonic() + 10
        while httpx.get(base + "/health").json()["running"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        second = threading.Thread(target=lambda: results.update(b=post(base + COMP, {"prompt": "abc"})))
        second.start()
        while httpx.get(base + "/health").json()["waiting"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        gate.set()
        first.join(60)
        second.join(60)
    assert results["a"].status_code == 503 and results["b"].status_code == 200


def test_request_timeout_is_a_503(tiny_server_pair):
    import threading

    app = create_app(tiny_server_pair, {"max_new_tokens": 3},
                     limits=Limits(request_timeout_seconds=0.3, stream_wait_seconds=0.05))
    worker = app.state.worker
    run, release = worker._run, threading.Event()
    worker._run = lambda job: (release.wait(30), run(job))  # a hung engine
    with serve_in_thread(app) as base:
        try:
            err = assert_error(post(base + COMP, {"prompt": "abc"}), 503)
            assert "request timeout (0.3 s)" in err["message"]
            with httpx.stream("POST", base + COMP, json={"prompt": "abc", "stream": True}, timeout=60) as r:
                lines = [line for line in r.iter_lines() if line]
            assert r.status_code == 200 and lines[-1] == "data: [DONE]"
            assert "request timeout" in json.loads(lines[-2][len("data: "):])["error"]["message"]
        finally:
            release.set()
        worker._run = run
        assert post(base + COMP, {"prompt": "abc"}).status_code == 200


def test_an_unexpected_error_gets_the_openai_shape(tiny_server_pair):
    app = create_app(tiny_server_pair)

    @app.get("/v1/boom")
    async def boom():
        raise RuntimeError("a bug")

    with serve_in_thread(app) as base, httpx.Client(base_url=base) as client:
        err = assert_error(client.get("/v1/boom"), 500)
        assert err["type"] == "server_error" and "a bug" not in err["message"]
        assert client.get("/health").status_code == 200  # the same keep-alive connection still works
        assert 'specdec_errors_total{status="500"}' in client.get("/metrics").text


def test_surrogates_in_an_answer_are_escaped():
    from specdec.frontends.server.app import SafeJSONResponse

    body = SafeJSONResponse({"m": "a\ud800", "e": "é"}).body
    assert json.loads(body) == {"m": "a\ud800", "e": "é"}


def test_controller_cache_is_bounded(tiny_server_pair):
    """300 distinct theta values kept 301 k=auto controllers (the bound here 64, the engine's
    MAX_CONTROLLERS: 1024)."""
    from specdec.frontends.api import make_config
    from specdec.models.costmodel import CostTable
    from specdec.core.scopes import MAX_CONTROLLERS, WarmStates

    engine = tiny_server_pair.engine
    saved = engine.target_costs, engine.caches.controllers
    engine.target_costs = CostTable("t", "float32", [1, 2, 4, 8], [0.01, 0.02, 0.04, 0.08], 64)
    try:
        assert saved[1].limit == MAX_CONTROLLERS == 1024
        engine.caches.controllers = WarmStates(64)
        first = engine.k_policy(make_config(policy="mars", theta=0.5))
        for i in range(300):
            engine.k_policy(make_config(policy="mars", theta=0.01 + i / 1000))
            if i % 10 == 0:  # used now and then: the least recently used go first
                assert engine.k_policy(make_config(policy="mars", theta=0.5)) is first
        assert len(engine.caches.controllers) == 64
    finally:
        engine.target_costs, engine.caches.controllers = saved


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
    st.recursive(st.none() | st.booleans() | st.integers(-3, 70) | st.floats(-2, 2) | st.text(max_size=5)
                 | st.sampled_from([1e-300, 5e-324, 1e-46, 1e-8, -5e-324])
                 | st.sampled_from(["\ud800", "a\udfff", "\udc80b"]),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                     st.sampled_from(["policy", "drafter", "k", "theta", "ngram_max"]), inner, max_size=3),
                 max_leaves=6),
    max_size=6))
def test_fuzzed_requests_never_500(url, body):
    assert_answered_cleanly(url, body)


TINY = st.sampled_from([1e-300, 5e-324, 1e-46, 1e-8, 0.0, 0.7, 1.0])
TEXT = st.text(max_size=6) | st.sampled_from(["\ud800", "a\udfff", "\udc80b", "ok"])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.fixed_dictionaries({"prompt": TEXT}, optional={
    "model": TEXT, "temperature": TINY, "top_p": TINY, "stop": st.lists(TEXT, max_size=3) | TEXT,
    "seed": st.integers(0, 3), "stream": st.booleans(), "max_tokens": st.integers(1, 4)}))
def test_fuzzed_sampling_fields_never_500(url, body):
    """Near-valid bodies, so that tiny floats and surrogates reach sampling and the answer."""
    assert_answered_cleanly(url, body)


def assert_answered_cleanly(url, body):
    """A clear 400, or a complete answer (a stream ends with [DONE] and no server error)."""
    r = post(url + COMP, body)
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
@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": "sekret"},
                                     {"authorization": "Basic sekret"}, {"authorization": "Bearer"},
                                     {"authorization": "Bearer sekret2"}],
                         ids=["no key", "wrong key", "no Bearer", "Basic", "empty", "longer"])
def test_api_key_required(keyed, headers):
    r = httpx.post(keyed.url + COMP, json={"prompt": "abc"}, headers=headers)
    assert assert_error(r, 401)["code"] == "invalid_api_key"
    for path in ("/v1/models", "/openapi.json", "/docs", "/tokenizer_info", "/metrics"):
        assert_error(httpx.get(keyed.url + path, headers=headers), 401)


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
def test_api_key_scheme_is_case_insensitive(keyed, scheme):
    r = httpx.post(keyed.url + COMP, json={"prompt": "abc"}, headers={"authorization": f"{scheme} sekret"})
    assert r.status_code == 200, r.text


def test_openapi_is_behind_the_key(keyed, url):
    assert httpx.get(keyed.url + "/openapi.json", headers={"authorization": "Bearer sekret"}).status_code == 200
    assert httpx.get(url + "/openapi.json").status_code == 200  # no key set: open


@pytest.mark.parametrize("key", ["", "   ", "two words", "caf\u00e9"])
def test_an_empty_or_unsendable_key_is_refused(tiny_server_pair, key):
    from specdec.errors import SpecdecError

    with pytest.raises(SpecdecError, match="API key"):
        create_app(tiny_server_pair, api_key=key)


def test_api_key_accepted(keyed):
    r = httpx.post(keyed.url + COMP, json={"prompt": "abc"}, headers={"authorization": "Bearer sekret"})
    assert r.status_code == 200
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key="sekret", max_retries=0)
    assert client.chat.completions.create(model="tiny", messages=MSG).choices[0].message.role == "assistant"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(keyed.url + "/health").status_code == 200  # the liveness probe stays open
    scrape = httpx.get(keyed.url + "/metrics", headers={"authorization": "Bearer sekret"})
    assert 'specdec_errors_total{status="401"}' in scrape.text  # metrics need the key, as in vLLM


def test_what_the_loaded_models_cannot_serve_is_a_400_before_the_stream(tiny_dirs):
    """Without a draft model, a request for the model drafter is refused as a status (not an
    error event after a 200 stream started), naming the speculative field; pld still serves."""
    pair = specdec.load(str(tiny_dirs[0]), draft=None, dtype="float32", device="cpu", progress=False)
    app = create_app(pair, {"drafter": "pld", "max_new_tokens": 4}, limits=Limits(max_tokens=64))
    with serve_in_thread(app) as base:
        for stream in (False, True):
            r = post(base + COMP, {"prompt": "abc", "max_tokens": 4, "stream": stream,
                                   "speculative": {"policy": "lossless", "drafter": "model"}})
            err = assert_error(r, 400, "speculative")
            assert "needs a draft model" in err["message"]
        assert post(base + COMP, {"prompt": "abc", "max_tokens": 4, "stream": True}).status_code == 200
