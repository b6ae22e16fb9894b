"""Drafting with a smaller model that shares the target's tokenizer, with its own KV cache."""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import SpecdecError
from ..models import CausalLM, common_prefix
from ..sampling import SamplingParams, draw, probabilities
from .base import Draft


class ModelDrafter:
    """Runs the draft model autoregressively for up to ``k`` tokens (greedy at T=0, else sampled
    with the same temperature/top-k/top-p, keeping each step's distribution as ``q``).

    Stops early at an end-of-sequence token (nothing after it could be used), and, with
    ``min_confidence > 0``, after a token the draft itself gave less than that probability
    (softmax at temperature 1): later drafts are unlikely to survive, so the round verifies now.
    This is transformers' ``assistant_confidence_threshold`` idea; it lets ``k`` be large.
    """

    name = "model"

    def __init__(self, lm: CausalLM, stop_ids: frozenset[int] = frozenset(), min_confidence: float = 0.0):
        self.check_confidence(min_confidence)
        self.lm = lm
        self.stop_ids = stop_ids
        self.min_confidence = float(min_confidence)

    @staticmethod
    def check_confidence(min_confidence: float) -> None:
        if isinstance(min_confidence, bool) or not isinstance(min_confidence, (int, float)) or not 0 <= min_confidence < 1:
            raise SpecdecError(f"min_confidence must be a number in [0, 1), got {min_confidence!r}")

    def unsure(self, logits: torch.Tensor, token: int) -> bool:
        """True when the draft gave ``token`` less than ``min_confidence`` (off at 0)."""
        if self.min_confidence <= 0:
            return False
        return float(torch.softmax(logits, dim=-1)[token]) < self.min_confidence

    def start(self, prompt: Sequence[int]) -> None:
        self.lm.reset()
        if len(prompt) > 1:
            self.lm.forward(list(prompt[:-1]))

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        logits = self.lm.logits_for(context, 1)[0]  # [V]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        raw: list[torch.Tensor] = []
        for i in range(k):
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
            logits = self.lm.forward([token])[0]
        return Draft(tokens, torch.stack(rows) if rows else None, torch.stack(raw))

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        self.lm.truncate(min(common_prefix(self.lm.tokens, context), len(context) - 1))
