"""The engine's caches, kept per caller side by side (specdec.core.scopes): the prefix cache, the
suffix cache and k=auto's state serve only the caller that left them, and serve that caller again
whoever ran in between; each store's bound is shared fairly (specdec.core.fair, its own tests in
test_fair.py). The server only names the caller (its tests: test_server_hostile.py,
test_prefix_caching.py)."""

from __future__ import annotations

from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.models.costmodel import CostTable
from specdec.core.caller import Caller
from specdec.core.drafters.suffix import SuffixCache
from specdec.core.engine import Engine
from specdec.core.request import DecodeConfig
from specdec.core.scopes import MAX_CONTROLLERS, Parked, WarmStates
from specdec.models.backends.base import Snapshot
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


def names(callers: list[Caller]) -> list[str]:
    return [c.name for c in callers]


def request(caller: str | None, drafter: str = "suffix", k: int | str = "auto") -> DecodeConfig:
    return DecodeConfig.from_options(drafter=drafter, k=k, max_new_tokens=8, temperature=0).with_settings(caller=caller)


def test_two_callers_caches_are_apart_and_each_callers_are_kept():
    e = engine()
    cached = [e.generate(prompt, request(caller)).stats.cached_prompt_tokens for prompt, caller in (
        (ALICE, "alice"), (ALICE + [50, 51], "alice"),  # alice's next turn reads only what is new
        (ALICE + [50, 51], "bob"),  # another caller's: read whole, though the cache held it
        (BOB, "bob"), (BOB + [52], "bob"),
        (ALICE + [50, 51], "alice"),  # bob's text was in the models' caches: alice's own copy is put back
        (ALICE + [50, 51], None), (ALICE + [50, 51], None))]  # a caller of its own, twice
    assert cached == [0, len(ALICE), 0, 0, len(BOB), len(ALICE) + 1, 0, 0]
    # the suffix cache: each caller's text in its own trie; nothing kept for an isolated caller (None)
    alice, bob = e.caches.suffix.requests(Caller.named("alice")), e.caches.suffix.requests(Caller.named("bob"))
    assert len(alice) == 3 and all(text[:len(ALICE)] == ALICE for text in alice)
    assert len(bob) == 3 and bob[0][:len(ALICE)] == ALICE and all(text[:len(BOB)] == BOB for text in bob[1:])
    assert len(e.caches.suffix.requests()) == 6
    # k=auto: one K policy per caller, which learned from that caller's answers only
    kept = {key[0].name: policy for key, policy in e.caches.controllers.items()}
    assert set(kept) == {"alice", "bob"} and kept["alice"] is not kept["bob"]
    assert len(kept["alice"].lengths) == 3 and len(kept["bob"].lengths) == 3
    assert e.k_policy(request("alice")) is kept["alice"] and e.k_policy(request("bob")) is kept["bob"]
    assert e.k_policy(request(None)) is not e.k_policy(request(None))  # never kept
    assert len(e.caches.controllers) == 2


def test_another_callers_generation_empties_both_models_caches_and_puts_back_the_callers_own():
    e = engine()
    e.generate(ALICE, request("alice", drafter="model", k=3))
    held = list(e.target.linear_tokens), list(e.draft.linear_tokens)
    assert all(held)
    e.caches.enter(Caller.named("alice"), (e.target, e.draft))  # the same caller: kept
    assert (list(e.target.linear_tokens), list(e.draft.linear_tokens)) == held
    e.caches.enter(Caller.named("bob"), (e.target, e.draft))  # another caller, with nothing parked: emptied
    assert list(e.target.linear_tokens) == [] and list(e.draft.linear_tokens) == []
    e.generate(BOB, request(None, drafter="model", k=3))
    assert list(e.target.linear_tokens) and list(e.draft.linear_tokens)
    e.caches.enter(Caller.ISOLATED, (e.target, e.draft))  # a caller of its own: never the same
    assert list(e.target.linear_tokens) == [] and list(e.draft.linear_tokens) == []
    e.caches.enter(Caller.named("alice"), (e.target, e.draft))  # alice's parked copy of the target's cache
    assert list(e.target.linear_tokens) == held[0] and list(e.draft.linear_tokens) == []
    assert names(e.caches.parked.callers()) == ["alice"]  # bob's request ran isolated: nothing parked


def fresh(prompt, **kw) -> list[int]:
    e = engine()
    e.caches.prefix_caching = False
    return e.generate(prompt, request("alice", **kw)).token_ids


def test_another_callers_request_in_between_changes_nothing_a_caller_sees():
    """Caller A's identical request: the same cached_tokens, the same K policy and the same output
    whether or not caller B was served in between (before, B emptied the caches: A's prefix was
    read whole, which told A that someone had been served)."""
    seen = []
    for between in ([], [(BOB, "bob")], [(BOB, "bob"), (ALICE, None)]):
        e = engine()
        first = e.generate(ALICE + [50], request("alice"))
        for prompt, caller in between:
            e.generate(prompt, request(caller))
        again = e.generate(ALICE + [50, 51], request("alice"))
        policy = e.k_policy(request("alice"))
        seen.append((again.stats.cached_prompt_tokens, again.token_ids, len(policy.lengths)))
        assert first.token_ids == fresh(ALICE + [50])
    assert seen[0][0] == len(ALICE) + 1 and seen[0][2] == 2  # the second request started from the first's
    assert seen[1:] == seen[:1] * 2
    assert seen[0][1] == fresh(ALICE + [50, 51])  # a copy put back gives a fresh cache's output


def test_two_callers_alternating_each_keep_their_prefix():
    e = engine()
    cached = []
    for turn in range(3):
        for name, base in (("alice", ALICE), ("bob", BOB)):
            cached.append(e.generate(base + [50] * turn + [51], request(name)).stats.cached_prompt_tokens)
    assert cached[:2] == [0, 0] and all(c >= len(BOB) for c in cached[2:]), cached
    assert sorted(names(e.caches.parked.callers())) == ["alice", "bob"]


def broken_load(state):
    raise RuntimeError("llama.cpp could not restore a copy of its cache")


def test_a_backend_that_cannot_copy_its_cache_or_no_budget_empties_it_at_a_switch():
    for cut in ("backend", "budget", "restore"):
        e = engine()
        if cut == "backend":
            e.target._state_bytes = lambda: None  # as the static cache answers
        elif cut == "budget":
            e.caches.parked = Parked(0)
        else:
            e.target._load = broken_load
        e.generate(ALICE, request("alice"))
        e.generate(BOB, request("bob"))
        again = e.generate(ALICE, request("alice"))
        assert again.stats.cached_prompt_tokens == 0 and again.token_ids == fresh(ALICE)
        assert names(e.caches.parked.callers()) == ([] if cut != "restore" else ["bob", "alice"])


def snap(size: int) -> Snapshot:
    return Snapshot((), None, size, 0)


def test_parked_copies_over_the_budget_go_from_the_caller_holding_the_most():
    parked = Parked(100)
    parked.put(Caller.named("a"), snap(30))
    parked.put(Caller.named("b"), snap(30))
    parked.put(Caller.named("c"), snap(60))  # 120 > 100: c holds the most, its own copy goes
    assert names(parked.callers()) == ["a", "b"] and parked.nbytes == 60
    parked.put(Caller.named("c"), snap(40))  # fits
    parked.put(Caller.named("d"), snap(20))  # 120: c's 40 is the most
    assert sorted(names(parked.callers())) == ["a", "b", "d"]
    parked.put(Caller.named("k1|salt:1"), snap(15))
    # 110: key k1 holds 30 in all, as much as a and b; the least recently used goes
    parked.put(Caller.named("k1|salt:2"), snap(15))
    assert "a" not in names(parked.callers()) and parked.nbytes <= 100
    parked.put(Caller.named("a"), None)  # nothing copied (over the budget): a keeps what it had (nothing here)
    assert parked.get(Caller.named("a")) is None
    assert parked.get(Caller.named("b")) is not None and names(parked.callers())[-1] == "b"


def test_many_callers_kinds_do_not_evict_another_callers_k_state():
    """Before, k=auto's states were one least-recently-used list of 64 for all: a client sending 64
    salts pushed out every other caller's state (and changed its K)."""
    states = WarmStates(MAX_CONTROLLERS)
    mine = states.get_or_make((Caller.named("victim"), "kind"), object)
    for i in range(64):
        states.get_or_make((Caller.named(f"all|salt:{i}"), "kind"), object)
    assert states.get_or_make((Caller.named("victim"), "kind"), object) is mine
    small = WarmStates(4)
    mine = small.get_or_make((Caller.named("k2"), "kind"), object)
    for i in range(10):  # one key's many salts and kinds: it evicts its own
        small.get_or_make((Caller.named(f"k1|salt:{i}"), "kind", i), object)
    assert small.get_or_make((Caller.named("k2"), "kind"), object) is mine and len(small) == 4


def test_one_callers_long_text_does_not_flush_another_callers_suffix_text():
    """Before, the suffix cache's bound was one least-recently-used budget for all: one caller
    resending a long prompt flushed another's text (whose drafting then found nothing)."""
    cache = SuffixCache(max_tokens=100)
    for start in range(0, 40, 10):
        alice = cache.scope(Caller.named("alice"))
        alice.add(list(range(start, start + 10)))
    for _ in range(3):
        cache.scope(Caller.named("bob")).add(list(range(200, 400)))
    assert len(cache.requests(Caller.named("alice"))) == 4  # 40 tokens, within an equal share of 100
    assert [len(text) for text in cache.requests(Caller.named("bob"))] == [60] and cache.tokens == 100
