"""``specdec tune``: for each loose policy asked for, the fastest setting of its parameters and K
on this machine whose task quality is *certified* within a budget of plain decoding, checked
again on problems the tuner never looked at, and written as a config file.

Everything runs through the bench runner (same process, ``ar`` timed alongside, resumable,
progress bar), in three run folders under ``--out`` (``confirm/`` first, for ``ar`` alone):

1. **proxy** (cheap, prunes the grid; it runs after ``ar``'s confirm run, below): every setting of every policy's grid (each rule's declared
   ``tune_grid``, or ``--grid``; times ``--k``) and ``ar`` on ``--proxy-samples`` problems of the
   tuning split at ``--proxy-tokens`` new tokens: speed relative to ``ar`` in the steady state,
   without the first round's prefills (:func:`specdec.bench.tune.certify.decode_speedup`), token agreement and
   where the tokens first diverge from ``ar``'s (:func:`specdec.bench.tune.certify.divergence`). A
   ``k=auto`` setting runs here at the fixed K ``--proxy-k`` (more for a FLy window that needs
   it): on a short request the controller can sit at K=0 after one unlucky probe, and a rule that
   never sees a draft looks perfectly faithful. Settings below ``--min-agreement`` (off by
   default) and settings another of the same policy beats on speed, divergence and agreement
   alike are dropped.
2. **confirm** (the pick): ``ar`` first, on the whole tuning split at ``--max-new-tokens``, scored
   on the task, before anything else runs; if even a setting that agreed with ``ar`` everywhere
   could not be certified on this split (:func:`specdec.bench.tune.certify.best_case_budget`), tune
   stops there and says which budget the split can certify and how many problems the asked one
   needs. After the proxy, each policy's settings, fastest proxy first (within ``--speed-tie``
   of the fastest left, fewest diverging problems first), ``--confirm`` at a time:
   a setting *qualifies* when the one-sided ``--confidence`` lower bound of its paired recovery
   against ``ar`` is ``>= 1 - --max-quality-loss``; the fastest qualifying setting (confirm-stage
   tokens/s) is the policy's pick. A setting stops part-way as soon as no outcome on the problems
   left could make it qualify (:func:`specdec.bench.tune.certify.can_still_qualify`, from ``ar``'s
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
import json
import sys

from ...errors import SpecdecError
from ...core.request import DEFAULTS
from ..running import configs as cfgs
from ..running.options import add_dataset_args, add_execution_args, add_sampling_args
from .plan import DEFAULT_CONFIDENCE, DEFAULT_MAX_LOSS, plan_tune
from .record import tune_record, write_configs
from .report import print_table, report_markdown
from .search import PolicyResult, feasibility_of, proxy_order, validated
from .stages import confirm_stage, proxy_stage, stage, validate_stage


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
    from ...frontends.cliargs import add_model_args

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


def cmd_tune(a: argparse.Namespace) -> int:
    """``specdec tune``: plan (no model), proxy, confirm (``ar`` first: can the split certify the
    budget at all?), validate, then ``tune.json``, ``report.md`` and a config file per pick
    (module docstring). No policy with a pick is an error (exit 2), as is a split that cannot
    certify the budget."""
    from ...frontends.cliargs import load_pair, startup_summary

    plan = plan_tune(a)  # everything that needs no model, first
    if a.status:
        from .status import status_markdown

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
        proxy_rows = proxy_stage(pair, a, plan, ar)
        for p in plan.policies:
            by_setting = {sid: proxy_rows[c.id] for sid, c in p.proxy_of.items()}
            r = results[p.policy]
            r.order, r.low_agreement, r.dominated = proxy_order({cfgs.AR: proxy_rows[cfgs.AR], **by_setting},
                                                                plan.min_agreement, plan.speed_tie)
        rows = confirm_stage(pair, a, plan, ar, results, rows)
        if plan.validation is not None and validated(results, a.validate_closest):
            validate_rows = validate_stage(pair, a, plan, ar, results)
    record = tune_record(a, plan, pair, proxy_rows, rows, validate_rows, results, feasibility)
    (plan.out / "tune.json").write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    (plan.out / "report.md").write_text(report_markdown(record), encoding="utf-8")
    if not a.quiet:
        print_table(record)
    if not feasibility["certifiable"]:
        raise SpecdecError(feasibility["message"] + f"; no config written ({plan.out / 'tune.json'})")
    return write_configs(a, plan, results, record)
