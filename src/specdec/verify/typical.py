"""Typical acceptance (Medusa, Cai et al. 2024; vLLM V0 ``typical_acceptance_sampler.py``).

A training-free lossy anchor: accept ``d`` when ``p(d) > min(epsilon, delta * exp(-H(p)))``.
"""

from __future__ import annotations

import torch


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each row of ``probs [K, V]`` -> ``[K]``; ``0 log 0 = 0``."""
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


def typical_accept(probs: torch.Tensor, draft_tokens: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """``[K]`` bool: ``p_i(d_i) > min(epsilon, delta * exp(-H(p_i)))``.

    probs: ``[K, V]`` the target's distributions at the draft positions. Deviation: at T=0 the
    sampling distribution is one-hot, which would make the rule exact match; we use the model's own
    softmax (temperature 1) there, as Medusa's greedy-typical setting effectively does.
    """
    threshold = torch.clamp(delta * torch.exp(-entropy(probs)), max=epsilon)  # [K]
    p_d = probs.gather(-1, draft_tokens[:, None]).squeeze(-1)  # [K]
    return p_d > threshold
