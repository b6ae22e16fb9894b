"""Fair eviction among callers (specdec.core.fair): over a store's bound, the caller holding the most
gives up its least recently used item; one key's salts share the key's share."""

from __future__ import annotations

from specdec.core.caller import Caller
from specdec.core.fair import principal, victim

A, B, C = (Caller.named(name) for name in "abc")


def test_the_caller_holding_the_most_gives_up_its_least_recently_used_item():
    items = [("a1", A, 10), ("b1", B, 30), ("a2", A, 10), ("b2", B, 5), ("c1", C, 20)]
    assert victim(items) == "b1"  # b holds 35
    assert victim(items, pinned={"b1"}) == "b2"
    assert victim(items, pending={C: 20}) == "c1"  # c, adding 20, would hold the most: its own goes
    assert victim([("c1", C, 5)], pinned={"c1"}, pending={C: 50}) is None  # nothing else to give
    assert victim([]) is None


def test_ties_go_to_the_least_recently_used_holder():
    assert victim([("a", A, 10), ("b", B, 10), ("c", C, 10)]) == "a"
    assert victim([("a", A, 10), ("b", B, 10)], pending={A: 0}) == "b"  # a just used


def test_one_keys_salts_share_the_keys_share():
    assert principal(Caller.named("k1|salt:abc")) == "k1" and principal(Caller.named("all")) == "all"
    assert principal(Caller.SHARED) == ""
    items = [("other", Caller.named("k2"), 30), *((f"s{i}", Caller.named(f"k1|salt:{i}"), 10) for i in range(4))]
    assert victim(items) == "s0"  # key k1 holds 40 across its salts: it gives up first, not k2
