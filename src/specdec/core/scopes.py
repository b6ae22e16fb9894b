"""What an engine keeps from one request to the next, and for whom: its caches, kept per caller side by side.

A request names its caller (:attr:`specdec.core.request.DecodeConfig.caller`, a
:class:`~specdec.core.caller.Caller`: the server's digest of the API key and the request's
``cache_salt``, or one scope for all on a server without a key; the library's shared caller by
default; an isolated one: a caller of its own, whom nothing before or after it serves).
Three things outlive a request, and each serves only the caller that left it (:class:`Caches`, one
per :class:`~specdec.core.engine.Engine`):

- **the prefix cache**: the target's KV cache holds the last generation's text, and with
  :attr:`Caches.prefix_caching` on a generation of the same caller keeps the positions its prompt
  shares with it. When a generation ends, a copy of the target's cache is *parked* in host memory
  for its caller (:class:`Parked`, :meth:`~specdec.models.backends.base.Model.snapshot`); when
  another caller's generation starts, the models' caches are emptied and that caller's own parked
  copy, if any, is put back. So a caller's next request finds its own prefix whoever ran in between,
  and never another's (``cached_tokens``, or its time to the first token, would tell how much of
  another's prompt a guess got right). A backend that cannot copy its cache empties it at a switch;
- **the suffix cache** (:class:`~specdec.core.drafters.SuffixCache`): earlier requests' text for the
  suffix drafters, one trie per caller;
- **k=auto's warm state**: one K policy per caller and kind of request (:class:`WarmStates`).

Each is bounded (parked copies: :data:`PARKED_BYTES`; the suffix cache: its tokens; K policies:
:data:`MAX_CONTROLLERS`), and over its bound gives up first what the caller holding the most holds
(:mod:`specdec.core.fair`): what one caller sends cannot evict another's state while that one holds
no more than an equal share. The server only names the caller; the engine applies these rules to
every generation.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence

from ..models.backends.base import Model, Snapshot, common_prefix
from .caller import Caller
from .drafters import CacheScope, SuffixCache
from .fair import victim

#: k=auto's K policies kept per engine, one per distinct (caller, policy, parameters, drafter, sampling
#: mode); over it, the caller holding the most gives up its least recently used (:func:`specdec.core.fair.victim`)
MAX_CONTROLLERS = 1024
#: host memory for the parked prefix caches, all callers together, in bytes (the server's --caller-cache-mb)
PARKED_BYTES = 512 << 20


class Parked:
    """The target's cache per caller, parked in host memory between its requests: one copy per
    caller (its last generation's that fit), at most ``budget`` bytes in all; over it, the copy of
    the caller holding the most goes first (:func:`specdec.core.fair.victim`; ties: the least
    recently used). ``budget=0`` parks nothing."""

    def __init__(self, budget: int = PARKED_BYTES):
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"budget must be an integer number of bytes >= 0, got {budget!r}")
        self.budget = budget
        self._held: OrderedDict[Caller, Snapshot] = OrderedDict()  # least recently used first

    @property
    def nbytes(self) -> int:
        """Bytes held, all callers together."""
        return sum(snap.nbytes for snap in self._held.values())

    def callers(self) -> list[Caller]:
        """The callers whose copies are held, least recently used first."""
        return list(self._held)

    def put(self, caller: Caller, snap: Snapshot | None) -> None:
        """Park ``snap`` as ``caller``'s copy (None: the caller keeps the copy it had), then evict
        until the copies fit the budget (the new one too, if its caller then holds the most)."""
        if snap is None:
            return
        self._held.pop(caller, None)
        self._held[caller] = snap
        while self.nbytes > self.budget:
            gone = victim([(who, who, held.nbytes) for who, held in self._held.items()])
            assert gone is not None  # nothing pinned: the largest holder has a copy to give up
            del self._held[gone]

    def drop(self, caller: Caller) -> None:
        """Forget ``caller``'s copy."""
        self._held.pop(caller, None)

    def get(self, caller: Caller) -> Snapshot | None:
        """``caller``'s parked copy (None: it has none), now the most recently used."""
        snap = self._held.get(caller)
        if snap is not None:
            self._held.move_to_end(caller)
        return snap


class WarmStates(OrderedDict):
    """k=auto's state per caller and request kind, kept across requests (a dict of ``(caller, *kind)``
    -> state): at most ``limit`` in all; a new one evicts the least recently used of the caller
    holding the most (:func:`specdec.core.fair.victim`), so that a client sending many kinds or
    salts evicts its own before another's."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def get_or_make(self, key, make: Callable[[], Any], stale: Callable[[Any], bool] = lambda state: False):
        state = self.pop(key, None)
        if state is None or stale(state):
            state = make()
        while self and len(self) >= self.limit:
            gone = victim([(k, k[0], 1) for k in self], pending={key[0]: 1})
            if gone is None:
                break
            del self[gone]
        self[key] = state
        return state

    def copy(self) -> "WarmStates":
        new = WarmStates(self.limit)
        new.update(self)
        return new


class Caches:
    """An engine's state across requests, each part per caller (module docstring)."""

    def __init__(self):
        #: prefix caching (vLLM's and llama-server's default): a generation keeps the target's cached
        #: positions its prompt shares with what the cache holds from its caller's request before,
        #: and reads only the rest (an agent's next turn re-sends the whole conversation). Off by
        #: default, so that every generation starts from an empty cache and bench's timings compare;
        #: the server turns it on. Output is the same either way up to floating-point differences of
        #: batched against incremental passes (near-ties on llama.cpp and in bf16).
        self.prefix_caching = False
        #: earlier requests' text for the suffix drafters, per caller (assign another to resize or share it)
        self.suffix = SuffixCache()
        #: k=auto's K policies, per caller and kind of request; at most MAX_CONTROLLERS (:class:`WarmStates`)
        self.controllers = WarmStates(MAX_CONTROLLERS)
        #: the target's cache per caller, parked between its requests (assign ``Parked(budget)`` to resize it)
        self.parked = Parked()
        #: whose text the models' caches hold; before the first generation nobody's, as after an
        #: isolated caller's (whose text serves no one)
        self._holder = Caller.ISOLATED

    def enter(self, caller: Caller, models: Sequence[Model | None]) -> None:
        """A generation of ``caller`` starts on ``models`` (the target, then the draft): unless they
        hold the same caller's text (never for an isolated caller), they are emptied, and with
        :attr:`prefix_caching` the target gets back the caller's parked copy, if it has one."""
        if not caller.isolated and caller == self._holder:
            return
        for lm in models:
            if lm is not None:
                lm.reset()
        target = models[0]
        held = self.parked.get(caller) if self.prefix_caching and not caller.isolated else None
        if held is not None and target is not None and held.owner == id(target):
            try:
                target.restore(held)
            except RuntimeError:  # the backend could not put it back: an empty cache, as without one
                self.parked.drop(caller)
                target.reset()
        self._holder = caller

    def leave(self, target: Model) -> None:
        """A generation ended: with :attr:`prefix_caching`, a copy of the target's cache is parked
        for its caller (:class:`Parked`, within its budget), for the caller's next request to find
        whatever runs in between. Its cost, a copy of the caller's own cache, is the caller's."""
        if self.prefix_caching and not self._holder.isolated and self.parked.budget > 0:
            self.parked.put(self._holder, target.snapshot(limit=self.parked.budget))

    def kept(self, target: Model, ids: Sequence[int]) -> int:
        """How many of ``ids`` (a prompt) the target's cache may keep: with :attr:`prefix_caching`,
        the prefix it shares with what the cache holds (after :meth:`enter`: the caller's own text), else 0."""
        return common_prefix(target.linear_tokens, ids) if self.prefix_caching else 0

    def history(self, caller: Caller, read: bool = True) -> CacheScope | None:
        """A request's view of the suffix cache: its caller's text (``read=False``: it only adds its
        own, as a request under a loose rule does); None for an isolated caller."""
        return self.suffix.scope(caller, read=read)

    def k_policy(self, caller: Caller, kind: tuple, make: Callable[[], Any], tables: tuple):
        """k=auto's K policy for ``caller``'s requests of ``kind``, kept from the last one (what one
        caller's requests taught it never steers another's: its K per round would tell what others
        sent), or ``make()``'s new one: for an isolated caller, and when the cost ``tables`` it was made
        for changed."""
        if caller.isolated:
            return make()

        def made():
            policy = make()
            policy.tables = tables
            return policy

        return self.controllers.get_or_make((caller, *kind), made,
                                            stale=lambda p: any(a is not b for a, b in zip(p.tables, tables)))
