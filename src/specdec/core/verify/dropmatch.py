"""DropMatch: MC dropout on the target's LM head ("Training-free Dropout Sampling for Semantic Token
Acceptance in Speculative Decoding"). No public code exists;
this is our reading of the paper, and each guess is marked below.

N dropout paths over the target's final hidden states (after the final norm, before the LM head)
give N alternative next-token predictions from ONE transformer pass; a draft consistent with that
cluster is accepted. Tokens the target's row puts at -inf (structured output's grammar mask) are
out of every path too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ...checks import option
from .base import Round, rule_draft_probs
from .divergence import js_divergence

CRITERIA = ("naive", "js", "majority", "paper")


def dropout_logits(
    hidden: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor], paths: int, p: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """``[N, M, V]`` logits of ``N = paths`` dropout paths for hidden states ``[M, H]``.

    Masks are i.i.d. Bernoulli(1 - p) per path, position and unit, with inverted-dropout scaling
    ``h * m / (1 - p)`` (paper Eq. 1-2). All ``N * M`` rows go through the LM head in one matmul.
    """
    m, h = hidden.shape
    keep = torch.rand((paths, m, h), generator=generator, device=hidden.device) >= p  # [N, M, H]
    dropped = hidden[None] * keep.to(hidden.dtype) / (1.0 - p)  # [N, M, H]
    return lm_head(dropped.reshape(paths * m, h)).reshape(paths, m, -1)


def path_tokens(path_logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """``[N, M]``: each path's token: argmax at T=0, else a draw from ``softmax(z / T)``."""
    if temperature == 0:
        return path_logits.argmax(dim=-1)
    n, m, v = path_logits.shape
    probs = torch.softmax(path_logits.reshape(n * m, v) / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).reshape(n, m)


def naive_accept(tokens: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """Eq. 4: ``d`` equals some path's token. tokens ``[N, M]``, draft_tokens ``[M]`` -> ``[M]``."""
    return (tokens == draft_tokens[None]).any(dim=0)


def majority_accept(tokens: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """Eq. 7: ``d`` is the paths' majority token. Guess: a strict majority (more than N/2 paths);
    the paper's text does not say how a plurality below half is treated."""
    votes = (tokens == draft_tokens[None]).sum(dim=0)  # [M]
    return 2 * votes > tokens.shape[0]


def js_accept(path_logits: torch.Tensor, draft_dist: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. 5-6: ``JS(q, c) <= max_n JS(softmax(z_n), c)`` with centroid ``c = softmax(mean_n z_n)``.

    path_logits ``[N, M, V]``, draft_dist ``[M, V]`` (the draft's distribution q) -> ``[M]``.
    Distributions use temperature ``T`` (1 at T=0).
    """
    t = temperature if temperature > 0 else 1.0
    paths = torch.softmax(path_logits / t, dim=-1)  # [N, M, V]
    centroid = torch.softmax(path_logits.mean(dim=0) / t, dim=-1)  # [M, V]
    spread = js_divergence(paths, centroid[None]).amax(dim=0)  # [M]
    return js_divergence(draft_dist, centroid) <= spread


@dataclass(frozen=True)
class DropMatch:
    """The ``dropmatch`` token rule: ``paths`` MC-dropout LM-head paths with dropout ``p``;
    criterion ``naive`` (any path's token), ``js`` (JS divergence to the paths' centroid),
    ``majority`` (more than half of the paths) or ``paper`` (js or majority, the paper's
    Algorithm 1). ``p = 0`` means no dropout, so no path differs from the target and the rule adds
    nothing (at any temperature).

    Only positions the lossless rule rejected are evaluated, so a round the lossless rule accepts
    whole costs nothing extra; otherwise one LM-head matmul over paths x those positions."""

    paths: int = option(5, lo=1, hi=64, help="MC-dropout paths on the LM head")
    p: float = option(0.1, lo=0.0, hi=1.0, hi_open=True, help="dropout probability")
    criterion: str = option("paper", choices=CRITERIA, help="naive | js | majority | paper (= js or majority)")
    #: what ``specdec tune`` sweeps by default (higher p = looser; majority is stricter than paper)
    tune_grid = {"p": (0.05, 0.1, 0.2), "criterion": ("paper", "majority")}
    name = "dropmatch"
    kind = "token"  # a :class:`~specdec.core.verify.base.TokenRule`
    needs_hidden = True

    def accepts(self, rnd: Round, where: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(where)
        if self.p == 0 or not bool(where.any()):
            return out
        if rnd.target_hidden is None or rnd.lm_head is None:
            raise RuntimeError("dropmatch needs the target's hidden states and LM head")
        idx = where.nonzero().squeeze(-1)  # [M]
        logits = dropout_logits(rnd.target_hidden[idx], rnd.lm_head, self.paths, self.p, rnd.generator)  # [N, M, V]
        if rnd.penalize_rows is not None:  # the paths judge against the penalised law, as the target's row does
            logits = rnd.penalize_rows(logits, idx)
        # a token the target's row rules out (-inf: structured output forbids it there) is out of every path
        logits = logits.masked_fill(torch.isneginf(rnd.target_logits[idx])[None], float("-inf"))
        drafts = rnd.draft_tokens[idx]
        temperature = rnd.params.temperature
        ok = torch.zeros_like(drafts, dtype=torch.bool)
        if self.criterion in ("naive", "majority", "paper"):
            tokens = path_tokens(logits, temperature, rnd.generator)  # [N, M]
            ok |= naive_accept(tokens, drafts) if self.criterion == "naive" else majority_accept(tokens, drafts)
        if self.criterion in ("js", "paper"):
            ok |= js_accept(logits, rule_draft_probs(rnd)[idx], temperature)
        out[idx] = ok
        return out
