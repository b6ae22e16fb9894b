"""How many tokens to draft: one small protocol the engine asks once per round.

A :class:`KPolicy` is made once per request (:func:`k_policy`) and answers :meth:`~KPolicy.budget`
before each round (the most drafts this round, 0 for a plain step), :meth:`~KPolicy.more` after
each draft token (whether the draft should propose another), and learns from
:meth:`~KPolicy.observe`. ``k=N`` is :class:`Fixed`; ``k="auto"`` is :class:`AutoK` for chains
and :class:`TreeAuto` for token trees. The same objects drive :mod:`specdec.replay`, so a replay
of a trace runs this very code.

``k="auto"`` (:class:`AutoK`) decides from what it knows, with no probes and no online cost
corrections: the target's measured pass cost at each width (its :class:`~specdec.costmodel.CostTable`),
the draft model's one-token and reading costs, and an acceptance model: how often a draft token
is kept given the draft's own probability ``p`` of it (bins over ``p``, starting from the prior
measured at calibration on the reference text, :class:`AcceptancePrior`, and updated by every
round, with forgetting, so the prior returns where nothing is drafted).

- **Per request, whether to start.** Drafting saves ``s`` seconds a token (a plain step against
  the best block at the pooled acceptance); before its first draft the draft model must read its
  window of the prompt and what was written since (its *backlog*). Over the lengths of this
  controller's recent answers (none yet: as long as ``max_new_tokens`` allows), the position to
  start at is the one that maximises the expected ``s * tokens left - reading cost``; none, if
  none gains. So a cold process drafts from its first round where that pays, and short answers
  after long prompts wait (or never read the prompt).
- **Per round, whether to draft.** A round drafts when some block beats a plain step at the pooled
  acceptance (K = 0 otherwise: where speculation cannot pay, a round costs what plain decoding does).
- **Per draft token, whether to go on.** After draft ``i``, whose chance that every draft so far is
  kept is ``P_i`` (the product of the bins' rates at the drafts' probabilities), the draft
  proposes another while some extension by ``j`` tokens gains more than it costs: ``P_i *
  (c + c^2 + ... + c^j)`` expected tokens at ``spt`` seconds each (the seconds a token takes at
  this acceptance: the rate to beat) against ``j`` draft steps and the wider verify pass. Jagged
  width curves (4-bit kernels take rows in fours) are read as measured.
- Drafters without probabilities (prompt lookup, suffix) draft the block that maximises expected
  tokens per second under a per-position acceptance estimate; their draft costs ~0.
- A policy with a lookahead ``W`` (FLy's window) drafts at least ``W + 1`` when it drafts, since
  shorter blocks leave the window inert.

Token trees (:class:`TreeAuto`): the model-drafted ``tree`` grows to its depth limit (its own
pruning sizes it); a tree without a draft model (lookahead), whose width its options fix, either
drafts its whole tree or takes a plain step, whichever its moving averages of the tokens a tree
round yields and of the tree pass's measured cost make faster (:class:`PassGate`).
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .costmodel import PRIOR_ACCEPTANCE, TIE_TOLERANCE, CostTable, best_k, tokens_per_second

#: the longest block: the cost tables measure verify passes up to 32 tokens (K drafts + 1)
K_MAX = 31
#: a backlog of at most this many tokens is a normal round's feed (the last bonus token, and the last
#: draft when every draft was kept): part of the per-draft cost, not a reading to weigh
STEADY_FEED = 2
#: a draft model's one-token pass as a share of the target's, when the draft's costs were not measured
UNMEASURED_DRAFT_STEP = 1 / 3
#: the draft probability bins of the acceptance model (right edges)
EDGES = (0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.98, 1.0)
#: pseudo-rounds of the prior in each bin, and the per-round forgetting of what was observed
PRIOR_WEIGHT, DECAY = 8.0, 0.99
#: answer lengths remembered per controller (to judge whether a new answer runs long enough to read for)
LENGTHS = 16
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

    @property
    def pooled(self) -> float:
        return (sum(self.kept) + self.prior_weight * self.prior) / (sum(self.reached) + self.prior_weight)

    def rates(self, k: int) -> list[float]:
        pooled, w = self.pooled, self.prior_weight
        return [((self.kept[i] if i < len(self.kept) else 0.0) + w * pooled)
                / ((self.reached[i] if i < len(self.reached) else 0.0) + w) for i in range(k)]


class KPolicy:
    """What the engine (and a replay) asks each round. ``budget(t, room, backlog)``: the most drafts
    this round (0: a plain step) when ``t`` tokens are written, ``room`` drafts fit, and the drafter
    must first read ``backlog`` tokens; ``more(i, p)``: after draft ``i`` (1-based), of draft
    probability ``p``, propose another?; ``observe(drafted, accepted, seconds)``: the round's
    outcome (``seconds``: its verify pass); ``begin``/``end``: a request starts / ends with
    ``tokens`` written. ``declined``: rounds of this request not drafted only because reading the
    backlog would not pay (for the stats)."""

    declined = 0

    def begin(self, max_new_tokens: int) -> None:
        self.declined = 0

    def budget(self, t: int, room: int, backlog: int) -> int:
        raise NotImplementedError

    def more(self, i: int, p: float) -> bool:
        return True

    def observe(self, drafted: int, accepted: int, seconds: float = 0.0) -> None:
        pass

    def end(self, tokens: int) -> None:
        pass


class Fixed(KPolicy):
    """``k=N`` (a tree: depth N): always N drafts, within the room left."""

    def __init__(self, k: int):
        self.k = max(0, int(k))

    def budget(self, t: int, room: int, backlog: int) -> int:
        return max(0, min(self.k, room))


class AutoK(KPolicy):
    """``k="auto"`` for chains (module docstring)."""

    def __init__(self, target: CostTable, draft: CostTable | None = None, needs_model: bool = True,
                 window: int = 0, prior: AcceptancePrior | None = None, k_max: int = K_MAX):
        self.target = target
        self.needs_model = needs_model
        if not needs_model:
            self.step, self.read = 0.0, (lambda n: 0.0)
        elif draft is not None:
            self.step, self.read = draft.forward(1), draft.read
        else:
            self.step = target.forward(1) * UNMEASURED_DRAFT_STEP
            self.read = lambda n: target.read(n) * UNMEASURED_DRAFT_STEP
        self.window = max(0, int(window))
        self.k_max = max(int(k_max), self.window + 1)
        #: the only K > 0 planned: those whose verify pass (K + 1 tokens) the table measured
        self.allowed = frozenset(w - 1 for w in target.widths if w >= 2)
        self.bins = Bins(prior or AcceptancePrior.assumed())
        self.positions = AcceptanceEstimate(prior=(prior or AcceptancePrior.assumed()).mean)
        self.lengths: list[int] = []  # recent answers' lengths, newest last
        self.max_new = 0
        self.start_at: int | None = 0  # this request's position to start reading at (None: never)
        self.planned_backlog, self.planned_t, self.planned_until = -1, 0, 0  # what start_at was planned for
        self._plans: dict[float, tuple[int, float]] = {}
        self.probs: list[float] = []  # this round's draft probabilities
        self.kept_p = 1.0  # the chance every draft of this round so far is kept
        self.limit = 0  # this round's budget

    # ------------------------------------------------------------------ estimates
    def plan(self, rate: float | None = None) -> tuple[int, float]:
        """The best block at a constant acceptance ``rate`` (the pooled one by default) and its
        seconds per token (a plain step's for K = 0)."""
        rate = self.rate() if rate is None else rate
        if rate not in self._plans:
            if len(self._plans) > 64:
                self._plans.clear()
            rates = [rate] * self.k_max
            k = best_k(self.target.forward, self.step, rates, self.k_max, k_min=self.window + 1 if self.window else 1,
                       allowed=self.allowed)
            self._plans[rate] = (k, 1.0 / tokens_per_second(self.target.forward, self.step, rates, k))
        return self._plans[rate]

    def rate(self) -> float:
        return self.bins.pooled() if self.needs_model else self.positions.pooled

    def start(self, t: int, room: int, backlog: int) -> int | None:
        """The position at which reading ``backlog`` (growing by one a token until then) gains the
        most over the answer's expected remaining length (None: it never gains). The lengths to
        expect: the recent answers still going at ``t``; with none yet, as long as the room
        allows; with every recent answer shorter, as long again as it has run."""
        k, spt = self.plan()
        saving = self.target.forward(1) - spt
        ends = [n for n in self.lengths if n > t]
        if not ends:
            ends = [t + (room + 1 if not self.lengths else min(room + 1, max(t, 1)))]
        self.planned_until = max(ends)
        if k == 0 or saving <= 0:
            return None
        best, best_gain = None, 0.0
        for s in range(t, min(max(ends), t + room + 1)):
            cost = self.read(backlog + s - t) - self.read(1)
            gain = sum(saving * (n - s) - cost for n in ends if n > s) / len(ends)
            if gain > best_gain * (1 + TIE_TOLERANCE):
                best, best_gain = s, gain
        return best

    # ------------------------------------------------------------------ the protocol
    def begin(self, max_new_tokens: int) -> None:
        self.declined = 0
        self.max_new = max_new_tokens
        self.planned_backlog = -1

    def budget(self, t: int, room: int, backlog: int) -> int:
        self.probs, self.kept_p, self.limit = [], 1.0, 0
        if room <= 0:
            return 0
        k, _ = self.plan()
        if k == 0:
            self.bins.decay()  # nothing is learned at K = 0: the prior slowly returns
            self._plans.clear()
            return 0
        if backlog > STEADY_FEED and self.needs_model:
            if (self.planned_backlog < 0 or backlog != self.planned_backlog + (t - self.planned_t)
                    or t >= self.planned_until):
                self.start_at, self.planned_backlog, self.planned_t = self.start(t, room, backlog), backlog, t
            if self.start_at is None or t < self.start_at:
                self.declined += 1
                return 0
        room = min(room, self.k_max)
        if not self.needs_model:  # no probabilities: the block with the most tokens per second
            k = best_k(self.target.forward, 0.0, self.positions.rates(room), room, allow_zero=False,
                       k_min=min(room, self.window + 1) if self.window else 1, allowed=self.allowed | {room})
            self.limit = k
            return k
        self.limit = room
        return room

    def more(self, i: int, p: float) -> bool:
        self.probs.append(float(p))
        self.kept_p *= self.bins.rate(p)
        if i >= self.limit:
            return False
        if i <= self.window:
            return True
        c = self.rate()
        _, spt = self.plan(c)
        base = self.target.forward(i + 1)
        gain = 0.0
        run = self.kept_p
        for j in range(1, self.limit - i + 1):
            run *= c
            gain += run * spt
            if gain > j * self.step + self.target.forward(i + 1 + j) - base:
                return True
            if run * spt < 1e-4 * self.step:
                break
        return False

    def observe(self, drafted: int, accepted: int, seconds: float = 0.0) -> None:
        if drafted <= 0:
            return
        self._plans.clear()
        if self.needs_model:
            self.bins.update(self.probs[:drafted], accepted)
        else:
            self.positions.update(drafted, accepted)

    def end(self, tokens: int) -> None:
        if tokens > 0:
            self.lengths = (self.lengths + [int(tokens)])[-LENGTHS:]


class PassGate(KPolicy):
    """``k="auto"`` for a tree drafter without a draft model (lookahead): each round either drafts
    its whole tree (``depth``) or takes a plain step, whichever yields more tokens per second by
    the moving averages of a tree round's nodes and tokens (starting optimistic, so the first
    rounds draft) against the target table's seconds at those widths, corrected by what the passes
    really took. While plain steps win, one round drafts after ``probe_every`` of them (the window
    and the pool learn only while drafting), the interval doubling up to ``MAX_PROBE_INTERVAL``,
    and only when the credit covers the pass's extra cost: each plain step earns ``EXPLORE_SHARE``
    of its seconds, so probing where the tree does not pay costs at most that share (measured
    before the credit: a 29-node pass probed every 16-64 steps cost 9% of plain speed on a 16-bit
    target and 19% on a 4-bit one). The engine keeps a gate across requests."""

    OPTIMISTIC_TOKENS = 2.0
    PROBE_EVERY, MAX_PROBE_INTERVAL, EXPLORE_SHARE, EMA = 16, 256, 0.02, 0.2

    def __init__(self, target: CostTable, depth: int = 0):
        self.target, self.depth = target, depth
        self.interval = self.PROBE_EVERY
        self.nodes: float | None = None
        self.tokens = self.OPTIMISTIC_TOKENS
        self.tree_scale = self.plain_scale = 1.0
        self.idle = 0
        self.credit = 0.0

    def rates(self) -> tuple[float, float]:
        """(tokens per second of a tree round, of a plain step) by the current estimates."""
        plain = 1.0 / (self.target.forward(1) * self.plain_scale)
        if self.nodes is None:
            return math.inf, plain
        return self.tokens / (self.target.forward(1 + round(self.nodes)) * self.tree_scale), plain

    def choose(self) -> bool:
        """Draft the tree this round (True) or take a plain step."""
        tree, plain = self.rates()
        if tree > plain * (1 + TIE_TOLERANCE):
            self.idle, self.interval = 0, self.PROBE_EVERY
            return True
        self.idle += 1
        step = self.target.forward(1) * self.plain_scale
        self.credit += self.EXPLORE_SHARE * step
        extra = self.target.forward(1 + round(self.nodes or 0)) * self.tree_scale - step
        if self.idle >= self.interval and extra <= self.credit:
            self.idle, self.interval = 0, min(2 * self.interval, self.MAX_PROBE_INTERVAL)
            self.credit -= max(0.0, extra)
            return True
        return False

    def budget(self, t: int, room: int, backlog: int) -> int:
        return max(0, min(self.depth, room)) if self.choose() else 0

    def observe(self, drafted: int, accepted: int, seconds: float = 0.0) -> None:
        """A round's tree size (0: a plain step), accepted drafts and target-pass seconds."""
        if seconds <= 0:
            return
        if drafted <= 0:
            self.plain_scale = _ema(self.plain_scale, _clamp(seconds / self.target.forward(1)), self.EMA)
            return
        self.nodes = _ema(self.nodes, drafted, self.EMA)
        self.tokens = _ema(self.tokens, 1.0 + accepted, self.EMA)
        self.tree_scale = _ema(self.tree_scale, _clamp(seconds / self.target.forward(1 + drafted)), self.EMA)


def _ema(prev: float | None, value: float, weight: float) -> float:
    return value if prev is None else prev + weight * (value - prev)


def _clamp(ratio: float) -> float:
    return min(max(ratio, 0.1), 10.0)


def why_plain_steps(target: CostTable, draft: CostTable | None, needs_model: bool, drafted: int, accepted: int,
                    prior: AcceptancePrior | None = None) -> str:
    """Why k=auto chose plain steps (K=0), for people: the measured costs it weighed and the
    acceptance drafting would need, against what the drafts tried were kept at."""
    auto = AutoK(target, draft, needs_model, prior=prior)
    costs = (f"a plain step {target.forward(1) * 1e3:.0f} ms, a 5-token pass {target.forward(5) * 1e3:.0f} ms, "
             f"a draft token {auto.step * 1e3:.0f} ms")
    if auto.plan(MAX_RATE)[0] == 0:
        return f"by this machine's measured pass costs ({costs}) not even near-perfect drafts would pay"
    lo, hi = 0.0, MAX_RATE
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if auto.plan(mid)[0] > 0 else (mid, hi)
    seen = f"the {drafted} drafts tried were kept at {accepted / drafted:.0%}" if drafted else "no draft was tried"
    return (f"by this machine's measured pass costs ({costs}) drafting pays only when drafts are kept at "
            f"{hi:.0%} or more; {seen}")


def k_policy(k: int | str, target: CostTable | None, draft: CostTable | None, *, needs_model: bool, trees: bool,
             depth_limit: int, window: int, fallback_k: int, prior: AcceptancePrior | None = None) -> KPolicy:
    """A new K policy (for :class:`WarmStates` to keep across requests): ``k=N`` is :class:`Fixed`;
    ``k="auto"`` without a cost table drafts ``fallback_k`` (a tree: its depth limit); with one, a
    chain gets :class:`AutoK`, a tree with a draft model its depth limit, one without a
    :class:`PassGate`."""
    if k != "auto":
        return Fixed(int(k))
    if trees:
        if target is not None and not needs_model:
            return PassGate(target, depth_limit)
        return Fixed(depth_limit)
    if target is None:
        return Fixed(fallback_k)
    return AutoK(target, draft, needs_model, window, prior)


class WarmStates(OrderedDict):
    """k=auto's state per request kind, kept across requests (a dict of key -> state): at most
    ``limit`` kinds, the least recently used evicted first."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def get_or_make(self, key, make: Callable[[], Any], stale: Callable[[Any], bool] = lambda state: False):
        state = self.pop(key, None)
        if state is None or stale(state):
            state = make()
        while len(self) >= self.limit:
            self.popitem(last=False)
        self[key] = state
        return state

    def copy(self) -> "WarmStates":
        new = WarmStates(self.limit)
        new.update(self)
        return new
