"""What one round of decoding did: the one record the engine leaves per round.

:meth:`specdec.core.engine.Engine.run` emits a :class:`RoundRecord` at the end of every round to one
observer: the generation's stats add it up (:meth:`specdec.core.stats.Stats.add`) and the request's K
policy learns from it (:meth:`specdec.core.autok.KPolicy.observe`). A replay
(:func:`specdec.traces.replay.replay`) hands the same K policies the same records, built from a trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .names import Source

#: a round's seconds by part, each named as the :class:`~specdec.core.stats.Stats` field that sums it
SECONDS = ("draft_seconds", "verify_seconds", "rule_seconds", "mask_seconds", "draft_mask_seconds",
           "predicted_verify_seconds")


@dataclass(frozen=True)
class Plan:
    """A round's plan, the K policy's one answer before the round (:meth:`specdec.core.autok.KPolicy.plan`):
    ``k`` drafts (a tree: its depth limit; 0: a plain step), from ``source`` (a portfolio's choice
    among its sources; None: the request's one drafter, or a plain step); ``declined``: the round is
    plain only because the draft model would first read more of its backlog than drafting was
    expected to repay."""

    k: int = 0
    source: Source | None = None
    declined: bool = False


@dataclass(frozen=True)
class RoundRecord:
    """One round: what it drafted and kept, and its seconds by part."""

    budget: int = 0  # the most drafts the K policy allowed (a tree: its depth limit); 0: a plain step
    drafted: int = 0  # draft tokens proposed (a tree: its nodes)
    accepted: int = 0  # of which the rule kept
    depth: int | None = None  # a token tree's depth; None: a chain
    relaxed: Mapping[str, int] = field(default_factory=dict)  # loose rule -> kept drafts the lossless rule would reject
    #: k=auto left the round plain only because the drafter would first read this many tokens (its
    #: backlog), more than drafting was expected to save; else None
    declined_backlog: int | None = None
    draft_seconds: float = 0.0  # proposing (the drafter's grammar work included)
    verify_seconds: float = 0.0  # the target's pass and the rule (the grammar's masking included)
    rule_seconds: float = 0.0  # of which: the verification rule itself
    mask_seconds: float = 0.0  # structured output: masking the target's rows, advancing on commit
    draft_mask_seconds: float = 0.0  # structured output: the drafter's masking of its own proposals
    predicted_verify_seconds: float = 0.0  # the target's cost table's seconds for this pass (0: no table)
    tokens: int = 0  # the answer's length after the round
    end: float = 0.0  # seconds from the generation's start to the round's end
    #: a portfolio (drafter ``auto``): the source that drafted (None: a plain step, or one source)
    source: Source | None = None
    #: a portfolio's copy offers this round, each scored against what the round committed:
    #: ``(source, run, reached, kept)`` (:meth:`specdec.core.drafters.base.Offer.outcome`)
    offers: tuple[tuple[str, int, int, int], ...] = ()

    @property
    def k_chosen(self) -> int:
        """What k=auto chose this round: a chain's drafts as proposed, else (a tree, or a drafter that
        proposed nothing) the budget; 0 for a plain step."""
        return self.drafted if self.drafted and self.depth is None else self.budget
