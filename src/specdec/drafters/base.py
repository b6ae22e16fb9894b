"""The drafter interface: propose K tokens, learn what was kept, roll back.

A drafter produces token ids (and, when it has them, the distributions they were drawn from);
it never decides acceptance. Rolling back is implied by :meth:`Drafter.commit`, which hands the
drafter the committed context after every round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from ..sampling import SamplingParams


@dataclass
class Draft:
    """Proposed tokens ``[k']`` (``k' <= k``), the distributions ``[k', V]`` they were drawn from
    (None at T=0 and for drafters without probabilities, which count as one-hot), the draft
    model's raw logits ``[k', V]`` (None for drafters without a model), and how many context
    tokens the draft model was fed before drafting (so its cost per draft token can be told apart
    from a prefill). A tree drafter also gives ``parents``: then the tokens are a tree's nodes, parents
first, not a chain."""

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    fed: int = 0  # context tokens the drafter had to feed its model first (1-2 normally; a prefill or catch-up more)
    parents: list[int] | None = None  # a token tree: node i hangs under node parents[i] (-1: the context); None = a chain

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(Protocol):
    name: str

    def start(self, prompt: Sequence[int]) -> None:
        """A new generation begins with ``prompt`` (prefill caches here)."""

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        """Up to ``k`` tokens that might follow ``context``."""

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        """The round kept ``accepted`` of ``drafted`` tokens; ``context`` is what is now committed.
        Drop any state beyond it (roll back) and learn from the outcome."""
