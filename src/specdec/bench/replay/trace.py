"""``specdec trace``: the traces of a greedy ``specdec bench`` folder's plain-decoding answers (the
target's check, each draft's agreement and probability at each position), what a replay reads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ...core.names import AR
from ...core.window import WINDOW_WORDS
from ...errors import SpecdecError


def bench_args(folder: Path) -> tuple[argparse.Namespace, dict]:
    """The ``specdec bench`` flags a folder was made with (its run.json's last invocation)."""
    from ...models.files import read_regular
    from ..running.command import register as register_bench
    from ..outputs.results import RUN_LIMIT

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
    from ..outputs.results import ResultsFile

    out = {}
    for rec in ResultsFile(folder).load():
        if rec.get("config") == AR and rec.get("repeat", 0) == 0 and rec.get("token_ids") is not None:
            out[rec["sample_id"]] = rec
    if not out:
        raise SpecdecError(f"{folder}: no plain-decoding (ar) answers to trace; run the bench with 'ar' among --policies")
    return out


def cmd_trace(a: argparse.Namespace) -> int:
    from ..tasks.datasets import load_dataset
    from ..running.options import parse_selection
    from ..tasks.prompts import build_prompt
    from ...traces.trace import header, tokenizer_fingerprint, trace_answer, write_traces

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
    from ...frontends.api import load
    from ...frontends.draft_formats import REFERENCE
    from ...traces.trace import draft_name, measure_prior

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
