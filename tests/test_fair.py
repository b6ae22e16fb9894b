"""Fair eviction among callers (specdec.core.fair): over a store's bound, the caller holding the most
gives up its least recently used item; one key's salts share the key's share."""

from __future__ import annotations

from specdec.core.fair import principal, victim


def test_the_caller_holding_the_most_gives_up_its_least_recently_used_item():
    items = [("a1", "a", 10), ("b1", "b", 30), ("a2", "a", 10), ("b2", "b", 5), ("c1", "c", 20)]
    assert victim(items) == "b1"  # b holds 35
    assert victim(items, pinned={"b1"}) == "b2"
    assert victim(items, pending={"c": 20}) == "c1"  # c, adding 20, would hold the most: its own goes
    assert victim([("c1", "c", 5)], pinned={"c1"}, pending={"c": 50}) is None  # nothing else to give
    assert victim([]) is None


def test_ties_go_to_the_least_recently_used_holder():
    assert victim([("a", "a", 10), ("b", "b", 10), ("c", "c", 10)]) == "a"
    assert victim([("a", "a", 10), ("b", "b", 10)], pending={"a": 0}) == "b"  # a just used


def test_one_keys_salts_share_the_keys_share():
    assert principal("k1|salt:abc") == "k1" and principal("all") == "all" and principal("") == ""
    items = [("other", "k2", 30), *((f"s{i}", f"k1|salt:{i}", 10) for i in range(4))]
    assert victim(items) == "s0"  # key k1 holds 40 across its salts: it gives up first, not k2
