"""Divergences between distributions along the last axis, in nats: what DropMatch's JS criterion
and Fuzzy Speculative Decoding compare. ``0 log 0 = 0`` throughout (``torch.special.xlogy``)."""

from __future__ import annotations

import math

import torch


def kl_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum p log(p / q)``: 0 for equal rows, ``+inf`` where ``q`` is 0 and ``p`` is not."""
    return (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(dim=-1)


def js_divergence(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence ``KL(a || m) / 2 + KL(b || m) / 2``, ``m = (a + b) / 2``: in
    ``[0, ln 2]``, finite for any pair (point masses included)."""
    mid = 0.5 * (a + b)
    return 0.5 * kl_divergence(a, mid) + 0.5 * kl_divergence(b, mid)


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation ``sum |p - q| / 2``: in ``[0, 1]``; against a point mass at ``d``, ``1 - p(d)``."""
    return 0.5 * (p - q).abs().sum(dim=-1)


#: by name, each with its largest value (a threshold at or above it accepts every pair)
DIVERGENCES = {"js": js_divergence, "kl": kl_divergence, "tv": tv_distance}
LARGEST = {"js": math.log(2.0), "kl": math.inf, "tv": 1.0}
