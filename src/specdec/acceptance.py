"""How often a draft token is kept: the acceptance models k="auto" plans with.

- :class:`AcceptancePrior`: per bin of the draft's own probability of its token, how often it was
  the target's, measured once (at calibration, teacher-forced on a reference text) and kept with
  the cost tables;
- :class:`Bins`: that prior updated by every round (decayed counts of drafts reached and kept per
  bin), for drafters with probabilities (a draft model);
- :class:`AcceptanceEstimate`: per-position conditional acceptance, for drafters without
  probabilities (prompt lookup, suffix).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Sequence

from .costmodel import PRIOR_ACCEPTANCE

#: the draft probability bins of the acceptance model (right edges)
EDGES = (0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.98, 1.0)
#: pseudo-rounds of the prior in each bin, and the per-round forgetting of what was observed
PRIOR_WEIGHT, DECAY = 8.0, 0.99
#: no chance of keeping a draft is taken above this: a block never looks free of risk
MAX_RATE = 0.99


def bin_of(p: float) -> int:
    return min(bisect.bisect_left(EDGES, float(p)), len(EDGES) - 1)


@dataclass
class AcceptancePrior:
    """How often a draft token is kept given the draft's own probability of it, per :data:`EDGES` bin,
    measured once (at calibration: the target and the draft teacher-forced over a reference text),
    and the mean over every position."""

    rates: list[float]
    mean: float = PRIOR_ACCEPTANCE
    source: str = "assumed: the draft's probabilities taken as calibrated"

    @classmethod
    def assumed(cls) -> "AcceptancePrior":
        lows = (0.0,) + EDGES[:-1]
        return cls([(lo + hi) / 2 for lo, hi in zip(lows, EDGES)])

    @classmethod
    def measured(cls, probs: Sequence[float], kept: Sequence[bool], source: str) -> "AcceptancePrior":
        """From the draft's top-1 probabilities along a text and whether each top-1 was the target's."""
        base = cls.assumed().rates
        hits, seen = [0.0] * len(EDGES), [0.0] * len(EDGES)
        for p, k in zip(probs, kept):
            b = bin_of(p)
            seen[b] += 1
            hits[b] += bool(k)
        rates = [(h + 2 * r) / (n + 2) for h, n, r in zip(hits, seen, base)]  # two pseudo-counts of the assumed rate
        mean = sum(bool(k) for k in kept) / len(kept) if kept else PRIOR_ACCEPTANCE
        return cls([round(r, 4) for r in rates], round(mean, 4), source)

    def to_dict(self) -> dict:
        return {"rates": self.rates, "mean": self.mean, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> "AcceptancePrior":
        rates = [float(r) for r in d["rates"]]
        if len(rates) != len(EDGES) or not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError("an acceptance prior needs one rate in [0, 1] per bin")
        return cls(rates, float(d.get("mean", PRIOR_ACCEPTANCE)), str(d.get("source", "")))


@dataclass
class Bins:
    """The acceptance model: per bin of the draft's probability, decayed counts of drafts reached
    (every earlier draft of the round kept) and kept, on top of the prior's pseudo-counts."""

    prior: AcceptancePrior
    reached: list[float] = field(default_factory=lambda: [0.0] * len(EDGES))
    kept: list[float] = field(default_factory=lambda: [0.0] * len(EDGES))

    def rate(self, p: float) -> float:
        b = bin_of(p)
        return min(MAX_RATE, (self.kept[b] + PRIOR_WEIGHT * self.prior.rates[b]) / (self.reached[b] + PRIOR_WEIGHT))

    def pooled(self) -> float:
        """The chance a draft is kept, over every bin: observed rounds and the prior's mean."""
        return min(MAX_RATE, (sum(self.kept) + PRIOR_WEIGHT * self.prior.mean) / (sum(self.reached) + PRIOR_WEIGHT))

    def update(self, probs: Sequence[float], accepted: int) -> None:
        self.decay()
        for i, p in enumerate(probs[: accepted + 1]):
            b = bin_of(p)
            self.reached[b] += 1.0
            self.kept[b] += float(i < accepted)

    def decay(self) -> None:
        self.reached = [x * DECAY for x in self.reached]
        self.kept = [x * DECAY for x in self.kept]


#: per round that drafts nothing, how much of a drafter-without-model's counts is kept (0.97, as while
#: drafting, let failed retries cost 5% on the 4-bit target's short Spec-Bench answers; 0.995 gave up
#: a little of the gain: docs/replay.md)
FORGET = 0.99


@dataclass
class AcceptanceEstimate:
    """For drafters without probabilities: per-position conditional acceptance
    ``P(draft i kept | drafts 1..i-1 kept)``, decayed counts shrunk towards the pooled rate."""

    prior: float = PRIOR_ACCEPTANCE
    prior_weight: float = 2.0
    decay: float = 0.97
    reached: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)

    def update(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.reached = [x * self.decay for x in self.reached] + [0.0] * max(0, drafted - len(self.reached))
        self.kept = [x * self.decay for x in self.kept] + [0.0] * max(0, drafted - len(self.kept))
        for i in range(min(accepted + 1, drafted)):
            self.reached[i] += 1.0
            self.kept[i] += float(i < accepted)

    def forget(self) -> None:
        """A round that drafted nothing: the counts fade by :data:`FORGET`, so the prior slowly
        returns and a drafter turned off by a bad stretch (prompt lookup on text that does not
        repeat) drafts again later (replayed: prompt lookup's k=auto on the 16-bit target went from
        1.00x to 1.13x on Spec-Bench 26; the 4-bit target stays at 1.00x on every category)."""
        self.reached = [x * FORGET for x in self.reached]
        self.kept = [x * FORGET for x in self.kept]

    @property
    def pooled(self) -> float:
        return (sum(self.kept) + self.prior_weight * self.prior) / (sum(self.reached) + self.prior_weight)

    def rates(self, k: int) -> list[float]:
        pooled, w = self.pooled, self.prior_weight
        return [((self.kept[i] if i < len(self.kept) else 0.0) + w * pooled)
                / ((self.reached[i] if i < len(self.reached) else 0.0) + w) for i in range(k)]
