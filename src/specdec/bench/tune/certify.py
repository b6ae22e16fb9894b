"""What ``specdec tune`` may promise: pure arithmetic over paired outcomes (no models).

A tuned setting *qualifies* for a quality budget ``L`` only when the lower bound of its paired
recovery interval against plain decoding (``ar``) on the same problems is at least ``1 - L``:
recovery = (problems the setting solves) / (problems ``ar`` solves), with the Bonett-Price hybrid
Wilson score interval for a ratio of paired proportions (:func:`specdec.bench.outputs.summary.bonett_price_ratio`,
the one bench reports), taken one-sided at the stated ``confidence`` (0.95: the lower end of the
two-sided 90% interval). A point estimate on a small split cannot resolve a 1-2% budget; this bound
says what the split *can* resolve:

- :func:`smallest_budget`: the smallest loss a setting's observed outcomes certify (``1 - bound``);
  :func:`best_case_budget`: the same for a setting that agreed with ``ar`` on every problem, the
  floor of what the split can certify at all, known as soon as ``ar`` has run.
- :func:`problems_needed`: how many problems the asked budget would need if the observed shares
  (both solved, lost, gained) held on a larger split; None when the point estimate itself is
  below the budget (no split size helps).
- :func:`can_still_qualify`: whether a setting part-way through the split could still qualify
  whatever it does on the problems left (``ar``'s outcomes there known): the confirm stage stops a
  setting that cannot (curtailed sampling; a pick still needs the whole split).
- :func:`divergence`: the proxy's measure, where each setting's tokens first differ from ``ar``'s;
  :func:`decode_speedup`: its speed figure, in the steady state (no prefill).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable

from ...core.names import AR
from ..outputs.summary import bonett_price_ratio, same_speed

#: the default one-sided confidence of a tuned pick
CONFIDENCE = 0.95
#: problems_needed searches up to this many problems
MAX_PROBLEMS = 10**7


def z_of(confidence: float) -> float:
    """The normal quantile whose two-sided interval has ``confidence`` below its upper end."""
    if not 0.5 <= confidence < 1.0:
        raise ValueError("confidence must be in [0.5, 1)")
    return statistics.NormalDist().inv_cdf(confidence)


def recovery_bound(both: float, gained: float, lost: float, confidence: float = CONFIDENCE) -> float | None:
    """The one-sided lower confidence bound of the paired recovery; None when ``ar`` solved none."""
    ci = bonett_price_ratio(both, gained, lost, z_of(confidence))
    return None if ci is None else ci[0]


def counts(paired: dict | None) -> tuple[int, int, int] | None:
    """``(both, gained, lost)`` from a summary row's ``paired`` figures (None without them)."""
    if not paired or paired.get("both") is None:
        return None
    return int(paired["both"]), int(paired["gained"]), int(paired["lost"])


def paired_bound(paired: dict | None, confidence: float = CONFIDENCE) -> float | None:
    """:func:`recovery_bound` of a summary row's ``paired`` figures (None without them)."""
    c = counts(paired)
    return None if c is None else recovery_bound(*c, confidence)


def clears(recovery: float | None, max_loss: float) -> bool:
    """True when a recovery (or its bound) is >= ``1 - max_loss``."""
    return recovery is not None and recovery >= 1.0 - max_loss - 1e-12


def qualifies(paired: dict | None, max_loss: float, confidence: float = CONFIDENCE) -> bool:
    """True when the recovery's lower bound is >= ``1 - max_loss`` (the pick's guarantee)."""
    return clears(paired_bound(paired, confidence), max_loss)


def smallest_budget(both: float, gained: float, lost: float, confidence: float = CONFIDENCE) -> float | None:
    """The smallest quality budget these outcomes certify (``1 - lower bound``, at least 0)."""
    bound = recovery_bound(both, gained, lost, confidence)
    return None if bound is None else max(0.0, 1.0 - bound)


def best_case_budget(ar_solved: int, confidence: float = CONFIDENCE) -> float | None:
    """The smallest budget a split where ``ar`` solves ``ar_solved`` problems can certify at all:
    that of a setting which solves exactly the same problems (no discordant pair)."""
    return smallest_budget(ar_solved, 0, 0, confidence)


def best_completion_bound(both: int, gained: int, lost: int, ar_solved_left: int, ar_failed_left: int,
                          confidence: float = CONFIDENCE) -> float | None:
    """The highest recovery bound a setting can still reach after the outcomes so far (``both``,
    ``gained``, ``lost``), with ``ar_solved_left`` problems left that ``ar`` solves and
    ``ar_failed_left`` that it fails: it solves every one of the first (losing one only lowers the
    bound) and, of the second, the number of gains that maximises the bound (a gain raises the
    ratio but widens the interval, so every count is tried). None when ``ar`` solves none."""
    b = both + ar_solved_left
    bounds = [recovery_bound(b, gained + g, lost, confidence) for g in range(ar_failed_left + 1)]
    known = [x for x in bounds if x is not None]
    return max(known) if known else None


def can_still_qualify(both: int, gained: int, lost: int, ar_solved_left: int, ar_failed_left: int,
                      max_loss: float, confidence: float = CONFIDENCE) -> bool:
    """False only when no outcome on the problems left can certify ``max_loss``
    (:func:`best_completion_bound`); True while ``ar`` has solved none (nothing to judge yet)."""
    bound = best_completion_bound(both, gained, lost, ar_solved_left, ar_failed_left, confidence)
    return bound is None or clears(bound, max_loss)


def problems_needed(both: int, gained: int, lost: int, n: int, max_loss: float,
                    confidence: float = CONFIDENCE) -> int | None:
    """The split size at which outcomes in the observed shares (``both``, ``gained``, ``lost`` of
    ``n`` problems) would certify ``max_loss``; ``n`` itself when they already do. None when the
    observed recovery is below ``1 - max_loss`` (more problems only narrow the interval around it)
    or ``ar`` solved none."""
    if n <= 0 or both + lost == 0:
        return None
    if not clears((both + gained) / (both + lost), max_loss):
        return None

    def ok(m: int) -> bool:
        f = m / n
        return clears(recovery_bound(both * f, gained * f, lost * f, confidence), max_loss)

    if ok(n):
        return n
    hi = n
    while not ok(hi):
        if hi >= MAX_PROBLEMS:
            return None
        hi = min(MAX_PROBLEMS, hi * 2)
    lo = hi // 2 if hi > n else n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def first_divergence(ids: list[int], ref: list[int]) -> int | None:
    """The position of the first token where ``ids`` and ``ref`` differ (a shorter output that is
    a prefix of the other diverges where it ends); None when they are the same."""
    for i, (a, b) in enumerate(zip(ids, ref)):
        if a != b:
            return i
    return None if len(ids) == len(ref) else min(len(ids), len(ref))


def divergence(records: Iterable[dict], config: str, ar: str = AR) -> dict[str, Any]:
    """The proxy's agreement figures of ``config`` against ``ar`` over the samples both ran (first
    repeat): ``n``, ``diverged`` (share of samples whose tokens differ from ``ar``'s),
    ``first_divergence`` (mean position of the first differing token, over those that differ; None
    when none does) and ``tokens_before_divergence`` (mean tokens equal to ``ar``'s before the first
    difference, over all samples: a sample that never differs counts its whole length)."""
    mine: dict[str, list[int]] = {}
    ref: dict[str, list[int]] = {}
    for r in records:
        if int(r.get("repeat", 0)) != 0:
            continue
        if r["config"] == config:
            mine[r["sample_id"]] = list(r["token_ids"])
        elif r["config"] == ar:
            ref[r["sample_id"]] = list(r["token_ids"])
    common = [s for s in mine if s in ref]
    firsts = [first_divergence(mine[s], ref[s]) for s in common]
    diverged = [f for f in firsts if f is not None]
    before = [len(ref[s]) if f is None else f for s, f in zip(common, firsts)]
    return {"n": len(common), "diverged": (len(diverged) / len(common)) if common else None,
            "first_divergence": (sum(diverged) / len(diverged)) if diverged else None,
            "tokens_before_divergence": (sum(before) / len(before)) if before else None}


def decode_speedup(records: Iterable[dict], config: str, ar: str = AR) -> float | None:
    """Tokens/s of ``config`` over ``ar``'s in the steady state, on the samples both ran (first
    repeat, timed at one machine speed: :func:`specdec.bench.outputs.summary.same_speed`): the tokens after
    the first round over the time after it (the engine's
    ``round_ends``; without them, the time after ``prefill_seconds``). The first round holds the
    target's prefill and a model drafter's (it prefills on its first proposal); at the proxy's few
    tokens a long prompt's prefill is most of a generation and the same for every setting, so with
    it the ranking would be mostly noise."""
    def steady(r: dict) -> tuple[float, float]:
        st = r.get("stats") or {}
        ends, acc = st.get("round_ends") or [], st.get("accepted_per_round") or []
        if len(ends) >= 2 and acc:
            return float(r["new_tokens"]) - (acc[0] + 1), max(ends[-1] - ends[0], 1e-9)
        return float(r["new_tokens"]), max(float(r["seconds"]) - (st.get("prefill_seconds") or 0.0), 1e-9)

    mine: dict[str, dict] = {}
    ref: dict[str, dict] = {}
    for r in records:
        if int(r.get("repeat", 0)) == 0 and r["config"] in (config, ar):
            (mine if r["config"] == config else ref)[r["sample_id"]] = r
    common = [s for s in mine if s in ref and same_speed((mine[s], ref[s]))]
    if not common:
        return None
    tps = []
    for d in (mine, ref):
        parts = [steady(d[s]) for s in common]
        tps.append(sum(p[0] for p in parts) / sum(p[1] for p in parts))
    return tps[0] / tps[1] if tps[1] else None


def proxy_speed(row: dict) -> float:
    """A proxy row's speed figure: ``decode_speedup_vs_ar`` (:func:`decode_speedup`) when it has
    one, else ``speedup_vs_ar``; 0 without either."""
    v = row.get("decode_speedup_vs_ar")
    return (row.get("speedup_vs_ar") if v is None else v) or 0.0


def dominated(rows: dict[str, dict]) -> set[str]:
    """The settings another one beats on every proxy figure: at least as fast (:func:`proxy_speed`),
    diverging on no more samples and agreeing on at least as many tokens, better in one of them."""
    def key(r: dict) -> tuple[float, float, float]:
        diverged = (r.get("divergence") or {}).get("diverged")
        return (proxy_speed(r), -(diverged if diverged is not None else 1.0),
                (r.get("agreement") or {}).get("token_agreement") or 0.0)

    out = set()
    for a, ra in rows.items():
        ka = key(ra)
        for b, rb in rows.items():
            kb = key(rb)
            if a != b and all(y >= x for x, y in zip(ka, kb)) and kb != ka:
                out.add(a)
                break
    return out


def hours(seconds: float | None) -> str:
    """``seconds`` as a rough duration for a message."""
    if seconds is None or not math.isfinite(seconds):
        return "unknown time"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
