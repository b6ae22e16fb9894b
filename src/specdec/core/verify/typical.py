"""Typical acceptance ("Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads", Cai et al. 2024, arXiv 2401.10774; vLLM V0 ``typical_acceptance_sampler.py``).

A training-free lossy anchor: accept ``d`` when ``p(d) > min(epsilon, delta * exp(-H(p)))``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...checks import option
from .base import Round, rule_target_probs


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each row of ``probs [K, V]`` -> ``[K]``; ``0 log 0 = 0``."""
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


def typical_accept(probs: torch.Tensor, draft_tokens: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """``[K]`` bool: ``p_i(d_i) > min(epsilon, delta * exp(-H(p_i)))``.

    probs: ``[K, V]`` the target's distributions at the draft positions. Deviation: at T=0 the
    sampling distribution is one-hot and Medusa falls back to exact match; we read the model's own
    softmax (temperature 1) there instead, so the rule still relaxes at T=0.
    """
    threshold = torch.clamp(delta * torch.exp(-entropy(probs)), max=epsilon)  # [K]
    p_d = probs.gather(-1, draft_tokens[:, None]).squeeze(-1)  # [K]
    return p_d > threshold


@dataclass(frozen=True)
class Typical:
    """The ``typical`` token rule: ``p(d) > min(epsilon, delta * exp(-H(p)))`` (:func:`typical_accept`)."""

    epsilon: float = option(0.09, lo=0.0, hi=1.0, help="p(d) > min(epsilon, delta*exp(-H))")
    delta: float = option(0.3, lo=0.0, help="see epsilon")
    #: what ``specdec tune`` sweeps by default (higher = stricter; delta governs where entropy is low)
    tune_grid = {"epsilon": (0.09, 0.3), "delta": (0.3, 0.6, 0.9)}
    name = "typical"
    kind = "token"  # a :class:`~specdec.core.verify.base.TokenRule`
    needs_hidden = False

    def accepts(self, rnd: Round, where: torch.Tensor) -> torch.Tensor:
        probs = rule_target_probs(rnd)[:-1]
        return typical_accept(probs, rnd.draft_tokens, self.epsilon, self.delta) & where
