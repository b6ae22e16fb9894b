"""After every round, whatever was accepted, each cache equals a fresh prefill of what it holds."""

import random

import pytest
import torch

from specdec.core.drafters import Draft
from specdec.core.engine import DecodeConfig, Engine
from specdec.models.backends.transformers.model import HFModel as CausalLM
from tinymodels import perturbed_copy, tiny_model


class ScriptedDrafter:
    """Proposes the true greedy continuation with one token corrupted at a random position (or
    none), so every accept length 0..K occurs."""

    name = "scripted"
    observes_target = False  # what the engine reads of a drafter besides its methods (the Drafter contract)

    def __init__(self, truth, prompt_len, seed=0):
        self.truth, self.prompt_len, self.rng = truth, prompt_len, random.Random(seed)
        self.patterns = set()

    def start(self, prompt):
        pass

    def backlog(self, context):
        return 0

    def offers(self, context, room):  # a drafter of one source offers no free drafts
        return []

    def draft(self, context, plan, params, generator):  # the round's plan: its K (one source)
        return self.propose(context, plan.k, params, generator)

    def propose(self, context, k, params, generator):
        pos = len(context) - self.prompt_len
        tokens = list(self.truth[pos : pos + k])
        bad = self.rng.randint(0, len(tokens))  # == len(tokens): no corruption
        if bad < len(tokens):
            tokens[bad] = (tokens[bad] + 1) % 259
        return Draft(tokens)

    def commit(self, context, drafted, accepted):
        self.patterns.add((drafted, accepted))


def fresh_cache(model, tokens):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([tokens]), past_key_values=cache, use_cache=True)
    return cache


def assert_cache_matches(lm: CausalLM):
    """The cache holds what a fresh prefill of ``lm.tokens`` holds (a static cache: in its first
    ``len(lm.tokens)`` slots; what lies past them is stale)."""
    n = len(lm.tokens)
    if lm.cache is not None:  # (a static cache is allocated by its first pass)
        assert lm.cache.get_seq_length() == n
    if not n:
        return
    ref = fresh_cache(lm.model, lm.tokens)
    for mine, theirs in zip(lm.cache.layers, ref.layers):
        torch.testing.assert_close(mine.keys[:, :, :n], theirs.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(mine.values[:, :, :n], theirs.values, rtol=1e-4, atol=1e-5)


def static_with_graphs(model):
    """The static KV cache with its passes replayed as graphs would be (eagerly: no GPU here)."""
    from specdec.models.backends.transformers.graphs import WidthGraphs, replay_eagerly
    from specdec.models.backends.transformers.static import StaticHFModel

    return StaticHFModel(model, graphs=lambda step, device: WidthGraphs(step, device, capture=replay_eagerly))


#: the ways the transformers backend runs a model: transformers' dynamic cache, the static cache with graphs
CACHES = {"dynamic": CausalLM, "static": static_with_graphs}


@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("k", [1, 3, 6])
def test_caches_equal_fresh_prefill_after_any_accept_pattern(k, cache):
    target = CACHES[cache](tiny_model(5))
    engine = Engine(target)
    prompt = list(range(40, 52))
    truth = Engine(CausalLM(tiny_model(5))).generate(prompt, DecodeConfig(policy="ar", max_new_tokens=80)).token_ids
    scripted = ScriptedDrafter(truth, len(prompt), seed=k)
    engine.make_drafter = lambda cfg: scripted
    for gen in engine.run(prompt, DecodeConfig(policy="lossless", drafter="pld", k=k, max_new_tokens=80)):
        committed = prompt + gen.token_ids
        assert target.tokens == committed[:-1]
        assert_cache_matches(target)
    assert committed[len(prompt):] == truth
    assert {a for _, a in scripted.patterns} == set(range(k + 1))  # every accept length happened


def test_draft_model_cache_after_rounds():
    t = tiny_model(6)
    draft = CausalLM(perturbed_copy(t, 0.1, 7))
    engine = Engine(CausalLM(t), draft)
    prompt = list(range(60, 70))
    for gen in engine.run(prompt, DecodeConfig(policy="lossless", drafter="model", k=4, max_new_tokens=50)):
        committed = prompt + gen.token_ids
        assert committed[: len(draft.tokens)] == draft.tokens  # the draft cache holds a committed prefix
        assert_cache_matches(draft)
        assert_cache_matches(engine.target)
