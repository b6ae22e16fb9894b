#!/usr/bin/env python
"""Other ways to price the portfolio's copies, replayed beside the default and each copy source alone
at k=auto (docs/free-drafts.md, the agent loop). The variants:

- ``run``: the default (a copy's chance per run bin and situation, learned from every offer: ``RunRates``);
- ``position``: per draft position, learned from every offer (as a copy source alone prices its drafts);
- ``better``: the better of ``run`` and each source's own rounds priced per position (as alone);
- ``last-round``: ``run``, its rates kept apart by the last round's outcome (plain, all kept, a miss).

``--clock-premium P`` prices every pass's extra width over a one-token pass at P times the table's
(1.5: the prices the AVX2 machine's agent loop followed); ``--decode`` leaves the prefill out (a
server with prefix caching reads one turn a request). Also prints, for the suffix source, how often a
copy with a run of 1-2 tokens was kept: scored at every position (as the portfolio learns) and in the
rounds suffix decoding alone drafted.

    python scripts/copy_pricing_variants.py --costs benchmarks/free-drafts-avx2/costs.json --clock-premium 1.5 \\
        --decode benchmarks/agent-loop-auto-q4_k_m-avx2-width-premium/traces.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses

from specdec.core.acceptance import AcceptanceEstimate, AcceptancePrior, run_bin
from specdec.core.autok import PortfolioK
from specdec.core.names import Source
from specdec.traces.runs import read_tables, replay_all
from specdec.models.costmodel import best_k_rate
from specdec.core.drafters import SuffixCache
from specdec.core.drafters.auto import copy_sources
from specdec.draftlength import MAX_CHAIN, MAX_K
from specdec.traces import replay as replay_mod
from specdec.traces.trace import read_traces


class PositionK(PortfolioK):
    """Copies priced per draft position, from every offer (``better``: the better of that from the
    source's own drafted rounds, and the run price)."""

    better = False

    def copy_price(self, offer, room, table=None, ks=frozenset()):
        n = min(len(offer.tokens), room, (table.widest if table is not None else MAX_K) - 1)  # K + 1: measured
        if n <= self.window or table is None:
            return 0, 0.0
        est = self.mine.setdefault(offer.source, AcceptanceEstimate())
        k, rate = best_k_rate(table.forward, 0.0, est.rates(n), n, k_min=self.window + 1, allow_zero=False,
                              allowed=ks | {n})
        if self.better:
            k1, r1 = super().copy_price(offer, room, table, ks)
            return (k, rate) if rate > r1 else (k1, r1)
        return k, rate

    def observe(self, r):
        super().observe(r)
        if self.better:
            if r.drafted and r.source not in (None, Source.MODEL):
                self.mine.setdefault(r.source, AcceptanceEstimate()).update(r.drafted, r.accepted)
            return
        for source, _, reached, kept in r.offers:
            self.mine.setdefault(source, AcceptanceEstimate()).update(reached, kept)


class LastRoundK(PortfolioK):
    """The run price, its rates kept per outcome of the last round (plain, all kept, a miss)."""

    def plan(self, t, room, backlog, offers=()):
        self.rates = self.by_state.setdefault(self.state if t > 0 else 0, {})
        return super().plan(t, room, backlog, offers)

    def observe(self, r):
        super().observe(r)
        self.state = 0 if not r.drafted else (1 if r.accepted == r.drafted else 2)


def make(name, target, draft_table, has_model, prior):
    cls = {"run": PortfolioK, "position": PositionK, "better": PositionK, "last-round": LastRoundK}[name]
    policy = cls(target, draft_table, has_model=has_model, prior=AcceptancePrior.from_dict(prior) if prior else None)
    policy.mine, policy.better, policy.by_state, policy.state = {}, name == "better", {}, 0
    return policy


def every_position(traces, stops) -> list[int]:
    """The suffix source's copies with a run of 1-2 tokens, scored at every answer position (as the
    portfolio learns): ``[kept, judged]``."""
    every = [0, 0]
    cache = SuffixCache()
    for tr in traces:
        src = replay_mod.LookupSource(copy_sources(stops, cache.scope())[Source.SUFFIX], tr)
        for t in range(len(tr.answer)):
            offer = src.offer(t, MAX_CHAIN)
            if offer is not None:
                reached, kept = offer.outcome(tr.answer[t:t + len(offer.tokens)])
                for i in range(reached):
                    if run_bin(offer.run + i) <= run_bin(2):
                        every[0] += i < kept
                        every[1] += 1
            src.commit(t, 0, 0)
    return every


@contextlib.contextmanager
def counting_short_runs(alone: list[int]):
    """While open, a drafter replayed alone counts its drafts at runs 1-2 into ``alone`` (kept, judged)."""
    propose = replay_mod.LookupSource.propose

    def counted(self, t, k, policy, clock):
        offer = self.drafter.offer(self.context, k)
        drafted, accepted, seconds = propose(self, t, k, policy, clock)
        for i in range(min(accepted + 1, drafted)):
            if offer is not None and self.drafter.name == "suffix" and run_bin(offer.run + i) <= run_bin(2):
                alone[0] += i < accepted
                alone[1] += 1
        return drafted, accepted, seconds

    replay_mod.LookupSource.propose = counted
    try:
        yield
    finally:
        replay_mod.LookupSource.propose = propose


def main() -> int:
    from specdec.checks import number_arg
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--costs", action="append", required=True)
    p.add_argument("--clock-premium", type=number_arg(float, 0, 100), default=1.0,
                   help="P in [0, 100] (default 1)")
    p.add_argument("--decode", action="store_true", help="leave the prefill out")
    a = p.parse_args()
    tables = read_tables(a.costs)
    for path in a.traces:
        head, traces = read_traces(path)
        target = tables[str(head["target"]).split("|")[0]]
        model = next(iter(traces[0].drafts), None)
        draft_table = tables.get(model.rsplit("|w", 1)[0]) if model else None
        model = model if draft_table is not None else None
        prior = (head.get("priors") or {}).get(model.rsplit("|w", 1)[0]) if model else None
        one = target.forward(1)
        clock = replay_mod.Clock(dataclasses.replace(
            target, seconds=[one + a.clock_premium * (s - one) for s in target.seconds]), draft_table)
        stops = frozenset(head.get("stop_ids") or ())
        pre = sum(clock.prefill(t.prompt_tokens - 1) for t in traces) if a.decode else 0.0
        plain = sum(replay_mod.replay(t, None, None, clock).seconds for t in traces) - pre
        out = {}
        for name in ("run", "position", "better", "last-round"):
            policy, cache = make(name, target, draft_table, model is not None, prior), SuffixCache()
            out[name] = plain / (sum(replay_mod.replay(t, model, policy, clock, copies=list(
                copy_sources(stops, cache.scope()).values())).seconds for t in traces) - pre)
        every, alone = every_position(traces, stops), [0, 0]
        with counting_short_runs(alone):
            for d in ("pld", "suffix"):
                out[f"{d} alone"] = plain / (replay_all(traces, d, target, None, [], stop_ids=stops,
                                                       clock=clock)["total"]["auto"] - pre)
        print(f"{path} ({'decode, ' if a.decode else ''}clock premium {a.clock_premium}): "
              + ", ".join(f"{k} {v:.3f}x" for k, v in out.items()))
        print(f"  suffix copies at runs 1-2 kept: every position {every[0]}/{every[1]}, "
              f"drafted alone {alone[0]}/{alone[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
