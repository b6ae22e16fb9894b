"""Lookahead decoding: a Jacobi window and an n-gram pool, drafted as one token tree. No draft model.

Fu, Bailis, Stoica, Zhang, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding" (ICML 2024, arXiv 2402.02057). Each target pass carries two branches:

- the *lookahead branch*, a 2D window of ``N - 1`` levels by ``W`` columns: level ``j``, column
  ``i`` sits at position ``p + i + j`` (``p``: the last committed token's). One Jacobi step per
  pass: the target's argmax after each column's top token becomes that column's next token, and
  the levels shift down by one, so every column carries a trajectory of guesses each made by the
  target right after the one below it. A column's ``N - 1`` tokens plus the new one form an
  n-gram, added to the pool under its first token;
- the *verification branch*: up to ``G`` n-grams from the pool whose first token is the last
  committed token, as chains after it.

The window is itself a token tree hanging off the context (as llama.cpp's ``examples/lookahead``
lays it out with sequence ids): level 0 is a chain (column 0's level-0 token is the last committed
token itself, i.e. the tree's root), and column ``i``'s levels ``1..N-2`` are a chain under its
level-0 node. Each window token then attends to the context, the level-0 tokens up to its column
and the lower levels of its own column: the lookahead mask of the paper's figure, as llama.cpp's
example builds it (tested against both). The ``G`` guesses are further
chains from the root. So a whole lookahead pass is one tree draft (``Draft.parents``), scored and
verified by the engine's tree pass on both backends; the rule walks every path of that tree, so
whatever it accepts along a window path is as correct as a guess (a bonus over the paper, which
verifies the guesses only). After the pass the engine hands the drafter the target's argmax at
every row (:meth:`LookaheadDrafter.observe`, declared by ``observes_target``): the Jacobi step and
the pool's harvest read it.

Greedy Jacobi updates at every temperature, as the paper's implementation (its guesses come from
the argmax even when sampling); at T>0 the tree rule tests each node as a point-mass proposal,
which is exact because the tree depends on earlier rounds only.

Deviations from the paper (and llama.cpp's example):

- identical paths are merged: the pass is a trie of the guesses and the window's column paths
  (a guess that repeats a window prefix, two equal guesses' prefixes, or two columns whose tokens
  coincide share nodes). Same tokens at the same positions under the same ancestors compute the
  same keys and values, so the attention pattern is the paper's, with fewer nodes;
- the window advances one Jacobi step per pass however many tokens the round committed (the
  reference implementation's default, ``ALWAYS_FWD_ONE``), its positions drifting by the extra
  tokens; it starts from the prompt's tokens (cycled), not random ones, so runs repeat exactly;
- the pool keeps the ``G`` most recently seen n-grams per first token (least recently seen
  dropped), and is filled from the window only (not from the prompt or the committed text);
- ``k`` caps the tree's depth: nodes deeper than ``k`` are left out (the columns they held skip
  that Jacobi step). ``k="auto"`` keeps the whole window (depth ``W - 1 + N - 2``) and prices the
  pass by its width in nodes against a plain step (:class:`specdec.core.autok.PassGate`).

The pass holds ``(W - 1) + W (N - 2) + G (N - 1)`` nodes at most (capped at ``MAX_NODES``) and
``W + G`` root-to-leaf paths (llama.cpp allows 256: the option ranges keep well below). On a CPU
such a pass costs nearly that many tokens' compute, so lookahead pays only where a verify pass over
many tokens is cheap (a GPU, or a memory-bound CPU target).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ...checks import option, options_of
from ...errors import SpecdecError
from ..sampling import SamplingParams
from .base import Draft, Drafter, depth_option, tree_draft

#: the most nodes one lookahead pass may hold (the target scores them all in one pass)
MAX_NODES = 1024


@dataclass(frozen=True)
class LookaheadOptions:
    lookahead_window: int = option(5, lo=1, hi=64, help="lookahead: W, the Jacobi window's columns (the paper's "
                                   "GPU setting is 15)")
    lookahead_ngram: int = option(4, lo=2, hi=16, help="lookahead: N, the n-gram size; the window has N-1 levels "
                                  "(paper: 5)")
    lookahead_guesses: int = option(5, lo=0, hi=64, help="lookahead: G, most pooled n-grams verified per pass, "
                                    "and kept per first token (paper: 15)")
    tree_depth: int | None = depth_option()


def pass_nodes(window: int, ngram: int, guesses: int) -> int:
    """The most nodes of one lookahead pass: the window's level 0 (its first column is the root),
    its ``N - 2`` upper levels, and ``G`` guesses of ``N - 1`` tokens."""
    return (window - 1) + window * (ngram - 2) + guesses * (ngram - 1)


def _shape(options: dict) -> tuple[int, int, int]:
    d = {k: default for k, (_, default) in options_of(LookaheadOptions).items()}
    d.update(options)
    return int(d["lookahead_window"]), int(d["lookahead_ngram"]), int(d["lookahead_guesses"])


class LookaheadDrafter(Drafter):
    """Lookahead decoding (module docstring): ``propose`` lays the window and the pool's guesses
    out as one tree, ``observe`` takes the target's argmax after every node to run the Jacobi
    step and harvest n-grams."""

    name = "lookahead"
    requires_model = False
    grows_trees = True
    observes_target = True
    Options = LookaheadOptions

    def __init__(self, lookahead_window: int = 5, lookahead_ngram: int = 4, lookahead_guesses: int = 5):
        self.check(lookahead_window=lookahead_window, lookahead_ngram=lookahead_ngram,
                   lookahead_guesses=lookahead_guesses)
        self.W, self.N, self.G = int(lookahead_window), int(lookahead_ngram), int(lookahead_guesses)
        #: ``[N-1][W]`` the window's tokens by level and column; ``levels[0][0]`` is unused (column
        #: 0's level-0 token is the last committed token)
        self.levels: list[list[int]] = []
        #: first token -> up to G n-gram tails (N-1 tokens each), least recently seen first
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self._tops: list[int | None] | None = None  # per column: the node after which its next token comes (-1: root)
        self._root = -1  # the last committed token at the last proposal

    @classmethod
    def check(cls, **options) -> None:
        """The pass must hold something, and at most MAX_NODES nodes."""
        w, n, g = _shape(options)
        if w == 1 and n == 2 and g == 0:
            raise SpecdecError("lookahead with lookahead_window=1, lookahead_ngram=2 and lookahead_guesses=0 "
                               "drafts nothing; raise one of them")
        if pass_nodes(w, n, g) > MAX_NODES:
            raise SpecdecError(f"a lookahead pass of W={w}, N={n}, G={g} holds {pass_nodes(w, n, g)} nodes, over "
                               f"the limit of {MAX_NODES} ((W-1) + W(N-2) + G(N-1)); lower them")

    @classmethod
    def build(cls, lm, stop_ids, **options) -> "LookaheadDrafter":
        return cls(**options)

    @classmethod
    def depth_limit(cls, **options) -> int:
        """The deepest node: the window's last column's top level, or a whole guess."""
        w, n, g = _shape(options)
        return max(w - 1 + n - 2, n - 1 if g else 0, 1)

    @classmethod
    def tree_size(cls, **options) -> int:
        return pass_nodes(*_shape(options))

    @classmethod
    def tree_paths(cls, depth: int, **options) -> tuple[int, int]:
        """Root-to-leaf paths: one per column (a chain when N = 2), one per guess; no draft model."""
        w, n, g = _shape(options)
        return (w if n > 2 else int(w > 1)) + g, 0

    def start(self, prompt: Sequence[int]) -> None:
        """A fresh window from the prompt's tokens (cycled) and an empty pool."""
        prompt = [int(t) for t in prompt] or [0]
        self.levels = [[prompt[(j * self.W + i) % len(prompt)] for i in range(self.W)] for j in range(self.N - 1)]
        self.pool = {}
        self._tops = None

    def propose(self, context: Sequence[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        """The pool's guesses after the last committed token, then the window, as one trie of
        nodes no deeper than ``k`` (parents first; guesses first among siblings, most recent first)."""
        if not self.levels:
            self.start(context)
        root = int(context[-1])
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        index: dict[tuple[int, int], int] = {}

        def add(parent: int | None, token: int) -> int | None:
            """The node for ``token`` under ``parent`` (-1: the root), new or shared; None when
            the parent was left out or the node would be deeper than ``k``."""
            if parent is None or (depths[parent] if parent >= 0 else 0) >= k:
                return None
            key = (parent, token)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                depths.append(1 + (depths[parent] if parent >= 0 else 0))
            return index[key]

        for tail in reversed(self.pool.get(root, [])):
            if self.guide is not None:  # structured output: cut at the first token the grammar refuses
                tail = tail[: self.guide.valid_prefix(list(tail))]
            node: int | None = -1
            for t in tail:
                node = add(node, t)
        level0: list[int | None] = [-1]
        for i in range(1, self.W):
            level0.append(add(level0[-1], self.levels[0][i]))
        tops: list[int | None] = []
        for i in range(self.W):
            node = level0[i]
            for j in range(1, self.N - 1):
                node = add(node, self.levels[j][i])
            tops.append(node)
        self._tops, self._root = tops, root
        return tree_draft(tokens, parents)

    def observe(self, draft: Draft, argmax: Sequence[int]) -> None:
        """One Jacobi step from the target's argmax after every row of the last pass (row 0: after
        the context, row ``i + 1``: after node ``i``): each column's n-gram (its level-0 token, or
        the root for column 0, its upper levels, and the target's next token) joins the pool, the
        levels shift down and the new tokens become the top level."""
        tops, self._tops = self._tops, None
        if tops is None:
            return
        new = [None if node is None else int(argmax[node + 1]) for node in tops]
        levels = self.levels
        if self.G:
            for i, token in enumerate(new):
                if token is not None:
                    head = self._root if i == 0 else levels[0][i]
                    self._remember(head, tuple(levels[j][i] for j in range(1, self.N - 1)) + (token,))
        top = [old if token is None else token for old, token in zip(levels[-1], new)]
        self.levels = [list(level) for level in levels[1:]] + [top]

    def _remember(self, head: int, tail: tuple[int, ...]) -> None:
        """Keep ``tail`` under ``head`` as the most recently seen; at most G per head."""
        grams = self.pool.setdefault(head, [])
        if tail in grams:
            grams.remove(tail)
        grams.append(tail)
        if len(grams) > self.G:
            del grams[0]

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        """Nothing to roll back: the window advanced in :meth:`observe`, and no model holds a cache."""
