"""What a verification round sees and what it decides, and the contracts of policies and rules.

A *policy* turns a :class:`Round` into a :class:`Verdict`. The engine builds the round from one
target forward pass over ``[last, d_1..d_K]`` and knows nothing about how the decision is made: it
reads only what :class:`Policy` declares (``lossy``, ``needs_hidden``, ``lookahead``,
``verifies_trees``). Loose policies are built from *rules* of two kinds (:class:`TokenRule`,
:class:`WindowRule`), registered by name in :data:`specdec.core.verify.policy.RULES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

import torch

from ..names import AR
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
    #: the request's penalties (repetition/presence/frequency) for logits ``[..., M, V]`` computed
    #: anew for verify rows ``idx`` ``[M]`` (a rule's own LM-head paths); None when none is on.
    #: ``target_logits`` already carry them.
    penalize_rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    #: how many tokens of the answer come before the first draft (the engine's committed count),
    #: for a loose policy's relaxation schedule (:mod:`specdec.core.verify.schedule`); None: unknown
    #: (a round built on its own), and then no schedule applies
    position: int | None = None

    @property
    def k(self) -> int:
        return int(self.draft_tokens.shape[0])

    def positions(self) -> torch.Tensor | None:
        """``[K]`` each draft's position in the answer (0 = its first token); None when unknown."""
        if self.position is None:
            return None
        return torch.arange(self.k, device=self.draft_tokens.device) + self.position


@dataclass(frozen=True)
class Verdict:
    """A round's decision: keep ``accepted`` leading drafts, then emit ``token``.

    ``relaxed`` counts, per loose rule, the kept drafts that the lossless rule alone would have
    rejected (empty for lossless policies). After a token tree, ``path`` names the kept nodes.
    """

    accepted: int
    token: int
    relaxed: Mapping[str, int] = field(default_factory=dict)
    path: tuple[int, ...] | None = None  # a tree round: the kept nodes, root first (``accepted`` of them)


class Policy(Protocol):
    """A verification policy: everything the engine, ``k="auto"`` and the vLLM adapter read of one.

    - ``name``; ``params``: the policy's parameters, defaults included, for the record;
    - ``lossy``: the output can differ from the target's;
    - ``needs_hidden``: the engine must pass the target's final hidden states (``Round.target_hidden``);
    - ``lookahead``: 0 for token-wise policies; ``W > 0`` when a rule judges a draft by the ``W``
      drafts after it (:class:`WindowRule`), so it acts only on blocks of more than ``W`` drafts:
      a fixed ``k <= W`` is refused up front, and ``k="auto"`` drafts at least ``W + 1`` when it drafts;
    - ``lookahead_label`` / ``lookahead_remedy``: how errors name that lookahead and how to shrink it;
    - ``verifies_trees``: :meth:`verify_tree` judges token trees (else only chains are drafted);
    - ``drafts``: it verifies drafts (False only for plain decoding, :class:`Plain`: no drafter runs
      and every round is the target's next token).
    """

    # read-only (properties here): the policies are frozen dataclasses
    @property
    def name(self) -> str: ...

    @property
    def lossy(self) -> bool: ...

    @property
    def needs_hidden(self) -> bool: ...

    @property
    def lookahead(self) -> int: ...

    @property
    def lookahead_label(self) -> str: ...

    @property
    def lookahead_remedy(self) -> str: ...

    @property
    def verifies_trees(self) -> bool: ...

    @property
    def drafts(self) -> bool: ...

    @property
    def params(self) -> dict: ...

    def verify(self, rnd: Round) -> Verdict: ...

    def verify_tree(self, rnd: TreeRound) -> Verdict: ...


class TokenRule(Protocol):
    """A loose rule that judges each draft on its own row (MARS, DropMatch, typical): ``kind =
    "token"``; ``accepts(rnd, where) -> [K] bool`` may accept drafts the lossless rule rejected,
    computed at least where ``where`` is True. Parameters are dataclass fields declared with
    :func:`specdec.checks.option`; ``tune_grid`` names what ``specdec tune`` sweeps."""

    kind: str
    name: str
    needs_hidden: bool

    def accepts(self, rnd: Round, where: torch.Tensor) -> torch.Tensor: ...


class WindowRule(Protocol):
    """A loose rule that judges a mismatch by the drafts after it (FLy's deferred window): ``kind =
    "window"``; ``flips(rnd, accept) -> [K] bool`` turns mismatches into acceptances reading the
    token-wise decisions ``accept``; ``lookahead``: it acts only on blocks longer than this;
    ``lookahead_label`` / ``lookahead_remedy`` for errors. A policy holds at most one."""

    kind: str
    name: str
    needs_hidden: bool
    lookahead: int
    lookahead_label: str
    lookahead_remedy: str

    def flips(self, rnd: Round, accept: torch.Tensor) -> torch.Tensor: ...


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
    lookahead = 0
    lookahead_label = ""
    lookahead_remedy = ""
    verifies_trees = True
    drafts = True

    @property
    def params(self) -> dict:
        return {}

    def verify(self, rnd: Round) -> Verdict:
        accepted = leading_true(lossless_mask(rnd))
        return Verdict(accepted, finish(rnd, accepted))

    def verify_tree(self, rnd: TreeRound) -> Verdict:
        """Greedy matching down the tree at T=0; recursive rejection over siblings at T>0
        (:mod:`specdec.core.verify.tree`)."""
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


@dataclass(frozen=True)
class Plain(Lossless):
    """Plain decoding (``ar``): a policy that drafts nothing, so each round is one target step and
    its next token (the engine runs no drafter for it). The same loop and model wrapper as every
    other policy, so speed comparisons against it are fair."""

    name: str = AR
    verifies_trees = False
    drafts = False
