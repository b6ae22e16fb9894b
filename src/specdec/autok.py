"""``k="auto"``: each round drafts the K that maximises expected tokens per second.

The choice is :func:`specdec.costmodel.best_k` over

- the target's measured pass cost at each width (its :class:`~specdec.costmodel.CostTable`),
- the drafter's cost per draft token (the draft model's table to start with, then what the
  rounds actually took; ~0 for prompt lookup),
- per-position acceptance rates ``a_i = P(draft i kept | drafts 1..i-1 kept)`` estimated online,
  with exponential forgetting (recent rounds count most) and shrinkage towards the pooled rate,
  so positions never drafted yet borrow from the ones that were.

Costs are corrected online too: the ratio of observed to predicted seconds (longer contexts,
another load on the machine) scales the target's and the draft's tables separately, so K is
re-chosen every round with the corrected costs. The target's passes over several tokens get a
correction of their own, learned from the drafting rounds alone: beside a draft model on the same
cores (llama.cpp runs a thread pool per model) a verify pass was measured at 1.5x its table's
seconds while one-token steps kept theirs, and a single correction, dominated by the plain steps,
would leave drafting priced too cheap. The draft model's catch-ups (see below) are corrected by
what they really took as well. When the target's correction stays beyond
``DRIFT_LOW``..``DRIFT_HIGH`` (passes under half, or over four times, the table's) for
``DRIFT_ROUNDS`` rounds in a row, the table itself is taken to be wrong (measured while the machine
was busy, or the machine has changed): its cached copy is marked stale
(:func:`specdec.costmodel.mark_stale`), so the next load measures again, and the generation's
stats carry the drift (``cost_drift``). The high bound is wide because passes over a long context
legitimately cost more than the table's (measured over 32 tokens); nothing legitimate makes them
cheaper.

``K = 0`` is a legal choice: a plain decoding step through the same target pass, so where
speculation cannot pay the engine costs what plain decoding costs. While at ``K = 0`` nothing is
learned about acceptance, so after ``probe_every`` rounds at K=0 one round drafts the best
``K > 0`` (a bounded price for noticing that the text became predictable); while probes keep
failing the interval doubles, up to ``MAX_PROBE_INTERVAL`` rounds. A probe by a draft model first
reads what was written since its last draft, and on a CPU that catch-up can cost several plain
steps: each plain step earns ``EXPLORE_SHARE`` (2%) of its seconds as credit, and a probe whose
catch-up costs more than the credit waits, so probing where drafting does not pay costs at most
that share of plain decoding's time. No probe is made where even
near-perfect drafts could not pay (``OPTIMISTIC_ACCEPTANCE``): a probe then buys nothing, and the
draft model's catch-up over the text since its last proposal makes it dear. The draft model's prefill is
lazy (its first proposal feeds the prompt), so a generation that never drafts never pays it.

A policy with a lookahead ``W`` (:attr:`specdec.verify.base.Policy.lookahead`: a window rule,
such as FLy's deferred window, judges a draft by the ``W`` drafts after it) acts as two rules,
depending on the block: a block of ``W`` drafts or fewer leaves the window inert (the round is
judged by the lossless rule and the token rules alone), a longer one lets it flip mismatches. The
controller keeps one acceptance estimate for each (the *inner* one learns from every round, through
what the round would have kept without the window, :attr:`specdec.verify.base.Verdict.inner`; the
windowed one from rounds longer than ``W``, and never rates a position below the inner estimate,
since the window only adds acceptances) and picks ``K`` among ``0``, ``1..W`` and ``W+1..k_max`` by
expected tokens per second. So where the window does not pay (text the draft rarely gets right, as
translation), such a policy with ``k="auto"`` drafts as short as its token rules alone would,
instead of choosing between nothing and a block too long to pay. While it drafts short blocks the
windowed estimate learns nothing, so after ``probe_every`` such rounds one round drafts the best
``K > W``, with the same doubling backoff.

K is chosen only where the target's pass over ``K + 1`` tokens was measured (the cost tables time
every width from 1 to 17, then 24 and 32): on a CPU the curve is jagged (llama.cpp's repacked 4-bit
kernels take rows in fours, so 4 and 8 tokens are cheap and 5 or 9 are not), and an interpolated
width would be a guess.

The draft model's reading is priced too. Before a round drafts, the drafter's backlog (the tokens
its model has not read yet: the prompt's window at the first draft, the text generated since at a
catch-up; :meth:`specdec.drafters.Drafter.backlog`) costs the draft table's prefill seconds; a
round drafts only when the time drafting is expected to save over the tokens still to come exceeds
that price. The tokens still to come are the expected answer length: the mean length of this
controller's recent answers (:meth:`KController.finished`), taken as memoryless (a geometric length
with that mean has that much left at any point), and never more than ``max_new_tokens`` allows;
before any answer has finished, what ``max_new_tokens`` allows. So short answers on a machine where
drafting barely pays never prefill the draft, and long ones do.

One controller lives per (policy, drafter, greedy or sampled) on an engine and keeps its estimates
across requests (warm start).

Token trees: the ``tree`` drafter grows up to its depth limit under ``k="auto"`` (its own pruning
sizes it; no controller). A tree drafter without a draft model (``lookahead``), whose width its
options fix, gets a :class:`PassGate` per generation instead: the whole tree or a plain step, the
tree's pass priced by its width in nodes, not by K.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from .costmodel import PRIOR_ACCEPTANCE, CostTable, best_k, mark_stale, tokens_per_second


#: while probes keep finding that drafting does not pay, they come at most this rarely
MAX_PROBE_INTERVAL = 256
#: a probe is worth its price only if drafting could pay at all: at this acceptance at every position
#: (all but perfect drafts). Where even that cannot beat a plain step (a compute-bound CPU whose wide
#: passes cost nearly one step per token), the controller never probes, so it costs what plain decoding costs.
OPTIMISTIC_ACCEPTANCE = 0.98
#: a draft model's one-token pass, as a fraction of the target's, before its own costs are known:
#: the bundled 0.5B draft costs 0.2-0.5 of the 1.5B target's step on the CPUs measured here, and
#: the first rounds' observed draft times replace this guess at once
UNMEASURED_DRAFT_STEP = 1 / 3
#: a longer block must beat a shorter one by more than this relative margin (float noise) to win
TIE_TOLERANCE = 1e-9
#: observed / predicted target pass seconds (the online correction) outside these bounds for
#: DRIFT_ROUNDS rounds in a row: the cost table is stale
DRIFT_LOW, DRIFT_HIGH = 0.5, 4.0
DRIFT_ROUNDS = 32
#: one round moves the online cost correction by at most this factor either way (a pass stalled by
#: another process, or a page fault, must not swing K for many rounds)
ROUND_RATIO_CLAMP = (0.1, 10.0)
#: the default longest block: the cost tables measure passes up to 32 tokens, K drafts + 1 bonus
K_MAX = 31
#: weight of each finished answer in the moving average of answer lengths (~3 answers of memory)
LENGTH_EMA = 0.3
#: rounds at K=0 before the first probe (then doubling up to MAX_PROBE_INTERVAL)
PROBE_EVERY = 16
#: weight of each round in the exponential moving averages of observed costs (~5 rounds of memory)
COST_EMA = 0.2
#: halvings when solving for the break-even acceptance: 2^-20 of the range, far below any noise
BISECT_STEPS = 20
#: a drafter backlog of at most this many tokens is the normal round's feed (the last round's bonus
#: token, and the last draft when all were kept): it is part of the per-draft-token cost, not priced apart
STEADY_FEED = 2
#: the share of plain decoding's time that probes may spend on the draft model's catch-up: each round
#: at K=0 earns this share of a plain step as credit, and a probe whose catch-up would cost more than
#: the credit waits. Where drafting does not pay, probing then costs at most this share.
EXPLORE_SHARE = 0.02


@dataclass
class AcceptanceEstimate:
    """Per-position conditional acceptance with forgetting. ``reached[i]``/``kept[i]``: decayed
    counts of rounds that drafted position ``i`` with every earlier draft kept, and of those
    that kept it too."""

    prior: float = PRIOR_ACCEPTANCE
    prior_weight: float = 2.0  # pseudo-rounds of the prior (pooled rate) and of the pooled rate (per position)
    decay: float = 0.97  # per observed round: ~33 rounds of memory
    reached: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)

    def update(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.reached = [x * self.decay for x in self.reached]
        self.kept = [x * self.decay for x in self.kept]
        if drafted > len(self.reached):
            grow = drafted - len(self.reached)
            self.reached += [0.0] * grow
            self.kept += [0.0] * grow
        for i in range(min(accepted + 1, drafted)):  # positions 0..accepted were reached
            self.reached[i] += 1.0
        for i in range(accepted):
            self.kept[i] += 1.0

    @property
    def pooled(self) -> float:
        return (sum(self.kept) + self.prior_weight * self.prior) / (sum(self.reached) + self.prior_weight)

    def rates(self, k: int) -> list[float]:
        pooled, w = self.pooled, self.prior_weight
        out = []
        for i in range(k):
            r, a = (self.reached[i], self.kept[i]) if i < len(self.reached) else (0.0, 0.0)
            out.append((a + w * pooled) / (r + w))
        return out


class KController:
    """Chooses K each round and learns from the round (see the module docstring)."""

    def __init__(self, target: CostTable, draft_step: float, k_max: int = K_MAX, probe_every: int = PROBE_EVERY,
                 ema: float = COST_EMA, window: int = 0, draft_prefill: Callable[[int], float] | None = None):
        self.target = target
        #: the only K > 0 chosen: those whose verify pass (K + 1 tokens) the target's table measured
        self.allowed = frozenset(w - 1 for w in target.widths if w >= 2)
        #: seconds for the draft model to read n tokens of backlog (None: drafting reads nothing, as prompt lookup)
        self.draft_prefill = draft_prefill
        #: rounds that did not draft because the backlog's reading would cost more than drafting saves
        self.backlog_declined = 0
        #: whether the last :meth:`choose` declined for that reason (the engine counts it per answer)
        self.declined = False
        #: moving average of the lengths of this controller's finished answers (None: none yet)
        self.expected_length: float | None = None
        self.draft_step = max(0.0, float(draft_step))  # seconds per draft token, before any round
        self.k_max = max(0, int(k_max))
        self.window = max(0, int(window))  # the policy's lookahead: blocks of at most this many drafts leave it inert
        self.probe_every = probe_every
        self.ema = ema
        self.acceptance = AcceptanceEstimate()  # with a window: rounds longer than it, flips included
        self.inner = AcceptanceEstimate()  # with a window: every round, as judged without it
        self.target_scale = 1.0  # observed / predicted target pass seconds, every round
        #: the same over drafting rounds only (passes over 2+ tokens), None before one: their passes can
        #: cost more than the table's beside the draft model (two thread pools on the same cores)
        self.wide_scale: float | None = None
        #: observed / predicted seconds of the draft model's catch-ups (a prefill of its backlog)
        self.catchup_scale = 1.0
        #: seconds of catch-up that probes may still spend (EXPLORE_SHARE of the plain steps taken)
        self.explore_credit = 0.0
        self.draft_seconds_per_token: float | None = None  # observed, EMA
        self.rounds_at_zero = 0
        self.probe_interval = probe_every  # doubles while probes keep failing, back to probe_every once K > 0 pays
        self.rounds_short = 0  # with a window: rounds in a row drafting no more than it
        self.window_probe_interval = probe_every  # the same backoff for trying a block past the window
        self.drift_rounds = 0  # rounds in a row with target_scale outside DRIFT_LOW..DRIFT_HIGH
        self.drift: float | None = None  # target_scale when the table was found stale (once)

    def verify_cost(self, width: int) -> float:
        scale = self.target_scale if width <= 1 or self.wide_scale is None else self.wide_scale
        return scale * self.target.forward(width)

    def catchup_cost(self, backlog: int) -> float:
        """Seconds for the draft model to read ``backlog`` tokens: its table's prefill, corrected by
        what its catch-ups really took (0 for a drafter that reads nothing or a steady feed)."""
        if backlog <= STEADY_FEED or self.draft_prefill is None:
            return 0.0
        return self.catchup_scale * self.draft_prefill(backlog)

    @property
    def draft_cost(self) -> float:
        return self.draft_step if self.draft_seconds_per_token is None else self.draft_seconds_per_token

    def choose(self, room: int, backlog: int = 0) -> int:
        """The K for the next round, at most ``room`` (what max_new_tokens and the context allow),
        when the drafter must first read ``backlog`` tokens (:meth:`worth_reading`)."""
        k = self._choose(room, backlog)
        remaining = room + 1 if self.expected_length is None else min(room + 1, self.expected_length)
        self.declined = k > 0 and not self.worth_reading(k, backlog, remaining)
        if self.declined:
            self.backlog_declined += 1
            return 0
        return k

    def finished(self, tokens: int) -> None:
        """An answer of ``tokens`` tokens ended (by a stop or the length limit): it updates the
        expected answer length."""
        if tokens <= 0:
            return
        prev = self.expected_length
        self.expected_length = float(tokens) if prev is None else prev + LENGTH_EMA * (tokens - prev)

    def worth_reading(self, k: int, backlog: int, remaining: float) -> bool:
        """Whether drafting ``k`` this round, and on for the ``remaining`` tokens, saves more time
        than the draft model's reading of ``backlog`` tokens costs (always, for a backlog of at most
        ``STEADY_FEED`` or a drafter that reads nothing). A round chosen as a probe (no better than a
        plain step at the current estimates) is judged at near-perfect acceptance: that is what it
        looks for."""
        if backlog <= STEADY_FEED or self.draft_prefill is None:
            return True
        plain = tokens_per_second(self.verify_cost, self.draft_cost, [], 0)
        rates = self.acceptance.rates(k) if not self.window else self._rates(k)[int(k > self.window)]
        rate = tokens_per_second(self.verify_cost, self.draft_cost, rates, k)
        if rate <= plain:
            rate = tokens_per_second(self.verify_cost, self.draft_cost, [OPTIMISTIC_ACCEPTANCE] * k, k)
        saved = remaining / plain - remaining / rate
        return saved > self.catchup_cost(backlog)

    def _choose(self, room: int, backlog: int = 0) -> int:
        k_max = min(self.k_max, max(0, room))
        k = self._best(k_max, allow_zero=True)
        if k == 0 and k_max > 0:
            self.rounds_at_zero += 1
            self.explore_credit += EXPLORE_SHARE * self.verify_cost(1)
            if self.rounds_at_zero >= self.probe_interval and not self.could_pay(k_max):
                self.rounds_at_zero = 0  # even near-perfect drafts would not pay here: no probe
            price = self.catchup_cost(backlog)
            if self.rounds_at_zero >= self.probe_interval and price <= self.explore_credit:
                # explore: is drafting paying again? (its catch-up paid from the credit)
                self.rounds_at_zero = 0
                self.explore_credit -= price
                self.probe_interval = min(2 * self.probe_interval, MAX_PROBE_INTERVAL)
                k = self._best(k_max, allow_zero=False)
        else:
            self.rounds_at_zero = 0
            self.probe_interval = self.probe_every
        if self.window and k_max > self.window:
            if 0 < k <= self.window:  # drafting short: now and then, is the window paying again?
                self.rounds_short += 1
                if self.rounds_short >= self.window_probe_interval:
                    self.rounds_short = 0
                    self.window_probe_interval = min(2 * self.window_probe_interval, MAX_PROBE_INTERVAL)
                    k = self._best_long(k_max, self._rates(k_max)[1])
            elif k > self.window:
                self.rounds_short = 0
                self.window_probe_interval = self.probe_every
        return k

    def could_pay(self, k_max: int) -> bool:
        """Whether some K > 0 beats a plain step at near-perfect acceptance (``OPTIMISTIC_ACCEPTANCE``)
        with the current cost estimates."""
        rates = [OPTIMISTIC_ACCEPTANCE] * max(1, k_max)
        return best_k(self.verify_cost, self.draft_cost, rates, k_max, allowed=self.allowed) > 0

    def _rates(self, k_max: int) -> tuple[list[float], list[float]]:
        """Per-position rates for blocks up to the window (inner) and past it (windowed, never below
        the inner ones: the window only adds acceptances)."""
        inner = self.inner.rates(k_max)
        return inner, [max(a, b) for a, b in zip(self.acceptance.rates(k_max), inner)]

    def _best_long(self, k_max: int, windowed: list[float]) -> int:
        """The best K past the window (``k_max > window``) under the windowed rates."""
        return best_k(self.verify_cost, self.draft_cost, windowed, k_max, k_min=self.window + 1, allow_zero=False,
                      allowed=self.allowed)

    def _best(self, k_max: int, allow_zero: bool) -> int:
        """The best K in ``0..k_max`` (``1..k_max`` without zero): without a window, one estimate for
        every K; with one, the inner estimate up to the window and the windowed one past it."""
        if not self.window:
            return best_k(self.verify_cost, self.draft_cost, self.acceptance.rates(k_max), k_max, allow_zero=allow_zero,
                          allowed=self.allowed)
        inner, windowed = self._rates(k_max)
        short = best_k(self.verify_cost, self.draft_cost, inner, min(k_max, self.window), allow_zero=allow_zero,
                       allowed=self.allowed)
        if k_max <= self.window:
            return short
        long = self._best_long(k_max, windowed)
        rate_short = tokens_per_second(self.verify_cost, self.draft_cost, inner, short)
        rate_long = tokens_per_second(self.verify_cost, self.draft_cost, windowed, long)
        return long if rate_long > rate_short * (1 + TIE_TOLERANCE) else short

    def observe(self, drafted: int, accepted: int, draft_seconds: float | None, verify_seconds: float,
                inner: int | None = None, fed: int = 0) -> None:
        """Learn from one round: its acceptance and what its passes really cost. ``fed``: the tokens
        the draft model read before drafting (its backlog); past ``STEADY_FEED`` the round's
        ``draft_seconds`` hold a prefill or catch-up, which corrects the catch-up price instead of
        the per-token cost. ``draft_seconds`` None: not known. ``inner``: with a window, the drafts
        the round would have kept without it (None: ``accepted``)."""
        if not self.window or drafted > self.window:
            self.acceptance.update(drafted, accepted)
        if self.window:
            self.inner.update(drafted, accepted if inner is None else min(inner, accepted))
        predicted = self.target.forward(drafted + 1)
        if predicted > 0 and verify_seconds > 0:
            ratio = _clamp(verify_seconds / predicted)
            self.target_scale = _ema(self.target_scale, ratio, self.ema)
            if drafted > 0:
                self.wide_scale = _ema(self.wide_scale, ratio, self.ema)
            self._check_drift()
        if drafted <= 0 or draft_seconds is None or draft_seconds < 0:
            return
        if fed > STEADY_FEED:
            if self.draft_prefill is None:
                return
            expected = self.draft_prefill(fed) + drafted * self.draft_cost
            if expected > 0:
                ratio = _clamp(draft_seconds / expected)
                self.catchup_scale = _ema(self.catchup_scale, ratio, self.ema)
            return
        self.draft_seconds_per_token = _ema(self.draft_seconds_per_token, draft_seconds / drafted, self.ema)


    def _check_drift(self) -> None:
        """A large sustained drift from the table: mark its cached copy stale (once)."""
        if DRIFT_LOW <= self.target_scale <= DRIFT_HIGH:
            self.drift_rounds = 0
            return
        self.drift_rounds += 1
        if self.drift_rounds >= DRIFT_ROUNDS and self.drift is None:
            self.drift = self.target_scale
            mark_stale(self.target, f"observed target passes took {self.target_scale:.2f}x the table's seconds "
                                    f"for {DRIFT_ROUNDS} rounds in a row")


class PassGate:
    """``k="auto"`` for a tree drafter without a draft model (lookahead): each round either drafts
    its whole tree or takes a plain step, whichever yields more tokens per second.

    Such a tree's width is set by its options, not by K (a lookahead pass holds the whole Jacobi
    window and the pool's guesses whatever the depth), so the round is priced by its width: the
    target table's seconds for a pass over ``1 + nodes`` tokens, ``nodes`` being the moving
    average of the trees actually drafted (the table knows chains' passes, of ``K + 1`` tokens;
    a tree pass of the same width is taken to cost the same, and widths beyond the widest measured
    one are extrapolated along the table's last slope). Against it: the moving average of the
    tokens a tree round yielded (``1 +`` accepted), starting from ``OPTIMISTIC_TOKENS`` so the
    first rounds draft, and a plain step at the table's one-token seconds. Both seconds are
    corrected by what the passes really took. While plain steps win, one round drafts after
    ``probe_every`` of them (the window and the pool learn only while drafting), the interval
    doubling up to ``MAX_PROBE_INTERVAL`` while probes keep losing, and only when the probe credit
    covers what the pass costs beyond a plain step: each plain step earns ``EXPLORE_SHARE`` of its
    seconds, as the chain controller's probes are paid, so probing where the tree does not pay
    costs at most ~2% (measured before the credit: a 29-node pass probed every 16-64 steps cost
    9% of plain speed on a 16-bit target and 19% on a 4-bit one). The engine keeps a gate across
    requests (per policy and drafter options), so what it learned is not spent again."""

    #: tokens per tree round assumed before any round (optimistic: the first rounds draft)
    OPTIMISTIC_TOKENS = 2.0

    def __init__(self, target: CostTable, probe_every: int = PROBE_EVERY, ema: float = COST_EMA):
        self.target = target
        self.ema = ema
        self.probe_every = self.interval = probe_every
        self.nodes: float | None = None  # moving average of the drafted trees' nodes (None: none drafted yet)
        self.tokens = self.OPTIMISTIC_TOKENS  # moving average of the tokens a tree round yielded
        self.tree_scale = 1.0  # observed / table seconds of tree passes
        self.plain_scale = 1.0  # observed / table seconds of plain steps
        self.idle = 0  # plain steps since the last tree round
        self.credit = 0.0  # seconds that probes may still spend beyond plain steps (EXPLORE_SHARE of those taken)

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
            self.idle, self.interval = 0, self.probe_every
            return True
        self.idle += 1
        step = self.target.forward(1) * self.plain_scale
        self.credit += EXPLORE_SHARE * step
        extra = self.target.forward(1 + round(self.nodes or 0)) * self.tree_scale - step  # what a probe costs more
        if self.idle >= self.interval and extra <= self.credit:  # a probe: the estimates learn only from tree rounds
            self.idle, self.interval = 0, min(2 * self.interval, MAX_PROBE_INTERVAL)
            self.credit -= max(0.0, extra)
            return True
        return False

    def observe(self, nodes: int, accepted: int, seconds: float) -> None:
        """A round's tree size (0: a plain step), accepted drafts and target-pass seconds."""
        if nodes <= 0:
            self.plain_scale = _ema(self.plain_scale, _clamp(seconds / self.target.forward(1)), self.ema)
            return
        self.nodes = _ema(self.nodes, nodes, self.ema)
        self.tokens = _ema(self.tokens, 1.0 + accepted, self.ema)
        self.tree_scale = _ema(self.tree_scale, _clamp(seconds / self.target.forward(1 + nodes)), self.ema)


def _ema(prev: float | None, value: float, weight: float) -> float:
    """An exponential moving average moved ``weight`` of the way to ``value`` (``value`` itself
    when there is none yet)."""
    return value if prev is None else prev + weight * (value - prev)


def _clamp(ratio: float) -> float:
    """One round's observed / predicted seconds, kept within ``ROUND_RATIO_CLAMP``."""
    return min(max(ratio, ROUND_RATIO_CLAMP[0]), ROUND_RATIO_CLAMP[1])


def draft_step_estimate(needs_model: bool, target: CostTable, draft: CostTable | None) -> float:
    """Seconds per draft token before any round, as the engine starts its controller: ~0 for a
    drafter without a model (prompt lookup), the draft model's one-token pass, or
    ``UNMEASURED_DRAFT_STEP`` of a target step when the draft model's costs were not measured."""
    if not needs_model:
        return 0.0
    return draft.forward(1) if draft is not None else target.forward(1) * UNMEASURED_DRAFT_STEP


def draft_prefill_estimate(needs_model: bool, target: CostTable,
                           draft: CostTable | None) -> Callable[[int], float] | None:
    """Seconds for the drafter's model to read ``n`` tokens: the draft model's measured prefill
    rate, ``UNMEASURED_DRAFT_STEP`` of the target's without one; None for a drafter without a model."""
    if not needs_model:
        return None
    if draft is not None:
        return draft.prefill
    return lambda n: target.prefill(n) * UNMEASURED_DRAFT_STEP


def breakeven_acceptance(verify, draft_step: float, k_max: int) -> float | None:
    """The lowest acceptance (the same at every draft position) at which some K > 0 beats a plain
    step under these costs; None when not even near-perfect drafts (``OPTIMISTIC_ACCEPTANCE``) would."""
    k_max = max(1, k_max)
    if best_k(verify, draft_step, [OPTIMISTIC_ACCEPTANCE] * k_max, k_max) == 0:
        return None
    lo, hi = 0.0, OPTIMISTIC_ACCEPTANCE
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        if best_k(verify, draft_step, [mid] * k_max, k_max) > 0:
            hi = mid
        else:
            lo = mid
    return hi


def why_plain_steps(target: CostTable, draft_step: float, drafted: int, accepted: int) -> str:
    """Why k=auto chose plain steps (K=0), for people: the measured costs it weighed and the
    acceptance drafting would need, against what the drafts tried were kept at."""
    k_max = max(1, target.widths[-1] - 1)
    costs = (f"a plain step {target.forward(1) * 1e3:.0f} ms, a 5-token pass {target.forward(5) * 1e3:.0f} ms, "
             f"a draft token {draft_step * 1e3:.0f} ms")
    need = breakeven_acceptance(target.forward, draft_step, k_max)
    if need is None:
        return f"by this machine's measured pass costs ({costs}) not even near-perfect drafts would pay"
    seen = (f"the {drafted} drafts tried were kept at {accepted / drafted:.0%}" if drafted else "no draft was tried")
    return (f"by this machine's measured pass costs ({costs}) drafting pays only when drafts are kept at "
            f"{need:.0%} or more; {seen}")


def controller_for(target: CostTable, draft: CostTable | None, needs_model: bool, window: int) -> KController:
    """A new request kind's k=auto controller: the draft's cost per token and per token of backlog
    from the tables (a drafter without a model drafts for ~0), K up to the widest measured pass, and
    at least one past the rule's lookahead ``window`` (shorter blocks leave the rule inert)."""
    k_max = max(1, target.widths[-1] - 1)
    return KController(target, draft_step_estimate(needs_model, target, draft), k_max=max(k_max, window + 1),
                       window=window, draft_prefill=draft_prefill_estimate(needs_model, target, draft))


class WarmStates(OrderedDict):
    """k=auto's state per request kind, kept across requests (a dict of key -> state): at most
    ``limit`` kinds, the least recently used evicted first (a server sees any number of distinct
    request parameters)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def get_or_make(self, key, make: Callable[[], Any], stale: Callable[[Any], bool] = lambda state: False):
        """The state for ``key``, made by ``make()`` when there is none yet or it is ``stale``; now
        the most recently used."""
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
