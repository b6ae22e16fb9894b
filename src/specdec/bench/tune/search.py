"""``specdec tune``'s decisions, from the stages' summary rows (no model, no run): the proxy's
confirm order, the confirm stage's stop rule and pick, whether the split can certify the budget at
all, the closest setting of a policy without a pick, and what the validation stage runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import SpecdecError
from ..outputs.summary import paired_quality, verdicts
from ..running import configs as cfgs
from . import certify
from .plan import TunePlan


def proxy_order(rows: dict[str, dict], min_agreement: float,
                speed_tie: float = 0.0) -> tuple[list[str], list[str], list[str]]:
    """Setting ids in confirm order; those dropped for agreement below ``min_agreement``; and those
    dominated by another setting (:func:`specdec.bench.tune.certify.dominated`). The order is by proxy
    speed (:func:`specdec.bench.tune.certify.proxy_speed`), fastest first, except that settings within
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
    (:func:`specdec.bench.tune.certify.qualifies`) on all ``n`` problems of the split (a setting stopped
    early never is), or None. Fastest: the highest confirm-stage ``time_speedup_vs_ar`` (the split
    done soonest; a setting writing longer answers is not faster for its tokens/s), else tokens/s."""
    ok = [c for c in confirmed if certify.qualifies(rows[c].get("paired"), max_loss, confidence)
          and (n is None or (rows[c].get("paired") or {}).get("n") == n)]
    return max(ok, key=lambda c: (rows[c].get("time_speedup_vs_ar") or 0.0, rows[c].get("tokens_per_second") or 0.0)) \
        if ok else None


def stopper(sample_ids: list[str], max_loss: float, confidence: float):
    """The confirm stage's ``skip``: True for a setting (never ``ar``) that can no longer qualify
    on the split ``sample_ids`` whatever it does on the problems it has not run
    (:func:`specdec.bench.tune.certify.can_still_qualify`; ``ar``'s outcomes must all be in)."""
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


def _seconds_per_sample(row: dict) -> float | None:
    n = row.get("samples") or 0
    return (row.get("seconds") or 0.0) / n if n else None


def feasibility_of(ar_row: dict, plan: TunePlan) -> dict:
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


def closest_setting(r: PolicyResult, rows: dict, plan: TunePlan) -> tuple[dict | None, str]:
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


def validation_figures(row: dict, plan: TunePlan) -> dict:
    bound = certify.paired_bound(row.get("paired"), plan.confidence)
    rec = row.get("recovery")
    return {"samples": row.get("samples"), "speed_samples": row.get("speed_samples"), "speedup_vs_ar": row.get("speedup_vs_ar"),
            "time_speedup_vs_ar": row.get("time_speedup_vs_ar"), "length_vs_ar": row.get("length_vs_ar"), "recovery": rec,
            "recovery_ci": (row.get("paired") or {}).get("recovery_ci"), "bound": bound,
            "held": certify.clears(rec, plan.max_loss), "certified": certify.clears(bound, plan.max_loss),
            "paired": row.get("paired")}
