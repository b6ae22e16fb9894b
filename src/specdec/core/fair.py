"""Fair eviction among callers: which item a bounded store shared by callers gives up first.

Each of the engine's stores that outlive a request (the parked prefix caches, the suffix cache's
text, k=auto's warm K policies; :mod:`specdec.core.scopes`) holds items, each owned by one caller
and of some size, in least-recently-used order, within one bound. When an addition puts it over the
bound, :func:`victim` names the item to drop: the least recently used item of the caller holding the
most, within the *principal* (the client a caller belongs to, :func:`principal`) holding the most;
ties go to the one least recently used. So whatever one caller adds evicts its own items before it
takes another's below what that one holds, and callers who hold no more than an equal share of the
bound (the bound over the number of callers holding something) lose nothing to it: the store can
only be over its bound while someone holds more than that share.
"""

from __future__ import annotations

from typing import Any, Collection, Hashable, Mapping, Sequence, TypeVar

from .caller import Caller

#: an item's key in a store (whatever the store indexes its items by)
Key = TypeVar("Key", bound=Hashable)


def principal(caller: Caller) -> str:
    """The client ``caller`` belongs to: its name up to the first ``|`` (the server names a scope
    ``<key>|salt:<digest>``, so all the salts of one API key share the key's share)."""
    return caller.name.split("|", 1)[0]


def _largest(totals: dict, recent: dict, among: Collection) -> Any:
    """The one of ``among`` with the largest total; ties: the least recently used."""
    return max(among, key=lambda who: (totals[who], -recent[who]), default=None)


def victim(items: Sequence[tuple[Key, Caller, int]], pinned: Collection[Key] = (),
           pending: Mapping[Caller, int] | None = None) -> Key | None:
    """The key of the item to evict from ``items`` (``(key, caller, size)``, least recently used
    first): of the principal holding the most, its caller holding the most, that caller's least
    recently used item (ties between holders: the least recently used one). ``pending``: sizes about
    to be added per caller, counted as held and as just used but not evictable; ``pinned``: keys that
    may not be evicted. None when the largest holder has nothing it may give up (the caller adding is
    the largest: it gets no more room)."""
    pending = pending or {}
    totals: dict = {}
    recent: dict = {}
    for rank, (key, caller, size) in enumerate([*items, *((None, c, s) for c, s in pending.items())]):
        for who in (("p", principal(caller)), ("c", caller)):
            totals[who] = totals.get(who, 0) + size
            recent[who] = rank
    top = _largest(totals, recent, [w for w in totals if w[0] == "p"])
    if top is None:
        return None
    callers = [w for w in totals if w[0] == "c" and principal(w[1]) == top[1]]
    caller = _largest(totals, recent, callers)
    return next((key for key, c, _ in items if c == caller[1] and key not in pinned), None)
