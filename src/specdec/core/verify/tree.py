"""Verifying a token tree scored in one target pass: walk down from the root, keeping at each node
one child that passes, then emit one more token.

Tree layout (as :class:`specdec.core.drafters.TreeDrafter` makes it): ``N`` nodes, node ``i`` is token
``tokens[i]`` under node ``parents[i]`` (``-1``: the context's last token, the root); parents come
before their children, and siblings are listed best first. ``target_logits`` has ``N + 1`` rows:
row 0 is the target's distribution after the context, row ``i + 1`` the one after node ``i``.

- T=0: the longest path whose every node equals the target's argmax at its parent (token-identical
  to plain greedy decoding), then the argmax at its end.
- T>0: recursive rejection sampling over siblings (SpecInfer, Miao et al., arXiv 2305.09781,
  "multi-step speculative sampling") with point-mass proposals: at a node with target distribution
  ``p``, child ``x`` passes with probability ``p(x) / sum(p)``; on rejection ``p(x)`` is set to 0 and
  the next sibling is tried; when all fail, the token is drawn from what is left of ``p``. This
  samples from ``p`` exactly whatever the siblings are, as long as they depend on the draft alone
  (the tree drafter's children are the draft's top tokens). Deviation from SpecInfer: its siblings
  are i.i.d. draws from the draft distribution ``q`` and are tested with ``min(1, p/q)``; with
  deterministic top-k siblings the point-mass form is the exact one, and a node passes with
  probability ``p``'s mass on its children, the most any exact rule can accept for that set.
- Loose rules (MARS, typical, DropMatch) judge every node against its parent's row, as they judge a
  chain's draft against its position's row; a node the lossless test rejects passes if a rule
  accepts it (exact match is tried first among siblings at T=0). A window rule (FLy's) runs along
  the path and its first-child continuation below the node where the walk stopped
  (:func:`specdec.core.verify.policy.window_extend`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..sampling import SamplingParams, draw


@dataclass
class TreeRound:
    """One tree verification round. ``N`` nodes, vocabulary ``V``, hidden size ``H``."""

    target_logits: torch.Tensor  # [N+1, V] float32: after the context, then after each node
    tokens: torch.Tensor  # [N] int64
    parents: list[int]  # [N] parent node, -1 = the root (the context's last token)
    params: SamplingParams
    generator: torch.Generator | None
    target_probs: torch.Tensor | None = None  # [N+1, V] processed target distributions (T > 0)
    target_hidden: torch.Tensor | None = None  # [N+1, H]
    lm_head: Callable[[torch.Tensor], torch.Tensor] | None = None
    draft_logits: torch.Tensor | None = None  # [N, V] the draft's raw logits each node was chosen from
    #: as :attr:`specdec.core.verify.base.Round.penalize_rows`, rows indexed as ``target_logits``
    penalize_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    #: as :attr:`specdec.core.verify.base.Round.position`: the answer's tokens before the root's children
    position: int | None = None

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    def node_positions(self) -> torch.Tensor | None:
        """``[N]`` each node's position in the answer (a child of the root: ``position``; one level
        down: one more); None when unknown."""
        if self.position is None:
            return None
        depth: list[int] = []
        for parent in self.parents:
            depth.append(0 if parent < 0 else depth[parent] + 1)
        return torch.tensor(depth, dtype=torch.long, device=self.tokens.device) + self.position

    def children(self) -> list[list[int]]:
        """``[N+1]`` lists: entry 0 the root's children, entry ``i + 1`` node ``i``'s, best first."""
        return tree_children(self.parents)

    def node_rows(self) -> torch.Tensor:
        """``[N]`` the target row each node is judged against: its parent's."""
        return torch.tensor(self.parents, dtype=torch.long, device=self.target_logits.device) + 1


def tree_children(parents: list[int]) -> list[list[int]]:
    """Children lists from parent indices: entry 0 for the root, entry ``i + 1`` for node ``i``."""
    out: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        out[parent + 1].append(node)
    return out


def tree_depth(parents: list[int]) -> int:
    """The longest root-to-leaf path's number of nodes (0 for an empty tree)."""
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return max(depth, default=0)


@dataclass
class Walk:
    """A walk's outcome: the kept path (node indices, root first), which of its nodes a loose rule
    kept (``loose[j]`` for ``path[j]``), the emitted token, and the siblings tried and rejected at the
    path's end (their tokens leave the T>0 residual)."""

    path: list[int]
    loose: list[bool]
    token: int
    rejected: list[int]


def walk_tree(rnd: TreeRound, extra: torch.Tensor | None = None) -> Walk:
    """Greedy matching (T=0) or recursive rejection over siblings with point-mass proposals (T>0)
    down the tree; ``extra`` ``[N]`` bool marks nodes a loose rule accepts when the lossless test
    rejects them (module docstring)."""
    kids = rnd.children()
    tokens = rnd.tokens.tolist()
    extra_list = extra.tolist() if extra is not None else [False] * rnd.n
    path: list[int] = []
    loose: list[bool] = []
    node = -1
    while True:
        options = kids[node + 1]
        chosen, by_rule, rejected = None, False, []
        if rnd.params.greedy:
            best = int(rnd.target_logits[node + 1].argmax())
            chosen = next((c for c in options if tokens[c] == best), None)
            if chosen is None:
                chosen = next((c for c in options if extra_list[c]), None)
                by_rule = chosen is not None
            if chosen is None:
                return Walk(path, loose, best, list(options))
        else:
            assert rnd.target_probs is not None
            p = rnd.target_probs[node + 1].clone()
            for c in options:
                mass = float(p.sum())
                u = float(torch.rand((), generator=rnd.generator, device=p.device))
                if mass > 0 and u * mass < float(p[tokens[c]]):
                    chosen = c
                    break
                if extra_list[c]:
                    chosen, by_rule = c, True
                    break
                rejected.append(c)
                p[tokens[c]] = 0.0
            if chosen is None:
                if float(p.sum()) <= 0:  # the siblings held all of p's mass and all were rejected: impossible but for rounding
                    p = rnd.target_probs[node + 1]
                return Walk(path, loose, int(draw((p / p.sum())[None], rnd.generator)[0]), rejected)
        path.append(chosen)
        loose.append(by_rule)
        node = chosen


def first_child_chain(parents: list[int], start: int) -> list[int]:
    """Nodes from ``start``'s first child down through first children to a leaf (``start=-1``: from
    the root)."""
    kids = tree_children(parents)
    out, node = [], start
    while kids[node + 1]:
        node = kids[node + 1][0]
        out.append(node)
    return out
