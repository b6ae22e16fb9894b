"""FLy: entropy gate + deferred window ("Training-Free Loosely Speculative Decoding: Accepting
Semantically Correct Drafts Beyond Exact Match", ICLR 2026, OpenReview JjoTg34YiU; code github
AMD-AGI/FLy, ``fly/models/FLy.py``).

A mismatch at draft position ``i`` (0-based) is accepted when the target is unsure there and then
agrees with the draft's continuation for the rest of a window: the target "did not self-correct".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...checks import option
from ...draftlength import MAX_CHAIN
from .base import Round


def topk_entropy(logits: torch.Tensor, k: int = 3) -> torch.Tensor:
    """``-sum_{top-k} p log p`` over the top-``k`` probabilities of the full softmax: ``[K, V] -> [K]``.

    This is the reference code's gate (``calculate_topk_entropy(logits, 3)``, threshold 0.3). The
    paper describes a normalized entropy instead; the code's form is what the defaults were tuned
    with, so we follow the code. The top-``k`` probabilities sum to at most 1, so its maximum is
    ``ln k`` (1.0986 for k = 3, all three at 1/3): ``theta > ln 3`` turns the gate (and the rule) off.
    """
    log_p = torch.log_softmax(logits.float(), dim=-1)
    top = log_p.topk(k, dim=-1).values  # [K, k]
    terms = torch.where(top > float("-inf"), top.exp() * top, 0.0)  # 0 log 0 = 0: fewer than k finite logits
    return -terms.sum(dim=-1)


def fly_flips(accept: torch.Tensor, gate_entropy: torch.Tensor, theta: float, window: int) -> torch.Tensor:
    """``[K]`` bool: the mismatches FLy turns into acceptances.

    accept: ``[K]`` what the per-token rule accepted; gate_entropy: ``[K]`` (see :func:`topk_entropy`).
    Position ``i`` flips iff ``not accept[i]``, ``gate_entropy[i] >= theta``, drafts
    ``i+1 .. i+window-1`` were all accepted, and ``i + window < K``.

    Semantics of the reference code, kept on purpose: the window needs ``window - 1`` later
    acceptances (vLLM's port needs ``window``); the last ``window`` positions never flip (the window
    must fit inside the draft block); the window reads the per-token decisions before any flip, so
    two mismatches closer than the window block each other; several far-apart mismatches in one
    block can each flip.
    """
    k = accept.shape[0]
    flips = torch.zeros_like(accept)
    if window < 1 or k <= window:
        return flips
    ok = accept.tolist()
    gate = (gate_entropy >= theta).tolist()
    for i in range(k - window):
        if not ok[i] and gate[i] and all(ok[i + 1 : i + window]):
            flips[i] = True
    return flips


@dataclass(frozen=True)
class Fly:
    """The ``fly`` window: FLy's entropy gate + deferred window over the block (:func:`fly_flips`)."""

    theta: float = option(0.3, lo=0.0, help="top-3 entropy gate; lower mismatches are rejected")
    #: a fixed k must exceed the window for the rule to act, and k is at most MAX_K (:mod:`specdec.draftlength`)
    window: int = option(6, lo=1, hi=MAX_CHAIN, help="a mismatch needs window-1 later agreements in the block")
    #: what ``specdec tune`` sweeps by default (higher theta = stricter gate; a longer window defers more)
    tune_grid = {"theta": (0.3, 0.5, 0.8), "window": (3, 6)}
    name = "fly"
    kind = "window"  # a :class:`~specdec.core.verify.base.WindowRule`
    needs_hidden = False

    @property
    def lookahead(self) -> int:
        """A mismatch flips only with ``window`` drafts after it in the block (:func:`fly_flips`)."""
        return self.window

    @property
    def lookahead_label(self) -> str:
        return f"FLy's window ({self.window})"

    @property
    def lookahead_remedy(self) -> str:
        return "or a smaller fly window (FLy's reference uses k=15)"

    def flips(self, rnd: Round, accept: torch.Tensor) -> torch.Tensor:
        return fly_flips(accept, topk_entropy(rnd.target_logits[:-1]), self.theta, self.window)
