"""``specdec serve`` over real HTTP on loopback, with tiny models: the openai client, streaming,
the ``speculative`` extension, usage stats, metrics, one-at-a-time queueing and disconnects."""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from serving import tiny_server  # noqa: E402
from specdec.frontends.server import Limits, create_app, serve_in_thread  # noqa: E402
from specdec.frontends.server.worker import pair_lock  # noqa: E402

LONG_PROMPT = "def f(x):"  # the tiny target's greedy continuation runs to the token limit (checked)


@pytest.fixture(scope="module")
def server(tiny_dirs):
    with tiny_server(*tiny_dirs) as running:
        yield running


def local(pair, prompt, **kw):
    """The in-process path (what ``specdec generate`` runs), while the server is idle."""
    with pair_lock(pair):
        return pair.generate(prompt, **kw)


def canonical(key: str) -> str:
    """``name{b="2",a="1"}`` -> ``name{a="1",b="2"}``: series compare whatever the label order."""
    if "{" not in key:
        return key
    name, labels = key.split("{", 1)
    pairs = sorted(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels[:-1]))
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


class Series(dict):
    """Scraped samples, looked up by series whatever the label order."""

    def __getitem__(self, key):
        return super().__getitem__(canonical(key))

    def get(self, key, default=None):
        return super().get(canonical(key), default)

    def __contains__(self, key):
        return super().__contains__(canonical(key))


def scrape(url: str) -> dict[str, float]:
    out = Series()
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            dict.__setitem__(out, canonical(key), float(value))
    return out


def spec_usage(resp) -> dict:
    return resp.model_dump()["usage"]["speculative"]


# ------------------------------------------------------------------------ the openai client
def test_completion_matches_in_process(server):
    r = server.client.completions.create(model="tiny", prompt="Hello there", max_tokens=24, temperature=0)
    ref = local(server.pair, "Hello there", chat=False, max_new_tokens=24, temperature=0.0, k=4)
    assert r.object == "text_completion" and r.model == "tiny"
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == ref.prompt_tokens
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == ref.prompt_tokens + len(ref.token_ids)


def test_chat_matches_in_process(server):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    r = server.client.chat.completions.create(model="whatever", messages=messages, max_tokens=20, temperature=0)
    ref = local(server.pair, messages, max_new_tokens=20, temperature=0.0, k=4)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.usage.prompt_tokens == ref.prompt_tokens  # the chat template was applied
    assert r.usage.completion_tokens == len(ref.token_ids)


def test_content_parts_and_developer_role(server):
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    parts = [{"role": "developer", "content": "Be brief."},
             {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}]
    a = server.client.chat.completions.create(model="tiny", messages=plain, max_tokens=10, temperature=0)
    b = server.client.chat.completions.create(model="tiny", messages=parts, max_tokens=10, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_prompt_as_one_element_list(server):
    a = server.client.completions.create(model="tiny", prompt=["abc"], max_tokens=8, temperature=0)
    b = server.client.completions.create(model="tiny", prompt="abc", max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text


def test_token_id_prompts(server):
    ids = server.pair.encode("abc", chat=False)
    text = server.client.completions.create(model="tiny", prompt="abc", max_tokens=8, temperature=0)
    for prompt in (ids, [ids]):  # lm-eval local-completions sends token ids by default
        r = server.client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0)
        assert r.choices[0].text == text.choices[0].text and r.usage.prompt_tokens == len(ids)


def test_streaming_completion(server):
    chunks = list(server.client.completions.create(
        model="tiny", prompt="Hello there", max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    whole = server.client.completions.create(model="tiny", prompt="Hello there", max_tokens=24, temperature=0)
    text_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in text_chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in text_chunks][-1] == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in text_chunks[:-1])
    assert len(text_chunks) > 2  # it really streamed
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert spec_usage(last)["policy"] == "lossless"


def test_streaming_chat(server):
    messages = [{"role": "user", "content": "Tell me a story."}]
    chunks = list(server.client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=30, temperature=0, stream=True))
    whole = server.client.chat.completions.create(model="tiny", messages=messages, max_tokens=30, temperature=0)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert all(c.usage is None for c in chunks)  # no include_usage: no usage chunk


def test_sse_wire_format(server):
    with httpx.stream("POST", server.url + "/v1/completions",
                      json={"prompt": "abc", "max_tokens": 6, "stream": True}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        body = r.read().decode()
    events = [e for e in body.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"


# ------------------------------------------------------------------ the speculative extension
def test_usage_carries_stats(server):
    r = server.client.completions.create(model="tiny", prompt="Hello there", max_tokens=24, temperature=0)
    s = spec_usage(r)
    assert s["policy"] == "lossless" and s["drafter"] == "auto" and s["k"] == 4  # the server's defaults
    assert s["rounds"] >= 1 and s["drafted"] >= s["accepted"] >= 0
    assert s["tau"] == pytest.approx(1 + s["accepted"] / s["rounds"])
    assert sum(s["accepted_at"]) == s["accepted"] and len(s["per_position_acceptance"]) == len(s["drafted_at"])
    assert s["lossy"] is False and s["relaxed"] == {}
    assert s["tokens_per_second"] > 0


def test_speculative_null_is_plain_decoding(server):
    kw = dict(model="tiny", prompt="Hello there", max_tokens=24, temperature=0)
    plain = server.client.completions.create(**kw, extra_body={"speculative": None})
    spec = server.client.completions.create(**kw)
    s = spec_usage(plain)
    assert s["policy"] == "ar" and s["tau"] == 1.0 and s["drafted"] == 0
    assert s["rounds"] == plain.usage.completion_tokens
    assert plain.choices[0].text == spec.choices[0].text  # lossless at T=0 in float32


def test_speculative_object_overrides_defaults(server):
    r = server.client.completions.create(model="tiny", prompt="abcabcabc", max_tokens=12, temperature=0,
                                         extra_body={"speculative": {"drafter": "pld", "k": 3}})
    s = spec_usage(r)
    assert (s["policy"], s["drafter"], s["k"]) == ("lossless", "pld", 3)


def test_speculative_object_merges_over_defaults():
    from specdec.frontends.server.params import Limits, build
    from specdec.frontends.server.schemas import CompletionRequest

    d = {"policy": "mars", "drafter": "pld", "k": 5, "mars_theta": 0.8, "ngram_max": 4, "max_new_tokens": 9, "seed": 1}

    def config(**body):
        c = build(CompletionRequest(prompt="x", **body), d, Limits()).config
        return c.policy, c.drafter, c.k, dict(c.policy_params), dict(c.drafter_params), c.max_new_tokens, c.sampling.seed

    spec = ("mars", "pld", 5, {"mars_theta": 0.8}, {"ngram_max": 4}, 9, 1)
    assert config() == spec  # absent: the server's defaults
    assert config(speculative=None) == ("ar", "auto", "auto", {}, {}, 9, 1)  # null: plain decoding
    assert config(speculative={}) == spec
    assert config(speculative={"k": 3}) == ("mars", "pld", 3, {"mars_theta": 0.8}, {"ngram_max": 4}, 9, 1)
    # another policy drops the default policy's parameters; another drafter, the drafter's options
    assert config(speculative={"policy": "lossless"}) == ("lossless", "pld", 5, {}, {"ngram_max": 4}, 9, 1)
    assert config(speculative={"drafter": "model"}) == ("mars", "model", 5, {"mars_theta": 0.8}, {}, 9, 1)
    assert config(max_tokens=4, seed=2, speculative={"k": 3})[5:] == (4, 2)  # the request's fields over the defaults


def test_loose_policy_reports_relaxed_counts(server):
    from specdec.core.verify import POLICIES

    if "mars" not in POLICIES:
        pytest.skip("no mars policy in this build")
    r = server.client.completions.create(model="tiny", prompt="Hello there", max_tokens=24, temperature=0,
                                         extra_body={"speculative": {"policy": "mars", "theta": 0.5}})
    s = spec_usage(r)
    assert s["policy"] == "mars" and s["lossy"] is True
    assert isinstance(s["relaxed"], dict) and all(v >= 0 for v in s["relaxed"].values())


def test_stop_strings_and_seeded_sampling(server):
    base = local(server.pair, "Hello there", chat=False, max_new_tokens=24, temperature=0.0, k=4).text
    stop = base[6:8]
    r = server.client.completions.create(model="tiny", prompt="Hello there", max_tokens=24, temperature=0,
                                         stop=[stop, "never-there"])
    assert r.choices[0].text == base[: base.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    kw = dict(model="tiny", prompt="Hello there", max_tokens=16, temperature=0.8, top_p=0.9, seed=7)
    assert server.client.completions.create(**kw).choices[0].text == server.client.completions.create(**kw).choices[0].text


def test_models_and_health(server):
    models = server.client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert server.client.models.retrieve("tiny").id == "tiny"
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


# ------------------------------------------------------------------------------- metrics
def test_metrics_counters_move(server):
    before = scrape(server.url)
    r = server.client.completions.create(model="tiny", prompt="Hello there", max_tokens=24, temperature=0)
    httpx.post(server.url + "/v1/completions", json={"prompt": "x", "temperature": -1})
    after = scrape(server.url)
    s, m = spec_usage(r), '{model_name="tiny"}'

    def delta(key):
        return after.get(key, 0) - before.get(key, 0)

    assert delta(f"vllm:generation_tokens_total{m}") == r.usage.completion_tokens
    assert delta(f"vllm:prompt_tokens_total{m}") == r.usage.prompt_tokens
    assert delta(f"vllm:spec_decode_num_draft_tokens_total{m}") == s["drafted"]
    assert delta(f"vllm:spec_decode_num_accepted_tokens_total{m}") == s["accepted"]
    assert delta(f"vllm:spec_decode_num_drafts_total{m}") == s["drafted_at"][0]
    for pos, accepted in enumerate(s["accepted_at"]):
        assert delta(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="tiny",position="{pos}"}}') == accepted
    assert delta('specdec_requests_total{endpoint="/v1/completions",status="200"}') == 1
    assert delta('specdec_requests_total{endpoint="/v1/completions",status="400"}') == 1
    assert delta('specdec_errors_total{status="400"}') == 1
    assert delta('specdec_generated_tokens_total{policy="lossless"}') == r.usage.completion_tokens
    assert delta("specdec_request_duration_seconds_count") == 1
    assert after["specdec_queue_depth"] == 0 and after[f"vllm:num_requests_running{m}"] == 0


# ------------------------------------------------------------------ one engine, many clients
def test_sixteen_concurrent_clients_match_sequential(server):
    def ask(i):
        if i % 2:
            r = server.client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"client {i}"}], max_tokens=20, temperature=0)
            return r.choices[0].message.content
        r = server.client.completions.create(model="tiny", prompt=f"client {i} says", max_tokens=20, temperature=0)
        return r.choices[0].text

    alone = [ask(i) for i in range(16)]
    results, errors = [None] * 16, []
    barrier = threading.Barrier(16)

    def run(i):
        try:
            barrier.wait()
            results[i] = ask(i)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert results == alone
    assert len(set(alone)) > 1  # different prompts gave different outputs


def _long_request(server, out: dict):
    """A long generation; a caller of its own each time (a fresh ``cache_salt``), so that an earlier
    identical request's text (the keyless server shares it) cannot make it short."""
    t0 = time.perf_counter()
    r = httpx.post(server.url + "/v1/completions", timeout=60,
                   json={"prompt": LONG_PROMPT, "max_tokens": 480, "temperature": 0,
                         "cache_salt": f"long-{time.perf_counter_ns()}"})
    out.update(status=r.status_code, seconds=time.perf_counter() - t0, body=r.json())


def _wait_running(server, timeout=10.0):
    deadline = time.monotonic() + timeout
    while scrape(server.url)['vllm:num_requests_running{model_name="tiny"}'] < 1:
        assert time.monotonic() < deadline, "the long request never started"
        time.sleep(0.005)


def test_health_and_metrics_answer_while_generating(server):
    done: dict = {}
    t = threading.Thread(target=_long_request, args=(server, done))
    t.start()
    _wait_running(server)
    t0 = time.perf_counter()
    assert httpx.get(server.url + "/health").status_code == 200
    metrics = scrape(server.url)
    elapsed = time.perf_counter() - t0
    t.join(60)
    assert metrics["specdec_queue_depth"] == 1
    assert done["status"] == 200 and done["body"]["choices"][0]["finish_reason"] == "length"
    assert elapsed < done["seconds"] / 3  # not stuck behind the generation


def test_disconnect_mid_stream_frees_the_engine(server):
    """Counted in target passes, not seconds (a timing bound failed once under a busy machine): the
    cancelled generation and the short request after it take fewer than half the passes a whole
    generation takes."""
    full: dict = {}
    calls = server.pair.target.forward_calls
    _long_request(server, full)
    whole = server.pair.target.forward_calls - calls
    assert full["body"]["usage"]["completion_tokens"] == 480 and whole > 40
    before = scrape(server.url)
    calls = server.pair.target.forward_calls
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server.url + "/v1/completions",
                      json={"prompt": LONG_PROMPT, "max_tokens": 480, "temperature": 0, "stream": True}) as r:
            lines = 0
            for line in r.iter_lines():
                lines += bool(line)
                if lines == 3:
                    break
    # the client is gone; the next request needs the engine
    r = server.client.completions.create(model="tiny", prompt="abc", max_tokens=4, temperature=0)
    assert r.choices[0].text is not None
    used = server.pair.target.forward_calls - calls
    assert used < whole / 2, f"{used} target passes after the disconnect; a whole generation takes {whole}"
    after = scrape(server.url)
    assert after["specdec_requests_cancelled_total"] - before["specdec_requests_cancelled_total"] == 1
    success = 'vllm:request_success_total{model_name="tiny",finished_reason="length"}'
    assert after[success] - before[success] == 1  # only the short request finished


def test_client_gone_while_queued_never_runs(server):
    before = scrape(server.url)
    busy: dict = {}
    t = threading.Thread(target=_long_request, args=(server, busy))
    t.start()
    _wait_running(server)
    with pytest.raises(httpx.ReadTimeout):  # queued behind the long request; gives up
        httpx.post(server.url + "/v1/completions", json={"prompt": "abc", "max_tokens": 8}, timeout=0.3)
    t.join(60)
    time.sleep(0.1)
    after = scrape(server.url)
    assert busy["status"] == 200
    assert after["specdec_requests_cancelled_total"] - before["specdec_requests_cancelled_total"] == 1
    generated = after['vllm:generation_tokens_total{model_name="tiny"}'] - before['vllm:generation_tokens_total{model_name="tiny"}']
    assert generated == busy["body"]["usage"]["completion_tokens"]  # the abandoned request never ran


# ------------------------------------------------------------------ vLLM and llama.cpp conventions
def test_tokenize_and_detokenize_in_vllm_shapes(server):
    r = httpx.post(server.url + "/tokenize", timeout=60, json={"prompt": "hello"})
    assert r.status_code == 200
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"]
    back = httpx.post(server.url + "/detokenize", timeout=60, json={"tokens": body["tokens"]}).json()
    assert back["prompt"] == "hello"
    chat = httpx.post(server.url + "/tokenize", timeout=60, json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > body["count"] - 5
    assert httpx.post(server.url + "/tokenize", timeout=60, json={}).status_code == 400
    assert httpx.post(server.url + "/detokenize", timeout=60, json={"tokens": [10 ** 9]}).status_code == 400


@pytest.mark.parametrize("field, value", [
    ("ignore_eos", True), ("min_tokens", 3), ("min_p", 0.1), ("use_beam_search", True),
    ("guided_whitespace_pattern", " "),
])
def test_output_changing_vllm_fields_are_refused(server, field, value):
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={"prompt": "hi", "max_tokens": 2, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_neutral_vllm_fields_pass(server):
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={"prompt": "hi", "max_tokens": 2, "ignore_eos": False,
                                                          "repetition_penalty": 1.0, "min_p": 0.0, "skip_special_tokens": True})
    assert r.status_code == 200


def test_penalties_and_stop_token_ids(server):
    """OpenAI's presence/frequency penalties, vLLM's repetition_penalty and stop_token_ids are taken;
    out-of-range values are 400s naming the field."""
    url, base = server.url + "/v1/completions", {"prompt": "abc abc abc", "max_tokens": 12, "temperature": 0}
    plain = httpx.post(url, timeout=60, json=base).json()
    for field, value in (("presence_penalty", 1.5), ("frequency_penalty", 1.5), ("repetition_penalty", 3.0)):
        r = httpx.post(url, timeout=60, json={**base, field: value})
        assert r.status_code == 200, (field, r.text)
    for field, value in (("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0),
                         ("stop_token_ids", [-1])):
        r = httpx.post(url, timeout=60, json={**base, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    r = httpx.post(url, timeout=60, json={**base, "stop_token_ids": [], "repetition_penalty": 1.0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == plain["choices"][0]["text"]


def test_draft_length_aliases(server):
    for body in ({"speculative": {"n_max": 3}}, {"num_speculative_tokens": 3}, {"speculative": {"num_speculative_tokens": 3}}):
        r = httpx.post(server.url + "/v1/completions", timeout=60, json={"prompt": "hi", "max_tokens": 4, **body})
        assert r.status_code == 200 and r.json()["usage"]["speculative"]["k"] == 3, body
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={"prompt": "hi", "max_tokens": 4, "speculative": {"p_min": 0.5}})
    assert r.status_code == 200 and r.json()["usage"]["speculative"]["params"]["min_confidence"] == 0.5
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={"prompt": "hi", "speculative": {"n_max": 3, "k": 4}})
    assert r.status_code == 400 and "same setting" in r.json()["error"]["message"]


def test_a_queued_stream_gets_headers_and_keepalives_at_once(server):
    app = create_app(server.pair, {"k": 4, "max_new_tokens": 16},
                     limits=Limits(max_tokens=500, stream_wait_seconds=0.05, keepalive_seconds=0.05), model_name="tiny")
    with serve_in_thread(app) as url:
        busy = SimpleNamespace(url=url)
        done: dict = {}
        t = threading.Thread(target=_long_request, args=(busy, done))
        t.start()
        _wait_running(busy)
        t0 = time.perf_counter()
        lines = []
        with httpx.stream("POST", url + "/v1/completions", timeout=60,
                          json={"prompt": "hi", "max_tokens": 4, "stream": True}) as r:
            headers_after = time.perf_counter() - t0
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
        t.join(60)
    assert headers_after < done["seconds"] / 2  # not stuck behind the running request
    assert lines[0] == ": keep-alive" and lines[-1] == "data: [DONE]"
    assert any(line.startswith("data: {") for line in lines)


def test_metrics_have_latency_histograms(server):
    text = httpx.get(server.url + "/metrics").text
    httpx.post(server.url + "/v1/completions", timeout=60, json={"prompt": "hi", "max_tokens": 6})
    after = scrape(server.url)
    assert after['vllm:time_to_first_token_seconds_count{model_name="tiny"}'] >= 1
    assert after['vllm:inter_token_latency_seconds_count{model_name="tiny"}'] >= 1
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    assert "_created" not in text


def test_latencies_from_round_times():
    from specdec.frontends.server.metrics import latencies

    ttft, itl = latencies([0.5, 0.9, 1.5], [2, 1, 0], queued_s=0.25)
    assert ttft == pytest.approx(0.75) and itl == pytest.approx([0.2, 0.2, 0.6])
    assert latencies([], [], 1.0) == (None, [])


@pytest.mark.parametrize("body, param", [
    ({"speculative": None, "num_speculative_tokens": 3}, "num_speculative_tokens"),
    ({"num_speculative_tokens": "3"}, "num_speculative_tokens"),
    ({"speculative": {"k": "fast"}}, "speculative.k"),
    ({"speculative": {"p_min": 1.5}}, "speculative.min_confidence"),  # the option p_min names
])
def test_bad_speculative_values_and_aliases(server, body, param):
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={"prompt": "hi", "max_tokens": 2, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.json()


def test_tokenizer_info_serves_what_lm_evals_remote_tokenizer_reads(server):
    """lm-evaluation-harness (tokenizer_backend=remote) probes GET /tokenizer_info, then encodes
    its eos_token through /tokenize: both must work, and the eos id must be the tokenizer's."""
    info = httpx.get(server.url + "/tokenizer_info", timeout=60).json()
    assert set(info) >= {"tokenizer_class", "eos_token", "bos_token", "pad_token", "chat_template"}
    assert info["vocab_size"] > 0 and info["model_max_length"] > 0
    eos = httpx.post(server.url + "/tokenize", timeout=60, json={"prompt": info["eos_token"],
                                                                  "add_special_tokens": False}).json()["tokens"]
    assert len(eos) == 1


def test_tokenize_refuses_both_prompt_and_messages_and_bad_types(server):
    both = {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(server.url + "/tokenize", timeout=60, json=both)
    assert r.status_code == 400 and "either prompt or messages" in r.json()["error"]["message"]
    assert httpx.post(server.url + "/detokenize", timeout=60, json={"tokens": "1 2"}).status_code == 400
    assert httpx.post(server.url + "/tokenize", timeout=60, json={"prompt": 5}).status_code == 400


def test_completion_logprobs_and_echo_are_the_target_s(server):
    """lm-eval's loglikelihood request (token ids, max_tokens 1, logprobs 1, echo): every prompt
    token's log-probability given the ones before it (the first None), then the generated one's."""
    pair = server.pair
    ids = pair.encode("The quick brown fox", chat=False)
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    with pair_lock(pair):
        ref = pair.prompt_logprobs(ids, top=1)
        out = pair.generate(ids, policy="ar", max_new_tokens=1, logprobs=1)
    assert lp["token_logprobs"][1:-1] == pytest.approx([x.logprob for x in ref[1:]], abs=1e-4)
    assert lp["token_logprobs"][-1] == pytest.approx(out.logprobs[0].logprob, abs=1e-4)
    # greedy: the generated token is its own most likely (what lm-eval's is_greedy reads)
    assert lp["token_logprobs"][-1] == pytest.approx(max(lp["top_logprobs"][-1].values()), abs=1e-6)
    assert r.json()["choices"][0]["text"].startswith(pair.tokenizer.decode(ids))
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    # without echo: the completion's tokens only
    plain = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": "abc abc", "max_tokens": 6, "logprobs": 2, "temperature": 0}).json()["choices"][0]["logprobs"]
    # (keyed by token text, as OpenAI's: two byte tokens that both print as U+FFFD share a key)
    assert len(plain["tokens"]) == 6 and all(1 <= len(t) <= 2 for t in plain["top_logprobs"])


def test_chat_logprobs_shape(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "logprobs": True, "top_logprobs": 3,
        "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"]
    assert all(len(c["top_logprobs"]) == 3 and c["logprob"] <= 0 and isinstance(c["bytes"], list) for c in content)
    assert content[0]["logprob"] == pytest.approx(content[0]["top_logprobs"][0]["logprob"])  # greedy


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1, "stream": True}, "stream"),
    ("/v1/completions", {"prompt": "x", "echo": True, "stream": True}, "stream"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 30},
     "top_logprobs"),
])
def test_bad_logprobs_requests_are_400s(server, path, body, param):
    r = httpx.post(server.url + path, timeout=60, json={"max_tokens": 2, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_n_choices_are_reproducible_with_a_seed(server):
    """n=3 with a seed: choice i is the generation with seed + i, so the same request gives the same
    choices, and each equals a one-choice request with its seed."""
    url = server.url + "/v1/completions"
    body = {"prompt": "abc abc", "max_tokens": 8, "temperature": 1.0, "seed": 7, "n": 3}
    first, again = (httpx.post(url, timeout=60, json=body).json() for _ in range(2))
    texts = [c["text"] for c in first["choices"]]
    assert [c["index"] for c in first["choices"]] == [0, 1, 2] and texts == [c["text"] for c in again["choices"]]
    for i, text in enumerate(texts):
        one = httpx.post(url, timeout=60, json={**body, "n": 1, "seed": 7 + i}).json()
        assert one["choices"][0]["text"] == text, i
    assert len(set(texts)) > 1  # sampled at T=1: they differ
    assert first["usage"]["completion_tokens"] == 3 * 8
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "n": 2, "temperature": 0}).json()
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    assert chat["choices"][0]["message"] == chat["choices"][1]["message"]  # greedy: the same answer twice
