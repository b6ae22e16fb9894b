#!/usr/bin/env python
"""Does the target's entropy or top-1 margin, free at every verify pass, make the portfolio's copy
stop rule better? Replays traces under the default (``drafter="auto"``: a copy priced by its run
and its situation, learned online) and under the same rule with each copy's rates kept per bin of the signal
at the last committed token (learned online the same way), beside the realistic bounds (the rates
fitted with hindsight on the same traces, by run, and by run and signal bin) and the portfolio's
oracle. Signals: ``scripts/target_signals.py``.

    python scripts/stop_signals.py --costs benchmarks/free-drafts-avx2/costs.json \\
        --costs benchmarks/free-drafts-avx2/draft-q4_k_m.json \\
        benchmarks/free-drafts-avx2/traces-spec-bench2-256-q4_k_m-avx2.jsonl:benchmarks/free-drafts-avx2/signals-spec-bench2-256-q4_k_m-avx2.json
"""

from __future__ import annotations

import argparse
import bisect
import json

import numpy as np

from specdec.core.acceptance import AcceptancePrior
from specdec.core.autok import PortfolioK
from specdec.traces.runs import FittedRates, fitted_copy_rates, read_tables
from specdec.core.drafters import SuffixCache
from specdec.core.drafters.auto import copy_sources
from specdec.traces.replay import Clock, copy_offers, oracle, replay
from specdec.traces.trace import read_traces

#: bin edges per signal (entropy in nats; margin: top-1 minus top-2 probability)
EDGES = {"entropy": (0.01, 0.1, 0.5, 1.5), "margin": (0.3, 0.7, 0.95, 0.99)}


class SignalPortfolioK(PortfolioK):
    """:class:`PortfolioK` with its copy rates kept per bin of a signal at the last committed token
    (the first round, which has none, in a bin of its own); ``fitted``: per bin, frozen rates per
    source and situation instead of learned ones."""

    def __init__(self, *args, edges: tuple, fitted: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.edges, self.fitted, self.by_bin, self.signal = edges, fitted, {}, None

    def bin_at(self, t: int) -> int:
        return len(self.edges) + 1 if t == 0 else bisect.bisect_left(self.edges, self.signal[t - 1])

    def plan(self, t, room, backlog, offers=()):
        b = self.bin_at(t)
        if b not in self.by_bin:
            self.by_bin[b] = {} if self.fitted is None else {
                key: FittedRates(prior=r) for key, r in self.fitted.get(b, {}).items()}
        self.rates = self.by_bin[b]
        return super().plan(t, room, backlog, offers)


def split_by_bin(offers: dict, signal: np.ndarray, edges: tuple) -> dict:
    """``copy_offers``' arrays split per signal bin of each position: ``{bin: {source: arrays}}``."""
    n = len(signal)
    bins = np.array([len(edges) + 1] + [bisect.bisect_left(edges, signal[t - 1]) for t in range(1, n)])
    return {b: {source: (np.where(bins == b, length, 0), kept, run, first)
                for source, (length, kept, run, first) in offers.items()} for b in range(len(edges) + 2)}


def run_file(traces_path: str, signals_path: str, tables: dict) -> dict:
    head, traces = read_traces(traces_path)
    signals = json.load(open(signals_path))["samples"]
    missing = [tr.sample_id for tr in traces if tr.sample_id not in signals]
    if missing:
        raise SystemExit(f"{signals_path}: no signals for {', '.join(missing[:3])} of {traces_path}; "
                         "make them with scripts/target_signals.py")
    model = next(iter(traces[0].drafts), None)
    source = model.rsplit("|w", 1)[0] if model else None
    target, draft_table = tables[str(head["target"]).split("|")[0]], tables.get(source)
    if draft_table is None:
        model = None
    prior = (head.get("priors") or {}).get(source)
    clock = Clock(target, draft_table)
    stops = frozenset(head.get("stop_ids") or ())

    def copies(cache):
        return list(copy_sources(stops, cache.scope()).values())

    def make(cls=PortfolioK, **kw):
        return cls(target, draft_table, has_model=model is not None,
                   prior=AcceptancePrior.from_dict(prior) if prior else None, **kw)

    oracle_cache = SuffixCache()
    offered = [copy_offers(tr, copies(oracle_cache)) for tr in traces]
    sig = {name: [np.asarray(signals[tr.sample_id][name]) for tr in traces] for name in EDGES}
    fit_run = make()
    fit_run.rates = {key: FittedRates(prior=r) for key, r in fitted_copy_rates(offered).items()}
    policies = {"default": make(), "fitted by run": fit_run}
    for name, edges in EDGES.items():
        policies[f"{name}, online"] = make(SignalPortfolioK, edges=edges)
        split = [split_by_bin(o, s, edges) for o, s in zip(offered, sig[name])]
        fitted = {b: fitted_copy_rates([per[b] for per in split]) for b in range(len(edges) + 2)}
        policies[f"fitted by run and {name}"] = make(SignalPortfolioK, edges=edges, fitted=fitted)
    caches = {name: SuffixCache() for name in policies}
    seconds = {name: 0.0 for name in [*policies, "plain", "oracle"]}
    for i, tr in enumerate(traces):
        seconds["plain"] += replay(tr, None, None, clock).seconds
        seconds["oracle"] += oracle(tr, model, clock, copies=offered[i])
        for name, policy in policies.items():
            if isinstance(policy, SignalPortfolioK):
                policy.signal = sig[policy_signal(name)][i]
            seconds[name] += replay(tr, model, policy, clock, copies=copies(caches[name])).seconds
    return seconds


def policy_signal(name: str) -> str:
    return next(s for s in EDGES if s in name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pairs", nargs="+", metavar="TRACES:SIGNALS")
    p.add_argument("--costs", action="append", required=True)
    a = p.parse_args()
    tables = read_tables(a.costs)
    for pair in a.pairs:
        traces_path, sep, signals_path = pair.rpartition(":")
        if not sep or not traces_path or not signals_path:
            p.error(f"{pair!r}: give a trace file and its signals file as TRACES:SIGNALS")
        s = run_file(traces_path, signals_path, tables)
        print(f"\n{traces_path} (time vs plain; / oracle):")
        print("| rule | speedup | / oracle |\n|---|---:|---:|")
        for name, sec in s.items():
            if name != "plain":
                print(f"| {name} | {s['plain'] / sec:.3f}x | {s['oracle'] / sec:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
