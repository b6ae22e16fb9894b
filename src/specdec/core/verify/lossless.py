"""Lossless verification: greedy exact match and Leviathan/Chen speculative sampling.

Vocabulary (as in vLLM's rejection sampler): a round's output tokens = accepted draft tokens +
one *recovered* token (at the first rejection) or one *bonus* token (when all drafts pass).

Shapes: ``K`` drafted tokens, vocabulary ``V``; the target scored ``[last, d_1..d_K]`` and so
gives ``K + 1`` rows, row ``i`` being the distribution for the token after ``d_1..d_i``.
"""

from __future__ import annotations

import torch


def greedy_accept(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """Exact match (Leviathan et al. 2023, greedy case): ``d_i`` passes iff ``d_i == argmax p_i``.

    target_logits: ``[K+1, V]``; draft_tokens: ``[K]``. Returns ``[K]`` bool. Ties in the argmax go
    to the lowest token id (``torch.argmax``), the same rule plain greedy decoding uses here.
    """
    return target_logits[:-1].argmax(-1) == draft_tokens


def sampling_accept(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): ``d_i`` passes iff
    ``u_i < p_i(d_i) / q_i(d_i)``, i.e. with probability ``min(1, p/q)``.

    target_probs: ``[K+1, V]``; draft_probs: ``[K, V]`` or None for a drafter without probabilities
    (prompt lookup), which is a one-hot ``q``; draft_tokens: ``[K]``; uniforms: ``[K]`` in [0, 1).
    Written as ``u * q < p`` so that no division happens.
    """
    p_d = target_probs[:-1].gather(-1, draft_tokens[:, None]).squeeze(-1)  # [K]
    if draft_probs is None:
        return uniforms < p_d
    q_d = draft_probs.gather(-1, draft_tokens[:, None]).squeeze(-1)  # [K]
    return uniforms * q_d < p_d


def residual(
    target_row: torch.Tensor, draft_row: torch.Tensor | None, draft_token: int
) -> torch.Tensor:
    """The distribution a rejected position resamples from: ``norm(max(p - q, 0))``.

    target_row: ``[V]``; draft_row: ``[V]`` or None (one-hot ``q`` at ``draft_token``). Falls back
    to ``p`` itself if the residual has no mass (only possible when ``p == q`` up to rounding, in
    which case the rejection had probability zero).
    """
    if draft_row is None:
        res = target_row.clone()
        res[draft_token] = 0.0
    else:
        res = (target_row - draft_row).clamp_min_(0.0)
    total = res.sum()
    if not torch.isfinite(total) or total <= 0:
        return target_row
    return res / total


def point_mass(draft_tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[K, V]`` one-hot rows at the drafts: the ``q`` of a drafter without probabilities."""
    out = torch.zeros(draft_tokens.shape[0], vocab, dtype=torch.float32, device=draft_tokens.device)
    return out.scatter_(-1, draft_tokens[:, None], 1.0)


def leading_true(mask: torch.Tensor) -> int:
    """Number of leading ``True`` in a 1-D bool mask: how many drafts the round keeps."""
    if mask.numel() == 0:
        return 0
    return int(mask.to(torch.int64).cumprod(0).sum())
