"""Hostile input on ``specdec serve``: numbers at the edge of what the arithmetic takes, bodies
shaped to make validation slow, metric labels from client text, work after the client leaves, and
text or prompt lengths crossing from one client to another. Each sends the request, checks the
status and the field named, and that the server then answers a normal request."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

import specdec  # noqa: E402
from specdec.core.caller import Caller  # noqa: E402
from specdec.core.drafters.suffix import SuffixCache  # noqa: E402
from specdec.core.request import MAX_K  # noqa: E402
from specdec.frontends.server import Limits, create_app, serve_in_thread  # noqa: E402
from specdec.core.verify.policy import RULES  # noqa: E402

COMP = "/v1/completions"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def pair(tiny_dirs):
    target, draft = tiny_dirs
    return specdec.load(str(target), draft=str(draft), dtype="float32", device="cpu", progress=False)


@pytest.fixture(scope="module")
def url(pair):
    with serve_in_thread(create_app(pair, {"max_new_tokens": 4}, limits=Limits(max_tokens=64))) as base:
        yield base


def post(url: str, body, timeout: float = 60, **headers) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url, content=content, headers={"content-type": "application/json", **headers}, timeout=timeout)


def refused(r: httpx.Response, param: str) -> str:
    """The 400's message, after checking that its ``param`` starts with ``param``."""
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert (err["param"] or "").startswith(param), err
    assert "\n" not in err["message"] and len(err["message"]) < 400, err["message"][:500]
    return err["message"]


def still_serving(url: str) -> None:
    r = post(url + COMP, {"prompt": "abc", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text


def streamed_error(url: str, body: dict) -> httpx.Response:
    return post(url + COMP, {**body, "stream": True})


# ------------------------------------------------------------------- numbers at the edges
@pytest.mark.parametrize("body, param", [
    ({"repetition_penalty": 1e-40, "temperature": 1.0}, "repetition_penalty"),
    ({"repetition_penalty": 5e-324, "temperature": 0.7}, "repetition_penalty"),
    ({"repetition_penalty": 1e-3}, "repetition_penalty"),
    ({"repetition_penalty": 1e30}, "repetition_penalty"),
    ({"seed": 2**64 - 1, "n": 2, "temperature": 1.0}, "seed"),
    ({"seed": 2**64 - 2, "n": 3}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"speculative": {"k": MAX_K + 1}}, "speculative.k"),
    ({"speculative": {"k": 500, "drafter": "model"}}, "speculative.k"),
    ({"speculative": {"n_max": 10**9}}, "speculative.k"),
    ({"num_speculative_tokens": 400}, "speculative.k"),
    ({"speculative": {"logprobs": 2}}, "speculative.logprobs"),
    ({"speculative": {"stop_token_ids": [1]}}, "speculative.stop_token_ids"),
    ({"speculative": {"regex": "a+"}}, "speculative.regex"),
    ({"speculative": {"policy": "mars" + " " * 100}}, "speculative.policy"),
    ({"speculative": {"drafter": "x" * 65}}, "speculative.drafter"),
], ids=lambda v: json.dumps(v)[:60] if isinstance(v, dict) else v)
def test_numbers_out_of_range_are_a_400_naming_the_field(url, body, param):
    refused(post(url + COMP, {"prompt": "abc", "max_tokens": 2, **body}), param)
    if "n" not in body:
        refused(streamed_error(url, {"prompt": "abc", "max_tokens": 2, **body}), param)
    still_serving(url)


HUGE = b"1" + b"0" * 400  # a JSON number no float holds (Python's json reads it as an int)


def _huge_params() -> list[tuple[str, str, str]]:
    """(where, name, option): every rule and drafter option that takes a number."""
    from specdec.checks import options_of
    from specdec.core.drafters import DRAFTERS

    out = [("policy", name, opt) for name, rule in RULES.items() for opt, (spec, _) in options_of(rule).items()
           if spec.kind in (int, float)]
    return out + [("drafter", name, opt) for name, cls in DRAFTERS.items()
                  for opt, (spec, _) in options_of(cls.Options).items() if spec.kind in (int, float)]


HUGE_PARAMS = _huge_params()


@pytest.mark.parametrize("where, name, option", HUGE_PARAMS, ids=[f"{n}-{o}" for _, n, o in HUGE_PARAMS])
def test_a_huge_json_number_in_a_parameter_is_a_400(url, where, name, option):
    """``"theta": 1`` followed by 400 zeros was a 500 (an OverflowError in the number check)."""
    body = b'{"prompt": "abc", "max_tokens": 2, "speculative": {"%s": "%s", "%s": %s}}' % (
        where.encode(), name.encode(), option.encode(), HUGE)
    message = refused(post(url + COMP, body), f"speculative.{option}")
    assert "integer of about 401 digits" in message, message
    still_serving(url)


@pytest.mark.parametrize("field", ["temperature", "top_p", "max_tokens", "seed", "top_k", "repetition_penalty",
                                   "presence_penalty", "frequency_penalty"])
def test_a_huge_json_number_in_a_sampling_field_is_a_400(url, field):
    r = post(url + COMP, b'{"prompt": "abc", "%s": %s}' % (field.encode(), HUGE))
    assert r.status_code == 400, r.text[:300]
    still_serving(url)


def test_the_edges_themselves_are_served(url):
    for body in ({"seed": 2**64 - 3, "n": 3, "temperature": 1.0}, {"seed": -(2**63), "temperature": 1.0},
                 {"repetition_penalty": 0.01, "temperature": 1.0}, {"repetition_penalty": 100.0, "temperature": 1.0},
                 {"speculative": {"k": MAX_K, "drafter": "model"}}):
        r = post(url + COMP, {"prompt": "abc", "max_tokens": 2, **body})
        assert r.status_code == 200, (body, r.text)
    r = post(url + COMP, {"prompt": "abc", "max_tokens": 2, "stream": True, "repetition_penalty": 0.01,
                          "temperature": 1.0})
    assert r.status_code == 200 and '"error"' not in r.text and r.text.rstrip().endswith("data: [DONE]")


def test_a_tree_that_cannot_fit_the_context_is_refused_before_generating(url):
    """A lookahead pass of W=64, N=16 holds 959 nodes, more than the tiny model's 512 positions:
    refused before any token (it failed after 27 s of generation, mid-stream)."""
    tree = {"policy": "lossless", "drafter": "lookahead", "k": "auto", "lookahead_window": 64,
            "lookahead_ngram": 16, "lookahead_guesses": 0}
    for stream in (False, True):
        r = post(url + COMP, {"prompt": "abc", "max_tokens": 8, "stream": stream, "speculative": tree})
        assert r.status_code == 400 and "do not fit the context" in r.json()["error"]["message"], r.text
    still_serving(url)


def test_a_tree_near_the_context_s_end_takes_plain_steps(url):
    """A tree that fits after the prompt but not near the context's end: plain steps there, no error."""
    tree = {"policy": "lossless", "drafter": "lookahead", "lookahead_window": 16, "lookahead_ngram": 8,
            "lookahead_guesses": 0}  # 127 nodes
    r = post(url + COMP, {"prompt": "ab" * 180, "max_tokens": 60, "speculative": tree, "temperature": 0})
    assert r.status_code == 200, r.text
    plain = post(url + COMP, {"prompt": "ab" * 180, "max_tokens": 60, "speculative": None, "temperature": 0})
    assert r.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]


# ---------------------------------------------------------------- bodies shaped to be slow
MANY = 300_000
SHAPES = {  # name: (path, body, param the 400 names)
    "messages of numbers": (CHAT, {"messages": [1] * MANY}, "messages"),
    "stop of numbers": (COMP, {"prompt": "x", "stop": [1] * MANY}, "stop"),
    "stop_token_ids of strings": (COMP, {"prompt": "x", "stop_token_ids": ["a"] * MANY}, "stop_token_ids"),
    "token-id prompt of strings": (COMP, {"prompt": [["a"] * MANY]}, "prompt"),
    "content parts of numbers": (CHAT, {"messages": [{"role": "user", "content": [1] * MANY}]}, "messages"),
    "detokenize strings": ("/detokenize", {"tokens": ["a"] * MANY}, "tokens"),
    "tokenize messages of numbers": ("/tokenize", {"messages": [1] * MANY}, "messages"),
}
#: bodies of many arrays or objects: refused before they are parsed
CONTAINERS = {
    "messages of empty objects": (CHAT, {"messages": [{}] * MANY}),
    "an unknown field of empty objects": (COMP, {"prompt": "x", "junk": [{}] * MANY}),
    "stop of empty lists": (COMP, {"prompt": "x", "stop": [[]] * MANY}),
    "tokenize messages of empty objects": ("/tokenize", {"messages": [{}] * MANY}),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_large_body_of_bad_items_is_one_quick_400(url, name):
    path, body, param = SHAPES[name]
    small = {k: (v[:3] if isinstance(v, list) and len(v) == MANY else v) for k, v in body.items()}
    if name == "token-id prompt of strings":
        small = {"prompt": [["a"] * 3]}
    for variant in (small, body):
        t0 = time.monotonic()
        refused(post(url + path, variant), param)
        assert time.monotonic() - t0 < 5
    still_serving(url)


@pytest.mark.parametrize("name", list(CONTAINERS))
def test_a_body_of_too_many_arrays_and_objects_is_refused_before_parsing(url, name):
    path, body = CONTAINERS[name]
    t0 = time.monotonic()
    r = post(url + path, body)
    assert r.status_code == 400 and "arrays and objects; at most 65536" in r.json()["error"]["message"], r.text
    assert time.monotonic() - t0 < 5
    still_serving(url)


def test_brackets_inside_strings_are_text(url):
    r = post(url + "/tokenize", {"prompt": "{[" * 70_000})
    assert r.status_code == 200 and r.json()["count"] == 140_000
    r = post(url + "/tokenize", {"messages": [{"role": "user", "content": "x"}] * 4096})  # a long chat passes
    assert r.status_code == 200, r.text


def test_health_answers_while_large_invalid_bodies_are_parsed(url):
    """Five large bodies at once (parsed one after another on the event loop before: three held
    /health for 50 s); /health must answer within a second throughout."""
    bodies = [(CHAT, {"messages": [{}] * MANY}), (COMP, {"prompt": "x", "junk": [{}] * MANY, "max_tokens": 1}),
              (COMP, {"prompt": "x", "stop": [1] * MANY}), ("/detokenize", {"tokens": ["a"] * MANY}),
              (COMP, {"prompt": "x", "junk": [1] * MANY, "max_tokens": 1})]
    bodies = [(path, json.dumps(body).encode()) for path, body in bodies]  # encoded here, not while measuring
    results: list = []
    threads = [threading.Thread(target=lambda p=p, b=b: results.append(post(url + p, b))) for p, b in bodies]
    for t in threads:
        t.start()
    worst = 0.0
    while any(t.is_alive() for t in threads):
        t0 = time.monotonic()
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        worst = max(worst, time.monotonic() - t0)
        time.sleep(0.01)
    for t in threads:
        t.join()
    assert worst < 1.0, worst
    assert sorted(r.status_code for r in results) == [400] * 5  # unknown fields are refused, not ignored
    still_serving(url)


def test_deep_nesting_is_a_400(url):
    deep = b'{"prompt": "x", "junk": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert post(url + COMP, deep).status_code == 400
    still_serving(url)


def test_openapi_still_lists_the_bodies(url):
    spec = httpx.get(url + "/openapi.json").json()
    assert {"CompletionRequest", "ChatRequest", "ChatMessage", "DetokenizeRequest"} <= set(spec["components"]["schemas"])
    ref = spec["paths"][COMP]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/CompletionRequest"


# ------------------------------------------------------------------------- metric labels
def test_metrics_stay_small_whatever_policy_names_clients_send(pair):
    app = create_app(pair, {"max_new_tokens": 2}, limits=Limits(max_tokens=8))
    with serve_in_thread(app) as base:
        refused(post(base + COMP, {"prompt": "ab", "speculative": {"policy": "mars" + " " * 2_000_000}}),
                "speculative.policy")
        names = [" mars", "mars ", "fly+mars", "mars+fly", " fly + mars ", "\tmars\n"] + [
            "mars" + " " * i for i in range(40)]
        for name in names:
            r = post(base + COMP, {"prompt": "ab", "max_tokens": 2, "speculative": {"policy": name, "k": 8}})
            assert r.status_code == 200, (name, r.text)
        page = httpx.get(base + "/metrics").text
    policies = {line.split('policy="')[1].split('"')[0] for line in page.splitlines() if 'policy="' in line}
    assert policies == {"mars", "fly+mars"}, policies
    assert len(page) < 64 * 1024


# ------------------------------------------------------------------ the client that leaves
def test_the_engine_is_freed_mid_round_when_the_client_leaves(tiny_dirs):
    """A draft model made slow (0.2 s a pass) and k=31: a round's drafting takes over 6 s. The
    client leaves during the first round; the engine must be free well before the round would end."""
    target, draft = tiny_dirs
    slow = specdec.load(str(target), draft=str(draft), dtype="float32", device="cpu", progress=False)
    forward = slow.engine.draft.forward

    def slow_forward(*args, **kwargs):
        time.sleep(0.2)
        return forward(*args, **kwargs)

    slow.engine.draft.forward = slow_forward
    app = create_app(slow, {"max_new_tokens": 64}, limits=Limits(max_tokens=64))
    body = {"prompt": "hello", "max_tokens": 64, "stream": True, "temperature": 0,
            "speculative": {"policy": "lossless", "drafter": "model", "k": MAX_K}}
    with serve_in_thread(app) as base, httpx.Client(timeout=60) as client:
        with client.stream("POST", base + COMP, json=body) as r:
            assert r.status_code == 200
            deadline = time.monotonic() + 30
            while httpx.get(base + "/health").json()["running"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            time.sleep(1.0)  # well inside the first round's drafting
        left = time.monotonic()
        while httpx.get(base + "/health").json()["running"]:
            assert time.monotonic() - left < 3.0, "the engine kept drafting after the client left"
            time.sleep(0.02)
        still_serving(base)


# -------------------------------------------------------------- text crossing between clients
SECRET = "the vault code is QX7-ZEBRA-9914-KILO and nobody else may read it"
LOOSEST = {"typical": {"epsilon": 0.0, "delta": 0.0}, "mars": {"theta": 0.0}, "fly": {"theta": 0.0, "window": 2},
           "dropmatch": {"criterion": "naive"}}


def _loose_outputs(base: str, headers_a: dict, headers_b: dict) -> dict[str, str]:
    out = {}
    for rule in RULES:
        spec = {"policy": rule, "drafter": "suffix", "k": 16, "suffix_min_prob": 0.0, **LOOSEST.get(rule, {})}
        a = post(base + COMP, {"prompt": SECRET + "\n" + SECRET, "max_tokens": 2, "temperature": 0,
                               "speculative": {"policy": "lossless", "drafter": "suffix"}}, **headers_a)
        assert a.status_code == 200, a.text
        b = post(base + COMP, {"prompt": "the vault code is", "max_tokens": 40, "temperature": 0,
                               "speculative": spec}, **headers_b)
        assert b.status_code == 200, (rule, b.text)
        out[rule] = b.json()["choices"][0]["text"]
    return out


@pytest.mark.parametrize("shared", [False, True], ids=["no-shared-caches", "shared caches (the default)"])
def test_a_secret_never_reaches_another_client_under_a_loose_rule(pair, shared):
    """Client A sends a secret; client B, under each loose rule at its loosest with the suffix
    drafter, starts the same sentence. With --no-shared-caches each keyless request drafts from its
    own text only; with the caches shared (the keyless default, or one key), a loose rule still
    never drafts from another request's."""
    pair.engine.caches.suffix = SuffixCache()  # empty: earlier tests' text is not this test's
    app = create_app(pair, {"max_new_tokens": 4}, limits=Limits(max_tokens=64), shared_caches=shared)
    with serve_in_thread(app) as base:
        for rule, text in _loose_outputs(base, {}, {}).items():
            assert "QX7" not in text and "ZEBRA" not in text, (rule, text)
    if shared:
        assert pair.engine.caches.suffix.requests(Caller.named("all"))  # kept, for exact rules to draft from
    else:
        assert pair.engine.caches.suffix.requests() == []  # nothing kept without a key


def test_exact_rules_may_draft_from_the_shared_cache(pair):
    pair.engine.caches.suffix = SuffixCache()
    app = create_app(pair, {"max_new_tokens": 4}, limits=Limits(max_tokens=64), shared_caches=True)
    spec = {"policy": "lossless", "drafter": "suffix", "k": 16}
    with serve_in_thread(app) as base:
        alone = post(base + COMP, {"prompt": "the vault code is", "max_tokens": 20, "temperature": 0,
                                   "speculative": spec}).json()
        post(base + COMP, {"prompt": SECRET + "\n" + SECRET, "max_tokens": 2, "temperature": 0, "speculative": spec})
        after = post(base + COMP, {"prompt": "the vault code is", "max_tokens": 20, "temperature": 0,
                                   "speculative": spec}).json()
    assert after["choices"][0]["text"] == alone["choices"][0]["text"]  # exact: the drafts change nothing


def test_the_prefix_cache_is_shared_only_within_a_key_and_salt(pair):
    prompt = "a prompt another client may try to guess, long enough"

    def cached(base, **kw):
        headers = kw.pop("headers", {})
        r = post(base + COMP, {"prompt": prompt, "max_tokens": 1, **kw}, **headers)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    with serve_in_thread(create_app(pair, {"max_new_tokens": 1}, shared_caches=False)) as base:
        cached(base)
        assert cached(base) == 0  # no key, the operator opted out: each request on its own
        cached(base, cache_salt="s3cret")
        assert cached(base, cache_salt="s3cret") > 0  # the same salt: the same client
        assert cached(base, cache_salt="other") == 0
        assert cached(base) == 0
        refused(post(base + COMP, {"prompt": "x", "cache_salt": ""}), "cache_salt")
    with serve_in_thread(create_app(pair, {"max_new_tokens": 1})) as base:
        cached(base)
        assert cached(base) > 0  # no key: one user's server, one scope without a salt
        assert cached(base, cache_salt="fresh-salt") == 0  # a salt isolates
    keys = {"authorization": "Bearer k1"}
    with serve_in_thread(create_app(pair, {"max_new_tokens": 1}, api_key="k1")) as base:
        cached(base, headers=keys)
        assert cached(base, headers=keys) > 0  # one key: one client
        assert cached(base, headers=keys, cache_salt="x") == 0


def test_two_keys_share_nothing_and_each_keeps_its_own_prefix(pair):
    """The engine, not each app's worker, knows whose text its models' caches hold: key k2's first
    request after k1's (another app over the same pair, the same prompt) reads its prompt whole, and
    k1's next one finds its own prefix again."""
    prompt = "a prompt another client may try to guess, long enough"

    def cached(base, key):
        r = post(base + COMP, {"prompt": prompt, "max_tokens": 1}, authorization=f"Bearer {key}")
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    one, two = (create_app(pair, {"max_new_tokens": 1}, api_key=key) for key in ("k1", "k2"))
    with serve_in_thread(one) as a, serve_in_thread(two) as b:
        cached(a, "k1")
        mine = cached(a, "k1")
        assert mine > 0
        assert cached(b, "k2") == 0
        assert cached(a, "k1") == mine  # its own copy put back: k2's request shows nowhere
        assert cached(b, "k2") == mine


# ---------------------------------------------------------------- every field honoured or refused
@pytest.mark.parametrize("field, value", [("drafter", "pld"), ("suffix_factor", 2.0), ("policy", "mars"), ("k", 4),
                                          ("theta", 0.8), ("n_max", 3)])
def test_a_speculative_setting_at_the_top_level_is_refused(url, field, value):
    """A top-level ``drafter`` or ``suffix_factor`` got a 200 and was dropped, while top-level
    ``num_speculative_tokens`` is honoured: now a 400 saying where the setting goes."""
    for path, body in ((COMP, {"prompt": "x"}), (CHAT, {"messages": [{"role": "user", "content": "x"}]})):
        message = refused(post(url + path, {**body, field: value}), field)
        assert f"{field} is a speculative setting" in message and '{"speculative"' in message, message
    r = post(url + COMP, {"prompt": "x", "max_tokens": 2, "num_speculative_tokens": 3})  # vLLM's name: honoured
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path, body, param", [
    (COMP, {"prompt": "x", "frobnicate": 1}, "frobnicate"),
    (COMP, {"prompt": "x", "chat_template": "{{ x }}"}, "chat_template"),
    (COMP, {"prompt": "x", "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats"),
    (CHAT, {"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages.0.name"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}]},
     "messages.0.content.0.cache_control"),
    ("/tokenize", {"prompt": "x", "return_token_strs": True}, "return_token_strs"),
    ("/detokenize", {"tokens": [1], "junk": 0}, "junk"),
    (COMP, {"prompt": "x", "z" * 10_000: 1}, "zzz"),
])
def test_an_unknown_field_is_refused_not_dropped(url, path, body, param):
    message = refused(post(url + path, body), param)
    assert "refused rather than ignored" in message, message
    still_serving(url)


def test_an_unknown_field_sent_as_null_is_a_field_left_out(url):
    """OpenAI clients send a whole assistant message back (``"tool_calls": null``, ``"refusal": null``):
    null is what a field left out means, so it passes."""
    r = post(url + COMP, {"prompt": "x", "max_tokens": 2, "drafter": None, "frobnicate": None})
    assert r.status_code == 200, r.text
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok", "tool_calls": None,
                                               "refusal": None, "function_call": None}, {"role": "user", "content": "x"}]
    r = post(url + CHAT, {"messages": chat, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_every_request_field_is_documented():
    """Each field a body declares is either honoured or refused, and docs/server.md names it."""
    from pathlib import Path

    from specdec.frontends.server.schemas import (ChatMessage, ChatRequest, CompletionRequest, DetokenizeRequest,
                                                  StreamOptions, TokenizeRequest)

    docs = (Path(__file__).resolve().parents[1] / "docs" / "server.md").read_text()
    missing = sorted({name for model in (CompletionRequest, ChatRequest, ChatMessage, TokenizeRequest, DetokenizeRequest,
                                         StreamOptions) for name in model.model_fields if f"`{name}`" not in docs})
    assert not missing, missing


def test_another_clients_request_does_not_show_in_cached_tokens(pair):
    """Without a key, client A (cache_salt "act") sends the same completion twice with a third
    client's request in between: A's cached_tokens are the same as without it (before, the caches
    were emptied whenever the caller changed, so A saw 0 and a slower answer, and learnt that
    someone had been served)."""
    body = {"prompt": "eleven tokens of text", "max_tokens": 2, "temperature": 0, "cache_salt": "act"}
    with serve_in_thread(create_app(pair, {"max_new_tokens": 2})) as base:
        seen = []
        for between in (None, {"prompt": "someone else's request", "max_tokens": 2},
                        {"prompt": "eleven tokens of text", "max_tokens": 2, "cache_salt": "third"}):
            post(base + COMP, body)
            if between is not None:
                assert post(base + COMP, between).status_code == 200
            again = post(base + COMP, body).json()
            seen.append((again["usage"]["prompt_tokens_details"]["cached_tokens"], again["choices"][0]["text"]))
    assert seen[0][0] > 0 and seen == seen[:1] * 3


def test_a_standard_clients_next_turn_reuses_its_prefix_on_the_default_server(pair):
    """A chat client sending no extra field (no key, no salt): turn 2 re-sends the conversation and
    reads only the new part; k=auto's state of turn 1 is the one turn 2 starts from."""
    pair.engine.caches.controllers.clear()
    turn1 = [{"role": "user", "content": "Write a line about the sea, then one about the hills."}]
    with serve_in_thread(create_app(pair, {"max_new_tokens": 8})) as base:
        first = post(base + CHAT, {"messages": turn1, "max_tokens": 8, "temperature": 0}).json()
        (policy,) = pair.engine.caches.controllers.values()
        turn2 = [*turn1, {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Now one about the sky."}]
        second = post(base + CHAT, {"messages": turn2, "max_tokens": 8, "temperature": 0}).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"] - 1, (cached, first["usage"])
    assert [key[0] for key in pair.engine.caches.controllers] == [Caller.named("all")]
    assert pair.engine.caches.controllers[next(iter(pair.engine.caches.controllers))] is policy  # kept, and learnt on
    assert len(getattr(policy, "model", policy).lengths) == 2  # both turns' answer lengths
