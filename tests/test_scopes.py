"""The engine's caches, scoped by caller (specdec.core.scopes): the prefix cache, the suffix cache and
k=auto's state serve only the caller that left them, and serve that caller again; the server only
names the caller (its tests: test_server_hostile.py, test_prefix_caching.py)."""

from __future__ import annotations

from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.models.costmodel import CostTable
from specdec.core.engine import Engine
from specdec.core.request import DecodeConfig
from tinymodels import perturbed_copy, tiny_model

ALICE = list(range(3, 40))
BOB = list(range(60, 90))


def engine() -> Engine:
    target = tiny_model(5)
    widths = [1, 2, 4, 8, 16, 32]
    e = Engine(CausalLM(target), CausalLM(perturbed_copy(target, 0.05, 6)), eos_ids=[258],
               target_costs=CostTable("t", "float32", widths, [0.01] * 6, 32))  # a flat table: drafting pays
    e.caches.prefix_caching = True  # as the server has it
    return e


def request(caller: str | None, drafter: str = "suffix", k: int | str = "auto") -> DecodeConfig:
    return DecodeConfig.from_options(drafter=drafter, k=k, max_new_tokens=8, temperature=0).with_settings(caller=caller)


def test_two_callers_caches_are_apart_and_each_callers_are_kept():
    e = engine()
    cached = [e.generate(prompt, request(caller)).stats.cached_prompt_tokens for prompt, caller in (
        (ALICE, "alice"), (ALICE + [50, 51], "alice"),  # alice's next turn reads only what is new
        (ALICE + [50, 51], "bob"),  # another caller's: read whole, though the cache held it
        (BOB, "bob"), (BOB + [52], "bob"),
        (ALICE + [50, 51], "alice"),  # bob's text was in the models' caches: read whole
        (ALICE + [50, 51], None), (ALICE + [50, 51], None))]  # a caller of its own, twice
    assert cached == [0, len(ALICE), 0, 0, len(BOB), 0, 0, 0]
    # the suffix cache: each caller's text in its own trie; nothing kept for the caller None
    alice, bob = e.caches.suffix.requests("alice"), e.caches.suffix.requests("bob")
    assert len(alice) == 3 and all(text[:len(ALICE)] == ALICE for text in alice)
    assert len(bob) == 3 and bob[0][:len(ALICE)] == ALICE and all(text[:len(BOB)] == BOB for text in bob[1:])
    assert len(e.caches.suffix.requests()) == 6
    # k=auto: one K policy per caller, which learned from that caller's answers only
    kept = {key[0]: policy for key, policy in e.caches.controllers.items()}
    assert set(kept) == {"alice", "bob"} and kept["alice"] is not kept["bob"]
    assert len(kept["alice"].lengths) == 3 and len(kept["bob"].lengths) == 3
    assert e.k_policy(request("alice")) is kept["alice"] and e.k_policy(request("bob")) is kept["bob"]
    assert e.k_policy(request(None)) is not e.k_policy(request(None))  # never kept
    assert len(e.caches.controllers) == 2


def test_another_callers_generation_empties_both_models_caches():
    e = engine()
    e.generate(ALICE, request("alice", drafter="model", k=3))
    held = list(e.target.linear_tokens), list(e.draft.linear_tokens)
    assert all(held)
    e.caches.enter("alice", (e.target, e.draft))  # the same caller: kept
    assert (list(e.target.linear_tokens), list(e.draft.linear_tokens)) == held
    e.caches.enter("bob", (e.target, e.draft))  # another caller: emptied
    assert list(e.target.linear_tokens) == [] and list(e.draft.linear_tokens) == []
    e.generate(BOB, request(None, drafter="model", k=3))
    assert list(e.target.linear_tokens) and list(e.draft.linear_tokens)
    e.caches.enter(None, (e.target, e.draft))  # a caller of its own: never the same
    assert list(e.target.linear_tokens) == [] and list(e.draft.linear_tokens) == []
