"""Drafting with a smaller model that shares the target's tokenizer, with its own KV cache."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch

from ..checks import check_options, option
from ..backends.base import Model, common_prefix
from ..sampling import SamplingParams, draw, probabilities
from .base import Draft, Drafter


def guided(guide):
    """``guide.trial()`` (the guide is rolled back on leaving), or nothing without a grammar."""
    return contextlib.nullcontext() if guide is None else guide.trial()


def min_confidence_option():
    return option(0.0, lo=0, hi=1, hi_open=True,
                  help="model, model+pld: stop a draft after a token the draft gave less than this probability, "
                       "so a large -k costs little")


@dataclass(frozen=True)
class ModelOptions:
    min_confidence: float = min_confidence_option()


class ModelDrafter(Drafter):
    """Runs the draft model autoregressively for up to ``k`` tokens (greedy at T=0, else sampled
    with the same temperature/top-k/top-p, keeping each step's distribution as ``q``).

    Stops early at an end-of-sequence token (nothing after it could be used), and, with
    ``min_confidence > 0``, after a token the draft itself gave less than that probability
    (softmax at temperature 1): later drafts are unlikely to survive, so the round verifies now.
    This is transformers' ``assistant_confidence_threshold`` idea; it lets ``k`` be large.
    """

    name = "model"
    needs_model = True
    Options = ModelOptions

    def __init__(self, lm: Model, stop_ids: frozenset[int] = frozenset(), min_confidence: float = 0.0):
        check_options(f"drafter {self.name!r}", ModelOptions, {"min_confidence": min_confidence})
        self.lm = lm
        self.stop_ids = stop_ids
        self.min_confidence = float(min_confidence)

    def unsure(self, logits: torch.Tensor, token: int) -> bool:
        """True when the draft gave ``token`` less than ``min_confidence`` (off at 0)."""
        if self.min_confidence <= 0:
            return False
        return float(torch.softmax(logits, dim=-1)[token]) < self.min_confidence

    def start(self, prompt: Sequence[int]) -> None:
        """Forget the last generation. The prompt is prefilled lazily, by the first :meth:`propose`
        (``logits_for`` feeds what the cache lacks): a generation that never drafts (k=auto at K=0)
        never pays the draft's prefill."""
        self.lm.reset()

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        """With a grammar (``guide``), each step's logits are masked by it first, so ``q`` is the
        masked draft distribution; the guide advances along the drafts and is rolled back after."""
        with guided(self.guide):
            return self._propose(context, k, params, generator)

    def _propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        fed = len(context) - min(common_prefix(self.lm.linear_tokens, context), len(context) - 1)
        logits = self.lm.logits_for(context, 1)[0]  # [V]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        raw: list[torch.Tensor] = []
        for i in range(k):
            if self.guide is not None:
                logits = self.guide.restrict(logits)
            raw.append(logits)
            if params.greedy:
                token = int(logits.argmax())
            else:
                q = probabilities(logits[None], params)  # [1, V]
                token = int(draw(q, generator)[0])
                rows.append(q[0])
            tokens.append(token)
            if i == k - 1 or token in self.stop_ids or self.unsure(logits, token):
                break
            if self.guide is not None:
                self.guide.advance([token])
            logits = self.lm.forward([token])[0]
        return Draft(tokens, torch.stack(rows) if rows else None, torch.stack(raw), fed=fed)

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        self.lm.truncate(min(common_prefix(self.lm.linear_tokens, context), len(context) - 1))
