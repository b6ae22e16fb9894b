"""Fuzzy Speculative Decoding ("Fuzzy Speculative Decoding for a Tunable Accuracy-Runtime
Tradeoff", Holsman, Huang and Dhingra, Findings of ACL 2025, arXiv 2502.20704).

A draft is accepted when the target's and the draft's distributions at its position are close:
``Div(p_i, q_i) <= threshold``, for a divergence ``js``, ``kl`` or ``tv``. The criterion reads the
two distributions, not the draft token itself; the threshold tunes how far the output may drift
from the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...checks import option
from ...errors import SpecdecError
from .base import Round, rule_draft_probs, rule_target_probs
from .divergence import DIVERGENCES, LARGEST


def fuzzy_accept(target_probs: torch.Tensor, draft_probs: torch.Tensor, divergence: str,
                 threshold: float) -> torch.Tensor:
    """``[K]`` bool: ``Div(p_i, q_i) <= threshold``.

    target_probs ``p``, draft_probs ``q``: ``[K, V]``, the target's and the draft's distributions at
    the draft positions. Divergences in nats (:mod:`specdec.core.verify.divergence`):
    ``js``: ``JS(p, q) = KL(p || m) / 2 + KL(q || m) / 2`` with ``m = (p + q) / 2``, in ``[0, ln 2]``;
    ``kl``: ``KL(p || q) = sum p log(p / q)``, target first (as the Secure Speculative Decoding
    re-implementation, YichiCS/Secure-Speculative-Decoding ``securesd/verifier/fsd.py``), in
    ``[0, inf]``; ``tv``: ``sum |p - q| / 2``, in ``[0, 1]``.
    """
    return DIVERGENCES[divergence](target_probs, draft_probs) <= threshold


@dataclass(frozen=True)
class Fuzzy:
    """The ``fuzzy`` token rule: accept a draft where ``Div(p, q) <= threshold`` (:func:`fuzzy_accept`).

    Deviations from the paper, on purpose:

    - The rule only adds acceptances, as every loose rule here: where the lossless rule accepts
      (exact match at T=0, ``min(1, p/q)`` at T>0) the draft stays accepted even when the divergence
      exceeds the threshold (FSD then rejects it), and a rejection resamples from the residual
      ``max(p - q, 0)`` as the lossless rule does. So ``threshold=0`` is lossless, and the relaxed
      counter counts exactly the drafts kept beyond it.
    - Which distributions: at T>0 the request's sampling distributions (after temperature, top-k and
      top-p) of the target and what the draft was drawn from; no draft outside the target's sampling
      support is kept (every loose rule's check). At T=0 both sampling distributions are one-hot, so
      the divergence would only tell exact matches from mismatches; the rule reads the models' own
      softmax (temperature 1) instead, as typical acceptance and DropMatch's JS do.
    - Drafters without a model's distribution (prompt lookup, suffix, n-gram trees) propose a point
      mass ``q`` at the draft: then ``tv`` is ``1 - p(d)`` (accept when the target gives the draft at
      least ``1 - threshold``), ``js`` is finite, and ``kl`` is infinite unless ``p`` is that same
      point mass, so ``fuzzy`` with ``kl`` relaxes nothing for them.
    - A token tree's node is judged against its parent's row with the draft model's softmax at the
      node (at the request's temperature, 1 at T=0; no top-k/top-p), as a tree gives no sampled ``q``.
    - The default threshold (0.1, with ``js``) is ours: the paper sweeps thresholds and names no
      default. A threshold above the divergence's largest value (``ln 2`` for ``js``, 1 for ``tv``)
      is refused: every draft in the support would pass.

    Only positions the lossless rule rejected are evaluated.
    """

    divergence: str = option("js", choices=tuple(DIVERGENCES), help="js | kl | tv: between the target's and the "
                                                                     "draft's distributions")
    threshold: float = option(0.1, lo=0.0, help="accept a draft when the divergence is at most this (nats; js <= "
                                                "ln 2, tv <= 1)")
    #: what ``specdec tune`` sweeps by default (higher = looser)
    tune_grid = {"threshold": (0.05, 0.1, 0.2)}
    name = "fuzzy"
    kind = "token"  # a :class:`~specdec.core.verify.base.TokenRule`
    needs_hidden = False

    def __post_init__(self) -> None:
        top = LARGEST[self.divergence]
        if self.threshold > top:
            raise SpecdecError(f"fuzzy threshold must be a number in [0, {top:.4f}] for divergence {self.divergence} "
                               f"(its largest value), got {self.threshold}")

    def accepts(self, rnd: Round, where: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(where)
        if not bool(where.any()):
            return out
        idx = where.nonzero().squeeze(-1)
        p, q = rule_target_probs(rnd)[idx], rule_draft_probs(rnd)[idx]
        out[idx] = fuzzy_accept(p, q, self.divergence, self.threshold)
        return out
