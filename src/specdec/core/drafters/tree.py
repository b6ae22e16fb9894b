"""Token trees from the draft model, EAGLE-2 style: several continuations per round, one target pass.

EAGLE-2 (Li et al., "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees",
arXiv 2406.16858) grows the tree level by level, expanding the nodes with the highest cumulative
draft probability, then keeps the best nodes overall ("reranking"). We do the same with the draft
model in place of EAGLE's feature-level head:

1. depth 1: the draft's top-``tree_width`` tokens after the context;
2. each further depth: the ``tree_width`` newest nodes with the highest cumulative probability
   (product of draft probabilities along their path) are fed to the draft model in one pass with a
   tree attention mask, and each gets its top-``tree_width`` children;
3. finally the ``tree_nodes`` nodes with the highest cumulative probability are kept. A child never
   scores above its parent, so the kept nodes always form a tree (ties go to the shallower node).

Growth stops at depth ``k``, at an end-of-sequence node (never expanded), or as soon as no
frontier node scores above the ``tree_nodes``-th best node so far (nothing deeper could be kept).

Children are the draft's most probable tokens at every temperature (under the request's
temperature/top-k/top-p at T>0), so the tree depends on the draft alone; verification treats each
child as a point-mass proposal (see :mod:`specdec.core.verify.tree`), which keeps T>0 exact whatever the
tree's shape.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ...checks import option
from ...errors import SpecdecError
from ...models.backends.base import Model, common_prefix
from ..sampling import SamplingParams, probabilities
from .base import Draft, Drafter, depth_option, tree_draft
from ..window import WINDOW_AUTO
from .model import Windowed, window_option


@dataclass(frozen=True)
class TreeOptions:
    tree_nodes: int = option(8, lo=1, hi=256, help="tree: most draft tokens per round (the target scores tree_nodes + 1)")
    tree_width: int = option(2, lo=1, hi=64, help="tree: most children per node, and nodes expanded per depth")
    draft_window: int = window_option()
    tree_depth: int | None = depth_option()


@dataclass
class _Node:
    token: int
    parent: int  # index into the candidate list, -1 = the context's last token
    depth: int
    score: float  # log of the cumulative draft probability
    row: int  # which stored draft-logits row the node was chosen from (its parent's)
    fed: int = -1  # its node index in the draft model's open tree, once fed


class TreeDrafter(Windowed, Drafter):
    """Grows a token tree with the draft model (module docstring). ``Draft.parents`` gives the
    shape: node ``i`` hangs under node ``parents[i]`` (-1: under the context's last token), parents
    first; ``Draft.probs`` is None (point-mass proposals) and ``Draft.logits[i]`` is the draft's raw
    logits row that node ``i`` was chosen from (its parent's)."""

    name = "tree"
    requires_model = True
    drafts_with_model = True
    grows_trees = True  # the engine verifies its drafts as a tree, and tree_depth (or a fixed k) is the depth limit
    Options = TreeOptions

    def __init__(self, lm: Model, stop_ids: frozenset[int] = frozenset(), tree_nodes: int = 8, tree_width: int = 2,
                 draft_window: int | str = WINDOW_AUTO):
        self.lm = lm
        self.draft_window = draft_window
        self.stop_ids = stop_ids
        self.tree_nodes, self.tree_width = int(tree_nodes), int(tree_width)
        if self.tree_width > lm.vocab_limit:
            raise SpecdecError(f"tree_width={self.tree_width} exceeds the vocabulary ({lm.vocab_limit} tokens)")
        self._fed_children: dict[tuple[int, int], int] = {}  # (fed parent, token) -> fed node
        self._base: list[int] | None = None  # the context of the last proposal

    @classmethod
    def depth_limit(cls, tree_nodes: int = TreeOptions.tree_nodes, **options) -> int:
        """k=auto: trees grow up to this depth (their own pruning stops them earlier)."""
        return tree_nodes

    @classmethod
    def tree_size(cls, tree_nodes: int = TreeOptions.tree_nodes, **options) -> int:
        return int(tree_nodes)

    @classmethod
    def tree_paths(cls, depth: int, tree_nodes: int = TreeOptions.tree_nodes,
                   tree_width: int = TreeOptions.tree_width, **options) -> tuple[int, int]:
        """The target scores at most ``tree_nodes`` leaves; the draft feeds at most ``tree_width`` per depth."""
        return tree_nodes, tree_width * depth + 1

    def start(self, prompt: Sequence[int]) -> None:
        super().start(prompt)
        self._base = None

    def _ranking(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """``[n, V]`` the distributions children are ranked by: the request's sampling
        distribution at T>0, the draft's softmax at T=0."""
        if params.greedy:
            return torch.softmax(logits, dim=-1)
        return probabilities(logits, params)

    def propose(self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None) -> Draft:
        """Grow the tree (module docstring). With a grammar (``guide``), every draft row is masked
        with the state after its node's path, so children are allowed tokens only (a forbidden token
        has probability 0 and is never a child: disallowed branches are never grown)."""
        with contextlib.nullcontext() if self.guide is None else self.guide.walk() as walk:
            return self._grow(self.view(context), k, params, walk)

    def _masked(self, walk, nodes: list[_Node], node: int, row: torch.Tensor) -> torch.Tensor:
        """``row`` (the draft's logits after ``node``; -1: after the context) masked by the grammar."""
        if walk is None:
            return row
        path = []
        while node >= 0:
            path.append(nodes[node].token)
            node = nodes[node].parent
        walk.to(path[::-1])
        return self.guide.restrict(row)

    def _grow(self, context: Sequence[int], k: int, params: SamplingParams, walk) -> Draft:
        lm, width, budget = self.lm, self.tree_width, self.tree_nodes
        fed = len(context) - min(common_prefix(lm.linear_tokens, context), len(context) - 1)
        nodes: list[_Node] = []
        rows = [self._masked(walk, nodes, -1, lm.tree_logits(context, [], [])[0])]  # [V] after the context
        self._base, self._fed_children = list(context), {}
        expand: list[int] = [-1]  # nodes whose children come next (-1: the context's last token)
        expand_rows = [0]
        for depth in range(1, k + 1):
            dist = self._ranking(torch.stack([rows[r] for r in expand_rows]), params)  # [E, V]
            top = dist.topk(min(width, dist.shape[-1]), dim=-1)
            new = []
            for e, parent in enumerate(expand):
                base_score = 0.0 if parent < 0 else nodes[parent].score
                for prob, token in zip(top.values[e].tolist(), top.indices[e].tolist()):
                    if prob <= 0:
                        break
                    new.append(len(nodes))
                    nodes.append(_Node(token, parent, depth, base_score + math.log(prob), expand_rows[e]))
            if depth == k or not new or self.stopping():
                break
            # the budget-th best score so far: a frontier node at or below it cannot be kept, nor its subtree
            cutoff = sorted((n.score for n in nodes), reverse=True)[budget - 1] if len(nodes) >= budget else -math.inf
            frontier = [i for i in new if nodes[i].token not in self.stop_ids and nodes[i].score > cutoff]
            frontier = sorted(frontier, key=lambda i: -nodes[i].score)[:width]
            if not frontier:
                break
            fed_parents = [nodes[nodes[i].parent].fed if nodes[i].parent >= 0 else -1 for i in frontier]
            out = lm.extend_tree([nodes[i].token for i in frontier], fed_parents)
            assert lm.tree is not None  # extend_tree grows the open tree
            expand, expand_rows = frontier, []
            for j, (i, fed_parent) in enumerate(zip(frontier, fed_parents)):
                nodes[i].fed = len(lm.tree.parents) - len(frontier) + j
                self._fed_children[(fed_parent, nodes[i].token)] = nodes[i].fed
                expand_rows.append(len(rows))
                rows.append(self._masked(walk, nodes, i, out[j]))
        keep = sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, nodes[i].depth, i))[:budget]
        keep.sort(key=lambda i: (nodes[i].depth, i))  # parents first
        where = {old: new for new, old in enumerate(keep)}
        tokens = [nodes[i].token for i in keep]
        parents = [where[nodes[i].parent] if nodes[i].parent >= 0 else -1 for i in keep]
        logits = torch.stack([rows[nodes[i].row] for i in keep]) if keep else None
        return tree_draft(tokens, parents, logits=logits, fed=fed)

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        """Keep the draft cache's entries along the committed path (gathered), drop the rest."""
        lm, context = self.lm, self.view(context)
        if lm.tree is not None and self._base is not None and list(context[: len(self._base)]) == self._base:
            path, node = [], -1
            for token in context[len(self._base):]:
                node = self._fed_children.get((node, token), -2)
                if node == -2:
                    break
                path.append(node)
            lm.keep_path(path)
        lm.truncate(min(common_prefix(lm.linear_tokens, context), len(context) - 1))
