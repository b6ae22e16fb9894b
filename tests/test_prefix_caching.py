"""Prefix caching: a generation keeps the target's cached positions its prompt shares with the
request before and reads only the rest; the output is the same as from an empty cache (float32)."""

from __future__ import annotations

import pytest

from specdec.frontends.api import Pair
from specdec.models.backends.transformers.model import HFModel as CausalLM
from tinymodels import byte_tokenizer, perturbed_copy, tiny_model


@pytest.fixture()
def pair():
    target = tiny_model(5)
    return Pair(CausalLM(target), byte_tokenizer(), CausalLM(perturbed_copy(target, 0.05, 6)))


PROMPT = list(range(3, 40))


@pytest.mark.parametrize("kw", [dict(policy="ar"), dict(policy="lossless", drafter="model", k=3),
                                dict(policy="lossless", drafter="pld", k=4)], ids=["ar", "model", "pld"])
def test_a_longer_prompt_reads_only_what_the_cache_lacks(pair, kw):
    fresh = [pair.generate(p, max_new_tokens=10, temperature=0, **kw) for p in (PROMPT, PROMPT + [50, 51, 52])]
    assert [o.stats.cached_prompt_tokens for o in fresh] == [0, 0]  # off by default: every prompt read whole
    pair.prefix_caching = True  # the Pair's switch, as the server sets it
    pair.engine.target.reset()
    first = pair.generate(PROMPT, max_new_tokens=10, temperature=0, **kw)
    again = pair.generate(PROMPT + [50, 51, 52], max_new_tokens=10, temperature=0, **kw)
    assert first.stats.cached_prompt_tokens == 0 and again.stats.cached_prompt_tokens == len(PROMPT)
    assert [first.token_ids, again.token_ids] == [o.token_ids for o in fresh]
    other = pair.generate([7, 8, 9, *PROMPT], max_new_tokens=10, temperature=0, **kw)  # nothing shared at the start
    assert other.stats.cached_prompt_tokens == 0


def test_the_server_reports_cached_prompt_tokens(pair):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from specdec.frontends.server import create_app

    app = create_app(pair, {"max_new_tokens": 6, "temperature": 0.0}, shared_caches=True)  # one user's server
    assert pair.prefix_caching  # the server's default, as vLLM's and llama-server's
    with TestClient(app, base_url="http://127.0.0.1") as client:
        body = {"model": "x", "prompt": PROMPT, "max_tokens": 6}
        first = client.post("/v1/completions", json=body).json()
        second = client.post("/v1/completions", json={**body, "prompt": PROMPT + [60, 61]}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] in (0, len(PROMPT) - 1)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == len(PROMPT)
    off = create_app(pair, {"max_new_tokens": 6}, prefix_caching=False)
    assert not pair.prefix_caching and off is not None


def test_a_prefix_caching_switch_that_is_not_a_bool_is_refused(pair):
    from specdec.errors import SpecdecError

    with pytest.raises(SpecdecError, match="prefix_caching must be True or False"):
        pair.prefix_caching = "no"
    assert pair.prefix_caching is False


def test_the_caller_cache_budget_is_a_byte_count(pair):
    from specdec.errors import SpecdecError

    assert pair.caller_cache_bytes == 512 << 20
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(SpecdecError, match="caller_cache_bytes must be an integer >= 0"):
            pair.caller_cache_bytes = bad
    pair.caller_cache_bytes = 0  # nothing parked: another caller's generation empties the cache
    assert pair.caller_cache_bytes == 0
