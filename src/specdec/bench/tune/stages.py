"""``specdec tune``'s three stages, each a resumable bench run folder under ``--out``: proxy,
confirm (batches of settings until each policy has a pick) and validate."""

from __future__ import annotations

import sys
from pathlib import Path

from ..running import configs as cfgs
from ..running.options import run_settings
from . import certify
from .plan import TunePlan
from .search import PolicyResult, closest_setting, pick, stopper, validated, validation_figures


def stage(pair, a, dataset, configs, settings, out: Path, env: dict, name: str,
          skip=None) -> tuple[dict, list[dict]]:
    """One bench run folder (resumable) -> (its per-configuration summary rows, its records);
    ``skip`` as :func:`specdec.bench.running.runner.run` takes it."""
    from ..outputs.results import check_run_settings, lock_out, prepare_dir
    from ..running.runner import run
    from ..outputs.summary import summarize

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


def proxy_stage(pair, a, plan: TunePlan, ar) -> dict[str, dict]:
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


def confirm_stage(pair, a, plan: TunePlan, ar, results: dict[str, PolicyResult], rows: dict) -> dict:
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


def validate_stage(pair, a, plan: TunePlan, ar, results: dict[str, PolicyResult]) -> dict:
    """``ar`` and every pick (with ``--validate-closest``, each closest setting of a policy without
    one too) on the validation split: recovery with its interval, whether the budget held (point
    estimate >= 1 - budget) and whether it is certified there too."""
    rows, _ = stage(pair, a, plan.validation, [ar, *(plan.by_id[c] for c in validated(results, a.validate_closest))],
                    plan.settings, plan.out, plan.env, "validate")
    for r in results.values():
        if r.pick is None and r.closest and r.closest["setting"] in rows:
            r.closest["validation"] = validation_figures(rows[r.closest["setting"]], plan)
        if r.pick:
            r.validation = validation_figures(rows[r.pick], plan)
            rec = r.validation["recovery"]
            if not r.validation["held"] and not a.quiet:
                print(f"specdec tune: warning: {r.pick} recovers {rec if rec is None else round(rec, 3)} of plain "
                      f"decoding's quality on the validation split, below the budget (1 - {plan.max_loss:g})",
                      file=sys.stderr)
    return rows
