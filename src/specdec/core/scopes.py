"""What an engine keeps from one request to the next, and for whom: its caches, scoped by caller.

A request names its caller (:attr:`specdec.core.request.DecodeConfig.caller`: the server's digest of
the API key and the request's ``cache_salt``; the library's ``""`` by default; None: a caller of
its own, whom nothing before or after it serves). Three things outlive a request, and each serves
only the caller that left it (:class:`Caches`, one per :class:`~specdec.core.engine.Engine`):

- **the prefix cache**: the models' KV caches hold the last generation's text. A generation of the
  same caller may keep the target's positions its prompt shares with it (with
  :attr:`Caches.prefix_caching` on); one of another caller, or of the caller None, starts from
  empty caches, so that no request reads another's prompt (``cached_tokens``, or its time to
  the first token, would tell how much of it a guess got right);
- **the suffix cache** (:class:`~specdec.core.drafters.SuffixCache`): earlier requests' text for the
  suffix drafters, one trie per caller;
- **k=auto's warm state**: one K policy per caller and kind of request (:class:`WarmStates`).

The server only names the caller; the engine applies these rules to every generation.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence

from ..models.backends.base import Model, common_prefix
from .drafters import CacheScope, SuffixCache

#: k=auto's K policies kept per engine, one per distinct (caller, policy, parameters, drafter, sampling
#: mode); the least recently used goes first (a server sees any number of distinct request parameters)
MAX_CONTROLLERS = 64
#: whose text the models' caches hold before the first generation: nobody's (no caller is this object)
_NOBODY = object()


class WarmStates(OrderedDict):
    """k=auto's state per request kind, kept across requests (a dict of key -> state): at most
    ``limit`` kinds, the least recently used evicted first."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def get_or_make(self, key, make: Callable[[], Any], stale: Callable[[Any], bool] = lambda state: False):
        state = self.pop(key, None)
        if state is None or stale(state):
            state = make()
        while len(self) >= self.limit:
            self.popitem(last=False)
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
        #: k=auto's K policies, per caller and kind of request; at most MAX_CONTROLLERS, least recently used evicted
        self.controllers = WarmStates(MAX_CONTROLLERS)
        self._holder: Any = _NOBODY  # whose text the models' caches hold

    def enter(self, caller: str | None, models: Sequence[Model | None]) -> None:
        """A generation of ``caller`` starts on ``models`` (the target and the draft): their caches
        are emptied unless they hold the same caller's text (never for the caller None)."""
        if caller is None or caller != self._holder:
            for lm in models:
                if lm is not None:
                    lm.reset()
        self._holder = caller

    def kept(self, target: Model, ids: Sequence[int]) -> int:
        """How many of ``ids`` (a prompt) the target's cache may keep: with :attr:`prefix_caching`,
        the prefix it shares with what the cache holds (after :meth:`enter`: the caller's own text), else 0."""
        return common_prefix(target.linear_tokens, ids) if self.prefix_caching else 0

    def history(self, caller: str | None, read: bool = True) -> CacheScope | None:
        """A request's view of the suffix cache: its caller's text (``read=False``: it only adds its
        own, as a request under a loose rule does); None for the caller None."""
        return self.suffix.scope(caller, read=read)

    def k_policy(self, caller: str | None, kind: tuple, make: Callable[[], Any], tables: tuple):
        """k=auto's K policy for ``caller``'s requests of ``kind``, kept from the last one (what one
        caller's requests taught it never steers another's: its K per round would tell what others
        sent), or ``make()``'s new one: for the caller None, and when the cost ``tables`` it was made
        for changed."""
        if caller is None:
            return make()

        def made():
            policy = make()
            policy.tables = tables
            return policy

        return self.controllers.get_or_make((caller, *kind), made,
                                            stale=lambda p: any(a is not b for a, b in zip(p.tables, tables)))
