"""``specdec trace`` and ``specdec replay``: record a greedy run's traces, and replay them on any
machine's cost tables (plain decoding, every fixed K, k=auto as implemented, the oracle)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ...draftlength import MAX_CHAIN
from ...errors import SpecdecError
from ...traces.runs import DEFAULT_KS, LOOKUP_DRAFTERS, read_tables, replay_all, replay_portfolio
from .tables import compare, portfolio_report, report
from .trace import cmd_trace


def register(sub) -> None:
    t = sub.add_parser(
        "trace", help="record the traces of a greedy bench run (what a replay needs)",
        description="For every answer of the plain-decoding (ar) configuration in a greedy 'specdec bench' "
                    "folder: the target's check that it is its greedy answer, and for each draft (model and "
                    "window) whether its argmax agrees with the answer at each position and its probability "
                    "there (one teacher-forced pass of each model), and its own continuation after a wrong "
                    "token. Writes FOLDER/traces.jsonl (or --out). 'specdec replay' reads it.")
    t.add_argument("folder", help="a 'specdec bench' output folder made at --temperature 0 with 'ar' among its policies")
    t.add_argument("--drafts", default=None, metavar="LIST",
                   help="comma list of draft model sources (default: the run's draft as it ran), e.g. "
                        "qwen2.5-coder-0.5b,qwen2.5-coder-0.5b@q4_0,qwen2.5-coder-0.5b@iq4_nl")
    t.add_argument("--windows", default="auto", metavar="LIST",
                   help="comma list of draft windows (prompt tokens the draft reads): N, auto or all (default: auto)")
    t.add_argument("--chains", default="first", choices=["first", "all", "none"],
                   help="record the draft's continuation after each wrong token for the first draft and window "
                        "(default), all of them, or none (exact replay of k=auto's wasted drafts needs them)")
    t.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N answers")
    t.add_argument("--out", default=None, metavar="FILE", help="where to write (default: FOLDER/traces.jsonl)")
    t.set_defaults(func=cmd_trace)

    r = sub.add_parser(
        "replay", help="replay traces on cost tables: plain, fixed K, k=auto and the oracle",
        description="Compute, from traces ('specdec trace') and cost tables ('specdec calibrate --export', or "
                    "cached table files), the end-to-end seconds of plain decoding, every fixed K, k=auto as "
                    "implemented (the engine's own controller, fed the trace and a clock made of the tables) and "
                    "the oracle (the K schedule with hindsight that minimises the time), per draft and in total.")
    r.add_argument("traces", help="a trace file")
    r.add_argument("--costs", action="append", required=True, metavar="PATH",
                   help="a 'specdec calibrate --export' file, a cost table file, or a folder of them (repeatable); "
                        "the target's and each draft's tables are found by model name")
    r.add_argument("--draft", action="append", default=None, metavar="NAME",
                   help="replay only this draft of the traces (a name as 'specdec replay' lists them), or pld or suffix "
                        "(drafters without a model, run on the traces' prompts; replayed by default where the traces "
                        "hold prompt ids); repeatable")
    r.add_argument("-k", "--k", default=",".join(map(str, DEFAULT_KS)), metavar="LIST",
                   help="fixed K to replay (default: %(default)s)")
    r.add_argument("--by-category", action="store_true", help="also the default's and the oracle's speedup per category")
    r.add_argument("--compare", default=None, metavar="FOLDER",
                   help="a bench folder these traces were made from: measured against replayed seconds for its "
                        "ar, fixed-K and k=auto configurations")
    r.add_argument("--json", default=None, metavar="FILE", help="also write every figure as JSON")
    r.set_defaults(func=cmd_replay)


def parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SpecdecError(f"--k: {text!r} is not a comma list of integers") from None
    if not ks or ks[0] < 1 or ks[-1] > MAX_CHAIN:  # K drafts: a pass of K + 1 tokens, the widest measured MAX_K
        raise SpecdecError(f"--k: each K must be in 1..{MAX_CHAIN}")
    return ks


def cmd_replay(a: argparse.Namespace) -> int:
    from ...traces.trace import read_traces

    head, traces = read_traces(a.traces)
    tables = read_tables(a.costs)
    target = str(head["target"]).split("|")[0]
    if target not in tables:
        raise SpecdecError(f"--costs: no table for the traces' target {target!r} (found: {', '.join(sorted(tables))})")
    names = list(traces[0].drafts) if traces else []
    lookups = list(LOOKUP_DRAFTERS) if traces and all(t.prompt is not None for t in traces) else []
    if a.draft:
        for d in a.draft:
            if d not in names + lookups:
                why = ("; drafters without a model need traces with prompt ids (made again with 'specdec trace')"
                       if d in LOOKUP_DRAFTERS else "")
                raise SpecdecError(f"--draft {d!r}: not in the traces (they hold: {', '.join(names + lookups)}){why}")
        names = a.draft
    else:
        names += lookups
    ks = parse_ks(a.k)
    results = {}
    for name in names:
        if name in LOOKUP_DRAFTERS:
            results[name] = replay_all(traces, name, tables[target], None, ks, stop_ids=head.get("stop_ids") or ())
            continue
        source = name.rsplit("|w", 1)[0]
        if source not in tables:
            raise SpecdecError(f"--costs: no table for the draft {source!r} (found: {', '.join(sorted(tables))})")
        prior = (head.get("priors") or {}).get(source)
        results[name] = replay_all(traces, name, tables[target], tables[source], ks, prior)
    lines = report(results, a.by_category)
    if lookups:
        model = next((n for n in names if n not in LOOKUP_DRAFTERS), None)
        model_source = model.rsplit("|w", 1)[0] if model else None
        prior = (head.get("priors") or {}).get(model_source) if model_source else None
        results["auto"] = replay_portfolio(traces, model, tables[target], tables[model_source] if model_source else None, prior,
                                           stop_ids=head.get("stop_ids") or ())
        lines += [""] + portfolio_report(results, model, a.by_category)
    elif traces and traces[0].prompt is None and not a.draft:  # what the report leaves out, and why
        lines += ["", f"(no prompt ids in these traces: {', '.join(LOOKUP_DRAFTERS)} and the portfolio (drafter auto) "
                      "are not replayed; make the traces again with 'specdec trace' to replay them)"]
    if a.compare:
        lines += compare(Path(a.compare), traces, results)
    print("\n".join(lines))
    if a.json:
        Path(a.json).write_text(json.dumps({"traces": a.traces, "costs": a.costs, "results": results}, indent=1))
    return 0
