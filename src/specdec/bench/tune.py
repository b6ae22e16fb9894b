"""``specdec tune``: the fastest setting of a policy's threshold(s) and K on this machine that keeps
task quality within a budget of plain decoding, written as a config file.

Two stages, both on a tuning split kept apart from the report set (default: HumanEval problems
100-163, positions 100..163; bench reports on the first ones), both through the bench runner (same
process, ``ar`` timed alongside, resumable, progress bar):

1. **proxy**: every setting of the grid (each rule's declared ``tune_grid`` or ``--grid``, times
   ``--k``) and ``ar`` on the first ``--proxy-samples`` samples, ``--proxy-tokens`` new tokens.
   It measures speed relative to ``ar`` and token agreement with ``ar``; settings below
   ``--min-agreement`` are dropped (off by default). This is a cheap ordering, not the pick.
2. **confirm**: the settings in order of proxy speed, ``--confirm`` at a time, on the whole tuning
   split at ``--max-new-tokens``, scored on the task (pass@1, or math accuracy). After each batch,
   if a confirmed setting is within the budget (recovery = quality / ``ar``'s quality on the same
   samples >= 1 - ``--max-quality-loss``), the fastest such setting (confirm-stage tokens/s) is the
   pick; otherwise the next batch runs. No setting within the budget: no config is written.

Outputs in ``--out``: ``proxy/`` and ``confirm/`` (bench run folders), ``tune.json`` (every setting's
figures and the pick) and the config file (``--write``, default ``<out>/config.json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..checks import check_number
from ..errors import SpecdecError
from ..request import DEFAULTS
from . import configs as cfgs
from .options import (add_dataset_args, add_execution_args, add_sampling_args, check_optional_dependencies,
                      parse_float, parse_selection, parse_settings, run_settings, sandbox_setting)

#: the tuning split when --samples is not given (HumanEval: the last 64 problems)
DEFAULT_SPLIT = {"humaneval": (100, 163)}
QUALITY_DATASETS = "humaneval, fixture, or spec-bench:math_reasoning"

EPILOG = """\
example (about an hour on 2 CPU cores):
  specdec tune --policy mars --k auto,8 --limit 16 --max-new-tokens 128 --out runs/tune-mars
  specdec generate --config runs/tune-mars/config.json "Write a function that ..."
  specdec bench --samples 0..99 --limit 20 --policies ar,lossless --config runs/tune-mars/config.json --out runs/he20
"""


def register(sub) -> None:
    p = sub.add_parser(
        "tune", help="pick a policy's threshold(s) and K for a quality budget; write a config file",
        description="Sweep the policy's main threshold(s) and K on a tuning split (default HumanEval problems "
                    "100-163, kept apart from bench's report set), measure speed, agreement with plain decoding "
                    "and task quality, and write the fastest setting whose quality is within --max-quality-loss "
                    "of plain decoding as a config file for generate/serve/bench --config.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("what to tune")
    g.add_argument("--policy", required=True, help="the policy to tune, e.g. mars, fly+mars, dropmatch, lossless")
    g.add_argument("--drafter", default=DEFAULTS["drafter"],
                   help=f"model | pld | model+pld (default: {DEFAULTS['drafter']})")
    g.add_argument("-k", "--k", default="auto,4,8", metavar="LIST",
                   help="K values to sweep: auto and/or integers (default: auto,4,8; FLy skips K <= its window)")
    g.add_argument("--grid", action="append", default=None, metavar="PARAM=V1,V2,...",
                   help="values for one policy parameter, e.g. mars_theta=0.7,0.8,0.9 (repeatable; default: each "
                        "rule's declared grid)")
    g.add_argument("--max-quality-loss", default="0.01", metavar="L",
                   help="largest relative quality loss vs plain decoding on the tuning split (default: 0.01)")
    add_dataset_args(g)
    add_sampling_args(g)
    s = p.add_argument_group("search")
    s.add_argument("--proxy-samples", default="4", metavar="N", help="samples of the proxy stage (default: 4)")
    s.add_argument("--proxy-tokens", default="64", metavar="M", help="new tokens in the proxy stage (default: 64)")
    s.add_argument("--min-agreement", default="0", metavar="A",
                   help="drop settings whose proxy token agreement with plain decoding is below A (default: 0 = keep all)")
    s.add_argument("--confirm", default="2", metavar="N",
                   help="settings confirmed on task quality per batch, fastest proxy first (default: 2)")
    o = p.add_argument_group("output and execution")
    o.add_argument("--out", required=True, metavar="DIR", help="output folder (created; reruns resume in it)")
    o.add_argument("--write", default=None, metavar="FILE", help="the config file to write (default: OUT/config.json)")
    add_execution_args(o)
    from ..cliargs import add_model_args

    add_model_args(p)
    p.set_defaults(func=cmd_tune)


# ------------------------------------------------------------------------------- the grid
def grid_axes(policy: str, overrides: list[str] | None) -> dict[str, list[Any]]:
    """``{prefixed parameter: values}``: each rule's ``tune_grid``, replaced by ``--grid`` items."""
    from ..verify import RULES, make_policy

    if policy == "ar":
        raise SpecdecError("policy 'ar' (plain decoding) has nothing to tune; it is the baseline")
    pol = make_policy(policy)  # validates the name
    rules = [] if pol is None else sorted(set(policy.split("+")) & set(RULES))
    axes: dict[str, list[Any]] = {}
    for rule in rules:
        for param, values in getattr(RULES[rule], "tune_grid", {}).items():
            axes[f"{rule}_{param}"] = list(values)
    for item in overrides or []:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not values.strip():
            raise SpecdecError(f"bad --grid {item!r}: use PARAM=V1,V2,... (e.g. mars_theta=0.7,0.9)")
        full = _prefixed(key, rules, policy)
        axes[full] = [cfgs.parse_value(v) for v in cfgs.split_list(values, "--grid value")]
    return axes


def _prefixed(key: str, rules: list[str], policy: str) -> str:
    from ..verify import rule_params

    if any(key == f"{r}_{p}" for r in rules for p in rule_params(r)):
        return key
    owners = [r for r in rules if key in rule_params(r)]
    if len(owners) != 1:
        taken = ", ".join(f"{r}_{p}" for r in rules for p in rule_params(r)) or "no parameters"
        raise SpecdecError(f"--grid {key!r} is not a parameter of policy {policy!r} (it takes {taken})"
                           if not owners else f"--grid {key!r} is ambiguous in {policy!r}; prefix it: "
                           + ", ".join(f"{r}_{key}" for r in owners))
    return f"{owners[0]}_{key}"


def grid_configs(policy: str, drafter: str, ks: list, axes: dict[str, list[Any]], settings) -> tuple[list, list[str]]:
    """Every setting as a bench Config, validated (:func:`specdec.bench.configs.validate`: its
    DecodeConfig is built once and kept); settings the policy refuses (FLy with K <= window) are
    skipped and returned as notes."""
    out, skipped = [], []
    names = list(axes)
    for values in itertools.product(*(axes[n] for n in names)):
        params = dict(zip(names, values))
        for k in ks:
            c = cfgs.Config(policy, drafter, k, params)
            try:
                [c] = cfgs.validate([c], max_new_tokens=settings.max_new_tokens, **settings.sampling())
            except SpecdecError as exc:
                if "window" not in str(exc):
                    raise
                skipped.append(c.id)
                continue
            out.append(c)
    if not out:
        raise SpecdecError(f"no setting of {policy!r} in the grid can run (skipped: {', '.join(skipped)})")
    return cfgs.dedupe(out), skipped


def parse_ks(text: str) -> list:
    return list(dict.fromkeys(cfgs.parse_k(x, "--k") for x in cfgs.split_list(text, "--k")))


# ------------------------------------------------------------------------------- the pick
def within_budget(row: dict, max_loss: float) -> bool:
    rec = row.get("recovery")
    return rec is not None and rec >= 1.0 - max_loss - 1e-12


def proxy_order(rows: dict[str, dict], min_agreement: float) -> tuple[list[str], list[str]]:
    """Setting ids by proxy speed (fastest first), and those dropped for low agreement."""
    kept, dropped = [], []
    for cid, r in rows.items():
        if cid == cfgs.AR:
            continue
        agree = (r.get("agreement") or {}).get("token_agreement")
        (dropped if agree is not None and agree < min_agreement else kept).append(cid)
    kept.sort(key=lambda c: -(rows[c].get("speedup_vs_ar") or 0.0))
    return kept, dropped


def pick(rows: dict[str, dict], confirmed: list[str], max_loss: float) -> str | None:
    """The fastest confirmed setting within the budget (confirm-stage tokens/s), or None."""
    ok = [c for c in confirmed if within_budget(rows[c], max_loss)]
    return max(ok, key=lambda c: rows[c].get("tokens_per_second") or 0.0) if ok else None


# ------------------------------------------------------------------------------- the command
def check_quality_dataset(spec: str) -> None:
    from .datasets import parse_dataset

    name, cats = parse_dataset(spec)
    if name in ("humaneval", "fixture") or (name == "spec-bench" and cats and set(cats) == {"math_reasoning"}):
        return
    raise SpecdecError(f"tune needs a dataset with a task-quality score ({QUALITY_DATASETS}); got {spec!r}")


def stage(pair, a, dataset, configs, settings, out: Path, env: dict, name: str) -> dict:
    """One bench run folder (resumable) -> its per-configuration summary rows."""
    from .results import check_run_settings, lock_out, prepare_dir
    from .runner import run
    from .summary import summarize

    folder = prepare_dir(out / name)
    with lock_out(folder, "specdec tune"):  # a second tune on the same folder is refused
        check_run_settings(folder, run_settings(a, settings, dataset, env), {"argv": env["argv"], "git": env["git"]})
        if not a.quiet:
            print(f"specdec tune: {name} stage, {len(configs) - 1} setting(s) + ar on {len(dataset.samples)} "
                  f"sample(s), {settings.max_new_tokens} tokens", file=sys.stderr, flush=True)
        records = run(pair, dataset, configs, [], settings, folder, progress=not a.quiet)
    return summarize(records, [c.to_dict() for c in configs], [s.id for s in dataset.samples], 1)["configs"]


@dataclass
class _TunePlan:
    """What ``specdec tune`` settles before any model loads (:func:`_plan_tune`)."""

    positions: Any
    max_loss: float
    min_agreement: float
    per_batch: int
    settings: Any
    proxy_settings: Any
    settings_grid: list
    skipped: list[str]
    dataset: Any
    proxy_set: Any
    out: Path
    target: Path
    env: dict


def _plan_tune(a: argparse.Namespace) -> _TunePlan:
    """Everything that needs no model, checked first: the selection and tuning split, the budget,
    the settings grid, the dataset (and its sandbox setting), the output paths and the environment."""
    from . import environment
    from .datasets import load_dataset

    limit, positions = parse_selection(a)
    check_quality_dataset(a.dataset)
    if positions is None:
        positions = DEFAULT_SPLIT.get(a.dataset.split(":")[0])
    max_loss = check_number("--max-quality-loss", parse_float(a.max_quality_loss, "--max-quality-loss"), 0.0, 1.0,
                            hi_open=True)
    min_agreement = check_number("--min-agreement", parse_float(a.min_agreement, "--min-agreement"), 0.0, 1.0)
    per_batch = cfgs.parse_int(a.confirm, "--confirm")
    settings = parse_settings(a)
    proxy_settings = replace(settings, max_new_tokens=cfgs.parse_int(a.proxy_tokens, "--proxy-tokens"))
    axes = grid_axes(a.policy, a.grid)
    settings_grid, skipped = grid_configs(a.policy, a.drafter, parse_ks(a.k), axes, settings)
    if a.draft == "none" and any(cfgs.needs_draft_model(c) for c in settings_grid):
        raise SpecdecError(f"drafter {a.drafter!r} needs a draft model, but --draft none was given")
    check_optional_dependencies(a, plots=False)
    dataset = load_dataset(a.dataset, limit, a.data, positions)
    sandbox_setting(dataset, settings.unsafe_exec)  # refuse before the models load
    proxy_set = replace(dataset, samples=dataset.samples[: cfgs.parse_int(a.proxy_samples, "--proxy-samples")])
    out = Path(a.out)
    target = Path(a.write) if a.write else out / "config.json"
    env = environment.describe()
    return _TunePlan(positions, max_loss, min_agreement, per_batch, settings, proxy_settings, settings_grid, skipped,
                     dataset, proxy_set, out, target, env)


def cmd_tune(a: argparse.Namespace) -> int:
    """``specdec tune``: plan (no model), proxy stage, confirm stage, ``tune.json``, then the config
    file for the pick (module docstring); no setting within the budget is an error."""
    from ..cliargs import load_pair, startup_summary
    from ..configfile import write_config

    plan = _plan_tune(a)  # everything that needs no model, first
    if plan.skipped and not a.quiet:
        print(f"specdec tune: skipped (FLy's window cannot act at that K): {', '.join(plan.skipped)}", file=sys.stderr)

    pair = load_pair(a, progress=not a.quiet)
    if not a.quiet:
        print(startup_summary(pair), file=sys.stderr, flush=True)
    if pair.draft is None and any(cfgs.needs_draft_model(c) for c in plan.settings_grid):
        raise SpecdecError(f"drafter {a.drafter!r} needs a draft model; pass --draft")
    settings = plan.settings
    [ar] = cfgs.validate([cfgs.Config(cfgs.AR)], max_new_tokens=settings.max_new_tokens, **settings.sampling())
    by_id = {c.id: c for c in plan.settings_grid}
    proxy_rows = stage(pair, a, plan.proxy_set, [ar, *plan.settings_grid], plan.proxy_settings, plan.out, plan.env,
                       "proxy")
    order, dropped = proxy_order(proxy_rows, plan.min_agreement)
    confirmed, rows, chosen = _confirm_stage(pair, a, plan, ar, by_id, order)
    result = tune_record(a, settings, plan.dataset, plan.positions, plan.max_loss, proxy_rows, order, dropped, rows,
                         confirmed, chosen, plan.skipped, plan.env, pair)
    (plan.out / "tune.json").write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    if not a.quiet:
        print_tables(proxy_rows, rows, chosen)
    if chosen is None:
        raise _no_pick_error(a, plan, rows, confirmed)
    c = by_id[chosen]
    decode = {"policy": c.policy, "drafter": c.drafter, "k": c.k, **c.params}
    write_config(plan.target, decode, tuned=result["pick"])
    print(json.dumps({"config": str(plan.target), **result["pick"]}, default=str), flush=True)
    if not a.quiet:
        print(f"specdec tune: wrote {plan.target} ({chosen}: {rows[chosen]['speedup_vs_ar']:.2f}x plain decoding, "
              f"recovery {rows[chosen]['recovery']:.3f} on {len(plan.dataset.samples)} tuning samples)",
              file=sys.stderr)
    return 0


def _confirm_stage(pair, a, plan: _TunePlan, ar, by_id: dict, order: list[str]) -> tuple[list[str], dict, str | None]:
    """The confirm stage: the settings in proxy order, ``--confirm`` more at a time, on the whole
    tuning split, until one is within the budget. Returns ``(confirmed, rows, chosen or None)``."""
    confirmed: list[str] = []
    rows: dict[str, dict] = {}
    chosen = None
    for start in range(0, len(order), plan.per_batch):
        confirmed += order[start: start + plan.per_batch]
        rows = stage(pair, a, plan.dataset, [ar, *(by_id[c] for c in confirmed)], plan.settings, plan.out, plan.env,
                     "confirm")
        if rows[cfgs.AR].get("quality") in (None, 0.0):
            raise SpecdecError("plain decoding solves none of the tuning samples, so a quality budget cannot be "
                               "judged; use more samples (--limit) or more tokens (--max-new-tokens)")
        chosen = pick(rows, confirmed, plan.max_loss)
        if chosen is not None:
            break
    return confirmed, rows, chosen


def _no_pick_error(a, plan: _TunePlan, rows: dict, confirmed: list[str]) -> SpecdecError:
    """The error when no confirmed setting keeps quality within the budget (naming the closest)."""
    best = max(confirmed, key=lambda c: rows[c].get("recovery") or 0.0, default=None)
    near = f"; closest: {best} (recovery {rows[best].get('recovery')})" if best else ""
    return SpecdecError(f"no setting of {a.policy!r} keeps quality within {plan.max_loss:.3g} of plain decoding on "
                        f"{len(plan.dataset.samples)} tuning samples{near}; no config written "
                        f"({plan.out / 'tune.json'})")


def tune_record(a, settings, dataset, positions, max_loss, proxy_rows, order, dropped, rows, confirmed, chosen, skipped,
                env, pair) -> dict:
    """What tune.json holds; its ``pick`` part is stored in the config file as ``tuned``."""
    keep = ("tokens_per_second", "speedup_vs_ar", "tau", "quality", "quality_metric", "recovery", "paired",
            "agreement", "samples")
    ar = rows.get(cfgs.AR, {})
    pick_info = None
    if chosen is not None:
        r = rows[chosen]
        pick_info = {
            "setting": chosen, "speedup_vs_ar": r.get("speedup_vs_ar"), "tokens_per_second": r.get("tokens_per_second"),
            "ar_tokens_per_second": ar.get("tokens_per_second"), "tau": r.get("tau"), "quality": r.get("quality"),
            "ar_quality": ar.get("quality"), "quality_metric": r.get("quality_metric"), "recovery": r.get("recovery"),
            "paired_vs_ar": r.get("paired"),
            "max_quality_loss": max_loss, "dataset": a.dataset, "positions": positions,
            "samples": len(dataset.samples), "max_new_tokens": settings.max_new_tokens,
            "sampling": settings.sampling(),
            "target": pair.target_name, "draft": pair.draft_name,
            "dtype": pair.target.variant, "backend": pair.backend,
            "cpu": env["hardware"]["cpu"], "cpu_flags": env["hardware"]["cpu_flags"], "gpu": env["hardware"]["gpu"],
            "git": env["git"], "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
    return {
        "policy": a.policy, "drafter": a.drafter, "max_quality_loss": max_loss, "skipped": skipped,
        "proxy": {cid: {k: r.get(k) for k in keep} for cid, r in proxy_rows.items()},
        "proxy_order": order, "dropped_low_agreement": dropped, "confirmed": confirmed,
        "confirm": {cid: {k: r.get(k) for k in keep} | {"within_budget": within_budget(r, max_loss)}
                    for cid, r in rows.items()},
        "pick": pick_info,
    }


def print_tables(proxy_rows: dict, rows: dict, chosen: str | None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    def f(x, spec=".2f"):
        return "–" if x is None else format(x, spec)

    console = Console(stderr=True)
    for title, table_rows, cols in (("proxy", proxy_rows, ("speedup", "tau", "agreement")),
                                    ("confirm", rows, ("speedup", "tau", "quality", "recovery"))):
        t = Table(title=f"specdec tune: {title}", title_justify="left")
        t.add_column("setting")
        for col in cols:
            t.add_column(col, justify="right")
        for cid, r in table_rows.items():
            cells = {"speedup": f(r.get("speedup_vs_ar")) + "x", "tau": f(r.get("tau")),
                     "agreement": f((r.get("agreement") or {}).get("token_agreement"), ".3f"),
                     "quality": f(r.get("quality"), ".3f"), "recovery": f(r.get("recovery"), ".3f")}
            t.add_row(escape(cid) + (" *" if cid == chosen else ""), *(cells[c] for c in cols))
        console.print(t)
