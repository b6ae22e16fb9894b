"""Every policy and composition runs through the engine at T=0 and T>0 on tiny models."""

import pytest
import torch

from specdec.frontends.api import Pair
from specdec.core.drafters import LookupModelDrafter, ModelDrafter
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.core.sampling import SamplingParams
from specdec.core.verify.policy import SCHEDULE_PARAMS
from tinymodels import byte_tokenizer, perturbed_copy, tiny_model

POLICIES = ["mars", "dropmatch", "typical", "fuzzy", "fly", "fly+mars", "fly+dropmatch", "fly+fuzzy", "mars+typical",
            "fly+dropmatch+mars+typical"]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(11)
    return Pair(CausalLM(target), byte_tokenizer(), CausalLM(perturbed_copy(target, 0.2, 12)))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("drafter", ["model", "pld", "model+pld"])
def test_policy_runs_and_reports(pair, policy, temperature, drafter):
    kw = dict(chat=False, policy=policy, drafter=drafter, k=8, max_new_tokens=40, temperature=temperature, seed=3)
    out = pair.generate("abc abc abc", **kw)
    s = out.stats
    assert s.new_tokens == len(out.token_ids)
    assert len(out.token_ids) == 40 or (out.finish_reason == "stop" and out.token_ids[-1] in pair.eos_ids)
    assert s.lossy and s.policy == policy
    rules = set(policy.split("+"))
    assert set(s.relaxed) == rules  # one counter per rule, even when zero
    # defaults recorded with the rule prefix, the schedule's (exact_prefix) without one
    assert all(k_.split("_")[0] in rules or k_ in SCHEDULE_PARAMS for k_ in s.params)
    assert s.rule_seconds <= s.verify_seconds
    again = pair.generate("abc abc abc", **kw)
    assert again.token_ids == out.token_ids  # seeded: reproducible, dropout masks included


def test_loose_rules_relax_something_on_a_weak_draft(pair):
    base = pair.generate("abc abc abc", chat=False, policy="lossless", k=8, max_new_tokens=60)
    for policy, params in [("mars", {"theta": 0.5}), ("typical", {}), ("dropmatch", {"p": 0.3, "criterion": "naive"}),
                           ("fly", {"theta": 0.0, "window": 2})]:
        out = pair.generate("abc abc abc", chat=False, policy=policy, k=8, max_new_tokens=60, **params)
        assert sum(out.stats.relaxed.values()) > 0, policy
        assert out.stats.mean_acceptance_length > base.stats.mean_acceptance_length, policy


def test_theta_one_mars_equals_lossless(pair):
    a = pair.generate("abc abc", chat=False, policy="lossless", k=5, max_new_tokens=40)
    b = pair.generate("abc abc", chat=False, policy="mars", theta=1.0, k=5, max_new_tokens=40)
    c = pair.generate("abc abc", chat=False, policy="dropmatch", p=0.0, k=5, max_new_tokens=40)
    assert a.token_ids == b.token_ids == c.token_ids
    assert b.stats.relaxed == {"mars": 0} and c.stats.relaxed == {"dropmatch": 0}


def test_lookup_accelerated_draft_equals_the_draft_model():
    """model+pld proposes exactly what the draft model would (greedy), for any context."""
    target = tiny_model(13, initializer_range=0.02)
    lm = CausalLM(perturbed_copy(target, 0.05, 14))
    plain, fast = ModelDrafter(lm), LookupModelDrafter(lm, lookup_tokens=4)
    params = SamplingParams()
    context = [40, 41, 42, 40, 41, 42, 40, 41]
    for step in range(12):
        plain.start(context)
        a = plain.propose(context, 7, params, None)
        fast.start(context)
        b = fast.propose(context, 7, params, None)
        assert a.tokens == b.tokens, step
        torch.testing.assert_close(a.logits, b.logits, rtol=1e-4, atol=1e-4)
        context = context + a.tokens[:3]
    assert fast.lookups > 0 and fast.lookup_hits > 0  # the lookup path really ran


def test_bad_drafter_options(pair):
    from specdec.errors import SpecdecError

    with pytest.raises(SpecdecError, match="takes min_confidence, draft_window, got"):
        pair.generate("hi", drafter="model", ngram_max=3)
    with pytest.raises(SpecdecError, match="lookup_tokens must be"):
        pair.generate("hi", drafter="model+pld", lookup_tokens=0)
    with pytest.raises(SpecdecError, match="takes ngram_max, ngram_min,"):
        pair.generate("hi", drafter="pld", lookup_tokens=3)


def test_min_confidence_shortens_drafts_and_stays_exact(pair):
    ar = pair.generate("abc abc abc", chat=False, policy="ar", max_new_tokens=40)
    plain = pair.generate("abc abc abc", chat=False, drafter="model", k=12, max_new_tokens=40)
    unsure = pair.generate("abc abc abc", chat=False, drafter="model", k=12, max_new_tokens=40, min_confidence=0.9)
    assert plain.token_ids == unsure.token_ids == ar.token_ids
    assert unsure.stats.drafted < plain.stats.drafted
    fast = pair.generate("abc abc abc", chat=False, k=12, max_new_tokens=40, min_confidence=0.9, drafter="model+pld")
    assert fast.token_ids == ar.token_ids and fast.stats.drafted == unsure.stats.drafted  # same drafts


@pytest.mark.parametrize("value", [-0.1, 1.0, "x", True])
def test_bad_min_confidence(pair, value):
    from specdec.errors import SpecdecError

    with pytest.raises(SpecdecError, match="min_confidence must be"):
        pair.generate("hi", min_confidence=value)
