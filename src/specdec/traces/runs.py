"""Replaying many traces at once, the library under ``specdec replay`` and the scripts: every trace of
a run under plain decoding, fixed K, k=auto and the oracle (:func:`replay_all`), under the portfolio
drafter (:func:`replay_portfolio`), the copy rates a run's traces show (:func:`fitted_copy_rates`,
:class:`FittedRates`), a stop-threshold controller for comparison (:class:`StopBelow`), and the cost
tables a replay prices with (:func:`read_tables`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.acceptance import COPY_PRIOR, RUN_EDGES, CopyKey, RunRates, copy_situation, run_bin
from ..core.autok import KPolicy
from ..draftlength import MAX_CHAIN
from ..errors import SpecdecError

if TYPE_CHECKING:
    from .replay import Clock

#: the fixed Ks a replay prices by default
DEFAULT_KS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15)
#: the most bytes one cost table file may have
COSTS_LIMIT = 16 << 20


def read_tables(paths: list[str]) -> dict[str, object]:
    """Cost tables by model name (before any ``|``), from export files, table files or folders."""
    from ..models.costmodel import CostTable
    from ..models.files import read_regular

    tables: dict[str, object] = {}
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.glob("*.json"))
        elif p.exists():
            files.append(p)
        else:
            raise SpecdecError(f"--costs {p}: no such file or folder")
    for f in files:
        raw = read_regular(f, COSTS_LIMIT, "cost table file")  # a FIFO or a link to /dev/zero is refused, not read
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise SpecdecError(f"{f}: not a JSON cost table ({exc.__class__.__name__})") from None
        items = data.get("tables", []) if isinstance(data, dict) and data.get("kind") == "specdec-costs" else [data]
        if not isinstance(items, list):
            raise SpecdecError(f"{f}: its 'tables' is not a list of cost tables")
        for d in items:
            if not isinstance(d, dict) or "widths" not in d:
                continue
            try:
                t = CostTable.from_dict(d)
            except (ValueError, KeyError, TypeError) as exc:
                raise SpecdecError(f"{f}: not a cost table this specdec reads ({exc})") from None
            tables[t.model.split("|")[0]] = t
    if not tables:
        raise SpecdecError(f"--costs {', '.join(paths)}: no cost tables found")
    return tables


def summed(rows: list[dict]) -> dict:
    out = {"plain": sum(r["plain"] for r in rows), "auto": sum(r["auto"] for r in rows),
           "oracle": None if any(r["oracle"] is None for r in rows) else sum(r["oracle"] for r in rows), "tokens": sum(r["tokens"] for r in rows),
           "rounds": sum(r["auto_rounds"] for r in rows), "prompts": len(rows)}
    out["fixed"] = {k: sum(r["fixed"][k] for r in rows) for k in rows[0]["fixed"]} if rows else {}
    out["threshold"] = {k: sum(r["threshold"][k] for r in rows) for k in rows[0]["threshold"]} if rows else {}
    out["auto_tau"] = out["tokens"] / out["rounds"] if out["rounds"] else 0.0
    if rows and all("fitted" in r for r in rows):
        out["fitted"] = sum(r["fitted"] for r in rows)
    return out


class FittedRates(RunRates):
    """A copy source's chances per run bin fixed to what the replayed traces show (learns nothing)."""

    def update(self, run: int, reached: int, kept: int) -> None:
        return None


def fitted_copy_rates(offered: list[dict]) -> dict[CopyKey, tuple[float, ...]]:
    """The portfolio's realistic bound's rates: per copy source and situation (as the portfolio
    keeps them apart, :func:`~specdec.core.acceptance.copy_situation`), the share of offered tokens
    the answers kept, per run bin, over every offer at every position of the traces
    (:func:`specdec.traces.replay.copy_offers`, censored as the portfolio learns: a copy matched to its
    end says nothing past it), fitted with hindsight; a bin never judged keeps the prior."""
    bins = len(RUN_EDGES) + 1
    counts: dict[CopyKey, tuple[list[float], list[float]]] = {}
    for per_trace in offered:
        for source, (length, kept, run, first) in per_trace.items():
            others = [f for s, (_, _, _, f) in per_trace.items() if s != source]
            for t in length.nonzero()[0]:
                key = copy_situation(source, int(run[t]), int(t), int(first[t]),
                                     [int(f[t]) for f in others if f[t] >= 0])
                reached_n, kept_n = counts.setdefault(key, ([0.0] * bins, [0.0] * bins))
                for i in range(min(int(kept[t]) + 1, int(length[t]))):
                    b = run_bin(int(run[t]) + i)
                    reached_n[b] += 1
                    kept_n[b] += float(i < kept[t])
    return {key: tuple(k / r if r else COPY_PRIOR[b] for b, (r, k) in enumerate(zip(reached_n, kept_n)))
            for key, (reached_n, kept_n) in counts.items()}


class StopBelow(KPolicy):
    """For comparison, not a default (``specdec replay``): up to ``k_max`` drafts, stopping after
    one the draft model gave less than ``threshold``. The best threshold found with hindsight over
    a dataset (:data:`THRESHOLDS`) bounds what a controller reading only the draft's own
    probabilities gets there, far tighter than the oracle on prose."""

    def __init__(self, threshold: float, k_max: int = MAX_CHAIN):
        self.threshold, self.k_max = float(threshold), int(k_max)

    def budget(self, t: int, room: int, backlog: int) -> int:
        return max(0, min(self.k_max, room))

    def more(self, i: int, p: float) -> bool:
        return p >= self.threshold


#: the stop thresholds :class:`StopBelow` is replayed at (the best one is reported)
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


#: drafters without a model that a replay runs itself on the traces' prompts and answers
LOOKUP_DRAFTERS = ("pld", "suffix")


def auto_k(target, draft_table, draft: str, window: int = 0, prior: dict | None = None):
    """The engine's k=auto controller (:class:`~specdec.core.autok.AutoK`) as a replay runs it for
    ``draft`` (a draft of the traces, or a drafter of :data:`LOOKUP_DRAFTERS`): one across the
    traces, warm from one to the next as in one process."""
    from ..core.acceptance import AcceptancePrior
    from ..core.autok import AutoK

    lookup = draft in LOOKUP_DRAFTERS
    return AutoK(target, None if lookup else draft_table, drafts_with_model=not lookup, window=window,
                 prior=AcceptancePrior.from_dict(prior) if prior and not lookup else None)


def replay_all(traces: list, draft: str, target, draft_table,
               ks: list[int], prior: dict | None = None, window: int = 0, stop_ids=frozenset(),
               clock: "Clock | None" = None) -> dict:
    """Every trace in order under plain decoding, each fixed K in ``ks``, k=auto (one controller
    across the traces, warm from one to the next as in one process) and the oracle: per prompt,
    per category and in total (seconds; ``fixed`` by K as a string). ``draft``: a draft of the
    traces, or a drafter without a model (:data:`LOOKUP_DRAFTERS`: run on the prompts, with one
    suffix cache across the traces as one engine keeps; no oracle, which plans over a model's trace)."""
    from ..core.autok import Fixed
    from ..core.drafters import SuffixCache, make_drafter
    from .replay import Clock, oracle, replay

    clock = clock or Clock(target, draft_table)
    lookup = draft in LOOKUP_DRAFTERS
    auto = auto_k(target, draft_table, draft, window, prior)
    caches: dict[str, SuffixCache] = {}

    def drafter(run: str):  # a fresh drafter per request; each run (fixed K, k=auto) its own engine's cache
        if not lookup:
            return None
        cache = caches.setdefault(run, SuffixCache())
        return make_drafter(draft, None, frozenset(stop_ids), {}, history=cache.scope())

    rows = []
    for tr in traces:
        a = replay(tr, None if lookup else draft, auto, clock, drafter("auto"))
        rows.append({"sample_id": tr.sample_id, "category": tr.category, "tokens": len(tr.answer),
                     "prompt_tokens": tr.prompt_tokens, "plain": replay(tr, None, None, clock).seconds,
                     "auto": a.seconds, "auto_rounds": a.rounds, "auto_drafted": a.drafted, "auto_accepted": a.accepted,
                     "fixed": {str(k): replay(tr, None if lookup else draft, Fixed(k), clock, drafter(f"k{k}")).seconds
                               for k in ks},
                     "oracle": None if lookup else oracle(tr, draft, clock),
                     "threshold": {} if lookup else {str(th): replay(tr, draft, StopBelow(th), clock).seconds
                                                     for th in THRESHOLDS}})
    cats: dict[str, list[dict]] = {}
    for r in rows:
        cats.setdefault(r["category"] or "all", []).append(r)
    return {"total": summed(rows), "categories": {c: summed(rs) for c, rs in cats.items()}, "prompts": rows}


def replay_portfolio(traces: list, draft: str | None, target, draft_table, prior: dict | None = None, window: int = 0,
                     stop_ids=frozenset(), clock: "Clock | None" = None) -> dict:
    """Every trace in order under the portfolio (``drafter="auto"``: one :class:`PortfolioK` across
    the traces, warm from one to the next, and one suffix cache, as in one process) with the draft
    ``draft`` among its sources (None: the copy sources only), against plain decoding and the
    portfolio's oracle (the source and K of every round chosen with hindsight): per prompt, per
    category and in total (seconds)."""
    from ..core.acceptance import AcceptancePrior
    from ..core.autok import PortfolioK
    from ..core.drafters import SuffixCache
    from ..core.drafters.auto import copy_sources
    from .replay import Clock, copy_offers, oracle, replay

    clock = clock or Clock(target, draft_table)

    def policy(rates=None) -> PortfolioK:
        return PortfolioK(target, draft_table, has_model=draft is not None, window=window,
                          prior=AcceptancePrior.from_dict(prior) if prior else None, rates=rates)

    def copies(of: SuffixCache) -> list:  # a fresh request's copy sources, as the engine's portfolio makes them
        return list(copy_sources(frozenset(stop_ids), of.scope()).values())

    oracle_cache = SuffixCache()
    offered = [copy_offers(tr, copies(oracle_cache)) for tr in traces]
    auto = policy()
    fit = policy({key: FittedRates(prior=rates) for key, rates in fitted_copy_rates(offered).items()})
    cache, fit_cache = SuffixCache(), SuffixCache()
    rows = []
    for tr, offers in zip(traces, offered):
        a = replay(tr, draft, auto, clock, copies=copies(cache))
        sources: dict[str, int] = {}
        for s in a.sources:
            if s is not None:
                sources[s] = sources.get(s, 0) + 1
        rows.append({"sample_id": tr.sample_id, "category": tr.category, "tokens": len(tr.answer),
                     "prompt_tokens": tr.prompt_tokens, "plain": replay(tr, None, None, clock).seconds,
                     "auto": a.seconds, "auto_rounds": a.rounds, "auto_drafted": a.drafted, "auto_accepted": a.accepted,
                     "auto_k_chosen": a.k_chosen, "auto_sources": sources,
                     "oracle": oracle(tr, draft, clock, copies=offers), "fixed": {}, "threshold": {},
                     "fitted": replay(tr, draft, fit, clock, copies=copies(fit_cache)).seconds})
    cats: dict[str, list[dict]] = {}
    for r in rows:
        cats.setdefault(r["category"] or "all", []).append(r)
    return {"total": summed(rows), "categories": {c: summed(rs) for c, rs in cats.items()}, "prompts": rows}
