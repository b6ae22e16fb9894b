#!/usr/bin/env python
"""The copy sources' acceptance by run (``specdec.core.acceptance.COPY_PRIOR``), measured on traces.

For every answer position of every trace, the portfolio's copy sources (prompt lookup and suffix,
as ``drafter="auto"`` runs them, one suffix cache across the traces of a file) are asked for their
offer; each offered token is scored against the answer up to its first miss (a copy that matches
to its end says nothing past it). Prints, per run bin of :data:`specdec.core.acceptance.RUN_EDGES`, how
often a copy's next token was kept, per source and pooled, and the tuple to paste.

    python scripts/copy_prior.py benchmarks/replay-avx512bf16/traces-humaneval20-bf16.jsonl \\
        benchmarks/replay-avx512bf16/traces-spec-bench26-bf16.jsonl
"""

from __future__ import annotations

import argparse

from specdec.core.acceptance import COPY_PRIOR, RUN_EDGES, run_bin
from specdec.core.drafters import SuffixCache
from specdec.core.drafters.auto import copy_sources
from specdec.traces.replay import LookupSource
from specdec.traces.trace import read_traces


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", help="trace files with prompt ids ('specdec trace')")
    a = p.parse_args()
    bins = len(RUN_EDGES) + 1
    counts = {}  # source -> [reached per bin, kept per bin]
    for path in a.traces:
        head, traces = read_traces(path)
        cache = SuffixCache()
        for tr in traces:
            sources = [LookupSource(d, tr) for d in copy_sources(frozenset(head.get("stop_ids") or ()),
                                                                  cache.scope()).values()]
            for t in range(len(tr.answer)):
                for src in sources:
                    offer = src.offer(t, 127)
                    if offer is not None:
                        reached, kept = offer.outcome(tr.answer[t:t + len(offer.tokens)])
                        r, k = counts.setdefault(offer.source, ([0] * bins, [0] * bins))
                        for i in range(reached):
                            r[run_bin(offer.run + i)] += 1
                            k[run_bin(offer.run + i)] += int(i < kept)
                    src.commit(t, 0, 0)
    lows = (1,) + tuple(e + 1 for e in RUN_EDGES)
    print("| run | " + " | ".join(f"{s} kept / judged" for s in counts) + " | pooled | prior now |")
    print("|---|" + "---:|" * (len(counts) + 2))
    pooled = []
    for b in range(bins):
        label = f"{lows[b]}-{RUN_EDGES[b]}" if b < len(RUN_EDGES) else f">{RUN_EDGES[-1]}"
        cells = [f"{k[b] / r[b]:.2f} / {r[b]}" if r[b] else "- / 0" for r, k in counts.values()]
        rr, kk = sum(r[b] for r, _ in counts.values()), sum(k[b] for _, k in counts.values())
        pooled.append(kk / rr if rr else None)
        print(f"| {label} | " + " | ".join(cells) + f" | {pooled[-1]:.2f} | {COPY_PRIOR[b]:.2f} |" if rr else
              f"| {label} | " + " | ".join(cells) + f" | - | {COPY_PRIOR[b]:.2f} |")
    print("pooled:", tuple(round(x, 2) if x is not None else None for x in pooled))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
