"""How many tokens to draft: one small protocol the engine asks once per round.

A :class:`KPolicy` is made once per request (:func:`k_policy`) and answers :meth:`~KPolicy.budget`
before each round (the most drafts this round, 0 for a plain step), :meth:`~KPolicy.more` after
each draft token (whether the draft should propose another), and learns from each round's record
(:class:`~specdec.core.rounds.RoundRecord`) in :meth:`~KPolicy.observe`. ``k=N`` is :class:`Fixed`;
``k="auto"`` is :class:`AutoK` for chains and :class:`PassGate` for a tree without a draft model;
the portfolio drafter's is :class:`PortfolioK`. Every K policy is here, and :func:`k_policy` picks one.
The same objects drive :mod:`specdec.traces.replay`, so a replay of a trace runs this very code.

``k="auto"`` (:class:`AutoK`) decides from what it knows, with no probes and no online cost
corrections: the target's measured pass cost at each width (its :class:`~specdec.models.costmodel.CostTable`),
the draft model's one-token and reading costs, and an acceptance model: how often a draft token
is kept given the draft's own probability ``p`` of it (bins over ``p``, starting from the prior
measured at calibration on the reference text, and updated by every round, with forgetting, so
the prior returns where nothing is drafted: :mod:`specdec.core.acceptance`).

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
  tokens per second under a per-position acceptance estimate (learned from their rounds, not from
  their match length); their draft costs ~0. While they take plain steps the estimate fades back
  to its prior, so they try again after a bad stretch.
- A policy with a lookahead ``W`` (FLy's window) drafts at least ``W + 1`` when it drafts, since
  shorter blocks leave the window inert.

Token trees under ``k="auto"``: the model-drafted ``tree`` grows to its depth limit (its own
pruning sizes it); a tree without a draft model (lookahead), whose width its options fix, either
drafts its whole tree or takes a plain step (:class:`PassGate`).
"""

from __future__ import annotations

import math
from typing import Sequence

from .acceptance import MAX_RATE, AcceptanceEstimate, AcceptancePrior, Bins, CopyKey, RunRates, copy_situation
from ..models.costmodel import (
    FALLBACK_K, TIE_TOLERANCE, CostTable, best_k, best_k_rate, expected_tokens, tokens_per_second)
from ..draftlength import MAX_CHAIN, MAX_K, K
from .names import Source
from .rounds import Plan, RoundRecord

#: a backlog of at most this many tokens is a normal round's feed (the last bonus token, and the last
#: draft when every draft was kept): part of the per-draft cost, not a reading to weigh
STEADY_FEED = 2
#: a draft model's one-token pass as a share of the target's, when the draft's costs were not measured
UNMEASURED_DRAFT_STEP = 1 / 3
#: answer lengths remembered per controller (to judge whether a new answer runs long enough to read for)
LENGTHS = 16
#: a start position is planned again when the seconds per token drafting would take moved by this share
REPLAN = 0.01
#: passes are priced at a round's context rounded down to a multiple of this (tables made once per step)
CONTEXT_STEP = 64


def draft_step(target: CostTable, draft: CostTable | None, drafts_with_model: bool) -> float:
    """A draft token's seconds as k=auto prices them: none for a drafter without a model, the draft's
    measured one-token pass, else :data:`UNMEASURED_DRAFT_STEP` of the target's."""
    if not drafts_with_model:
        return 0.0
    return draft.forward(1) if draft is not None else target.forward(1) * UNMEASURED_DRAFT_STEP


def allowed_ks(table: CostTable) -> frozenset[int]:
    """The only K > 0 k=auto plans: those whose verify pass (K + 1 tokens) ``table`` measured."""
    return frozenset(w - 1 for w in table.widths if w >= 2)


def block_at(forward, step: float, rate: float, k_max: int, allowed: frozenset[int],
             window: int = 0) -> tuple[int, float]:
    """The best block at a constant acceptance ``rate``, by the target's pass seconds ``forward(width)``
    and a draft token's ``step``, and its seconds per token (a plain step's for K = 0); a policy's
    lookahead ``window`` drafts at least ``window + 1``."""
    rates = [rate] * k_max
    k = best_k(forward, step, rates, k_max, k_min=window + 1 if window else 1, allowed=allowed)
    return k, 1.0 / tokens_per_second(forward, step, rates, k)


def break_even_rate(target: CostTable, step: float) -> float | None:
    """The lowest acceptance (to within 2^-20 of :data:`~specdec.core.acceptance.MAX_RATE`) at which
    k=auto drafts a chain at all, by ``target``'s pass costs and a draft token's ``step`` seconds
    (:func:`draft_step`); None when not even ``MAX_RATE`` pays. What the CLI's note on plain steps quotes."""
    allowed = allowed_ks(target)

    def drafts(rate: float) -> bool:
        return block_at(target.forward, step, rate, MAX_CHAIN, allowed)[0] > 0

    if not drafts(MAX_RATE):
        return None
    lo, hi = 0.0, MAX_RATE
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if drafts(mid) else (mid, hi)
    return hi


class KPolicy:
    """What the engine (and a replay) asks each round. ``plan(t, room, backlog, offers)``: the round's
    :class:`~specdec.core.rounds.Plan` (how many drafts, 0 for a plain step; a portfolio's source)
    when ``t`` tokens are written, ``room`` drafts fit, the drafter must first read ``backlog``
    tokens, and a portfolio's copy sources make ``offers``; ``more(i, p)``: after draft ``i``
    (1-based), of draft probability ``p``, propose another?; ``observe(record)``: the round's record
    (what it drafted and kept, its seconds by part: :class:`~specdec.core.rounds.RoundRecord`);
    ``begin``/``end``: a request starts / ends with ``tokens`` written (``cut``: by the length
    limit, so the answer would have run longer). A policy of one source implements
    ``budget(t, room, backlog)``, the plan's K, or ``plan`` itself when it may decline a round (a plan
    of K = 0 with ``declined``: plain only because reading the backlog would not pay, :class:`AutoK`).
    ``declined``: how many rounds of this request it declined (for the stats)."""

    declined = 0
    #: the cost tables and prior it was made for (the engine makes a new one when they change)
    tables: tuple = ()

    def begin(self, max_new_tokens: int, prompt_tokens: int = 0, draft_context: int | None = None) -> None:
        """A request starts: at most ``max_new_tokens`` to write after ``prompt_tokens`` of prompt, of
        which the draft model reads ``draft_context`` (its window; None: all)."""
        self.declined = 0

    def plan(self, t: int, room: int, backlog: int, offers: Sequence = ()) -> Plan:
        """The round's plan; ``offers``: a portfolio's free drafts this round
        (:class:`~specdec.core.drafters.base.Offer`), which only :class:`PortfolioK` reads. By
        default :meth:`budget`'s K, never declined."""
        return Plan(self.budget(t, room, backlog))

    def budget(self, t: int, room: int, backlog: int) -> int:
        """The most drafts this round (0: a plain step), for a policy of one source."""
        raise NotImplementedError

    def more(self, i: int, p: float) -> bool:
        return True

    def observe(self, r: RoundRecord) -> None:
        pass

    def end(self, tokens: int, cut: bool = False) -> None:
        pass


class Fixed(KPolicy):
    """``k=N`` (a tree: depth N): always N drafts, within the room left."""

    def __init__(self, k: int):
        self.k = max(0, int(k))

    def budget(self, t: int, room: int, backlog: int) -> int:
        return max(0, min(self.k, room))


class AutoK(KPolicy):
    """``k="auto"`` for chains (module docstring)."""

    def __init__(self, target: CostTable, draft: CostTable | None = None, drafts_with_model: bool = True,
                 window: int = 0, prior: AcceptancePrior | None = None, k_max: int = MAX_CHAIN):
        self.target = target
        self.drafts_with_model = drafts_with_model
        self.draft = draft
        self.step = draft_step(target, draft, drafts_with_model)
        self.draft_view = 0  # prompt tokens the draft model reads this request (its window)
        self.step_context = -1  # the draft context self.step is priced at
        if not drafts_with_model:
            self.read = lambda n: 0.0
        elif draft is not None:
            self.read = draft.read
        else:
            self.read = lambda n: target.read(n) * UNMEASURED_DRAFT_STEP
        self.window = max(0, int(window))
        self.k_max = max(int(k_max), self.window + 1)
        self.allowed = allowed_ks(target)
        self.bins = Bins(prior or AcceptancePrior.assumed())
        self.positions = AcceptanceEstimate()  # drafters without a model: the draft model's prior says nothing of them
        self.lengths: list[tuple[int, bool]] = []  # recent answers' (length, cut by the limit), newest last
        self.max_new = 0
        self.start_at: int | None = 0  # this request's position to start reading at (None: never)
        self.planned_backlog, self.planned_t, self.planned_until = -1, 0, 0  # what start_at was planned for
        self.planned_spt = 0.0  # and at which seconds per token drafting would take
        self._plans: dict[float, tuple[int, float]] = {}
        self.probs: list[float] = []  # this round's draft probabilities
        self.kept_p = 1.0  # the chance every draft of this round so far is kept
        self.limit = 0  # this round's budget

    def retable(self, target: CostTable) -> None:
        """Plan on ``target`` from now on (the portfolio prices each request at its prompt's context)."""
        if target is not self.target:
            self.target, self.allowed = target, allowed_ks(target)
            self._plans.clear()

    # ------------------------------------------------------------------ estimates
    def block(self, rate: float | None = None) -> tuple[int, float]:
        """The best block at a constant acceptance ``rate`` (the pooled one by default) and its
        seconds per token (a plain step's for K = 0)."""
        rate = self.rate() if rate is None else rate
        if rate not in self._plans:
            if len(self._plans) > 64:
                self._plans.clear()
            self._plans[rate] = block_at(self.target.forward, self.step, rate, self.k_max, self.allowed, self.window)
        return self._plans[rate]

    def rate(self) -> float:
        return self.bins.pooled() if self.drafts_with_model else self.positions.pooled

    def start(self, t: int, room: int, backlog: int) -> int | None:
        """The position at which reading ``backlog`` (growing by one a token until then) gains the
        most over the answer's expected remaining length (None: it never gains). The lengths to
        expect: the recent answers still going at ``t`` (one cut by its length limit, as long as the
        room allows); with none yet, as long as the room allows; with every recent answer shorter,
        as long again as it has run."""
        k, spt = self.block()
        saving = self.target.forward(1) - spt
        ends = [t + room + 1 if cut else n for n, cut in self.lengths if cut or n > t]
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
    def begin(self, max_new_tokens: int, prompt_tokens: int = 0, draft_context: int | None = None) -> None:
        self.declined = 0
        self.max_new = max_new_tokens
        self.planned_backlog = -1
        self.draft_view = max(0, int(prompt_tokens if draft_context is None else draft_context))
        self.step_context = -1

    def _reprice(self, t: int) -> None:
        """A draft token priced at the context the draft model drafts at: its window of the prompt and
        the answer so far (per :data:`CONTEXT_STEP`), on its table's wide passes where measured
        (:meth:`~specdec.models.costmodel.CostTable.step_at`)."""
        if not self.drafts_with_model or self.draft is None:
            return
        at = (self.draft_view + t) // CONTEXT_STEP * CONTEXT_STEP
        if at != self.step_context:
            self.step_context, step = at, self.draft.step_at(at)
            if step != self.step:
                self.step = step
                self._plans.clear()

    def budget(self, t: int, room: int, backlog: int) -> int:
        return self.plan(t, room, backlog).k

    def plan(self, t: int, room: int, backlog: int, offers: Sequence = ()) -> Plan:
        """The round's K (its drafts stop earlier when :meth:`more` says so); declined when it is
        plain only because the draft model would first read ``backlog`` tokens (growing by one a token
        until :meth:`start`'s position), which the drafts would not repay."""
        self.probs, self.kept_p, self.limit = [], 1.0, 0
        if room <= 0:
            return Plan()
        self._reprice(t)
        k, spt = self.block()
        if k == 0:  # nothing is learned at K = 0: the prior slowly returns
            self._fade()
            return Plan()
        if backlog > STEADY_FEED and self.drafts_with_model:
            if (self.planned_backlog < 0 or backlog != self.planned_backlog + (t - self.planned_t)
                    or t >= self.planned_until or abs(spt - self.planned_spt) > REPLAN * self.planned_spt):
                self.start_at, self.planned_backlog, self.planned_t = self.start(t, room, backlog), backlog, t
                self.planned_spt = spt
            if self.start_at is None or t < self.start_at:
                self.declined += 1
                self._fade()  # nor while waiting to read: else a plan that barely pays never starts
                return Plan(declined=True)
        room = min(room, self.k_max)
        if not self.drafts_with_model:  # no probabilities: the block with the most tokens per second
            k = best_k(self.target.forward, 0.0, self.positions.rates(room), room, allow_zero=False,
                       k_min=min(room, self.window + 1) if self.window else 1, allowed=self.allowed | {room})
            self.limit = k
            return Plan(k)
        self.limit = room
        return Plan(room)

    def _fade(self) -> None:
        self.bins.decay() if self.drafts_with_model else self.positions.forget()
        self._plans.clear()

    def more(self, i: int, p: float) -> bool:
        self.probs.append(float(p))
        self.kept_p *= self.bins.rate(p)
        if i >= self.limit:
            return False
        if i <= self.window:
            return True
        c = self.rate()
        _, spt = self.block(c)
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

    def observe(self, r: RoundRecord) -> None:
        if r.drafted <= 0:
            return
        self._plans.clear()
        if self.drafts_with_model:
            self.bins.update(self.probs[:r.drafted], r.accepted)
        else:
            self.positions.update(r.drafted, r.accepted)

    def end(self, tokens: int, cut: bool = False) -> None:
        if tokens > 0:
            self.lengths = (self.lengths + [(int(tokens), bool(cut))])[-LENGTHS:]


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

    def observe(self, r: RoundRecord) -> None:
        """A round's tree size (0: a plain step), accepted drafts and target-pass seconds."""
        drafted, seconds = r.drafted, r.verify_seconds
        if seconds <= 0:
            return
        if drafted <= 0:
            self.plain_scale = _ema(self.plain_scale, _clamp(seconds / self.target.forward(1)), self.EMA)
            return
        self.nodes = _ema(self.nodes, drafted, self.EMA)
        self.tokens = _ema(self.tokens, 1.0 + r.accepted, self.EMA)
        self.tree_scale = _ema(self.tree_scale, _clamp(seconds / self.target.forward(1 + drafted)), self.EMA)


def _ema(prev: float | None, value: float, weight: float) -> float:
    return value if prev is None else prev + weight * (value - prev)


def _clamp(ratio: float) -> float:
    return min(max(ratio, 0.1), 10.0)


#: where the target's table has no wide passes measured (an older table, a folder's), a round that
#: drafts prices its pass's extra width over a one-token pass at this times the table's: the tables'
#: own passes run over a 32-token cache, and at the contexts answers run at (hundreds of tokens) a wide
#: pass's extra cost was 1.26-1.43x the table's (AVX2-only EPYC, 4-bit target, rounds of the edit
#: workload and Spec-Bench); 1.5 did best of 1.0-1.8 replayed on those traces (docs/free-drafts.md).
#: A table with wide passes (:attr:`~specdec.models.costmodel.CostTable.wide_widths`) is priced at each
#: round's context instead (:func:`priced_at`)
WIDTH_PREMIUM = 1.5


class PortfolioK(KPolicy):
    """The K policy of the portfolio drafter (``drafter="auto"``,
    :mod:`specdec.core.drafters.auto`): each round, the source and K with the most expected tokens per
    second at the target's measured pass costs, or a plain step.

    - Every pass is priced at the round's context (the prompt and the answer so far,
      :func:`priced_at`): on the target's table at that context where its wide passes were measured,
      else with the pass's extra width at :data:`WIDTH_PREMIUM` times the table's.
    - A copy source's offer (prompt lookup, suffix: free to ask and to propose) is priced by its
      run (:class:`~specdec.core.acceptance.RunRates`, one per source and situation,
      :func:`~specdec.core.acceptance.copy_situation`: at the answer's start, a match reaching back to
      it, or neither; whether another offer starts with the same token; learned from every offer
      scored against what each round committed, drafted or not): its K is the prefix with the most
      expected tokens per second, ``E(K) / pass(K + 1)``, up to the widest pass the table measured
      (:func:`copy_ks`: a copy of 127 tokens where passes of 128 were measured).
    - The draft model is the :class:`AutoK` it would have alone (when reading its backlog pays, the
      block at the pooled acceptance, after each draft whether to go on), its passes priced at the
      prompt's context; its rate is its plan's.
    - A plain step yields one token per one-token pass. Ties go to the free sources, then to plain.

    ``k=N`` (``fixed``), or no cost table: every round drafts N from the source with the most
    expected kept tokens (the model at its prior's mean acceptance), a plain step when none offers."""

    def __init__(self, target: CostTable | None, draft: CostTable | None = None, *, has_model: bool,
                 prior: AcceptancePrior | None = None, window: int = 0, fixed: int | None = None,
                 rates: dict[CopyKey, RunRates] | None = None):
        self.target, self.fixed = target, None if fixed is None else max(0, int(fixed))
        self.prompt = 0  # this request's prompt tokens: a round's context is the prompt and the answer so far
        self._priced: dict[int, tuple[CostTable, frozenset[int]]] = {}  # per context step: the table and its Ks
        self.model = AutoK(self.priced_at(0)[0], draft, True, window, prior) \
            if has_model and target is not None and fixed is None else None
        self.model_rate = (prior or AcceptancePrior.assumed()).mean if has_model else 0.0  # k=N: the model's
        self.window = max(0, int(window))  # a policy's lookahead: a copy drafts more than it, or nothing
        #: the copy sources' chances per run bin, per source and situation (``rates``: to start from,
        #: e.g. a replay's rates fitted with hindsight, which learn nothing)
        self.rates: dict[CopyKey, RunRates] = dict(rates or {})
        self.situations: dict[str, CopyKey] = {}  # this round's offers' situations, by source
        self.chosen = Plan()  # this round's plan (what :meth:`more` drafts by)

    def begin(self, max_new_tokens: int, prompt_tokens: int = 0, draft_context: int | None = None) -> None:
        self.declined = 0
        self.prompt = max(0, int(prompt_tokens))
        if self.model is not None:
            self.model.retable(self.priced_at(self.prompt)[0])
            self.model.begin(max_new_tokens, prompt_tokens, draft_context)

    def priced_at(self, context: int) -> tuple[CostTable, frozenset[int]]:
        """The target's passes as a round at ``context`` tokens is priced (:func:`priced_at`, per
        :data:`CONTEXT_STEP`) and the Ks a copy may draft on them (:func:`copy_ks`)."""
        step = max(0, int(context)) // CONTEXT_STEP * CONTEXT_STEP
        if step not in self._priced:
            if len(self._priced) > 256:
                self._priced.clear()
            assert self.target is not None, "priced only with a target's table"
            table = priced_at(self.target, step)
            self._priced[step] = (table, copy_ks(table))
        return self._priced[step]

    def copy_price(self, offer, room: int, table: CostTable | None = None,
              ks: frozenset[int] = frozenset()) -> tuple[int, float]:
        """``(K, expected tokens per second)`` of the offer's best prefix on ``table`` (``(0, 0)``:
        none); with ``k=N`` or no table, ``(K, expected kept tokens)``."""
        widest = table.widest if table is not None else MAX_K
        n = min(len(offer.tokens), room, widest - 1)  # K drafts: a pass of K + 1, the widest the table measured
        if n <= self.window:
            return 0, 0.0
        chances = self.rates_of(offer.source).kept_chances(offer.run, n)
        if self.fixed is not None or table is None:
            k = min(n, self.fixed or n)
            return k, expected_tokens(chances, k)
        return best_k_rate(table.forward, 0.0, chances, n, k_min=self.window + 1, allow_zero=False, allowed=ks)

    def rates_of(self, source: str) -> RunRates:
        """The chances per run bin of ``source``'s copies in this round's situation (:meth:`plan`
        sets it; a source it has not seen counts as mid-answer, alone)."""
        key = self.situations.get(source) or (source, "part", False)
        rates = self.rates.get(key)
        if rates is None:
            rates = self.rates[key] = RunRates()
        return rates

    def plan(self, t: int, room: int, backlog: int, offers: Sequence = ()) -> Plan:
        firsts = {o.source: o.tokens[0] for o in offers if o.tokens}
        self.situations = {o.source: copy_situation(o.source, o.run, t, firsts.get(o.source, -1),
                                                    [f for s, f in firsts.items() if s != o.source]) for o in offers}
        self.chosen = Plan()
        if room > 0:
            self.chosen = (self._fixed(room, offers) if self.fixed is not None or self.target is None
                           else self._cheapest(t, room, backlog, offers))
        self.declined += self.chosen.declined
        return self.chosen

    def budget(self, t: int, room: int, backlog: int) -> int:
        """The plan's K with no copy offers (the draft model or a plain step)."""
        return self.plan(t, room, backlog).k

    def _cheapest(self, t: int, room: int, backlog: int, offers: Sequence) -> Plan:
        table, ks = self.priced_at(self.prompt + t)
        best, choice = 1.0 / table.forward(1), Plan()
        for offer in offers:
            k, rate = self.copy_price(offer, room, table, ks)
            if k and rate > best * (1 + TIE_TOLERANCE):
                best, choice = rate, Plan(k, offer.source)
        if self.model is not None:
            mine = self.model.plan(t, room, backlog)
            if mine.k and 1.0 / self.model.block()[1] > best * (1 + TIE_TOLERANCE):
                choice = Plan(mine.k, Source.MODEL)
            elif choice.source is None and mine.declined:
                choice = Plan(declined=True)  # plain only because reading the backlog would not pay
        return choice

    def _fixed(self, room: int, offers: Sequence) -> Plan:
        k = min(room, self.fixed if self.fixed is not None else FALLBACK_K)
        best, choice = 0.0, Plan()
        if self.model_rate > 0:
            best, choice = expected_tokens([self.model_rate] * k, k), Plan(k, Source.MODEL)
        for offer in offers:
            kk, kept = self.copy_price(offer, k)
            if kk and kept > best * (1 + TIE_TOLERANCE):
                best, choice = kept, Plan(kk, offer.source)
        return choice

    def more(self, i: int, p: float) -> bool:
        if self.chosen.source == Source.MODEL and self.model is not None:
            return self.model.more(i, p)
        return i < self.chosen.k

    def observe(self, r: RoundRecord) -> None:
        if r.source == Source.MODEL and self.model is not None:
            self.model.observe(r)
        for source, run, reached, kept in r.offers:
            self.rates_of(source).update(run, reached, kept)

    def end(self, tokens: int, cut: bool = False) -> None:
        if self.model is not None:
            self.model.end(tokens, cut)


def premium(table: CostTable) -> CostTable:
    """``table`` with every pass's extra width over a one-token pass at :data:`WIDTH_PREMIUM` times
    its price (how :class:`PortfolioK` prices a table without wide passes)."""
    import dataclasses

    one = table.forward(1)
    return dataclasses.replace(table, seconds=[one + WIDTH_PREMIUM * (s - one) for s in table.seconds])


def priced_at(table: CostTable, context: int) -> CostTable:
    """``table``'s passes after ``context`` tokens as :class:`PortfolioK` prices them: measured at
    that context where the table has wide passes (:meth:`CostTable.at_context`), else at
    :data:`WIDTH_PREMIUM` (:func:`premium`)."""
    return table.at_context(context) if table.wide_widths else premium(table)


def copy_ks(table: CostTable) -> frozenset[int]:
    """The Ks a copy may draft on ``table``: those whose pass the short-context curve measured
    (it is jagged there: 4-bit kernels take rows in fours), and every K up to the widest pass beyond
    it (wide passes cost about in proportion to their width, read between the measured ones)."""
    return allowed_ks(table) | frozenset(range(MAX_K, table.widest))


def k_policy(k: K, target: CostTable | None, draft: CostTable | None, *, drafts_with_model: bool, trees: bool,
             depth_limit: int, window: int, fallback_k: int, prior: AcceptancePrior | None = None,
             portfolio: bool = False, has_model: bool = False) -> KPolicy:
    """A new K policy (for :class:`WarmStates` to keep across requests): a portfolio drafter gets
    :class:`PortfolioK` (``has_model``: a draft model is among its sources); otherwise ``k=N`` is
    :class:`Fixed`; ``k="auto"`` without a cost table drafts ``fallback_k`` (a tree: its depth
    limit); with one, a chain gets :class:`AutoK`, a tree with a draft model its depth limit, one
    without a :class:`PassGate`."""
    if portfolio:
        return PortfolioK(target, draft, has_model=has_model, prior=prior, window=window,
                          fixed=k.fixed)
    if k.fixed is not None:  # not auto
        return Fixed(k.fixed)
    if trees:
        if target is not None and not drafts_with_model:
            return PassGate(target, depth_limit)
        return Fixed(depth_limit)
    if target is None:
        return Fixed(fallback_k)
    return AutoK(target, draft, drafts_with_model, window, prior)
