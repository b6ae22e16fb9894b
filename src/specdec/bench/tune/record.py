"""``specdec tune``'s files: ``tune.json`` (every figure of every stage) and one config file per
pick, which stores its ``tune.json`` entry as ``tuned``."""

from __future__ import annotations

import json
import sys
import time

from ...errors import SpecdecError
from ..running import configs as cfgs
from . import certify
from .plan import TunePlan
from .search import PolicyResult


def write_configs(a, plan: TunePlan, results: dict[str, PolicyResult], record: dict) -> int:
    from ...core.configfile import write_config

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


def tune_record(a, plan: TunePlan, pair, proxy_rows, rows, validate_rows, results, feasibility) -> dict:
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
