"""``specdec tune``: for each loose policy asked for, the fastest setting of its parameters and K
on this machine whose task quality is *certified* within a budget of plain decoding, checked
again on problems the tuner never looked at, and written as a config file.

Everything runs through the bench runner (same process, ``ar`` timed alongside, resumable,
progress bar), in three run folders under ``--out`` (``confirm/`` first, for ``ar`` alone):

1. **proxy** (cheap, prunes the grid; it runs after ``ar``'s confirm run, below): every setting of every policy's grid (each rule's declared
   ``tune_grid``, or ``--grid``; times ``--k``) and ``ar`` on ``--proxy-samples`` problems of the
   tuning split at ``--proxy-tokens`` new tokens: speed relative to ``ar`` in the steady state,
   without the first round's prefills (:func:`specdec.bench.certify.decode_speedup`), token agreement and
   where the tokens first diverge from ``ar``'s (:func:`specdec.bench.certify.divergence`). A
   ``k=auto`` setting runs here at the fixed K ``--proxy-k`` (more for a FLy window that needs
   it): on a short request the controller can sit at K=0 after one unlucky probe, and a rule that
   never sees a draft looks perfectly faithful. Settings below ``--min-agreement`` (off by
   default) and settings another of the same policy beats on speed, divergence and agreement
   alike are dropped.
2. **confirm** (the pick): ``ar`` first, on the whole tuning split at ``--max-new-tokens``, scored
   on the task, before anything else runs; if even a setting that agreed with ``ar`` everywhere
   could not be certified on this split (:func:`specdec.bench.certify.best_case_budget`), tune
   stops there and says which budget the split can certify and how many problems the asked one
   needs. After the proxy, each policy's settings, fastest proxy first (within ``--speed-tie``
   of the fastest left, fewest diverging problems first), ``--confirm`` at a time:
   a setting *qualifies* when the one-sided ``--confidence`` lower bound of its paired recovery
   against ``ar`` is ``>= 1 - --max-quality-loss``; the fastest qualifying setting (confirm-stage
   tokens/s) is the policy's pick. A setting stops part-way as soon as no outcome on the problems
   left could make it qualify (:func:`specdec.bench.certify.can_still_qualify`, from ``ar``'s
   outcomes there; ``--no-early-stop`` runs every setting to the end): it cannot be the pick, and
   the time goes to the next setting. A pick has always run the whole split. A policy with none
   gets the smallest budget its best setting certifies, and the split size the asked budget needs
   from the observed discordance, with a time estimate (from the problems it ran: a setting
   stopped at a loss overstates its loss rate).
3. **validate**: ``ar`` and every pick on a validation split disjoint from the tuning split by
   default (the next problems outside it, as many as it has): recovery with its interval, and a
   warning when it falls below the budget. ``--validate-closest`` also runs the closest setting of
   each policy without a pick there (what the refused setting would have lost).
4. ``tune.json`` (every figure), ``report.md`` (the table) and one config file per pick
   (``--write`` for a single policy; default ``<out>/config.json``, or ``config-<policy>.json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..checks import check_number
from ..draftlength import K
from ..errors import SpecdecError
from ..core.request import DEFAULTS
from ..core.names import AR
from . import certify
from . import configs as cfgs
from .options import (add_dataset_args, add_execution_args, add_sampling_args, check_optional_dependencies,
                      parse_float, parse_selection, parse_settings, run_settings, sandbox_setting)
from .report import fmt, speed_basis
from .summary import paired_quality, verdicts

#: the tuning split when --samples is not given (HumanEval: the second half; the first half,
#: 0..81, is the default validation split and holds bench's usual report set)
DEFAULT_SPLIT = {"humaneval": (82, 163)}

#: the budget and confidence a tune asks for when not told: what the default split can certify on
#: the bundled pair, whose plain decoding solves 47 of HumanEval's 82 tuning problems (measured,
#: 512 tokens): at 0.9 a setting that changes no outcome is certified within 0.018, and one that loses
#: one problem and gains another within 0.042; at 0.02 / 0.95 no setting could qualify there (floor
#: 0.029), so the documented workflow ended without a config file
DEFAULT_MAX_LOSS = 0.05
DEFAULT_CONFIDENCE = 0.9
QUALITY_DATASETS = "humaneval, fixture, or spec-bench:math_reasoning"

EPILOG = """\
examples:
  specdec tune --policy mars,fly --k 4 --out runs/tune           # tune on HumanEval 82..163, validate on 0..81
  specdec tune --policy mars --grid theta=0.9,0.95 --max-quality-loss 0.05 --confidence 0.9 --out runs/tune-mars
  specdec tune --policy mars --grid theta=0.9,0.95 --max-quality-loss 0.05 --confidence 0.9 --out runs/tune-mars --status
  specdec generate --config runs/tune-mars/config.json "Write a function that ..."
"""


def register(sub) -> None:
    p = sub.add_parser(
        "tune", help="pick each policy's parameters and K for a certified quality budget; write config files",
        description="Sweep each policy's parameters and K on a tuning split (default HumanEval 82..163), prune "
                    "with a cheap proxy (agreement with plain decoding at few tokens), confirm on the task, and "
                    "pick the fastest setting whose paired recovery against plain decoding is >= 1 - "
                    "--max-quality-loss at the lower end of a one-sided --confidence interval; then measure the "
                    "picks on a validation split the tuner never saw (default: as many problems outside the "
                    "tuning split) and write one config file per pick for generate/serve/bench --config.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("what to tune")
    g.add_argument("--policy", required=True, metavar="LIST",
                   help="the loose policy or policies to tune, comma-separated (one shared ar): e.g. mars or "
                        "mars,fly,dropmatch,typical,fly+mars")
    g.add_argument("--drafter", default=DEFAULTS["drafter"],
                   help=f"model | pld | model+pld (default: {DEFAULTS['drafter']})")
    g.add_argument("-k", "--k", default="auto,4,8", metavar="LIST",
                   help="K values to sweep: auto and/or integers (default: auto,4,8; FLy skips K <= its window)")
    g.add_argument("--grid", action="append", default=None, metavar="PARAM=V1,V2,...",
                   help="values for one policy parameter, e.g. mars_theta=0.7,0.8,0.9 (repeatable; default: each "
                        "rule's declared grid)")
    g.add_argument("--max-quality-loss", default=f"{DEFAULT_MAX_LOSS:g}", metavar="L",
                   help="largest relative quality loss vs plain decoding that the pick must be certified within "
                        f"(default: {DEFAULT_MAX_LOSS:g})")
    g.add_argument("--confidence", default=f"{DEFAULT_CONFIDENCE:g}", metavar="C",
                   help="one-sided confidence of that certificate: the lower bound of the paired recovery "
                        f"interval (Bonett-Price) must be >= 1 - L (default: {DEFAULT_CONFIDENCE:g}; with the "
                        "default budget, what HumanEval's 82-problem half can certify when plain decoding solves "
                        "about half of it)")
    add_dataset_args(g)
    g.add_argument("--validate-samples", default=None, metavar="A..B|none",
                   help="the validation split's positions (default: as many problems as the tuning split has, "
                        "the first ones outside it); none = skip validation")
    g.add_argument("--validate-closest", action="store_true",
                   help="also validate the closest setting of each policy that has no pick (what it would lose)")
    add_sampling_args(g)
    _add_search_args(p.add_argument_group("search"))
    o = p.add_argument_group("output and execution")
    o.add_argument("--out", required=True, metavar="DIR", help="output folder (created; reruns resume in it)")
    o.add_argument("--status", action="store_true",
                   help="print where the run in --out stands (each stage's settings so far against plain decoding: "
                        "problems run, lost/gained, recovery, speed, whether each can still qualify) and exit; give "
                        "the run's own flags; loads no model, writes nothing, safe while the run goes")
    o.add_argument("--write", default=None, metavar="FILE",
                   help="the config file to write, with one policy (default: OUT/config.json; OUT/config-POLICY.json "
                        "each with several)")
    add_execution_args(o)
    from ..frontends.cliargs import add_model_args

    add_model_args(p)
    p.set_defaults(func=cmd_tune)


def _add_search_args(s) -> None:
    """The proxy and confirm stages' flags."""
    s.add_argument("--proxy-samples", default="20", metavar="N", help="tuning problems in the proxy stage (default: 20)")
    s.add_argument("--proxy-tokens", default="32", metavar="M", help="new tokens in the proxy stage (default: 32)")
    s.add_argument("--proxy-k", default="4", metavar="K",
                   help="the fixed K a k=auto setting drafts at in the proxy stage (default: 4)")
    s.add_argument("--speed-tie", default="0.05", metavar="R",
                   help="proxy speeds within R (relative) of the fastest count as equal, and the setting that diverges "
                        "from plain decoding on fewer problems is confirmed first (default: 0.05; 0 = by speed alone)")
    s.add_argument("--min-agreement", default="0", metavar="A",
                   help="drop settings whose proxy token agreement with plain decoding is below A (default: 0 = keep all)")
    s.add_argument("--confirm", default="2", metavar="N",
                   help="settings of each policy confirmed on task quality per batch, fastest proxy first (default: 2)")
    s.add_argument("--max-confirm", default=None, metavar="N",
                   help="confirm at most N settings of each policy in all (default: every setting the proxy kept)")
    s.add_argument("--no-early-stop", action="store_true",
                   help="run every confirmed setting on the whole tuning split, even once it can no longer qualify")


# ------------------------------------------------------------------------------- the grid
def parse_policies(text: str) -> list[str]:
    """``--policy`` as a list of loose (or exact) policy names, validated, without duplicates."""
    names = list(dict.fromkeys(cfgs.split_list(text, "--policy")))
    for name in names:
        check_policy(name)
    return names


def check_policy(name: str):
    """The policy object of ``name``, refusing ``ar`` (the baseline) and unknown names."""
    from ..core.verify import make_policy

    if name == AR:
        raise SpecdecError("policy 'ar' (plain decoding) has nothing to tune; it is the baseline")
    return make_policy(name)


def grid_axes(policy: str, overrides: list[str] | None) -> dict[str, list[Any]]:
    """``{prefixed parameter: values}``: each rule's ``tune_grid``, replaced by ``--grid`` items
    (with several policies, an item applies to each policy that has the parameter)."""
    from ..core.verify import RULES

    pol = check_policy(policy)
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


def grid_for_policies(policies: list[str], overrides: list[str] | None) -> dict[str, dict[str, list[Any]]]:
    """:func:`grid_axes` per policy; with several policies a ``--grid`` item goes to each policy
    that takes it (an item none takes is an error naming them all)."""
    if len(policies) == 1:
        return {policies[0]: grid_axes(policies[0], overrides)}
    items: dict[str, list[str]] = {p: [] for p in policies}
    for item in overrides or []:
        took = []
        for p in policies:
            try:
                grid_axes(p, [item])
            except SpecdecError as exc:
                if "is not a parameter" in str(exc):
                    continue
                raise
            items[p].append(item)
            took.append(p)
        if not took:
            raise SpecdecError(f"--grid {item.partition('=')[0].strip()!r} is not a parameter of any policy in "
                               f"{', '.join(policies)}")
    return {p: grid_axes(p, items[p]) for p in policies}


def _prefixed(key: str, rules: list[str], policy: str) -> str:
    from ..core.verify import rule_params
    from ..core.verify.policy import SCHEDULE_PARAMS

    if any(key == f"{r}_{p}" for r in rules for p in rule_params(r)) or (rules and key in SCHEDULE_PARAMS):
        return key  # prefixed already, or the policy's own (its relaxation schedule: never prefixed)
    owners = [r for r in rules if key in rule_params(r)]
    if len(owners) != 1:
        taken = ", ".join([*(f"{r}_{p}" for r in rules for p in rule_params(r)),
                           *(SCHEDULE_PARAMS if rules else ())]) or "no parameters"
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


def proxy_config(c, proxy_k: int, settings):
    """The configuration the proxy stage runs for grid setting ``c``: ``c`` itself at a fixed K,
    or, for ``k=auto``, at ``proxy_k`` (at least one more than a FLy window, so the window can act)."""
    from ..core.verify import make_policy

    if not K.parse(c.k).auto:
        return c
    pol = make_policy(c.policy, c.params)
    k = max(proxy_k, (pol.lookahead + 1) if pol is not None and pol.lookahead else 0)
    [out] = cfgs.validate([replace(c, k=k, request=None)], max_new_tokens=settings.max_new_tokens,
                          **settings.sampling())
    return out


def parse_ks(text: str) -> list:
    return list(dict.fromkeys(cfgs.parse_k(x, "--k") for x in cfgs.split_list(text, "--k")))


# ------------------------------------------------------------------------------- the pick
def proxy_order(rows: dict[str, dict], min_agreement: float,
                speed_tie: float = 0.0) -> tuple[list[str], list[str], list[str]]:
    """Setting ids in confirm order; those dropped for agreement below ``min_agreement``; and those
    dominated by another setting (:func:`specdec.bench.certify.dominated`). The order is by proxy
    speed (:func:`specdec.bench.certify.proxy_speed`), fastest first, except that settings within
    ``speed_tie`` (relative) of the fastest left count as equally fast: of those, the one that
    diverges from ``ar`` on the fewest problems goes first (then the most token agreement)."""
    low, kept = [], {}
    for cid, r in rows.items():
        if cid == cfgs.AR:
            continue
        agree = (r.get("agreement") or {}).get("token_agreement")
        if agree is not None and agree < min_agreement:
            low.append(cid)
        else:
            kept[cid] = r
    beaten = certify.dominated(kept)
    left = sorted((c for c in kept if c not in beaten), key=lambda c: -certify.proxy_speed(rows[c]))
    order = []
    while left:
        floor = certify.proxy_speed(rows[left[0]]) * (1.0 - speed_tie)
        ties = [c for c in left if certify.proxy_speed(rows[c]) >= floor - 1e-12]
        first = min(ties, key=lambda c: (_diverged(rows[c]), -_agreement(rows[c])))  # stable: faster wins ties
        order.append(first)
        left.remove(first)
    return order, low, sorted(beaten)


def _diverged(row: dict) -> float:
    d = (row.get("divergence") or {}).get("diverged")
    return 1.0 if d is None else d


def _agreement(row: dict) -> float:
    return (row.get("agreement") or {}).get("token_agreement") or 0.0


def pick(rows: dict[str, dict], confirmed: list[str], max_loss: float,
         confidence: float = certify.CONFIDENCE, n: int | None = None) -> str | None:
    """The fastest confirmed setting whose paired recovery is certified within the budget
    (:func:`specdec.bench.certify.qualifies`) on all ``n`` problems of the split (a setting stopped
    early never is), or None. Fastest: the highest confirm-stage ``time_speedup_vs_ar`` (the split
    done soonest; a setting writing longer answers is not faster for its tokens/s), else tokens/s."""
    ok = [c for c in confirmed if certify.qualifies(rows[c].get("paired"), max_loss, confidence)
          and (n is None or (rows[c].get("paired") or {}).get("n") == n)]
    return max(ok, key=lambda c: (rows[c].get("time_speedup_vs_ar") or 0.0, rows[c].get("tokens_per_second") or 0.0)) \
        if ok else None


# ------------------------------------------------------------------------------- the command
def stopper(sample_ids: list[str], max_loss: float, confidence: float):
    """The confirm stage's ``skip``: True for a setting (never ``ar``) that can no longer qualify
    on the split ``sample_ids`` whatever it does on the problems it has not run
    (:func:`specdec.bench.certify.can_still_qualify`; ``ar``'s outcomes must all be in)."""
    wanted = set(sample_ids)

    def skip(cfg, records: dict[str, dict]) -> bool:
        if cfg.id == cfgs.AR:
            return False
        ar = verdicts([r for r in records.values() if r["config"] == cfgs.AR and r["sample_id"] in wanted])
        if len(ar) < len(wanted):
            return False
        mine = verdicts([r for r in records.values() if r["config"] == cfg.id and r["sample_id"] in wanted])
        both, gained, lost = certify.counts(paired_quality(mine, ar)) or (0, 0, 0)
        left = [ar[s] for s in wanted if s not in mine]
        return not certify.can_still_qualify(both, gained, lost, sum(left), len(left) - sum(left), max_loss,
                                             confidence)

    return skip


def check_quality_dataset(spec: str) -> None:
    from .datasets import parse_dataset

    name, cats = parse_dataset(spec)
    if name in ("humaneval", "fixture") or (name == "spec-bench" and cats and set(cats) == {"math_reasoning"}):
        return
    raise SpecdecError(f"tune needs a dataset with a task-quality score ({QUALITY_DATASETS}); got {spec!r}")


def stage(pair, a, dataset, configs, settings, out: Path, env: dict, name: str,
          skip=None) -> tuple[dict, list[dict]]:
    """One bench run folder (resumable) -> (its per-configuration summary rows, its records);
    ``skip`` as :func:`specdec.bench.runner.run` takes it."""
    from .results import check_run_settings, lock_out, prepare_dir
    from .runner import run
    from .summary import summarize

    folder = prepare_dir(out / name)
    with lock_out(folder, "specdec tune"):  # a second tune on the same folder is refused
        check_run_settings(folder, run_settings(a, settings, dataset, env), {"argv": env["argv"], "git": env["git"]})
        if not a.quiet:
            print(f"specdec tune: {name} stage, {len(configs) - 1} setting(s) + ar on {len(dataset.samples)} "
                  f"sample(s), {settings.max_new_tokens} tokens", file=sys.stderr, flush=True)
        records = run(pair, dataset, configs, [], settings, folder, progress=not a.quiet, skip=skip,
                      label=f"tune {name}")
    rows = summarize(records, [c.to_dict() for c in configs], [s.id for s in dataset.samples], 1)["configs"]
    return rows, records


@dataclass
class PolicyPlan:
    """One policy's grid: its settings and the proxy configuration each runs as."""

    policy: str
    settings: list
    skipped: list[str]
    proxy_of: dict[str, Any]  # setting id -> proxy Config


@dataclass
class _TunePlan:
    """What ``specdec tune`` settles before any model loads (:func:`_plan_tune`)."""

    positions: Any
    max_loss: float
    confidence: float
    min_agreement: float
    speed_tie: float
    per_batch: int
    max_confirm: int | None  # settings confirmed per policy at most (None: all the proxy kept)
    settings: Any
    proxy_settings: Any
    policies: list[PolicyPlan]
    dataset: Any
    proxy_set: Any
    validation: Any  # a Dataset, or None (skipped)
    validation_overlap: list[str]
    out: Path
    targets: dict[str, Path]
    env: dict
    by_id: dict = field(default_factory=dict)


def parse_validation(text: str | None) -> tuple[int, int] | str | None:
    """``--validate-samples``: positions ``(a, b)``, ``"none"``, or None (the default split)."""
    if text is None:
        return None
    if str(text).strip().lower() == "none":
        return "none"
    return cfgs.parse_positions(text, "--validate-samples")


def validation_split(a, dataset, positions) -> tuple[Any, list[str]]:
    """The validation Dataset (None with ``--validate-samples none`` or when nothing is left) and
    the ids it shares with the tuning split (empty by default). ``positions``: :func:`parse_validation`."""
    from .datasets import load_dataset

    if positions == "none":
        return None, []
    tuning = {s.id for s in dataset.samples}
    if positions is not None:
        v = load_dataset(a.dataset, None, a.data, positions)
        return v, [s.id for s in v.samples if s.id in tuning]
    full = load_dataset(a.dataset, None, a.data)
    rest = [s for s in full.samples if s.id not in tuning][: len(dataset.samples)]
    return (replace(full, samples=rest) if rest else None), []


def _plan_tune(a: argparse.Namespace) -> _TunePlan:
    """Everything that needs no model, checked first: the selection, tuning and validation
    splits, the budget and confidence, the settings grids, the dataset (and its sandbox setting),
    the output paths and the environment."""
    from . import environment
    from .datasets import load_dataset

    limit, positions = parse_selection(a)
    validate_positions = parse_validation(a.validate_samples)
    check_quality_dataset(a.dataset)
    if positions is None:
        positions = DEFAULT_SPLIT.get(a.dataset.split(":")[0])
    max_loss = check_number("--max-quality-loss", parse_float(a.max_quality_loss, "--max-quality-loss"), 0.0, 1.0,
                            hi_open=True)
    confidence = check_number("--confidence", parse_float(a.confidence, "--confidence"), 0.5, 1.0, hi_open=True)
    min_agreement = check_number("--min-agreement", parse_float(a.min_agreement, "--min-agreement"), 0.0, 1.0)
    speed_tie = check_number("--speed-tie", parse_float(a.speed_tie, "--speed-tie"), 0.0, 1.0, hi_open=True)
    per_batch = cfgs.parse_int(a.confirm, "--confirm")
    max_confirm = None if a.max_confirm is None else cfgs.parse_int(a.max_confirm, "--max-confirm")
    settings = parse_settings(a)
    proxy_settings = replace(settings, max_new_tokens=cfgs.parse_int(a.proxy_tokens, "--proxy-tokens"))
    proxy_k = cfgs.parse_int(a.proxy_k, "--proxy-k")
    names = parse_policies(a.policy)
    if a.write and len(names) > 1:
        raise SpecdecError("--write names one config file; with several policies each gets OUT/config-POLICY.json")
    ks = parse_ks(a.k)
    plans = []
    for name, axes in grid_for_policies(names, a.grid).items():
        grid, skipped = grid_configs(name, a.drafter, ks, axes, settings)
        plans.append(PolicyPlan(name, grid, skipped, {c.id: proxy_config(c, proxy_k, proxy_settings) for c in grid}))
    if a.draft == "none" and any(cfgs.needs_draft_model(c) for p in plans for c in p.settings):
        raise SpecdecError(f"drafter {a.drafter!r} needs a draft model, but --draft none was given")
    check_optional_dependencies(a, plots=False)
    dataset = load_dataset(a.dataset, limit, a.data, positions)
    sandbox_setting(dataset, settings.unsafe_exec)  # refuse before the models load
    validation, overlap = validation_split(a, dataset, validate_positions)
    proxy_set = replace(dataset, samples=dataset.samples[: cfgs.parse_int(a.proxy_samples, "--proxy-samples")])
    out = Path(a.out)
    targets = {p.policy: (Path(a.write) if a.write else out / "config.json") if len(plans) == 1
               else out / f"config-{p.policy}.json" for p in plans}
    env = environment.describe(getattr(a, "argv_typed", None))
    plan = _TunePlan(positions, max_loss, confidence, min_agreement, speed_tie, per_batch, max_confirm, settings, proxy_settings,
                     plans, dataset, proxy_set, validation, overlap, out, targets, env)
    plan.by_id = {c.id: c for p in plans for c in p.settings}
    return plan


@dataclass
class PolicyResult:
    """What tune found for one policy."""

    policy: str
    order: list[str] = field(default_factory=list)
    low_agreement: list[str] = field(default_factory=list)
    dominated: list[str] = field(default_factory=list)
    confirmed: list[str] = field(default_factory=list)
    pick: str | None = None
    why_none: str = ""
    closest: dict | None = None
    validation: dict | None = None

    @property
    def exhausted(self) -> bool:
        return len(self.confirmed) >= len(self.order)


def cmd_tune(a: argparse.Namespace) -> int:
    """``specdec tune``: plan (no model), proxy, confirm (``ar`` first: can the split certify the
    budget at all?), validate, then ``tune.json``, ``report.md`` and a config file per pick
    (module docstring). No policy with a pick is an error (exit 2), as is a split that cannot
    certify the budget."""
    from ..frontends.cliargs import load_pair, startup_summary

    plan = _plan_tune(a)  # everything that needs no model, first
    if a.status:
        from .tune_status import status_markdown

        splits = {"proxy": plan.proxy_set.samples, "confirm": plan.dataset.samples,
                  "validate": plan.validation.samples if plan.validation is not None else []}
        print(status_markdown(plan.out, {k: [x.id for x in v] for k, v in splits.items()}, plan.max_loss,
                              plan.confidence), end="")
        return 0
    for p in plan.policies:
        if p.skipped and not a.quiet:
            print(f"specdec tune: skipped (FLy's window cannot act at that K): {', '.join(p.skipped)}", file=sys.stderr)
    if plan.validation_overlap and not a.quiet:
        print(f"specdec tune: warning: the validation split shares {len(plan.validation_overlap)} problem(s) with the "
              "tuning split, so it is not an independent check", file=sys.stderr)

    pair = load_pair(a, progress=not a.quiet)
    if not a.quiet:
        print(startup_summary(pair), file=sys.stderr, flush=True)
    if pair.draft is None and any(cfgs.needs_draft_model(c) for c in plan.by_id.values()):
        raise SpecdecError(f"drafter {a.drafter!r} needs a draft model; pass --draft")
    settings = plan.settings
    [ar] = cfgs.validate([cfgs.Config(cfgs.AR)], max_new_tokens=settings.max_new_tokens, **settings.sampling())
    results = {p.policy: PolicyResult(p.policy) for p in plan.policies}
    # ar on the tuning split first: it settles whether this split can certify the budget at all
    rows, _ = stage(pair, a, plan.dataset, [ar], plan.settings, plan.out, plan.env, "confirm")
    feasibility = feasibility_of(rows[cfgs.AR], plan)
    proxy_rows: dict[str, dict] = {}
    validate_rows = None
    if feasibility["certifiable"]:
        proxy_rows = _proxy_stage(pair, a, plan, ar)
        for p in plan.policies:
            by_setting = {sid: proxy_rows[c.id] for sid, c in p.proxy_of.items()}
            r = results[p.policy]
            r.order, r.low_agreement, r.dominated = proxy_order({cfgs.AR: proxy_rows[cfgs.AR], **by_setting},
                                                                plan.min_agreement, plan.speed_tie)
        rows = _confirm_stage(pair, a, plan, ar, results, rows)
        if plan.validation is not None and validated(results, a.validate_closest):
            validate_rows = _validate_stage(pair, a, plan, ar, results)
    record = tune_record(a, plan, pair, proxy_rows, rows, validate_rows, results, feasibility)
    (plan.out / "tune.json").write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    (plan.out / "report.md").write_text(report_markdown(record), encoding="utf-8")
    if not a.quiet:
        print_table(record)
    if not feasibility["certifiable"]:
        raise SpecdecError(feasibility["message"] + f"; no config written ({plan.out / 'tune.json'})")
    return _write_configs(a, plan, results, record)


def _proxy_stage(pair, a, plan: _TunePlan, ar) -> dict[str, dict]:
    """Runs the proxy stage: ``ar`` and each distinct proxy configuration; rows with ``divergence``."""
    proxies = cfgs.dedupe([c for p in plan.policies for c in p.proxy_of.values()])
    [proxy_ar] = cfgs.validate([cfgs.Config(cfgs.AR)], max_new_tokens=plan.proxy_settings.max_new_tokens,
                               **plan.proxy_settings.sampling())
    rows, records = stage(pair, a, plan.proxy_set, [proxy_ar, *proxies], plan.proxy_settings, plan.out, plan.env,
                          "proxy")
    for cid, r in rows.items():
        if cid != cfgs.AR:
            r["divergence"] = certify.divergence(records, cid)
            r["decode_speedup_vs_ar"] = certify.decode_speedup(records, cid)
    return rows


def _confirm_stage(pair, a, plan: _TunePlan, ar, results: dict[str, PolicyResult], rows: dict) -> dict:
    """Batches of each undecided policy's settings in proxy order (``ar`` has run: ``rows``) until
    every policy has a pick or none is left; the closest setting of each policy without one.
    Returns the confirm rows."""
    confirmed: list[str] = []
    skip = None if a.no_early_stop else stopper([s.id for s in plan.dataset.samples], plan.max_loss, plan.confidence)
    while True:
        batch = []
        for r in results.values():
            if r.pick is None and not r.exhausted:
                last = len(r.order) if plan.max_confirm is None else min(len(r.order), plan.max_confirm)
                new = r.order[len(r.confirmed): min(last, len(r.confirmed) + plan.per_batch)]
                r.confirmed += new
                batch += new
        if not batch:
            break
        confirmed += batch
        rows, _ = stage(pair, a, plan.dataset, [ar, *(plan.by_id[c] for c in confirmed)], plan.settings, plan.out,
                        plan.env, "confirm", skip=skip)
        for r in results.values():
            if r.pick is None:
                r.pick = pick(rows, r.confirmed, plan.max_loss, plan.confidence, len(plan.dataset.samples))
    for r in results.values():
        if r.pick is None:
            r.closest, r.why_none = closest_setting(r, rows, plan)
    return rows


def _seconds_per_sample(row: dict) -> float | None:
    n = row.get("samples") or 0
    return (row.get("seconds") or 0.0) / n if n else None


def feasibility_of(ar_row: dict, plan: _TunePlan) -> dict:
    """Whether the tuning split can certify the budget at all, from ``ar``'s outcomes: the best
    case is a setting that solves exactly what ``ar`` solves."""
    n = ar_row.get("quality_n") or ar_row.get("samples") or 0
    quality = ar_row.get("quality")
    if quality in (None, 0.0):
        raise SpecdecError("plain decoding solves none of the tuning samples, so a quality budget cannot be "
                           "judged; use more samples (--limit) or more tokens (--max-new-tokens)")
    solved = round(quality * n)
    best = certify.best_case_budget(solved, plan.confidence)
    assert best is not None  # ar solved at least one (quality > 0)
    out = {"ar_solved": solved, "n": n, "best_case_budget": best, "certifiable": best <= plan.max_loss + 1e-12,
           "message": ""}
    if not out["certifiable"]:
        need = certify.problems_needed(solved, 0, 0, n, plan.max_loss, plan.confidence)
        per = _seconds_per_sample(ar_row)
        out["problems_needed"] = need
        eta = None if need is None or per is None else need * per * 2
        out["message"] = (
            f"no setting can qualify on this split: ar solves {solved} of {n} problems, so even a setting that "
            f"solves exactly the same ones is certified only within a loss of {best:.3f} at {plan.confidence:g} "
            f"confidence (asked: {plan.max_loss:g}); the asked budget needs about {need} problems with no "
            f"discordant one (ar and one setting: about {certify.hours(eta)} at this speed), or a larger "
            f"--max-quality-loss, or a lower --confidence")
    return out


def closest_setting(r: PolicyResult, rows: dict, plan: _TunePlan) -> tuple[dict | None, str]:
    """The confirmed setting of ``r`` with the highest recovery bound, the budget it certifies,
    and the split size the asked budget would need at its observed discordance (with a time
    estimate: its and ``ar``'s seconds per problem here)."""
    best, best_bound = None, -1.0
    for c in r.confirmed:
        bound = certify.paired_bound(rows.get(c, {}).get("paired"), plan.confidence)
        if bound is not None and bound > best_bound:
            best, best_bound = c, bound
    if best is None:
        return None, (f"no setting of {r.policy} was left to confirm (--min-agreement dropped them all)"
                      if not r.order else f"no confirmed setting of {r.policy} has a paired recovery")
    counted = certify.counts(rows[best]["paired"])
    assert counted is not None  # it has a bound, so its counts
    both, gained, lost = counted
    n, total = rows[best]["paired"]["n"], len(plan.dataset.samples)
    need = certify.problems_needed(both, gained, lost, n, plan.max_loss, plan.confidence)
    mine, ar = _seconds_per_sample(rows[best]), _seconds_per_sample(rows[cfgs.AR])
    eta = None if need is None or mine is None or ar is None else need * (mine + ar)
    info = {"setting": best, "recovery": rows[best].get("recovery"), "bound": best_bound,
            "certifies": max(0.0, 1.0 - best_bound), "problems_needed": need, "seconds_needed": eta,
            "problems_run": n, "stopped_early": n < total}
    needs = (f"the asked {plan.max_loss:g} needs about {need} problems at its observed discordance "
             f"({lost} lost, {gained} gained of {n}; about {certify.hours(eta)} at this speed)" if need is not None
             else f"its measured recovery {rows[best].get('recovery'):.3f} is itself below 1 - {plan.max_loss:g}, "
                  "so no split size certifies it")
    stopped = (f" (it stopped after {n} of {total} problems, when no outcome on the rest could make it qualify; "
               "these figures are from the problems it ran, and stopping at a loss overstates the loss rate)"
               if n < total else "")
    why = (f"no setting of {r.policy} qualifies: the closest, {best}, is certified within a loss of "
           f"{info['certifies']:.3f} at {plan.confidence:g} confidence (lower bound {best_bound:.3f}); {needs}{stopped}")
    return info, why


def validated(results: dict[str, PolicyResult], closest: bool) -> list[str]:
    """The settings the validation stage runs: every pick, and with ``closest`` the closest
    setting of each policy without one."""
    out = [r.pick for r in results.values() if r.pick]
    if closest:
        out += [r.closest["setting"] for r in results.values() if r.pick is None and r.closest]
    return list(dict.fromkeys(out))


def _validation_figures(row: dict, plan: _TunePlan) -> dict:
    bound = certify.paired_bound(row.get("paired"), plan.confidence)
    rec = row.get("recovery")
    return {"samples": row.get("samples"), "speed_samples": row.get("speed_samples"), "speedup_vs_ar": row.get("speedup_vs_ar"),
            "time_speedup_vs_ar": row.get("time_speedup_vs_ar"), "length_vs_ar": row.get("length_vs_ar"), "recovery": rec,
            "recovery_ci": (row.get("paired") or {}).get("recovery_ci"), "bound": bound,
            "held": certify.clears(rec, plan.max_loss), "certified": certify.clears(bound, plan.max_loss),
            "paired": row.get("paired")}


def _validate_stage(pair, a, plan: _TunePlan, ar, results: dict[str, PolicyResult]) -> dict:
    """``ar`` and every pick (with ``--validate-closest``, each closest setting of a policy without
    one too) on the validation split: recovery with its interval, whether the budget held (point
    estimate >= 1 - budget) and whether it is certified there too."""
    rows, _ = stage(pair, a, plan.validation, [ar, *(plan.by_id[c] for c in validated(results, a.validate_closest))],
                    plan.settings, plan.out, plan.env, "validate")
    for r in results.values():
        if r.pick is None and r.closest and r.closest["setting"] in rows:
            r.closest["validation"] = _validation_figures(rows[r.closest["setting"]], plan)
        if r.pick:
            r.validation = _validation_figures(rows[r.pick], plan)
            rec = r.validation["recovery"]
            if not r.validation["held"] and not a.quiet:
                print(f"specdec tune: warning: {r.pick} recovers {rec if rec is None else round(rec, 3)} of plain "
                      f"decoding's quality on the validation split, below the budget (1 - {plan.max_loss:g})",
                      file=sys.stderr)
    return rows


def _write_configs(a, plan: _TunePlan, results: dict[str, PolicyResult], record: dict) -> int:
    from ..core.configfile import write_config

    written = 0
    for r in results.values():
        if r.pick is None:
            if len(results) > 1 and not a.quiet:
                print(f"specdec tune: {r.why_none}", file=sys.stderr)
            continue
        c = plan.by_id[r.pick]
        decode = {"policy": c.policy, "drafter": c.drafter, "k": c.k, **c.params}
        target = plan.targets[r.policy]
        write_config(target, decode, tuned=record["policies"][r.policy]["pick"])
        written += 1
        print(json.dumps({"config": str(target), **record["policies"][r.policy]["pick"]}, default=str), flush=True)
    if not written:
        whys = "; ".join(r.why_none for r in results.values())
        raise SpecdecError(f"{whys}; no config written ({plan.out / 'tune.json'})")
    return 0


KEEP = ("tokens_per_second", "speedup_vs_ar", "time_speedup_vs_ar", "length_vs_ar", "decode_speedup_vs_ar", "tau", "quality", "quality_metric", "recovery", "paired", "agreement",
        "divergence", "samples", "speed_samples", "seconds")


def tune_record(a, plan: _TunePlan, pair, proxy_rows, rows, validate_rows, results, feasibility) -> dict:
    """What tune.json holds; each policy's ``pick`` is stored in its config file as ``tuned``."""
    settings, env = plan.settings, plan.env
    ar = rows.get(cfgs.AR, {})
    policies = {}
    for p in plan.policies:
        r = results[p.policy]
        pick_info = None
        if r.pick is not None:
            row = rows[r.pick]
            pick_info = {
                "setting": r.pick, "speed_samples": row.get("speed_samples"), "speedup_vs_ar": row.get("speedup_vs_ar"),
                "time_speedup_vs_ar": row.get("time_speedup_vs_ar"), "length_vs_ar": row.get("length_vs_ar"),
                "tokens_per_second": row.get("tokens_per_second"), "ar_tokens_per_second": ar.get("tokens_per_second"),
                "tau": row.get("tau"), "quality": row.get("quality"), "ar_quality": ar.get("quality"),
                "quality_metric": row.get("quality_metric"), "recovery": row.get("recovery"),
                "recovery_bound": certify.paired_bound(row.get("paired"), plan.confidence),
                "confidence": plan.confidence, "paired_vs_ar": row.get("paired"),
                "max_quality_loss": plan.max_loss, "dataset": a.dataset, "positions": plan.positions,
                "samples": len(plan.dataset.samples), "validation": r.validation,
                "validation_positions": a.validate_samples or "default",
                "max_new_tokens": settings.max_new_tokens, "sampling": settings.sampling(),
                "target": pair.target_name, "draft": pair.draft_name, "dtype": pair.target.variant,
                "backend": pair.backend, "cpu": env["hardware"]["cpu"], "cpu_flags": env["hardware"]["cpu_flags"],
                "gpu": env["hardware"]["gpu"], "git": env["git"], "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        policies[p.policy] = {
            "grid": [c.id for c in p.settings], "skipped": p.skipped,
            "proxy_of": {sid: c.id for sid, c in p.proxy_of.items()}, "proxy_order": r.order,
            "dropped_low_agreement": r.low_agreement, "dominated": r.dominated, "confirmed": r.confirmed,
            "stopped_early": {c: rows[c].get("samples") for c in r.confirmed
                              if c in rows and (rows[c].get("samples") or 0) < len(plan.dataset.samples)},
            "pick": pick_info, "closest": r.closest, "why_none": r.why_none or None,
        }
    return {
        "policies_asked": [p.policy for p in plan.policies], "drafter": a.drafter, "max_quality_loss": plan.max_loss,
        "confidence": plan.confidence, "dataset": a.dataset, "tuning_samples": [s.id for s in plan.dataset.samples],
        "validation_samples": [s.id for s in plan.validation.samples] if plan.validation is not None else [],
        "validation_overlap": plan.validation_overlap, "max_new_tokens": settings.max_new_tokens,
        "proxy_tokens": plan.proxy_settings.max_new_tokens, "speed_tie": plan.speed_tie,
        "max_confirm": plan.max_confirm, "early_stop": not a.no_early_stop, "backend": pair.backend,
        "cpu": env["hardware"]["cpu"], "cpu_flags": env["hardware"]["cpu_flags"], "git": env["git"],
        "feasibility": feasibility,
        "proxy": {cid: {k: r.get(k) for k in KEEP} for cid, r in proxy_rows.items()},
        "confirm": {cid: {k: r.get(k) for k in KEEP} | {
            "qualifies": cid != cfgs.AR and certify.qualifies(r.get("paired"), plan.max_loss, plan.confidence)}
            for cid, r in rows.items()},
        "validate": None if validate_rows is None else {cid: {k: r.get(k) for k in KEEP}
                                                        for cid, r in validate_rows.items()},
        "policies": policies,
    }


# ------------------------------------------------------------------------------- the table
def _rec(rec, ci) -> str:
    if rec is None:
        return "–"
    return f"{rec:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def _speed(row: dict | None) -> str:
    """Tokens/s over ar's, and (in brackets) ar's time over this setting's on the same problems."""
    if not row:
        return "–"
    return f"{fmt(row.get('speedup_vs_ar'), '.2f', 'x')} ({fmt(row.get('time_speedup_vs_ar'), '.2f', 'x')}){speed_basis(row)}"



def table_rows(record: dict) -> list[list[str]]:
    """One row per policy: pick, speed vs ar and recovery (95% CI; one-sided bound) on the
    tuning split, the same on the validation split, and whether the budget held there."""
    out = []
    for policy, p in record["policies"].items():
        pk = p["pick"]
        if pk is None:
            c = p.get("closest") or {}
            conf = record["confirm"].get(c.get("setting"), {})
            paired = conf.get("paired") or {}
            run = (f", stopped at {c['problems_run']}/{len(record['tuning_samples'])}" if c.get("stopped_early")
                   else "")
            out.append([policy, "none qualifies" + (f" (closest {c['setting']}{run})" if c.get("setting") else ""),
                        _speed(conf),
                        _rec(c.get("recovery"), paired.get("recovery_ci")), fmt(c.get("bound"), ".3f"),
                        f"{fmt(c.get('certifies'), '.3f')} (needs ~{c.get('problems_needed') or '∞'} problems)"
                        if c else "–", *_validation_cells(c.get("validation"))])
            continue
        out.append([policy, pk["setting"], _speed(pk),
                    _rec(pk["recovery"], (pk.get("paired_vs_ar") or {}).get("recovery_ci")),
                    fmt(pk["recovery_bound"], ".3f"),
                    "–" if pk["recovery_bound"] is None else f"{max(0.0, 1 - pk['recovery_bound']):.3f}",
                    *_validation_cells(pk.get("validation"))])
    return out


def _validation_cells(v: dict | None) -> list[str]:
    """Speed vs ar, recovery [CI] and whether the budget held, on the validation split."""
    if not v:
        return ["–", "–", "–"]
    held = ("yes" if v["held"] else "**no**") + (", certified" if v.get("certified") else "")
    return [_speed(v), _rec(v.get("recovery"), v.get("recovery_ci")), held]


HEADER = ["policy", "pick", "speed vs ar, tokens/s (time) (tuning)", "recovery, tuning [95% CI]", "lower bound",
          "certified within", "speed vs ar, tokens/s (time) (validation)", "recovery, validation [95% CI]", "budget held (validation)"]


def _words(x) -> str:
    return ", ".join(map(str, x)) if isinstance(x, (list, tuple)) else str(x)


def _commit(git) -> str:
    if isinstance(git, dict):
        return str(git.get("commit") or "?")[:10] + (" (dirty)" if git.get("dirty") else "")
    return str(git)


def report_markdown(record: dict) -> str:
    f = record["feasibility"]
    lines = [f"# specdec tune: {', '.join(record['policies_asked'])}", "",
             f"Budget: loss <= {record['max_quality_loss']:g} of plain decoding, certified by the one-sided "
             f"{record['confidence']:g} lower bound of the paired recovery (Bonett-Price). Dataset "
             f"{record['dataset']}: {len(record['tuning_samples'])} tuning problems (ar solves {f['ar_solved']}), "
             f"{len(record['validation_samples'])} validation problems; {record['max_new_tokens']} new tokens; "
             f"backend {record['backend']}; CPU {record['cpu']} (flags: {_words(record['cpu_flags'])}); "
             f"git {_commit(record['git'])}.", ""]
    if not f["certifiable"]:
        lines += [f["message"] + ".", ""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(record)]
    lines += ["", "Speed: tokens/s over plain decoding's; in brackets, plain decoding's time over the setting's on "
              "the same problems (how much sooner the same problems finish: lower than the tokens/s ratio when "
              "the setting writes longer answers)."]
    lines += [""] + [f"- {p}: {d['why_none']}" for p, d in record["policies"].items() if d.get("why_none")]
    return "\n".join(lines).rstrip() + "\n"


def print_table(record: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(stderr=True)
    if not record["feasibility"]["certifiable"]:
        return
    t = Table(title="specdec tune", title_justify="left")
    for h in HEADER:
        t.add_column(h, justify="left" if h in ("policy", "pick") else "right")
    for row in table_rows(record):
        t.add_row(*(escape(x) for x in row))
    console.print(t)
