"""A request's sampling defaults come from the model's generation_config (as transformers, vLLM
and OpenAI-compatible servers take them), under the call's own values; a server request without
max_tokens may run to the context's end, within the server's limit."""

from __future__ import annotations

import json

import pytest

from specdec.models import genconfig
from specdec.frontends.api import Pair
from specdec.cli import build_parser
from specdec.frontends.cliargs import decode_kwargs
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from tinymodels import byte_tokenizer, perturbed_copy, tiny_model

QWEN = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


@pytest.mark.parametrize("data, want", [
    ({"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}, QWEN),
    ({"temperature": 0.6}, {"temperature": 0.6}),                        # only what the file holds
    ({"do_sample": False, "temperature": 0.9, "top_p": 0.5}, {"temperature": 0.0}),  # greedy wins
    ({"do_sample": False, "repetition_penalty": 1.2}, {"temperature": 0.0, "repetition_penalty": 1.2}),
    ({"repetition_penalty": 1.0, "bos_token_id": 1}, {}),                # 1.0 is no penalty
    ({"eos_token_id": 2}, {}),
])
def test_what_a_generation_config_sets(data, want):
    assert genconfig.from_json(data) == want


def test_sources(tmp_path):
    assert genconfig.resolve("auto", "qwen2.5-coder-1.5b")[0] == QWEN
    assert genconfig.resolve("auto", "qwen2.5-coder-1.5b@bf16")[0] == QWEN  # a format copy is the same model
    assert genconfig.resolve("specdec", "qwen2.5-coder-1.5b") == ({}, "specdec's defaults (asked)")
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.3}))
    assert genconfig.resolve("auto", str(tmp_path))[0] == {"temperature": 0.3}
    assert genconfig.resolve(str(tmp_path / "generation_config.json"), "x.gguf")[0] == {"temperature": 0.3}
    assert genconfig.resolve("auto", str(tmp_path / "model.gguf"))[0] == {}  # a bare GGUF file ships none
    with pytest.raises(SpecdecError) as err:
        genconfig.resolve(str(tmp_path / "missing.json"), "x")
    assert "\n" not in str(err.value) and "does not exist" in str(err.value)


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(5)
    p = Pair(CausalLM(target), byte_tokenizer(), CausalLM(perturbed_copy(target, 0.05, 6)))
    p.sampling_defaults = dict(QWEN)
    return p


def test_a_call_without_sampling_settings_gets_the_models(pair):
    prompt = [1, 2, 3, 4]
    got = pair.generate(prompt, policy="ar", max_new_tokens=12, seed=3)
    same = pair.generate(prompt, policy="ar", max_new_tokens=12, seed=3, **QWEN)
    assert got.token_ids == same.token_ids
    greedy = pair.generate(prompt, policy="ar", max_new_tokens=12, temperature=0, repetition_penalty=1.0)
    assert pair.generate(prompt, policy="ar", max_new_tokens=12, temperature=0,
                         repetition_penalty=1.0).token_ids == greedy.token_ids  # the call's own values win


def test_cli_layers_flags_over_the_models_settings():
    p = build_parser()
    kw = decode_kwargs(p.parse_args(["generate", "x"]))
    assert {k: kw[k] for k in QWEN} == QWEN and kw["presence_penalty"] == 0.0
    kw = decode_kwargs(p.parse_args(["generate", "x", "--temperature", "0"]))
    assert kw["temperature"] == 0.0 and kw["top_k"] == 20
    kw = decode_kwargs(p.parse_args(["generate", "x", "--generation-config", "specdec"]))
    assert kw["temperature"] == 0.0 and kw["repetition_penalty"] == 1.0 and kw["top_k"] == 0
    kw = decode_kwargs(p.parse_args(["serve", "--temperature", "0.2"]))
    assert kw["temperature"] == 0.2 and kw["top_p"] == 0.8


def test_server_defaults_are_the_models_and_run_to_the_context_end(pair):
    from specdec.frontends.server.app import _checked_settings
    from specdec.frontends.server.params import Limits, build
    from specdec.frontends.server.schemas import CompletionRequest

    defaults, limits = _checked_settings(pair, None, None, Limits(max_tokens=300))
    req = build(CompletionRequest(prompt="hi"), defaults, limits)
    s = req.config.sampling
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty) == (0.7, 0.8, 20, 1.05)
    assert req.config.max_new_tokens == 300  # no max_tokens: to the context's end, within the limit
    req = build(CompletionRequest(prompt="hi", max_tokens=5, temperature=0), defaults, limits)
    assert req.config.max_new_tokens == 5 and req.config.sampling.temperature == 0.0
    defaults, limits = _checked_settings(pair, {"max_new_tokens": 16}, None, Limits(max_tokens=300))
    assert build(CompletionRequest(prompt="hi"), defaults, limits).config.max_new_tokens == 16  # the flag's


def test_an_answer_without_a_budget_stops_at_the_context_end(pair):
    """The engine ends the answer where the context is full (finish reason length)."""
    limit = pair.target.max_length
    assert limit is not None
    prompt = list(range(1, 11))
    out = pair.generate(prompt, policy="ar", max_new_tokens=limit * 2, temperature=0, repetition_penalty=1.0)
    assert len(prompt) + len(out.token_ids) <= limit


@pytest.mark.parametrize("content, words", [("{not json", "unreadable"), ("[1, 2]", "not a JSON object")])
def test_a_bad_generation_config_file_is_one_line(tmp_path, content, words):
    path = tmp_path / "generation_config.json"
    path.write_text(content)
    with pytest.raises(SpecdecError) as err:
        genconfig.resolve(str(path), "x")
    assert "\n" not in str(err.value) and words in str(err.value)
    with pytest.raises(SpecdecError):
        genconfig.resolve(str(tmp_path), "x")  # the folder holding it: the same check
