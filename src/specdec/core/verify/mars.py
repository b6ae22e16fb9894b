"""MARS: margin-aware speculative verification ("MARS: Unleashing the Power of Speculative Decoding
via Margin-Aware Verification", Song, Wang et al., Algorithm 1; code github 5SSjw/MARS).

A draft that is the target's top-2 token is accepted when the target barely prefers its top-1:
the ratio of raw logits ``r = z_(2) / z_(1)`` exceeds ``theta``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...checks import option
from .base import Round


def mars_accept(target_logits: torch.Tensor, draft_tokens: torch.Tensor, theta: float) -> torch.Tensor:
    """``[K]`` bool: ``d_i`` is the target's top-1 or top-2 token and ``z_(2) / z_(1) > theta``.

    target_logits: ``[K, V]`` raw logits at the draft positions; draft_tokens: ``[K]``.

    Deviations, on purpose:
    - Guard: relax only when ``z_(1) > 0``. With both top logits negative the ratio exceeds 1 and
      the reference code relaxes every such position; the paper assumes positive top logits.
    - The rule only adds acceptances. At T=0 this is the paper's Algorithm 1 (top-1, else top-2 when
      ``r > theta``). At T>0 the reference code accepts a top-1/top-2 draft when ``r > theta`` and
      otherwise uses ``min(1, p/q)``, but it also *rejects* a draft outside the top-2 whenever
      ``r > theta``; here such a draft keeps its lossless chance.
    - ``r`` uses raw logits; temperature scales both and leaves the ratio unchanged.
    """
    values, indices = target_logits.topk(2, dim=-1)  # [K, 2]
    z1, z2 = values[:, 0], values[:, 1]
    relax = (z1 > 0) & (z2 > theta * z1)  # == z2 / z1 > theta, without dividing, for z1 > 0
    in_top2 = (indices == draft_tokens[:, None]).any(dim=-1)
    return relax & in_top2


@dataclass(frozen=True)
class Mars:
    """The ``mars`` token rule: accept a top-2 draft when ``z_(2) / z_(1) > theta`` (:func:`mars_accept`)."""

    theta: float = option(0.9, lo=0.0, hi=1.0, help="accept a top-2 draft when z2/z1 exceeds this")
    #: what ``specdec tune`` sweeps by default (lower = looser)
    tune_grid = {"theta": (0.8, 0.9, 0.95)}
    name = "mars"
    kind = "token"  # a :class:`~specdec.core.verify.base.TokenRule`
    needs_hidden = False

    def accepts(self, rnd: Round, where: torch.Tensor) -> torch.Tensor:
        return mars_accept(rnd.target_logits[:-1], rnd.draft_tokens, self.theta) & where
