"""Replaying greedy generations on any machine's cost tables: plain decoding, every fixed K, k=auto
as implemented, and the oracle.

A trace (:mod:`specdec.traces.trace`) fixes every round of greedy lossless decoding given a K schedule;
a cost table (:class:`~specdec.models.costmodel.CostTable`, this machine's or another's, ``specdec
calibrate --export``) prices each pass. So the end-to-end seconds of a generation are computed,
not measured, the way the engine spends them:

- the target's prefill of the prompt but its last token (one pass, logits at the last);
- per round that drafts: the draft model reads its backlog in one pass (its window of the prompt
  at the first draft, else the 1-2 tokens since its last draft, more after plain steps), which
  gives the first draft token, then one pass per further draft token; then the target's verify
  pass over ``K + 1`` tokens at its measured width;
- per plain step: the target's one-token pass.

Each pass costs its table's seconds times ``1 + context_slope * (context - table.context)`` (the
tables are measured over a 32-token cache; an exported table carries the slope it measured).

:func:`replay` runs a :class:`~specdec.core.autok.KPolicy` (the engine's own objects:
:class:`~specdec.core.autok.Fixed`, :class:`~specdec.core.autok.AutoK`) over a trace; :func:`oracle` is the schedule with hindsight that minimises the
time: dynamic programming over (answer position, draft backlog), where each round's K is chosen
knowing how many drafts will be kept and how long the answer runs, so it is an upper bound no
controller reaches (it never drafts for a short answer, and stops every block just before its
first rejection).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..models.costmodel import CostTable
from ..draftlength import MAX_CHAIN
from ..errors import SpecdecError
from ..core.names import Source
from ..core.rounds import Plan, RoundRecord
from .trace import DraftTrace, Trace


@dataclass
class Clock:
    """The seconds of each pass, from a target's and a draft's cost tables."""

    target: CostTable
    draft: CostTable | None = None
    #: the engine's own seconds beside the passes (its Python, the rule, cache bookkeeping): per plain
    #: step, per round that drafts, and per draft token. 0 on a CPU, where they are a few percent of a
    #: pass; on a GPU, where a pass is launch-bound, ``scripts/gpu_projection.py`` measures them.
    step_overhead: float = 0.0
    round_overhead: float = 0.0
    token_overhead: float = 0.0
    _at: dict = field(default_factory=dict, repr=False, compare=False)  # the target's table per context step

    def verify(self, width: int, context: int) -> float:
        """A verify pass of ``width`` tokens after ``context``: on the target's table at that context
        where its wide passes were measured (:meth:`CostTable.at_context`, per 64 tokens of context),
        else scaled by its ``context_slope``."""
        if self.target.wide_widths:
            step = context // 64 * 64
            table = self._at.get(step)
            if table is None:
                table = self._at[step] = self.target.at_context(step)
            return table.forward(width)
        return self.target.forward(width) * self.target.slope_scale(context)

    def prefill(self, tokens: int) -> float:
        return self.target.read(tokens) * self.target.slope_scale(tokens // 2)

    def draft_read(self, tokens: int, context: int) -> float:
        if self.draft is None:
            return 0.0
        return self.draft.read(tokens) * self.draft.slope_scale(context)

    def draft_reads(self, size: int) -> np.ndarray:
        """``draft_read(b, context)`` for ``b`` in ``0..size-1`` at the table's own context (times
        :meth:`draft_scale` for another)."""
        if self.draft is None:
            return np.zeros(size)
        return np.array([self.draft.read(b) for b in range(size)])

    def draft_scale(self, context: int) -> float:
        return 1.0 if self.draft is None else self.draft.slope_scale(context)

    def draft_step(self, context: int) -> float:
        return 0.0 if self.draft is None else self.draft.step_at(context)


@dataclass
class Replayed:
    """One generation's replayed seconds and rounds."""

    seconds: float = 0.0
    prefill: float = 0.0
    draft: float = 0.0
    verify: float = 0.0
    overhead: float = 0.0  # the engine's own (Clock.step_overhead, ...)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    k_chosen: list[int] = field(default_factory=list)  # drafts proposed per round (0: a plain step)
    accepted_per_round: list[int] = field(default_factory=list)
    sources: list[str | None] = field(default_factory=list)  # a portfolio: the source that drafted each round

    @property
    def tau(self) -> float:
        """Mean tokens per round (the target's own included)."""
        return self.tokens / self.rounds if self.rounds else 0.0


def _proposal(dt: DraftTrace, t: int, i: int, n: int, state: dict) -> tuple[float, bool]:
    """The ``i``-th draft (1-based) of a round from answer position ``t``: (its draft probability,
    whether it is a stop id). On the answer while every draft so
    far agreed; after the first disagreement, the recorded chain (else the answer's probabilities
    at those positions stand in)."""
    pos = t + i - 1
    if state.get("off") is None:
        if pos >= n:
            return 0.0, True  # past the answer's end: the generation is over after this round
        if not dt.agree[pos]:
            state["off"], state["chain"] = pos, None if dt.chains is None else dt.chains.get(pos)
        return dt.top1[pos], dt.stops[pos]
    chain = state["chain"]
    j = pos - state["off"] - 1
    if chain is not None:
        if j < len(chain):
            return chain[j][0], chain[j][1]
        return 0.0, False  # the chain stopped where keeping every draft had become unlikely
    return (dt.top1[pos] if pos < n else 0.0), False


class ModelSource:
    """A draft model's proposals, from its :class:`~specdec.traces.trace.DraftTrace`: a round reads the
    backlog (its window of the prompt at the first draft, else what was written since), then one
    pass per further draft token; ``more`` is asked after each at the draft's probability."""

    def __init__(self, dt: DraftTrace, trace: Trace):
        self.dt, self.n, self.read = dt, len(trace.answer), 0  # tokens of its view it has read

    def backlog(self, t: int) -> int:
        return self.dt.view + t - min(self.read, self.dt.view + t - 1)

    def propose(self, t: int, k: int, policy, clock: Clock) -> tuple[int, int, float]:
        """``(drafted, accepted, draft seconds)`` of a round from answer position ``t`` with budget ``k``."""
        view = self.dt.view
        seconds = clock.draft_read(self.backlog(t), view + t)
        state: dict = {}
        drafted = 0
        for i in range(1, k + 1):
            p, stop = _proposal(self.dt, t, i, self.n, state)
            drafted = i
            if not policy.more(i, p) or i == k or stop:
                break
            seconds += clock.draft_step(view + t + i)
        accepted = 0
        while accepted < drafted and t + accepted < self.n and self.dt.agree[t + accepted]:
            accepted += 1
        return drafted, accepted, seconds

    def commit(self, t: int, drafted: int, accepted: int) -> None:
        if drafted:
            self.read = self.dt.view + t + min(accepted, drafted - 1)


class LookupSource:
    """A drafter without a model (prompt lookup, suffix), run as the engine runs it on the prompt
    and the answer: its proposals are compared with the answer; its drafting costs nothing."""

    def __init__(self, drafter, trace: Trace):
        if trace.prompt is None:
            raise SpecdecError(f"{trace.sample_id}: this trace holds no prompt ids, so a drafter without a model "
                               "cannot be replayed on it; make it again with 'specdec trace'")
        from ..core.sampling import SamplingParams

        self.drafter, self.trace, self.params = drafter, trace, SamplingParams(temperature=0.0)
        self.context = list(trace.prompt)
        drafter.start(self.context)

    def backlog(self, t: int) -> int:
        return 0

    def offer(self, t: int, room: int):
        """A copy source's :class:`~specdec.core.drafters.base.Offer` at answer position ``t`` (None: none)."""
        return self.drafter.offer(self.context, room) if room > 0 else None

    def propose(self, t: int, k: int, policy, clock: Clock) -> tuple[int, int, float]:
        answer = self.trace.answer
        tokens = self.drafter.propose(self.context, k, self.params, None).tokens[:k]
        accepted = 0
        while accepted < len(tokens) and t + accepted < len(answer) and tokens[accepted] == answer[t + accepted]:
            accepted += 1
        return len(tokens), accepted, 0.0

    def commit(self, t: int, drafted: int, accepted: int) -> None:
        assert self.trace.prompt is not None  # a copy source replays a trace with its prompt
        self.context = list(self.trace.prompt) + self.trace.answer[: t + accepted + 1]
        self.drafter.commit(self.context, drafted, accepted)


def _drafting(model: ModelSource | None, lookup: LookupSource | None) -> ModelSource | LookupSource:
    """The source a round drafts from: the model's, else prompt lookup's (a round drafts only with one)."""
    source = model or lookup
    assert source is not None, "a round drafts only with a source"
    return source


def replay(trace: Trace, draft: str | None, policy, clock: Clock, drafter=None, copies: Sequence = ()) -> Replayed:
    """The seconds of ``trace``'s generation under ``policy`` (None: plain decoding) with the draft
    ``draft`` (a name in ``trace.drafts``), or with ``drafter`` (a drafter without a model, e.g.
    :class:`~specdec.core.drafters.LookupDrafter`, run on the trace's prompt and answer); the policy is
    asked exactly as the engine asks it, and learns from each round's
    :class:`~specdec.core.rounds.RoundRecord`. A portfolio (:class:`~specdec.core.autok.PortfolioK`): its copy
    sources as ``copies`` (drafters with ``offer``, fresh for this request), asked for their offers
    each round as the engine asks them, beside the draft ``draft`` (None: no model among them)."""
    n, prompt = len(trace.answer), trace.prompt_tokens
    out = Replayed()
    out.prefill = clock.prefill(prompt - 1)
    model = lookup = None
    sources: list[LookupSource] = []
    if policy is not None:
        model = ModelSource(trace.drafts[draft], trace) if draft is not None else None
        lookup = LookupSource(drafter, trace) if drafter is not None else None
        sources = [LookupSource(d, trace) for d in copies]
        policy.begin(trace.max_new_tokens, prompt_tokens=prompt,
                     draft_context=model.dt.view if model is not None else prompt)
    t = 0
    while t < n:
        room = trace.max_new_tokens - t
        offers = [o for o in (c.offer(t, room - 1) for c in sources) if o is not None] if room > 1 else []
        plan = Plan() if policy is None else policy.plan(t, room - 1, model.backlog(t) if model else 0, offers)
        k = max(0, min(plan.k, room - 1))
        chosen = plan.source if k and sources else None
        drafted = accepted = 0
        seconds = 0.0
        if k and chosen is not None and chosen != Source.MODEL:
            offer = next(o for o in offers if o.source == chosen)
            drafted = min(k, len(offer.tokens))
            accepted = offer.outcome(trace.answer[t:t + drafted])[1]
        elif k:
            drafted, accepted, seconds = _drafting(model, lookup).propose(t, k, policy, clock)
            out.draft += seconds
        sec = clock.verify(drafted + 1, prompt + t)
        out.verify += sec
        out.overhead += clock.round_overhead + drafted * clock.token_overhead if drafted else clock.step_overhead
        if policy is not None:  # the round's record, as the engine leaves it
            committed = trace.answer[t:t + accepted + 1]
            policy.observe(RoundRecord(budget=k, drafted=drafted, accepted=accepted, draft_seconds=seconds,
                                       verify_seconds=sec, source=chosen if drafted else None,
                                       offers=tuple((o.source, o.run, *o.outcome(committed)) for o in offers)))
        out.rounds += 1
        out.drafted += drafted
        out.accepted += accepted
        out.tokens += min(accepted + 1, n - t)
        out.k_chosen.append(drafted)
        out.accepted_per_round.append(accepted)
        out.sources.append(chosen if drafted else None)
        if model is not None:
            model.commit(t, drafted if chosen in (None, Source.MODEL) else 0, accepted)
        for c in ([lookup] if lookup is not None else []) + sources:
            c.commit(t, drafted, accepted)
        t += accepted + 1
    if policy is not None:
        policy.end(n, cut=trace.finish_reason == "length")
    out.seconds = out.prefill + out.draft + out.verify + out.overhead
    return out


def copy_offers(trace: Trace, copies: Sequence, k_max: int = MAX_CHAIN) -> dict[str, tuple[np.ndarray, ...]]:
    """Each copy source's offer at every answer position ``t`` (its drafter run on the prompt and
    ``answer[:t]``, as a portfolio asks it): per source, ``(length[t], kept[t], run[t], first[t])``,
    the offer's length (0: none), how many of its tokens the answer goes on with, its run and its
    first token (-1: none)."""
    n = len(trace.answer)
    out: dict[str, tuple[np.ndarray, ...]] = {}
    for drafter in copies:
        source = LookupSource(drafter, trace)
        length, kept, run = (np.zeros(n, dtype=np.int64) for _ in range(3))
        first = np.full(n, -1, dtype=np.int64)
        for t in range(n):
            offer = source.offer(t, k_max)
            if offer is not None:
                length[t], kept[t] = len(offer.tokens), offer.outcome(trace.answer[t:t + len(offer.tokens)])[1]
                run[t], first[t] = offer.run, offer.tokens[0]
            source.commit(t, 0, 0)
        out[drafter.name] = (length, kept, run, first)
    return out


def runs(dt: DraftTrace, n: int) -> np.ndarray:
    """``runs[t]``: how many answer positions from ``t`` on the draft agrees with in a row."""
    out = np.zeros(n + 1, dtype=np.int64)
    for t in range(n - 1, -1, -1):
        out[t] = out[t + 1] + 1 if dt.agree[t] else 0
    return out


def oracle(trace: Trace, draft: str | None, clock: Clock, k_max: int = MAX_CHAIN,
           copies: dict[str, tuple[np.ndarray, ...]] | None = None) -> float:
    """The least end-to-end seconds of ``trace``'s generation over every K schedule (module
    docstring): ``V[t, b]``, the seconds to finish from answer position ``t`` with a draft backlog
    of ``b`` tokens, is the cheaper of a plain step (to ``t + 1``, backlog ``b + 1``) and a round
    that reads the backlog and drafts the best ``K`` (to ``t + a + 1``, backlog 1, or 2 when all
    ``K`` were kept). The portfolio's oracle: also each copy source's offer at ``t`` (``copies``,
    :func:`copy_offers`), cut to the best ``K`` (to ``t + a + 1``, the draft's backlog ``b + a + 1``);
    ``draft=None``: no model among the sources."""
    n, prompt = len(trace.answer), trace.prompt_tokens
    dt = trace.drafts[draft] if draft is not None else None
    view = dt.view if dt is not None else 0
    run = runs(dt, n) if dt is not None else None
    size = view + n + 2 if dt is not None else 1
    values = np.zeros((n + 2, size))  # rows past the answer's end cost nothing more
    reads = clock.draft_reads(size)

    def later(row: np.ndarray, fed: int) -> np.ndarray:
        """``row`` seen from a backlog ``fed`` tokens shorter (the model read none of them)."""
        return row if size == 1 else np.append(row[fed:], np.full(fed, row[-1]))

    for t in range(n - 1, -1, -1):
        room = trace.max_new_tokens - t
        best_row = clock.verify(1, prompt + t) + clock.step_overhead + later(values[t + 1], 1)
        for length, kept, *_ in (copies or {}).values():
            for k in range(1, min(k_max, room - 1, int(length[t])) + 1):
                a = min(k, int(kept[t]))
                cost = (clock.verify(k + 1, prompt + t) + clock.round_overhead + k * clock.token_overhead
                        + later(values[min(t + a + 1, n)], a + 1))
                best_row = np.minimum(best_row, cost)
        if dt is not None and run is not None:  # both or neither
            best = np.inf
            step = clock.draft_step(view + t)
            for k in range(1, min(k_max, room - 1, int(run[t]) + 1) + 1):
                a = min(k, int(run[t]))
                nxt = min(t + a + 1, n)
                cost = ((k - 1) * step + clock.verify(k + 1, prompt + t) + clock.round_overhead
                        + k * clock.token_overhead + values[nxt, 2 if a == k else 1])
                best = min(best, cost)
            if np.isfinite(best):
                best_row = np.minimum(best_row, reads * clock.draft_scale(view + t) + best)
        values[t] = best_row
    return clock.prefill(prompt - 1) + float(values[0, view])
