"""``specdec trace`` and ``specdec replay``: record a greedy run's traces, and replay them on any
machine's cost tables (plain decoding, every fixed K, k=auto as implemented, the oracle)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..core.drafters.model import ModelDrafter
from ..core.names import AR
from ..core.window import WINDOW_WORDS
from ..draftlength import MAX_CHAIN
from ..errors import SpecdecError
from ..traces.runs import DEFAULT_KS, LOOKUP_DRAFTERS, read_tables, replay_all, replay_portfolio



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


# ----------------------------------------------------------------------------------- trace
def bench_args(folder: Path) -> tuple[argparse.Namespace, dict]:
    """The ``specdec bench`` flags a folder was made with (its run.json's last invocation)."""
    from ..models.files import read_regular
    from .cli import register as register_bench
    from .results import RUN_LIMIT

    try:  # a regular file only (a FIFO would hang the read)
        run = json.loads(read_regular(folder / "run.json", RUN_LIMIT, "run.json"))
        argv = [str(a) for a in run["invocations"][-1]["argv"]]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
        raise SpecdecError(f"{folder}: not a 'specdec bench' folder (no readable run.json)") from None
    p = argparse.ArgumentParser()
    register_bench(p.add_subparsers(dest="command"))
    try:
        return p.parse_args(argv), run
    except SystemExit:
        raise SpecdecError(f"{folder}: its run.json's command no longer parses: {' '.join(argv)}") from None


def ar_answers(folder: Path) -> dict[str, dict]:
    from .results import ResultsFile

    out = {}
    for rec in ResultsFile(folder).load():
        if rec.get("config") == AR and rec.get("repeat", 0) == 0 and rec.get("token_ids") is not None:
            out[rec["sample_id"]] = rec
    if not out:
        raise SpecdecError(f"{folder}: no plain-decoding (ar) answers to trace; run the bench with 'ar' among --policies")
    return out


def cmd_trace(a: argparse.Namespace) -> int:
    from .datasets import load_dataset
    from .options import parse_selection
    from .prompts import build_prompt
    from ..traces.trace import header, tokenizer_fingerprint, trace_answer, write_traces

    folder = Path(a.folder)
    b, run = bench_args(folder)
    settings = run.get("settings", {})
    if float(settings.get("temperature", b.temperature)) != 0.0:
        raise SpecdecError(f"{folder}: traces replay greedy runs only; this one sampled at temperature "
                           f"{settings.get('temperature')}")
    answers = ar_answers(folder)
    windows = [w.strip() for w in a.windows.split(",") if w.strip()]
    for w in windows:
        if w not in WINDOW_WORDS and not (w.isdigit() and int(w) > 0):
            raise SpecdecError(f"--windows: {w!r} is not a positive number, auto or all")
    limit, positions = parse_selection(b)
    dataset = load_dataset(b.dataset, limit, b.data, positions)
    samples = [s for s in dataset.samples if s.id in answers][: a.limit]
    target_name = settings.get("target", b.target)
    pair, drafts, priors = trace_models(target_name, settings, a, windows)
    out = Path(a.out) if a.out else folder / "traces.jsonl"
    traces = []
    from rich.progress import Progress

    with Progress(transient=False) as bar:
        task = bar.add_task("trace", total=len(samples))
        for s in samples:
            rec = answers[s.id]
            ids = pair.encode(build_prompt(pair.tokenizer, s).text, chat=False)
            if len(ids) != rec.get("prompt_tokens", len(ids)):
                raise SpecdecError(f"{s.id}: the prompt is {len(ids)} tokens here but {rec['prompt_tokens']} in the run "
                                   "(another tokenizer or prompt format)")
            traces.append(trace_answer(pair.target, drafts, ids, rec["token_ids"], rec.get("finish_reason") or "stop",
                                       int(settings.get("max_new_tokens", rec["new_tokens"])), frozenset(pair.eos_ids),
                                       sample_id=s.id, category=s.category))
            bar.update(task, advance=1)
    head = header(f"{target_name}", tokenizer_fingerprint(pair.tokenizer), count=len(traces), source=str(folder),
                  dataset=b.dataset, target_variant=pair.target.variant, priors=priors, stop_ids=sorted(pair.eos_ids),
                  drafts={name: {"source": name.rsplit("|w", 1)[0], "window": w} for name, (_, w, _) in drafts.items()})
    write_traces(out, head, traces)
    low = [t.sample_id for t in traces if t.target_agree < 1.0]
    print(f"wrote {len(traces)} traces of {len(drafts)} draft(s) to {out}"
          + (f"; {len(low)} answer(s) differ from this machine's teacher-forced target at some position "
             f"(near-ties: {', '.join(low[:5])}{'...' if len(low) > 5 else ''})" if low else ""))
    return 0


def trace_models(target_name: str, settings: dict, a: argparse.Namespace, windows: list[str]):
    """The run's target (uncalibrated: nothing is timed), each draft source loaded once, the drafts
    to trace by name (model, window, chain length) and each source's acceptance prior on the
    reference text."""
    from ..frontends.api import load
    from ..frontends.draft_formats import REFERENCE
    from ..traces.trace import draft_name, measure_prior

    backend = settings.get("backend", "auto")
    given = {k: settings.get(k) for k in ("dtype", "draft_dtype", "device")}
    options = {k: v for k, v in given.items() if v not in (None, "auto")}  # as the run loaded them
    target_opts = {k: v for k, v in options.items() if k != "draft_dtype"}
    draft_opts = {**target_opts, **({"dtype": options["draft_dtype"]} if "draft_dtype" in options else {})}
    pair = load(target_name, draft=None, backend=backend, calibrate=False, progress=True, **target_opts)
    sources = [s.strip() for s in (a.drafts or settings.get("draft") or "").split(",") if s.strip()]
    if not sources:
        raise SpecdecError("no draft to trace: the run had none; name one with --drafts")
    drafts, priors = {}, {}
    ref = pair.tokenizer(REFERENCE)["input_ids"]
    for i, source in enumerate(sources):
        lm = load(source, draft=None, backend=backend, calibrate=False, progress=True, **draft_opts).target
        priors[source] = measure_prior(pair.target, lm, ref, source=f"reference text, {source}").to_dict()
        for j, w in enumerate(windows):
            window = w if w in WINDOW_WORDS else int(w)
            chains = 16 if a.chains == "all" or (a.chains == "first" and i == 0 and j == 0) else 0
            drafts[draft_name(source, w)] = (lm, window, chains)
    return pair, drafts, priors


# ----------------------------------------------------------------------------------- replay
def parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SpecdecError(f"--k: {text!r} is not a comma list of integers") from None
    if not ks or ks[0] < 1 or ks[-1] > MAX_CHAIN:  # K drafts: a pass of K + 1 tokens, the widest measured MAX_K
        raise SpecdecError(f"--k: each K must be in 1..{MAX_CHAIN}")
    return ks


def cmd_replay(a: argparse.Namespace) -> int:
    from ..traces.trace import read_traces

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


def _x(plain: float, s: float | None) -> str:
    """A speedup, or "-" where either time is not a finite positive number (never a nonsense figure)."""
    if s is None:
        return "-"
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (plain, s))
    return f"{plain / s:.2f}x" if ok else "-"


def report(results: dict, by_category: bool) -> list[str]:
    lines = ["| draft | plain s | best fixed K | best stop threshold | k=auto (default) | oracle | k=auto / oracle |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        t = r["total"]
        best_k = min(t["fixed"], key=lambda k: t["fixed"][k])
        th = min(t["threshold"], key=lambda k: t["threshold"][k]) if t["threshold"] else None
        stop = f"p<{th} {_x(t['plain'], t['threshold'][th])}" if th else "-"
        lines.append(f"| {name} | {t['plain']:.1f} | K={best_k} {_x(t['plain'], t['fixed'][best_k])} | {stop} | "
                     f"{_x(t['plain'], t['auto'])} (tau {t['auto_tau']:.2f}) | {_x(t['plain'], t['oracle'])} | "
                     + (f"{t['oracle'] / t['auto']:.2f} |" if t["oracle"] else "- |"))
    if by_category:
        for name, r in results.items():
            lines += ["", f"{name}, per category:", "| category | plain s | k=auto | oracle | best fixed K |",
                      "|---|---:|---:|---:|---:|"]
            for cat, c in sorted(r["categories"].items()):
                best_k = min(c["fixed"], key=lambda k: c["fixed"][k])
                lines.append(f"| {cat} | {c['plain']:.1f} | {_x(c['plain'], c['auto'])} | {_x(c['plain'], c['oracle'])} | "
                             f"K={best_k} {_x(c['plain'], c['fixed'][best_k])} |")
    return lines


def portfolio_report(results: dict, model: str | None, by_category: bool) -> list[str]:
    """The portfolio (``drafter="auto"``, the default) beside each of its sources alone at k=auto
    and its oracle: in total and, ``by_category``, per category."""
    cols = [n for n in (model, *LOOKUP_DRAFTERS) if n is not None and n in results]
    head = (f"portfolio (default, drafter auto: {' + '.join(cols)}) against each source alone at k=auto; time vs plain:",
            "| prompts | plain s | " + " | ".join(f"{c} alone" for c in cols)
            + " | default (auto) | fitted bound | portfolio oracle | default / fitted | default / oracle |",
            "|---|---:|" + "---:|" * (len(cols) + 5))

    def row(label: str, get) -> str:
        auto = get("auto")
        return (f"| {label} | {auto['plain']:.1f} | " + " | ".join(_x(auto["plain"], get(c)["auto"]) for c in cols)
                + f" | {_x(auto['plain'], auto['auto'])} (tau {auto['auto_tau']:.2f}) | {_x(auto['plain'], auto['fitted'])}"
                + f" | {_x(auto['plain'], auto['oracle'])} | {auto['fitted'] / auto['auto']:.2f}"
                + f" | {auto['oracle'] / auto['auto']:.2f} |")

    lines = list(head) + [row(f"all {results['auto']['total']['prompts']}", lambda n: results[n]["total"])]
    if by_category:
        for cat in sorted(results["auto"]["categories"]):
            lines.append(row(cat, lambda n, cat=cat: results[n]["categories"][cat]))
    return lines


def compare(folder: Path, traces, results: dict) -> list[str]:
    """Measured (the folder's records) against replayed seconds, for the configurations a replay
    models: ar, lossless with the model drafter at a fixed K or k=auto."""
    from .results import ResultsFile

    ids = {t.sample_id for t in traces}
    measured: dict[str, float] = {}
    for rec in ResultsFile(folder).load():
        if rec.get("sample_id") not in ids or rec.get("repeat", 0) != 0:
            continue
        cfg = rec["config"]
        if cfg == AR or (rec.get("policy") == "lossless" and rec.get("drafter") == ModelDrafter.name
                           and not rec.get("params")):
            measured[cfg] = measured.get(cfg, 0.0) + float(rec["stats"]["total_seconds"])
    name = next(iter(results))
    r = results[name]["total"]
    lines = ["", f"measured ({folder}) against replayed ({name}):", "| configuration | measured s | replayed s | replayed / measured |",
             "|---|---:|---:|---:|"]
    for cfg, sec in sorted(measured.items()):
        if cfg == AR:
            rep = r["plain"]
        elif cfg.endswith("kauto"):
            rep = r["auto"]
        else:
            try:
                k = int(cfg.rsplit("/k", 1)[1])
            except (IndexError, ValueError):
                continue
            rep = r["fixed"].get(str(k))
            if rep is None:
                continue
        lines.append(f"| {cfg} | {sec:.1f} | {rep:.1f} | {rep / sec:.3f} |" if sec > 0 else f"| {cfg} | {sec:.1f} | {rep:.1f} | - |")
    return lines


