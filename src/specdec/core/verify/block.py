"""Block verification: the K drafts of a chain judged jointly instead of token by token.

Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh, "Block Verification Accelerates
Speculative Decoding" (ICLR 2025, arXiv 2403.10444), Algorithm 2. Exact (the output follows the
target's distribution) and never accepts fewer drafts in expectation than token-wise speculative
sampling; optimal among rules that read only the drafted path's probabilities. vLLM ships it as
``rejection_sample_method="block"``.

With drafts ``X_1..X_K``, target rows ``P_1..P_{K+1}`` and draft rows ``Q_1..Q_K``:

- ``w_0 = 1``, ``w_i = min(1, w_{i-1} P_i(X_i) / Q_i(X_i))`` (a point-mass ``Q`` when the drafter
  has no probabilities, as prompt lookup: ``Q_i(X_i) = 1``);
- for ``i < K``: ``Z_i = sum_x max(w_i P_{i+1}(x) - Q_{i+1}(x), 0)`` and
  ``h_i = Z_i / (Z_i + 1 - w_i)`` (1 when the denominator is 0); ``h_K = w_K``;
- with ``eta_i ~ U(0, 1)``, keep ``tau`` = the largest ``i`` with ``eta_i <= h_i`` (0 if none);
- the next token: from ``P_{K+1}`` when ``tau = K``, else from
  ``norm(max(w_tau P_{tau+1} - Q_{tau+1}, 0))`` (at ``tau = 0`` the usual residual).

At T=0 the rule is greedy exact match, as the lossless policy's (the paper's rule is for
sampling; with one-hot target rows it keeps the same prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import draw
from .base import Lossless, Round, Verdict
from .lossless import point_mass


def block_weights(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """``[K+1]`` the weights ``w_0 = 1, w_1..w_K`` (module docstring). target_probs ``[K+1, V]``,
    draft_probs ``[K, V]``, draft_tokens ``[K]``."""
    p = target_probs[:-1].gather(-1, draft_tokens[:, None]).squeeze(-1).double()  # [K]
    q = draft_probs.gather(-1, draft_tokens[:, None]).squeeze(-1).double()
    ratio = torch.where(q > 0, p / q.clamp_min(1e-300), (p > 0).double())  # a draft q never proposes: p > 0 passes
    w = [torch.ones((), dtype=torch.float64, device=p.device)]
    for i in range(p.shape[0]):
        w.append(torch.clamp(w[-1] * ratio[i], max=1.0))
    return torch.stack(w)


def block_accept(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                 uniforms: torch.Tensor) -> tuple[int, float]:
    """``(tau, w_tau)``: how many drafts block verification keeps, and the weight that scales the
    residual at ``tau``. uniforms: ``[K]`` in [0, 1)."""
    k = draft_tokens.shape[0]
    w = block_weights(target_probs, draft_probs, draft_tokens)  # [K+1]
    tau = 0
    for i in range(1, k + 1):
        if i < k:
            z = float((w[i] * target_probs[i].double() - draft_probs[i].double()).clamp_min(0).sum())
            denom = z + 1.0 - float(w[i])
            h = z / denom if denom > 0 else 1.0
        else:
            h = float(w[k])
        if float(uniforms[i - 1]) <= h:
            tau = i
    return tau, float(w[tau])


def block_residual(target_row: torch.Tensor, draft_row: torch.Tensor, weight: float) -> torch.Tensor:
    """``norm(max(w P - Q, 0))``: what the token after a partial block is drawn from. Falls back to
    ``P`` itself when that has no mass (a rejection of probability zero, up to rounding)."""
    res = (weight * target_row.double() - draft_row.double()).clamp_min(0.0)
    total = res.sum()
    if not torch.isfinite(total) or total <= 0:
        return target_row
    return (res / total).to(target_row.dtype)


@dataclass(frozen=True)
class Block(Lossless):
    """Block verification (Sun et al., arXiv 2403.10444; module docstring): lossless, for chains.
    T=0: greedy exact match, :class:`~specdec.core.verify.base.Lossless`'s own path."""

    name: str = "block"
    verifies_trees = False  # chains only: the joint rule is defined on one drafted path

    def verify_tree(self, rnd):
        raise NotImplementedError("block verification verifies chains only")

    def verify(self, rnd: Round) -> Verdict:
        if rnd.params.greedy:
            return super().verify(rnd)
        assert rnd.target_probs is not None
        p = rnd.target_probs
        q = rnd.draft_probs if rnd.draft_probs is not None else point_mass(rnd.draft_tokens, p.shape[-1])
        uniforms = torch.rand(rnd.k, generator=rnd.generator, device=p.device, dtype=p.dtype)
        tau, weight = block_accept(p, q, rnd.draft_tokens, uniforms)
        row = p[tau] if tau == rnd.k else block_residual(p[tau], q[tau], weight)
        return Verdict(tau, int(draw(row[None], rnd.generator)[0]))

