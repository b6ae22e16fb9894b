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
from typing import Iterable, Sequence

from ..models.costmodel import PRIOR_ACCEPTANCE

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


#: run bins of the copy sources' acceptance model (right edges): how many tokens a copy has matched
#: before a draft token (the context's matched suffix, then the drafts before it)
RUN_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: the chance a copy's next token is kept, per run bin (the last bin: every longer run), before any
#: round is observed: up to a run of 48 measured on the 16-bit target's greedy traces of HumanEval 20
#: and Spec-Bench 26 (``benchmarks/replay-avx512bf16``; prompt lookup and suffix offers at every
#: answer position, 19,770 judged tokens, pooled over both sources: ``scripts/copy_prior.py``), made
#: non-decreasing (adjacent bins that fall are pooled); runs of 49 and more (which those answers
#: almost never reach) from the 4-bit target's edit traces (``benchmarks/free-drafts-avx2``, 132,000
#: judged tokens past a run of 48: 0.99-1.00 kept), rounded down
COPY_PRIOR = (0.22, 0.40, 0.54, 0.55, 0.70, 0.82, 0.82, 0.87, 0.87, 0.96, 0.96, 0.99, 0.99, 0.995, 0.995, 0.995, 0.995)
#: no chance of keeping a copy's token is taken above this (a copy of 100 tokens at this rate
#: expects 79 kept): copies that have matched hundreds of tokens are kept nearly whole
COPY_MAX_RATE = 0.995
#: pseudo-rounds of the copy prior per run bin, and the forgetting per round observed
COPY_PRIOR_WEIGHT, COPY_DECAY = 4.0, 0.98


def run_bin(run: int) -> int:
    return bisect.bisect_left(RUN_EDGES, int(run))


#: run_bin for every run up to the last edge (longer runs are in the last bin)
_RUN_BINS = tuple(run_bin(r) for r in range(RUN_EDGES[-1] + 1))


@dataclass
class RunRates:
    """For copy sources (prompt lookup, suffix): the chance a copy's next token is kept given its
    *run*, how many tokens the copy had matched before it (the matched suffix of the context, plus
    the drafts before it in the round): decayed counts per run bin (:data:`RUN_EDGES`) on top of
    :data:`COPY_PRIOR`'s pseudo-counts. A copy proposed in a round, drafted or not, is scored against
    the tokens the round committed: positions up to its first miss count as reached, and a copy
    that matched all of them says nothing of the positions after (censored: never counted as
    misses)."""

    prior: tuple[float, ...] = COPY_PRIOR
    reached: list[float] = field(default_factory=lambda: [0.0] * (len(RUN_EDGES) + 1))
    kept: list[float] = field(default_factory=lambda: [0.0] * (len(RUN_EDGES) + 1))
    _rates: list[float] | None = field(default=None, repr=False, compare=False)  # per bin, made again on update

    def rates(self) -> list[float]:
        """The chance per run bin."""
        if self._rates is None:
            self._rates = [min(COPY_MAX_RATE, (k + COPY_PRIOR_WEIGHT * p) / (r + COPY_PRIOR_WEIGHT))
                           for k, r, p in zip(self.kept, self.reached, self.prior)]
        return self._rates

    def rate(self, run: int) -> float:
        return self.rates()[_RUN_BINS[run] if run < len(_RUN_BINS) else len(RUN_EDGES)]

    def kept_chances(self, run: int, n: int) -> list[float]:
        """For drafts ``1..n`` of a copy with run ``run``: the chance draft ``i`` is kept given
        drafts ``1..i-1`` were (what :func:`specdec.models.costmodel.expected_tokens` takes)."""
        rates, bins, last = self.rates(), _RUN_BINS, len(RUN_EDGES)
        return [rates[bins[r] if r < len(bins) else last] for r in range(run, run + n)]

    def update(self, run: int, reached: int, kept: int) -> None:
        """A copy of run ``run`` whose first ``reached`` tokens were judged and ``kept`` of them kept
        (``kept == reached``: all matched, nothing known past them; else the last one missed)."""
        if reached <= 0:
            return
        self._rates = None
        self.reached = [x * COPY_DECAY for x in self.reached]
        self.kept = [x * COPY_DECAY for x in self.kept]
        for i in range(reached):
            b = run_bin(run + i)
            self.reached[b] += 1.0
            self.kept[b] += float(i < kept)


#: the situations a copy's chances are kept apart by (:func:`copy_situation`): one
#: :class:`RunRates` per source and situation
CopyKey = tuple[str, str, bool]


def copy_situation(source: str, run: int, t: int, first: int, others: Iterable[int]) -> CopyKey:
    """Where a copy stands when it is offered at answer position ``t``, as ``(source, place,
    agreed)``; the portfolio learns its chances per run bin apart for each:

    - ``place``: ``"first"`` before the answer's first token; ``"whole"`` when its match reaches
      back to the answer's first token (``run >= t``: the answer so far is all a copy, as where an
      agent's answers begin the way its earlier answers did); ``"part"`` otherwise;
    - ``agreed``: another source's offer this round starts with the same token (``first``, the
      offer's first token; ``others``, the other offers' first tokens).

    Replayed on the AVX2 machine's traces (docs/free-drafts.md), keeping these apart took the agent
    loop from 1.12x to 1.20x plain decoding (every pass's extra width at 1.5 times the table's),
    above suffix decoding alone, and moved the edits, HumanEval and Spec-Bench by +0.013, 0.000 and
    +0.001; the run bins alone cannot tell a suffix copy with a run of one at an agent answer's
    start (kept 92% of the time) from one mid-answer (37%)."""
    place = "first" if t == 0 else "whole" if run >= t else "part"
    return source, place, first in others
