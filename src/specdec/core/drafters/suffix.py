"""Suffix decoding: drafts from how the text went on after earlier occurrences of its own ending,
counted in a suffix trie over the request's text and, optionally, earlier requests' text.

Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications"
(arXiv 2411.04975); vLLM ships it as speculative method ``suffix`` (Snowflake's arctic-inference).
No second model; no probabilities (each draft token is a point mass, as prompt lookup's).

The structure (:class:`SuffixTrie`): a trie of every substring of length <= ``depth`` (a bounded
depth suffix tree, not path-compressed), each node counting the substring's occurrences.

- appending a token costs O(depth): the nodes of the text's suffixes (up to ``depth`` long) each
  step to their child along the token (the ``frontier``);
- memory is O(depth) nodes per token where the text is new, fewer where it repeats (shared
  paths); a node is one small object (a single child is held without a dict);
- finding the longest suffix of the context (up to ``suffix_match`` tokens) that occurred before
  with a continuation costs O(m log m) (binary search on m: if a suffix occurred followed by some
  token, so did every shorter one);
- removing a sequence (cache eviction) replays it: O(length x depth).

Drafting (the paper's greedy expansion): from the matched node, continuations are scored by their
empirical probability, the product along the path of ``count(child) / count(continued parent)``;
nodes are taken best first while the score is at least ``suffix_min_prob``, down to at most
``ceil(suffix_factor x match length)`` tokens (the paper's MAX_SPEC = alpha x p) and ``k``. The
chain drafter (``suffix``) follows the most frequent child only; the tree drafter
(``suffix-tree``) keeps up to ``tree_nodes`` nodes. A draft's score is the sum of its nodes'
probabilities (the expected accepted tokens); between the request's own trie and the cache's, the
higher-scoring draft is proposed, as in the paper.

Cross-request cache (:class:`SuffixCache`): one per engine (so per ``Pair``, per server process),
bounded in tokens, evicting whole requests, the least recently extended of the caller holding the
most first (:mod:`specdec.core.fair`); its tries are kept per caller (the server's API key and
cache salt, :func:`specdec.frontends.server.app.cache_scope`), so a caller's drafts never come from
another caller's text.
A request under a loose rule adds its text but never reads the cache: a loose rule may keep a draft
the target would not have produced, so a draft from other requests' text could carry that text
into its output; exact rules' output does not depend on the drafts. A request opts out with
``suffix_cache=false``: it neither reads the cache nor is added to it.

Deviations from the paper: (1) the trie has bounded depth instead of a path-compressed suffix tree
(simpler incremental updates and eviction; vLLM's bound is the same idea); (2) only the longest
matching suffix is expanded, not every match length with the best kept; (3) the threshold is on
the path's cumulative probability (vLLM's ``min_token_prob`` is per token); (4) the cache holds
prompts as well as outputs, and the running request's text is added as it is committed.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ...checks import option
from ..caller import Caller
from ..fair import victim
from ..sampling import SamplingParams
from .base import Draft, Drafter, Offer, answer_run, depth_option, tree_draft

#: the suffix tries' depth: a matched suffix plus its draft fit in this many tokens (vLLM's default)
DEPTH = 24
#: the cross-request cache's default bound, in tokens (about 1.4 kB a token where text is new: ~90 MB full)
CACHE_TOKENS = 65536


class _Node:
    """A trie node: how often its path occurred, and its children (None, one node, or a dict)."""

    __slots__ = ("token", "count", "kids")
    token: int
    count: int
    kids: "_Node | dict[int, _Node] | None"

    def __init__(self, token: int):
        self.token, self.count, self.kids = token, 0, None

    def child(self, token: int) -> "_Node | None":
        kids = self.kids
        if kids is None:
            return None
        if isinstance(kids, _Node):
            return kids if kids.token == token else None
        return kids.get(token)

    def children(self) -> list["_Node"]:
        kids = self.kids
        return [] if kids is None else [kids] if isinstance(kids, _Node) else list(kids.values())

    def add_child(self, token: int) -> "_Node":
        node = _Node(token)
        if self.kids is None:
            self.kids = node
        elif isinstance(self.kids, _Node):
            self.kids = {self.kids.token: self.kids, token: node}
        else:
            self.kids[token] = node
        return node

    def drop_child(self, token: int) -> None:
        if isinstance(self.kids, _Node):
            self.kids = None
        else:
            assert self.kids is not None  # it has the child
            del self.kids[token]
            if len(self.kids) == 1:
                (self.kids,) = self.kids.values()


class SuffixTrie:
    """Every substring (up to ``depth`` tokens) of the sequences added, with occurrence counts
    (module docstring). Sequences are appended to through their ``frontier`` (a list the caller
    keeps per sequence, empty for a new one)."""

    def __init__(self, depth: int = DEPTH):
        if depth < 2:
            raise ValueError(f"a suffix trie needs depth >= 2, got {depth}")
        self.depth = depth
        self.root = _Node(-1)
        self.nodes = 0  # nodes besides the root

    def append(self, frontier: list[_Node], tokens: Sequence[int]) -> list[_Node]:
        """Add ``tokens`` after the sequence whose suffixes' nodes are ``frontier`` (shortest
        first); returns the new frontier. O(depth) per token."""
        for t in tokens:
            t = int(t)
            new = []
            for parent in (self.root, *frontier[: self.depth - 1]):
                node = parent.child(t)
                if node is None:
                    node = parent.add_child(t)
                    self.nodes += 1
                node.count += 1
                new.append(node)
            frontier = new
        return frontier

    def remove(self, tokens: Sequence[int]) -> None:
        """Take away a whole sequence added before (its counts; nodes left at zero go)."""
        tokens = [int(t) for t in tokens]
        for start in range(len(tokens)):
            parent = self.root
            for t in tokens[start : start + self.depth]:
                node = parent.child(t)
                assert node is not None  # the sequence was added
                node.count -= 1
                if node.count == 0:  # its subtree held this occurrence only: it goes whole
                    parent.drop_child(t)
                    self.nodes -= self._size(node)
                    break
                parent = node

    @staticmethod
    def _size(node: _Node) -> int:
        return 1 + sum(SuffixTrie._size(kid) for kid in node.children())

    def find(self, pattern: Sequence[int]) -> _Node | None:
        """The node of ``pattern`` (None: it never occurred)."""
        node = self.root
        for t in pattern:
            kid = node.child(int(t))
            if kid is None:
                return None
            node = kid
        return node

    def match(self, context: Sequence[int], longest: int) -> tuple[_Node | None, int]:
        """``(node, m)``: the longest suffix of ``context`` (``m <= longest``, below the depth) that
        occurred followed by some token, and its node; ``(None, 0)`` when none did."""
        lo, hi, best = 1, min(longest, self.depth - 1, len(context)), None
        while lo <= hi:  # "occurred with a continuation" holds for every suffix shorter than one that did
            mid = (lo + hi) // 2
            node = self.find(context[len(context) - mid :])
            if node is not None and node.kids is not None:
                best, lo = (node, mid), mid + 1
            else:
                hi = mid - 1
        return best if best is not None else (None, 0)

    def continuations(self, pattern: Sequence[int]) -> dict[int, int]:
        """``{token: count}``: what followed ``pattern`` and how often (empty: nothing did)."""
        node = self.find(pattern)
        return {} if node is None else {kid.token: kid.count for kid in node.children()}


@dataclass
class Plan:
    """A draft from one trie: tokens, parents (parents first; -1: the context), and its score,
    the sum of the tokens' estimated probabilities (the expected accepted tokens)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    score: float = 0.0
    match: int = 0  # the length of the context's suffix it continues


def expand(node: _Node | None, depth: int, nodes: int, min_prob: float, tree: bool,
           stop_ids: frozenset[int] = frozenset(), allowed: Callable[[list[int]], bool] | None = None) -> Plan:
    """Grow a draft from the matched ``node``, best first by estimated probability (module
    docstring): at most ``nodes`` tokens, ``depth`` deep, none below ``min_prob``; a chain
    (``tree=False``) follows each node's most frequent child only. No node grows under an
    end-of-sequence token. ``allowed(path)``, when given, may refuse the node at the end of
    ``path`` (its tokens from the context on), and so its subtree."""
    plan, order = Plan(), itertools.count()
    paths: list[list[int]] = []  # with ``allowed``: each kept node's path
    heap: list = []

    def push(parent_node: _Node, parent: int, level: int, score: float) -> None:
        kids = parent_node.children()
        total = sum(kid.count for kid in kids)
        if not kids or level > depth:
            return
        if not tree:
            kids = [max(kids, key=lambda kid: kid.count)]  # the first seen among equals
        for kid in kids:
            heapq.heappush(heap, (-score * kid.count / total, next(order), level, parent, kid))

    if node is not None:
        push(node, -1, 1, 1.0)
    while heap and len(plan.tokens) < nodes:
        neg, _, level, parent, kid = heapq.heappop(heap)
        if -neg < min_prob:
            break
        if allowed is not None:
            path = (paths[parent] if parent >= 0 else []) + [kid.token]
            if not allowed(path):
                continue
            paths.append(path)
        plan.tokens.append(kid.token)
        plan.parents.append(parent)
        plan.score += -neg
        if kid.token not in stop_ids:
            push(kid, len(plan.tokens) - 1, level + 1, -neg)
    return plan


@dataclass
class _Entry:
    """One request's text in the cache."""

    caller: Caller
    tokens: list[int] = field(default_factory=list)
    frontier: list = field(default_factory=list)


class SuffixCache:
    """Earlier requests' text for the suffix drafters, bounded: at most ``max_tokens`` tokens in
    all, whole requests evicted, each time the least recently extended of the caller holding the
    most (:meth:`extend`), so that one caller's text cannot push another's below an equal share of
    the bound. One suffix trie per caller, so a caller never drafts from another caller's text (the
    server's caller: its API key and cache salt; the library's: ``DecodeConfig.caller``, the shared
    caller by default). Thread-safe.

    Every :class:`~specdec.core.engine.Engine` (so every ``Pair``) has one, ``engine.caches.suffix``;
    assign another to bound it differently (``SuffixCache(max_tokens=...)``) or to share one
    between engines over the same tokenizer."""

    def __init__(self, max_tokens: int = CACHE_TOKENS, depth: int = DEPTH):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        self.max_tokens, self.depth = max_tokens, depth
        self.tokens = 0  # tokens held, all callers together
        self._tries: dict[Caller, SuffixTrie] = {}
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently extended first
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def scope(self, caller: Caller = Caller.SHARED, read: bool = True) -> "CacheScope | None":
        """What one request of ``caller`` reads and adds (:class:`CacheScope`; ``read=False``: adds
        only, as a request under a loose rule does); None for an isolated caller, which shares nothing."""
        return None if caller.isolated else CacheScope(self, caller, read)

    def requests(self, of: Caller | None = None) -> list[list[int]]:
        """The requests' texts held (``of`` one caller; None: of every caller), least recently extended first."""
        with self._lock:
            return [list(e.tokens) for e in self._entries.values() if of is None or e.caller == of]

    def open(self, caller: Caller) -> int:
        with self._lock:
            entry = next(self._ids)
            self._entries[entry] = _Entry(caller)
            return entry

    def extend(self, entry: int, tokens: Sequence[int]) -> None:
        """Append to a request's text, evicting other requests' to make room, each time the least
        recently extended of the caller holding the most (:func:`specdec.core.fair.victim`: its own
        before another's); when the caller adding holds the most and has nothing else to give up,
        only what fits is kept. A request already evicted stays out."""
        with self._lock:
            held = self._entries.get(entry)
            if held is None:
                return
            self._entries.move_to_end(entry)
            while self.tokens + len(tokens) > self.max_tokens:
                gone = victim([(k, e.caller, len(e.tokens)) for k, e in self._entries.items()], pinned=(entry,),
                              pending={held.caller: len(tokens)})
                if gone is None:  # the caller adding holds the most: its text gets no more room
                    break
                self._evict(gone)
            tokens = list(tokens)[: max(0, self.max_tokens - self.tokens)]
            if not tokens:
                return
            trie = self._tries.get(held.caller)
            if trie is None:
                trie = self._tries[held.caller] = SuffixTrie(self.depth)
            held.frontier = trie.append(held.frontier, tokens)
            held.tokens += tokens
            self.tokens += len(tokens)

    def _evict(self, entry: int) -> None:  # with the lock held
        held = self._entries.pop(entry)
        trie = self._tries[held.caller]
        trie.remove(held.tokens)
        self.tokens -= len(held.tokens)
        if trie.root.kids is None:
            del self._tries[held.caller]

    def read(self, caller: Caller, plan: Callable[[SuffixTrie], Plan]) -> Plan:
        """``plan(trie)`` over ``caller``'s trie, under the lock (an empty plan when it has none)."""
        with self._lock:
            trie = self._tries.get(caller)
            return Plan() if trie is None else plan(trie)


class CacheScope:
    """One request's view of a :class:`SuffixCache`: its caller's trie to read, and its own entry,
    opened at its first tokens, to extend."""

    def __init__(self, cache: SuffixCache, caller: Caller, read: bool = True):
        self.cache, self.caller, self.reads = cache, caller, read
        self.entry: int | None = None

    def add(self, tokens: Sequence[int]) -> None:
        if self.entry is None:
            self.entry = self.cache.open(self.caller)
        self.cache.extend(self.entry, tokens)

    def read(self, plan: Callable[[SuffixTrie], Plan]) -> Plan:
        return self.cache.read(self.caller, plan) if self.reads else Plan()


@dataclass(frozen=True)
class SuffixOptions:
    suffix_match: int = option(12, lo=1, hi=DEPTH - 1, help="suffix: longest suffix of the text matched (tokens)")
    suffix_factor: float = option(1.0, lo=0, lo_open=True, hi=16,
                                  help="suffix: draft at most ceil(factor x match length) tokens (the paper's alpha)")
    suffix_min_prob: float = option(0.1, lo=0, hi=1, help="suffix: draft no token whose estimated probability "
                                                            "(continuation frequencies multiplied along its path) is lower")
    suffix_cache: bool = option(True, help="suffix: also draft from earlier requests' text (same API key) and "
                                           "keep this one's for later requests")


@dataclass(frozen=True)
class SuffixTreeOptions(SuffixOptions):
    tree_nodes: int = option(8, lo=1, hi=256, help="tree: most draft tokens per round (the target scores tree_nodes + 1)")
    tree_depth: int | None = depth_option()


class SuffixDrafter(Drafter):
    """Suffix decoding's chain (module docstring): the most frequent continuation of the longest
    matching suffix, from the request's own text or the cache's, whichever scores higher."""

    name = "suffix"
    requires_model = False
    reads_history = True
    Options = SuffixOptions
    tree = False

    def __init__(self, stop_ids: frozenset[int] = frozenset(), suffix_match: int = 12, suffix_factor: float = 1.0,
                 suffix_min_prob: float = 0.1, suffix_cache: bool = True, tree_nodes: int = 8,
                 history: CacheScope | None = None, prompts: bool = True):
        self.stop_ids = frozenset(stop_ids)
        self.longest, self.factor, self.min_prob = int(suffix_match), float(suffix_factor), float(suffix_min_prob)
        self.nodes = int(tree_nodes)
        self.history = history if suffix_cache else None
        self.trie = SuffixTrie()
        self._frontier: list = []
        self._indexed = 0  # context tokens in the trie (and the cache)
        self.prompt_len = 0
        #: index the prompt too (False: only what is generated, this request's and, through the cache,
        #: earlier ones'; the portfolio's suffix source, beside prompt lookup over the prompt, skips
        #: indexing each prompt: ~24 trie nodes a token, a fraction of a second for a long prompt)
        self.prompts = prompts
        #: proposals drawn from the cache rather than the request's own text
        self.from_cache = 0

    @classmethod
    def build(cls, lm, stop_ids, history: CacheScope | None = None, **options) -> "SuffixDrafter":
        return cls(stop_ids, history=history, **options)

    def start(self, prompt: Sequence[int]) -> None:
        self.trie, self._frontier, self._indexed = SuffixTrie(), [], 0 if self.prompts else len(prompt)
        self.prompt_len = len(prompt)
        self._learn(prompt)

    def _learn(self, context: Sequence[int]) -> None:
        """Index the context's new tokens, here and in the cache."""
        new = list(context[self._indexed :])
        if not new:
            return
        self._frontier = self.trie.append(self._frontier, new)
        self._indexed = len(context)
        if self.history is not None:
            self.history.add(new)

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        self._learn(context)

    def _plan(self, trie: SuffixTrie, context: Sequence[int], k: int, allowed) -> Plan:
        node, m = trie.match(context, self.longest)
        if node is None:
            return Plan()
        depth = min(k, math.ceil(self.factor * m), trie.depth - m)
        plan = expand(node, depth, self.nodes if self.tree else depth, self.min_prob, self.tree, self.stop_ids,
                      allowed)
        plan.match = m
        return plan

    def propose(self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
                ) -> Draft:
        """The better of the two plans (the request's own text first among equals). With a grammar
        (``guide``), a node it refuses is never drafted, nor anything under it."""
        plan = self._guided_best(context, k)
        return tree_draft(plan.tokens, plan.parents) if self.tree else Draft(plan.tokens)

    def offer(self, context: Sequence[int], k: int) -> Offer | None:
        """The chain :meth:`propose` would draft (up to ``k``), its run the matched suffix's length
        (as :func:`~specdec.core.drafters.base.answer_run` counts it); None when nothing continues the text."""
        plan = self._guided_best(context, k)
        if not plan.tokens:
            return None
        return Offer(self.name, tuple(plan.tokens), answer_run(plan.match, len(context), self.prompt_len))

    def _guided_best(self, context: Sequence[int], k: int) -> Plan:
        if self.guide is None:
            return self._best(context, k, None)
        with self.guide.walk() as walk:
            def allowed(path: list[int]) -> bool:
                walk.to(path[:-1])
                return self.guide.valid_prefix(path[-1:]) == 1

            return self._best(context, k, allowed)

    def _best(self, context: Sequence[int], k: int, allowed) -> Plan:
        plan = self._plan(self.trie, context, k, allowed)
        if self.history is not None:
            other = self.history.read(lambda trie: self._plan(trie, context, k, allowed))
            if other.score > plan.score:
                plan = other
                self.from_cache += 1
        return plan


class SuffixTreeDrafter(SuffixDrafter):
    """Suffix decoding's token tree (the paper's speculation tree; module docstring): up to
    ``tree_nodes`` continuations of the longest matching suffix, the most probable first,
    verified in one target pass."""

    name = "suffix-tree"
    grows_trees = True
    Options = SuffixTreeOptions
    tree = True

    @classmethod
    def depth_limit(cls, tree_nodes: int = SuffixTreeOptions.tree_nodes, **options) -> int:
        """k=auto: the tree's own limits stop it (no deeper than ``tree_nodes`` nor the trie)."""
        return min(int(tree_nodes), DEPTH - 1)

    @classmethod
    def tree_size(cls, tree_nodes: int = SuffixTreeOptions.tree_nodes, **options) -> int:
        return int(tree_nodes)

    @classmethod
    def tree_paths(cls, depth: int, tree_nodes: int = SuffixTreeOptions.tree_nodes, **options) -> tuple[int, int]:
        """The target scores at most ``tree_nodes`` leaves; no draft model feeds a tree."""
        return int(tree_nodes), 0
