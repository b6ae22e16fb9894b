"""What a verification round sees and what it decides.

A *policy* turns a :class:`Round` into a :class:`Verdict`. The engine builds the round from one
target forward pass over ``[last, d_1..d_K]`` and knows nothing about how the decision is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

import torch

from ..sampling import SamplingParams, draw
from .lossless import greedy_accept, leading_true, point_mass, residual, sampling_accept
from .tree import TreeRound, walk_tree


@dataclass
class Round:
    """One verification round's tensors. ``K`` drafts, vocabulary ``V``, hidden size ``H``."""

    target_logits: torch.Tensor  # [K+1, V] float32, raw logits of the target
    draft_tokens: torch.Tensor  # [K] int64
    draft_probs: torch.Tensor | None  # [K, V] the distributions drafts were drawn from; None = one-hot
    params: SamplingParams
    generator: torch.Generator | None
    target_probs: torch.Tensor | None = None  # [K+1, V] processed target distributions (T > 0)
    target_hidden: torch.Tensor | None = None  # [K+1, H] final hidden states, when a rule asks for them
    lm_head: Callable[[torch.Tensor], torch.Tensor] | None = None  # [..., H] -> [..., V] float32
    draft_logits: torch.Tensor | None = None  # [K, V] the draft model's raw logits (None for lookup)

    @property
    def k(self) -> int:
        return int(self.draft_tokens.shape[0])


@dataclass(frozen=True)
class Verdict:
    """A round's decision: keep ``accepted`` leading drafts, then emit ``token``.

    ``relaxed`` counts, per loose rule, the kept drafts that the lossless rule alone would have
    rejected (empty for lossless policies). After a token tree, ``path`` names the kept nodes.
    ``inner``: for a policy with FLy's window, the leading drafts the round would have kept without
    the window (what ``k="auto"`` expects of blocks too short for the window to act); else None.
    """

    accepted: int
    token: int
    relaxed: Mapping[str, int] = field(default_factory=dict)
    path: tuple[int, ...] | None = None  # a tree round: the kept nodes, root first (``accepted`` of them)
    inner: int | None = None


class Policy(Protocol):
    """A verification policy. ``lossy`` marks policies whose output can differ from the target's;
    ``needs_hidden`` asks the engine for the target's final hidden states; ``params`` are the
    policy's parameters, defaults included, for the record."""

    name: str
    lossy: bool
    needs_hidden: bool
    params: dict

    def verify(self, rnd: Round) -> Verdict: ...

    # policies that can verify token trees also have: def verify_tree(self, rnd: TreeRound) -> Verdict


def lossless_mask(rnd: Round) -> torch.Tensor:
    """``[K]`` bool: which drafts the lossless rule accepts (exact match at T=0, ``min(1, p/q)`` else)."""
    if rnd.params.greedy:
        return greedy_accept(rnd.target_logits, rnd.draft_tokens)
    assert rnd.target_probs is not None
    uniforms = torch.rand(
        rnd.k, generator=rnd.generator, device=rnd.target_probs.device, dtype=rnd.target_probs.dtype
    )
    return sampling_accept(rnd.target_probs, rnd.draft_probs, rnd.draft_tokens, uniforms)


def finish(rnd: Round, accepted: int) -> int:
    """The token emitted after ``accepted`` kept drafts: recovered at a rejection, bonus otherwise.

    T=0: the target's argmax at that position. T>0: a draw from the residual ``norm(max(p - q, 0))``
    at a rejection, from ``p_{K+1}`` for the bonus.
    """
    if rnd.params.greedy:
        return int(rnd.target_logits[accepted].argmax())
    assert rnd.target_probs is not None
    row = rnd.target_probs[accepted]
    if accepted < rnd.k:
        q_row = None if rnd.draft_probs is None else rnd.draft_probs[accepted]
        row = residual(row, q_row, int(rnd.draft_tokens[accepted]))
    return int(draw(row[None], rnd.generator)[0])


@dataclass(frozen=True)
class Lossless:
    """Greedy exact match at T=0; Leviathan/Chen speculative sampling at T>0. Output distribution
    equals the target's exactly (token-identical to plain greedy decoding at T=0)."""

    name: str = "lossless"
    lossy: bool = False
    needs_hidden: bool = False

    @property
    def params(self) -> dict:
        return {}

    def verify(self, rnd: Round) -> Verdict:
        accepted = leading_true(lossless_mask(rnd))
        return Verdict(accepted, finish(rnd, accepted))

    def verify_tree(self, rnd: TreeRound) -> Verdict:
        """Greedy matching down the tree at T=0; recursive rejection over siblings at T>0
        (:mod:`specdec.verify.tree`)."""
        walk = walk_tree(rnd)
        return Verdict(len(walk.path), walk.token, path=tuple(walk.path))


def rule_target_probs(rnd: Round) -> torch.Tensor:
    """``[K+1, V]`` the target distributions loose criteria read: the sampling distribution at T>0,
    the model's own softmax (temperature 1) at T=0, where the sampling distribution is one-hot."""
    if rnd.params.greedy or rnd.target_probs is None:
        return torch.softmax(rnd.target_logits, dim=-1)
    return rnd.target_probs


def rule_draft_probs(rnd: Round) -> torch.Tensor:
    """``[K, V]`` the draft's distributions: what drafts were drawn from at T>0, the draft model's
    softmax at T=0, and one-hot at the drafts for drafters without a model (prompt lookup)."""
    if not rnd.params.greedy and rnd.draft_probs is not None:
        return rnd.draft_probs
    if rnd.draft_logits is not None:
        t = rnd.params.temperature if rnd.params.temperature > 0 else 1.0
        return torch.softmax(rnd.draft_logits / t, dim=-1)
    return point_mass(rnd.draft_tokens, rnd.target_logits.shape[-1])
