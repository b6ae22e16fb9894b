"""``specdec bench``: the command line. ``register(subparsers)`` is called by ``specdec.cli``.

Everything that can be checked without models is checked first (each configuration's request,
built once: :func:`.configs.validate`; the dataset, the output folder and its stored settings), so
a typo fails in a second with one line (``SpecdecError``, exit 2), not after the models load. The
flags and checks shared with ``specdec tune`` live in :mod:`.options`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import sys
from pathlib import Path

from ...errors import SpecdecError
from ...core.request import DEFAULTS
from ...core.names import AR
from . import configs as cfgs
from ..tasks.datasets import load_dataset
from .options import (add_dataset_args, add_execution_args, add_sampling_args, check_optional_dependencies,
                      parse_selection, parse_settings, run_settings)
from ..tasks.prompts import FORMAT_VERSION

EPILOG = """\
examples:
  specdec bench --dataset humaneval --limit 20 --policies ar,lossless --k 5 --out runs/he20
  specdec bench --dataset spec-bench:math_reasoning,qa --limit 10 --policies lossless,mars:theta=0.8 \\
      --drafter model,pld --k-sweep 2..8 --peers hf-assisted,hf-pld --out runs/sb
  specdec bench --dataset json-extraction --policies ar,lossless:k=3,mars:k=3 --out runs/json
      (structured output: every configuration decodes under each prompt's JSON schema)
items: NAME or NAME:key=value[:key=value...]; inside a policy item, k= and drafter= override the
global --k/--k-sweep/--drafter for that item (fly+mars:k=15). ar (plain decoding, the baseline)
always runs. Rerunning the same command with the same --out resumes where it stopped; the same
command with --report-only writes interim figures from the samples finished so far.
"""


def register(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmark rules, drafters and K against plain decoding (speed and quality)",
        description="Run every configuration on the same prompts in one process, with plain decoding (ar) "
                    "as the baseline and transformers' assisted generation as an optional peer; write "
                    "results.jsonl, summary.json, report.md and plots into --out.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("what to run")
    add_dataset_args(g)
    g.add_argument("--policies", default="ar,lossless", metavar="LIST",
                   help="comma list of policy items, e.g. ar,lossless,mars:theta=0.8,fly+mars:k=15 (default: ar,lossless)")
    g.add_argument("--config", action="append", default=None, metavar="FILE",
                   help="also run the configuration in this config file (as 'specdec tune' writes; repeatable)")
    g.add_argument("--drafter", default=DEFAULTS["drafter"], metavar="LIST",
                   help=f"comma list: model, pld, model+pld (default: {DEFAULTS['drafter']})")
    g.add_argument("-k", "--k", default=DEFAULTS["k"], metavar="K",
                   help="draft tokens per round, or auto (chosen each round from the measured cost model) "
                        f"(default: {DEFAULTS['k']})")
    g.add_argument("--k-sweep", default=None, metavar="A..B",
                   help="run every K in A..B (inclusive), A..B..STEP or a list 2,4,8 instead of --k")
    g.add_argument("--peers", default=None, metavar="LIST",
                   help="peers: hf-assisted (transformers, same draft model), hf-pld (prompt_lookup_num_tokens=10), "
                        "llama-cpp (llama-cpp-python on the target's GGUF, plain decoding), llama-cpp-pld "
                        "(llama-cpp-python's own prompt lookup, num_pred_tokens=10), llama-cpp-spec "
                        "(llama.cpp's own draft-model speculation: llama-speculative-simple, built by "
                        "scripts/build_llama_tools.sh; draft_max=3 as llama.cpp's default), ov (OpenVINO GenAI on the "
                        "target's GGUF, plain decoding; pip install openvino-genai), ov-pld (its own prompt lookup, "
                        "num_assistant_tokens=5, max_ngram_size=3); parameters as items, "
                        "e.g. hf-assisted:num_assistant_tokens=5 or llama-cpp-spec:draft_max=8. Policies take "
                        ":backend=transformers|llama.cpp to run on another backend than the run's, in the same process")
    add_sampling_args(g)
    g.add_argument("--repeats", default="1", metavar="R",
                   help="time each (sample, configuration) R times; report the median and min-max (default: 1)")
    o = p.add_argument_group("output and execution")
    o.add_argument("--out", required=True, metavar="DIR", help="output folder (created; reruns resume in it)")
    o.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    o.add_argument("--report-only", action="store_true",
                   help="generate nothing: write the report, summary and plots from the samples that every "
                        "configuration has finished in --out (interim figures of a long run; rerun without it "
                        "to resume)")
    add_execution_args(o)
    from ...frontends.cliargs import add_model_args

    add_model_args(p)
    p.set_defaults(func=cmd_bench)


def parse_args(a: argparse.Namespace):
    """Flags -> (configs, peers, settings, (limit, positions)); every check that needs no model."""
    selection = parse_selection(a)
    k = cfgs.parse_k(a.k, "--k")
    sweep = cfgs.parse_k_sweep(a.k_sweep) if a.k_sweep else None
    settings = parse_settings(a, cfgs.parse_int(a.repeats, "--repeats"))
    configs = cfgs.build_configs(a.policies, a.drafter, k, sweep)
    configs = cfgs.dedupe([*configs, *(cfgs.config_from_file(f) for f in a.config or [])])
    peers = cfgs.build_peers(a.peers)
    for c in peers if not getattr(a, "report_only", False) else ():  # re-reporting runs no peer
        cfgs.check_peer_available(c)
    configs = cfgs.validate(configs, max_new_tokens=settings.max_new_tokens, **settings.sampling())
    if a.draft == "none":
        for c in [*configs, *peers]:
            if cfgs.needs_draft_model(c):
                raise SpecdecError(f"configuration {c.id} needs a draft model, but --draft none was given")
    return configs, peers, settings, selection


def cmd_bench(a: argparse.Namespace) -> int:
    from . import environment
    from ..outputs.results import lock_out, prepare_dir

    if a.report_only:
        a = with_folder_command(a)
    configs, peers, settings, (limit, positions) = parse_args(a)
    everything = [*configs, *peers]
    check_optional_dependencies(a, plots=not a.no_plots)
    dataset = load_dataset(a.dataset, limit, a.data, positions)
    check_structured(dataset, everything)
    planned = len(dataset.samples)
    env = environment.describe(getattr(a, "argv_typed", None))
    stored = run_settings(a, settings, dataset, env)
    if a.report_only:
        out, dataset, records, env, models = report_inputs(a, stored, env, dataset, everything, settings.repeats)
    else:
        out = prepare_dir(a.out)
        with lock_out(out):  # a second run on the same folder is refused; a killed run leaves no lock
            records, models = _bench_locked(a, out, stored, env, configs, peers, everything, settings, dataset)
            write_outputs(a, records, everything, dataset, planned, settings, out, env, models)
        return 0
    write_outputs(a, records, everything, dataset, planned, settings, out, env, models)
    return 0


#: flags that say how to report, not what was run: ``--report-only`` never takes them from run.json
OUTPUT_FLAGS = {"out", "report_only", "quiet", "command", "func", "argv_typed"}


#: defaults that changed, as (setting, the default before, the time it changed): a command a folder
#: records from before that time ran under the old default where it did not type the setting
CHANGED_DEFAULTS = (("drafter", "model", "2026-11-27T10:20:22+0000"),)


def _read_run(out: Path) -> dict | None:
    from ...models.files import read_regular
    from ..outputs.results import RUN_LIMIT

    path = Path(out) / "run.json"
    if not os.path.lexists(path):
        return None
    raw = read_regular(path, RUN_LIMIT, "run.json")  # a FIFO or a link to /dev/zero is refused, not read
    try:
        run = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise SpecdecError(f"{path} is unreadable: {str(exc)[:200]}") from None
    return run if isinstance(run, dict) else {}


def _last_record(run: dict) -> dict:
    """The record whose command names the folder's run: the last migration's, else the last invocation."""
    for name in ("migrations", "invocations"):
        items = run.get(name)
        if isinstance(items, list) and items and isinstance(items[-1], dict):
            if name == "invocations" or items[-1].get("command"):
                return items[-1]
    return {}


def recorded_command(out: Path) -> list[str] | None:
    """The argv (after ``specdec``) that made the folder ``out``, as its run.json records it: the
    command a migration stored, else the last invocation's. None without a run.json."""
    run = _read_run(out)
    if run is None:
        return None
    record = _last_record(run)
    command = record.get("command") or record.get("argv") or []
    if not (isinstance(command, list) and all(isinstance(a, str) for a in command)):
        raise SpecdecError(f"{Path(out) / 'run.json'}: the command it records is not a list of words")
    return list(command) or None


def recorded_defaults(out: Path) -> dict[str, str]:
    """The settings whose default changed after the folder's command was recorded (its record's
    time): the old defaults, which that command ran under where it did not type them."""
    run = _read_run(out) or {}
    when = _last_record(run).get("time")
    if not isinstance(when, str):
        return {}
    return {name: old for name, old, changed in CHANGED_DEFAULTS if when < changed}


def bench_parser() -> argparse.ArgumentParser:
    """A parser of ``specdec bench ...`` alone (the argv after ``specdec``), as ``specdec`` builds it."""
    p = argparse.ArgumentParser(prog="specdec")
    register(p.add_subparsers(dest="command"))
    return p


def typed_flags(argv: list[str]) -> set[str]:
    """The destinations of the bench flags written in ``argv`` (``specdec bench ...``), whatever
    their values: parsed by a copy of the parser whose defaults are all absent."""
    parser = bench_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    for action in sub._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    sub._defaults.clear()
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            return set(vars(parser.parse_args(argv))) - {"command"}
        except SystemExit:
            return set()


def with_folder_command(a: argparse.Namespace) -> argparse.Namespace:
    """``specdec bench --report-only --out FOLDER``: every setting not typed is taken from the
    command FOLDER's run.json records (so the folder alone names its run); a typed one is kept, and
    the check against run.json refuses it where it disagrees. Without a record of the command (or
    when called with a namespace that was not typed: ``argv_typed`` absent) ``a`` is returned as is."""
    typed_argv = getattr(a, "argv_typed", None)
    command = recorded_command(Path(a.out))
    if typed_argv is None or command is None:
        return a
    if command[:1] != ["bench"]:
        raise SpecdecError(f"{a.out} was made by 'specdec {command[0] if command else '?'}', not 'specdec bench'"
                           + ("; 'specdec tune ... --status' reports a tune folder" if command[:1] == ["tune"] else ""))
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            recorded = bench_parser().parse_args(command)
    except SystemExit:
        raise SpecdecError(f"{a.out}/run.json records a command today's specdec does not parse: "
                           f"specdec {shlex.join(command)}") from None
    typed = typed_flags(typed_argv)
    in_command = typed_flags(command)
    for name, old in recorded_defaults(Path(a.out)).items():
        if name not in in_command:
            setattr(recorded, name, old)
    filled = argparse.Namespace(**vars(a))
    for key, value in vars(recorded).items():
        if key not in typed and key not in OUTPUT_FLAGS:
            setattr(filled, key, value)
    if not a.quiet and set(vars(recorded)) - typed - OUTPUT_FLAGS:
        print(f"specdec: re-reporting {a.out} with the settings its run.json records (specdec {shlex.join(command)})",
              file=sys.stderr)
    return filled


def check_structured(dataset, configs: list) -> None:
    """A dataset whose samples carry a JSON schema (``json-extraction``): every configuration must
    be able to decode under it (checked with the first sample's, before any model loads)."""
    from .runner import sample_constraints

    constraints = sample_constraints(dataset)
    if constraints:
        cfgs.check_constrained(configs, next(iter(constraints.values())))


def _bench_locked(a, out, stored, env, configs, peers, everything, settings, dataset) -> tuple[list[dict], dict]:
    """Check or store run.json, load the models and run what is not finished: the records and
    the models' description. The caller holds ``out``'s lock."""
    from ...frontends.cliargs import load_pair, startup_summary
    from ..outputs.results import check_run_settings
    from .runner import run

    check_run_settings(out, stored, {"argv": env["argv"], "git": env["git"]})
    pair = load_pair(a, progress=not a.quiet)
    if not a.quiet:
        print(startup_summary(pair), file=sys.stderr, flush=True)
    for c in everything:
        if c.kind == "peer" and c.policy.startswith("hf-") and pair.backend != "transformers":
            raise SpecdecError(f"peer {c.policy} runs transformers' generate() on the run's own model objects, "
                               f"so it needs --backend transformers (this run uses {pair.backend})")
        if pair.draft is None and cfgs.needs_draft_model(c):
            raise SpecdecError(f"configuration {c.id} needs a draft model; pass --draft (none was loaded for "
                               f"{a.target!r})")
    records = run(pair, dataset, configs, peers, settings, out, progress=not a.quiet)
    models = {"target": pair.target_name, "draft": pair.draft_name, "draft_quant": pair.draft_quant,
              "backend": pair.backend, "backend_why": pair.backend_why,
              "dtype": pair.target.variant,
              "draft_dtype": None if pair.draft is None else pair.draft.variant,
              "dtype_asked": stored["dtype"], "dtype_why": pair.costs.why, "device": stored["device"],
              "cost_model": {role: (None if t is None else t.to_dict())
                             for role, t in (("target", pair.costs.target), ("draft", pair.costs.draft))}}
    return records, models


def write_outputs(a: argparse.Namespace, records: list[dict], everything: list, dataset, planned: int, settings,
                  out: Path, env: dict, models: dict) -> None:
    """summary.json, report.md, the plots and the exports of ``records``; the table on stderr and
    the summary as the last stdout line."""
    from ..outputs.export import export
    from ..outputs.report import write_report, write_summary
    from ..outputs.summary import summarize

    summary = summarize(records, [c.to_dict() for c in everything], [s.id for s in dataset.samples], settings.repeats)
    categories: dict[str, int] = {}
    for s in dataset.samples:
        categories[s.category] = categories.get(s.category, 0) + 1
    summary = {
        "run": {
            "dataset": a.dataset, "data_source": dataset.source, "samples": len(dataset.samples),
            "samples_planned": planned,
            "categories": categories if a.dataset.startswith("spec-bench") else None,
            "models": models,
            "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature, "top_p": settings.top_p,
            "top_k": settings.top_k, "seed": settings.seed, "repeats": settings.repeats, "warmup": settings.warmup,
            "prompt_format": FORMAT_VERSION, "out": str(out),
            **({"constraint": "json_schema (each sample's own)"}
               if any(s.schema is not None for s in dataset.samples) else {}),
        },
        "environment": env,
        **summary,
        "plots": [],
    }
    if not a.no_plots:
        try:
            from ..outputs.plots import make_plots
        except ImportError:  # matplotlib is in the bench extra
            print("specdec: warning: matplotlib is not installed; no plots (pip install 'specdec-rules[bench]')",
                  file=sys.stderr)
        else:
            summary["plots"] = make_plots(summary, out)
    summary["exports"] = export(records, out, a.dataset, str(models["target"]))
    write_summary(summary, out)
    write_report(summary, out)
    if not a.quiet:
        _print_table(summary)
        print(f"specdec: wrote {Path(out) / 'report.md'}, summary.json, results.jsonl"
              + (f" and {len(summary['plots'])} plots" if summary["plots"] else ""), file=sys.stderr)
    print(json.dumps(summary, ensure_ascii=False, default=str), flush=True)


def report_inputs(a: argparse.Namespace, stored: dict, env: dict, dataset, everything: list, repeats: int):
    """What ``--report-only`` reports, from the folder alone: no model is loaded and nothing is
    generated or appended, so it works on any machine. The command must name the run (its
    settings other than the machine's must match run.json); the report then names the hardware and
    versions the results were made with (run.json) and the dtypes the records carry. Returns
    ``(out, finished dataset, its records, env, models)``."""
    from ..outputs.results import ResultsFile, read_run_settings
    from ..outputs.summary_kept import kept, over, read_summary

    out = Path(a.out)
    if not os.path.lexists(out / "results.jsonl"):  # one that is there but no plain file is refused when read
        raise SpecdecError(f"--report-only: {a.out} holds no results.jsonl; run the command without it first")
    made, invocations = read_run_settings(out, stored, ignore=MACHINE_KEYS)
    # what the report prints of the machine that made them: plain values only (the folder may be anyone's)
    made = {k: v for k, v in made.items() if k not in MACHINE_KEYS or isinstance(v, (str, int, float, type(None)))
            or (k == "cpu_flags" and isinstance(v, list) and all(isinstance(f, str) for f in v))}
    dataset = finished_only(dataset, out, everything, repeats)
    wanted = {s.id for s in dataset.samples}
    results = ResultsFile(out)
    records = [r for r in results.load(repair=False) if r["sample_id"] in wanted]  # writes nothing: a run may hold it
    if results.report() is not None:
        print(results.report("they are left out of the report"), file=sys.stderr)
    if any(made.get(k) != stored.get(k) for k in MACHINE_KEYS):
        print(f"specdec: reporting results made on another machine ({made.get('cpu')}, flags "
              f"{','.join(made.get('cpu_flags') or [])}); speeds are that machine's", file=sys.stderr)
    last = invocations[-1] if invocations and isinstance(invocations[-1], dict) else {}
    made_by = recorded_command(out)
    env = {**env, "git": last.get("git") if isinstance(last.get("git"), dict) else {"commit": None, "dirty": None},
           "argv": made_by or env["argv"], "reported_by": env["argv"] if made_by else None,
           "versions": {**env["versions"], "python": None, "torch": made.get("torch"),
                        "transformers": made.get("transformers")},
           "hardware": {"cpu": made.get("cpu"), "cpu_flags": made.get("cpu_flags") or [], "cpu_cores": None,
                        "torch_threads": None, "gpu": made.get("gpu"), "platform": None}}
    dtypes = sorted({(r["dtypes"].get("target"), r["dtypes"].get("draft")) for r in records
                     if isinstance(r.get("dtypes"), dict) and r.get("config") != AR} or {(None, None)},
                    key=str)
    models = {"target": made.get("target"), "draft": made.get("draft"), "draft_quant": made.get("draft_quant"),
              "dtype": ", ".join(str(t) for t, _ in dtypes) if dtypes != [(None, None)] else
              f"{made.get('dtype')} (as asked; the records do not say what it resolved to)",
              "draft_dtype": ", ".join(str(d) for _, d in dtypes) if dtypes != [(None, None)] else None,
              "dtype_asked": made.get("dtype"), "dtype_why": None, "device": made.get("device"), "cost_model": None}
    # what the run learned on loading (backend, cost tables, resolved draft, cores...): its summary.json's
    earlier = kept(read_summary(out), made, a.dataset)
    env["versions"], env["hardware"] = (over(earlier[s], env[s]) for s in ("versions", "hardware"))
    return out, dataset, records, env, over(earlier["models"], models)


#: run.json settings that describe the machine and its software, not the run: --report-only may
#: report a folder made elsewhere.
MACHINE_KEYS = ("cpu", "cpu_flags", "gpu", "torch", "transformers", "sandbox")


def finished_only(dataset, out: Path, configs: list, repeats: int):
    """``dataset`` cut to the samples that every configuration (and repeat) has a record of in
    ``out``, in dataset order: a partial run reported as a paired comparison at its n."""
    from dataclasses import replace

    from ..outputs.results import ResultsFile, record_key

    keys = {r["key"] for r in ResultsFile(out).load(repair=False)}
    done = [s for s in dataset.samples
            if all(record_key(s.id, c.id, rep) in keys for c in configs for rep in range(repeats))]
    if not done:
        raise SpecdecError(f"{out} has no sample that every configuration has finished; nothing to report yet")
    return replace(dataset, samples=done)


def _print_table(summary: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..outputs.report import WITHHELD, time_vs_ar

    t = Table(title="specdec bench", title_justify="left")
    for col in ("configuration", "tau", "tok/s", "speedup", "time [95% CI]", "quality", "recovery", "agreement"):
        t.add_column(col, justify="left" if col == "configuration" else "right")

    def f(x, spec=".2f"):
        return "–" if x is None else format(x, spec)

    for cid, r in summary["configs"].items():
        ag = (r.get("agreement") or {}).get("token_agreement")
        speedup = WITHHELD if r.get("speed_withheld") else f(r.get("speedup_vs_ar")) + "x"
        t.add_row(escape(cid), f(r.get("tau")), f(r.get("tokens_per_second"), ".1f"), speedup,
                  time_vs_ar(r), f(r.get("quality"), ".3f"), f(r.get("recovery"), ".3f"), f(ag, ".3f"))
    Console(stderr=True).print(t)
