"""Per-configuration aggregates from ``results.jsonl`` records (pure arithmetic, no models).

- time of a (sample, configuration): the median over its repeats of ``seconds`` (wall time of
  the generate call); tokens likewise. ``tokens_per_second`` = sum of tokens / sum of times.
- ``speedup_vs_ar`` = tokens/s of the configuration / tokens/s of ``ar``, both over the samples
  both have finished, measured in the same run. Spread: the same ratio per repeat index, min/max.
- ``time_speedup_vs_ar`` = ``ar``'s seconds / the configuration's, summed over the same samples:
  how much sooner the same work finishes. It differs from ``speedup_vs_ar`` when a rule changes
  how much is written (a lossy rule's answers may be longer or shorter than plain decoding's):
  ``length_vs_ar`` = the configuration's tokens / ``ar``'s on those samples (1 for a lossless rule).
  Spread: ``time_speedup_min``/``max`` per repeat index, as for ``speedup_vs_ar``.
  ``time_speedup_ci``: its interval, a seeded percentile bootstrap over samples (``TIME_CI_LEVEL``,
  ``BOOTSTRAP_RESAMPLES`` resamples of the samples with replacement, ``BOOTSTRAP_SEED``: the same
  records give the same interval), each resample's ratio of sums; None on fewer than 2 samples.
  It is what the samples' spread says, not run-to-run drift of the machine.
- Machine speed: a folder resumed on another machine holds generations timed at two speeds. Each
  record carries ``step_ms``, the target's one-token pass timed when its run started (the runner's
  probe); speed ratios (the three above, ``speedup_vs_best_ar``, ``decode_speedup_vs_ar``) pair a
  sample's records only when every ``step_ms`` among them is within ``SPEED_TOLERANCE`` (or
  ``SPEED_NOISE_MS``) of the others; records without one, made before the probe, pair only with
  each other. ``speed_samples`` counts the samples behind them; ``speed_withheld`` is True where
  the two share samples but none timed at one speed (no speed figure is given). Quality uses every
  sample.
- ``tau`` = 1 + accepted / verify passes over all its generations (``ar`` = 1; peers: generated
  tokens / target forward passes). Per-position acceptance and the zero-accept share pool counts.
- ``quality``: HumanEval pass@1 (mean of passed), else Spec-Bench math_reasoning accuracy;
  ``recovery`` = quality / ``ar`` quality on the same samples (None when ``ar`` scores 0).
- ``paired``: the quality against ``ar`` sample by sample, so "90% on 10 problems" reads as what it
  is. Each sample's pass/fail (or correct/incorrect) is its first repeat's (repeat 0: the same
  outcome as recovery's with one repeat or greedy decoding), on the ``n`` samples both scored.
  ``both``: solved by both; ``lost``: solved by ``ar`` and not by the configuration; ``gained``: the reverse.
  ``mcnemar_p``: exact (conditional) McNemar test, two-sided: the binomial test of ``lost`` against
  ``gained`` with p = 1/2, ``min(1, 2 P(X <= min(lost, gained)))``, X ~ Bin(lost + gained, 1/2);
  1 with no discordant pair. ``difference``: pass rate minus ``ar``'s, with a 95% interval by
  Newcombe's square-and-add (hybrid score) method for paired proportions (Newcombe 1998, method 10:
  Wilson score limits of both rates, combined with the correlation of the pair, phi corrected as
  there). ``recovery`` (rate / ``ar``'s rate) with the Bonett-Price hybrid Wilson score interval for
  a ratio of paired proportions (Bonett & Price 2006). Both are closed-form (deterministic, no
  resampling) and keep a width when the two agree on every sample, where a bootstrap over samples
  collapses to a point; both are among those Fagerland, Lydersen & Laake (2014) recommend for the
  paired 2x2 table. ``paired`` is None for ``ar`` itself, without ``ar``, with no sample both scored,
  or where the dataset has no quality measure; ``recovery`` and its interval are None when ``ar``
  solved none of the ``n``.
- ``agreement``: exact-match rate of token ids with ``ar`` (same sample and repeat) and mean
  token-level agreement (matching positions / longer length); from the record's own, else (a
  configuration that ran before ``ar`` on that sample) from ``ar``'s record's token ids.
- ``structured`` (only for configurations whose records decoded under a constraint, e.g.
  ``json-extraction``): over all their generations, ``n``, ``valid`` and ``validity`` (output parses
  and validates against the sample's schema; the ``quality`` then is ``json_validity``),
  ``truncated`` (cut by the budget before the JSON closed; invalid), ``same_text_as_ar`` (share of
  outputs whose text equals ``ar``'s for the same sample and repeat), ``speedup_vs_ar_same_backend``
  (tokens/s over that of plain decoding on the same backend, ``ar`` or ``ar:backend=B``, on the
  samples both finished; None without one) and the grammar mask's cost, from the engine's
  ``mask_seconds`` (masking the target's rows in verify passes, part of ``verify_seconds``) and
  ``draft_mask_seconds`` (grammar work inside the drafter): ``mask_ms_per_pass`` (per target verify
  pass, ``rounds``), ``mask_share`` (of ``verify_seconds``), ``draft_mask_ms_per_pass`` and
  ``draft_mask_share`` (of ``draft_seconds``); each None where the records do not carry it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Iterable, Sequence

import numpy as np

from ...core.names import AR
from ...core.stats import tau_of

AR_ID = AR  # plain decoding's configuration id
#: the per-record verdict behind each quality metric
OUTCOME_KEY = {"pass@1": "passed", "math_accuracy": "correct", "json_validity": "json_valid"}
#: records whose machine speeds (``step_ms``) differ more than this factor are not timed against each
#: other (the probe's own jitter on one machine is a few percent)
SPEED_TOLERANCE = 1.25
#: milliseconds: step times closer than this are one speed whatever their ratio (a tiny model's step
#: is a few milliseconds, where the clock's and the scheduler's jitter is the whole difference)
SPEED_NOISE_MS = 5.0
#: two-sided 95%: the normal quantile at 0.975
Z95 = statistics.NormalDist().inv_cdf(0.975)
#: the time ratios' bootstrap interval (module docstring): level, resamples and seed
TIME_CI_LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _per_sample(recs: list[dict]) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in recs:
        out[r["sample_id"]][int(r["repeat"])] = r
    return out


def same_speed(recs: Iterable[dict]) -> bool:
    """Whether ``recs`` were timed at one machine speed (module docstring): their ``step_ms`` within
    ``SPEED_TOLERANCE`` or ``SPEED_NOISE_MS`` of each other, or none of them with one."""
    steps = [r.get("step_ms") for r in recs]
    known = [float(s) for s in steps if s is not None]
    if not known:
        return True
    if len(known) < len(steps) or min(known) <= 0:
        return False
    return max(known) <= SPEED_TOLERANCE * min(known) or max(known) - min(known) <= SPEED_NOISE_MS


def timed_common(mine: dict[str, dict[int, dict]], theirs: dict[str, dict[int, dict]]) -> list[str]:
    """The samples (``_per_sample`` maps) both have, whose records were all timed at one machine speed."""
    return [s for s in mine if s in theirs and same_speed([*mine[s].values(), *theirs[s].values()])]


def _speed(by_sample: dict[str, dict[int, dict]], samples: Iterable[str]) -> tuple[float, float, float | None]:
    """(sum of median tokens, sum of median seconds, tokens/s) over ``samples``."""
    tokens = seconds = 0.0
    for s in samples:
        reps = list(by_sample[s].values())
        tokens += statistics.median(r["new_tokens"] for r in reps)
        seconds += statistics.median(r["seconds"] for r in reps)
    return tokens, seconds, _ratio(tokens, seconds)


def _totals_by_repeat(by_sample: dict[str, dict[int, dict]], samples: list[str]) -> dict[int, tuple[float, float]]:
    """(tokens, seconds) per repeat index that every one of the samples has (and took time)."""
    out = {}
    repeats = sorted({r for s in samples for r in by_sample[s]})
    for rep in repeats:
        if all(rep in by_sample[s] for s in samples):
            tok = sum(by_sample[s][rep]["new_tokens"] for s in samples)
            sec = sum(by_sample[s][rep]["seconds"] for s in samples)
            if sec > 0:
                out[rep] = (tok, sec)
    return out


def ratio_of_sums_ci(num: Sequence[float], den: Sequence[float], level: float = TIME_CI_LEVEL,
                     resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """Percentile bootstrap interval of ``sum(num) / sum(den)``, resampling the pairs
    ``(num[i], den[i])`` with replacement (seeded); None on fewer than 2 pairs."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    if len(a) < 2:
        return None
    idx = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    tops, bottoms = a[idx].sum(axis=1), b[idx].sum(axis=1)
    ratios = tops[bottoms > 0] / bottoms[bottoms > 0]
    if not len(ratios):
        return None
    tail = 100 * (1 - level) / 2
    return [float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))]


def _median_seconds(by_sample: dict[str, dict[int, dict]], samples: list[str]) -> list[float]:
    return [statistics.median(r["seconds"] for r in by_sample[s].values()) for s in samples]


def _tps_by_repeat(by_sample: dict[str, dict[int, dict]], samples: list[str]) -> dict[int, float]:
    """tokens/s per repeat index, over the samples that have that repeat."""
    return {rep: tok / sec for rep, (tok, sec) in _totals_by_repeat(by_sample, samples).items()}


def _quality(recs: list[dict]) -> dict[str, Any]:
    passed = [bool(r["quality"]["passed"]) for r in recs if "passed" in (r.get("quality") or {})]
    correct = [bool(r["quality"]["correct"]) for r in recs if "correct" in (r.get("quality") or {})]
    out: dict[str, Any] = {}
    if passed:
        out.update(pass_at_1=_mean(passed), quality=_mean(passed), quality_metric="pass@1", quality_n=len(passed))
    if correct:
        out["math_accuracy"] = _mean(correct)
        if not passed:
            out.update(quality=_mean(correct), quality_metric="math_accuracy", quality_n=len(correct))
    kept = [bool(r["quality"]["kept_all"]) for r in recs if "kept_all" in (r.get("quality") or {})]
    if kept:  # edits: the share of answers that kept every line meant to stay
        out["kept_all"] = _mean(kept)
    valid = [bool(r["quality"]["json_valid"]) for r in recs if "json_valid" in (r.get("quality") or {})]
    if valid and not passed and not correct:
        out.update(quality=_mean(valid), quality_metric="json_validity", quality_n=len(valid))
    return out


def _outcomes(by_sample: dict[str, dict[int, dict]], key: str) -> dict[str, bool]:
    """Each sample's verdict ``quality[key]`` at its first repeat that has one."""
    out = {}
    for s, reps in by_sample.items():
        scored = [reps[r]["quality"][key] for r in sorted(reps) if key in (reps[r].get("quality") or {})]
        if scored:
            out[s] = bool(scored[0])
    return out


def verdicts(recs: list[dict]) -> dict[str, bool]:
    """Each sample's task verdict in ``recs`` (one configuration's records), under the metric
    its quality figure uses (pass@1, math accuracy or JSON validity); empty without one."""
    key = OUTCOME_KEY.get(_quality(recs).get("quality_metric", ""))
    return {} if key is None else _outcomes(_per_sample(recs), key)


def mcnemar_exact(lost: int, gained: int) -> float:
    """Two-sided exact McNemar p-value: the binomial test of ``lost`` vs ``gained`` at p = 1/2."""
    m = lost + gained
    tail = sum(math.comb(m, i) for i in range(min(lost, gained) + 1))
    return min(1.0, 2 * tail / 2**m)


def wilson(x: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for ``x`` successes of ``n``."""
    half = z * math.sqrt(z * z + 4 * x * (1 - x / n))
    return (2 * x + z * z - half) / (2 * (n + z * z)), (2 * x + z * z + half) / (2 * (n + z * z))


def newcombe_paired_difference(both: int, gained: int, lost: int, neither: int,
                               z: float = Z95) -> tuple[float, float]:
    """Newcombe's square-and-add interval for p1 - p2 of paired proportions (his method 10):
    p1 = (both + gained) / n is the configuration's rate, p2 = (both + lost) / n ``ar``'s."""
    n = both + gained + lost + neither
    x1, x2 = both + gained, both + lost
    p1, p2 = x1 / n, x2 / n
    (l1, u1), (l2, u2) = wilson(x1, n, z), wilson(x2, n, z)
    margins = x1 * (n - x1) * x2 * (n - x2)
    cross = both * neither - gained * lost
    # phi: the correlation of the pair, with Newcombe's correction towards 0 for positive values
    phi = 0.0 if not margins else (cross - n / 2 if cross > n / 2 else min(cross, 0)) / math.sqrt(margins)
    down = (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)
    up = (u1 - p1) ** 2 + (p2 - l2) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2)
    return p1 - p2 - math.sqrt(max(0.0, down)), p1 - p2 + math.sqrt(max(0.0, up))


def bonett_price_ratio(both: float, gained: float, lost: float, z: float = Z95) -> tuple[float, float] | None:
    """Bonett-Price hybrid Wilson score interval for p1 / p2 of paired proportions (p1 the
    configuration's rate, p2 ``ar``'s); None when ``ar`` solved none (the ratio is undefined)."""
    x1, x2, m = both + gained, both + lost, both + gained + lost
    if x2 == 0:
        return None
    a = math.sqrt((gained + lost + 2) / ((x1 + 1) * (x2 + 1)))
    b = math.sqrt((1 - (x1 + 1) / (m + 2)) / (x1 + 1))
    c = math.sqrt((1 - (x2 + 1) / (m + 2)) / (x2 + 1))
    zz = z * a / (b + c)
    (l1, u1), (l2, u2) = wilson(x1, m, zz), wilson(x2, m, zz)
    return l1 / u2, u1 / l2


def paired_quality(mine: dict[str, bool], ar: dict[str, bool]) -> dict[str, Any] | None:
    """The paired comparison of per-sample verdicts with ``ar``'s on the samples both have
    (module docstring); None when there are none."""
    common = [s for s in mine if s in ar]
    if not common:
        return None
    both = sum(mine[s] and ar[s] for s in common)
    gained = sum(mine[s] and not ar[s] for s in common)
    lost = sum(ar[s] and not mine[s] for s in common)
    n = len(common)
    ratio_ci = bonett_price_ratio(both, gained, lost)
    return {"n": n, "both": both, "lost": lost, "gained": gained, "mcnemar_p": mcnemar_exact(lost, gained),
            "difference": (gained - lost) / n,
            "difference_ci": list(newcombe_paired_difference(both, gained, lost, n - both - gained - lost)),
            "recovery": _ratio(both + gained, both + lost), "recovery_ci": None if ratio_ci is None else list(ratio_ci)}


def aggregate(recs: list[dict], ar_recs: list[dict], is_ar: bool) -> dict[str, Any]:
    """The figures for one configuration's records against the ``ar`` records."""
    by_sample = _per_sample(recs)
    ar_by_sample = _per_sample(ar_recs)
    samples = sorted(by_sample)
    common = [s for s in samples if s in ar_by_sample]
    tokens, seconds, tps = _speed(by_sample, samples)
    out: dict[str, Any] = {"samples": len(samples), "generations": len(recs), "new_tokens": tokens,
                           "seconds": seconds, "tokens_per_second": tps}
    timed = timed_common(by_sample, ar_by_sample)
    out["speed_samples"] = len(timed)
    out["speed_withheld"] = bool(common) and not timed
    out.update(_speedup_figures(by_sample, ar_by_sample, samples, timed, tps, is_ar))
    stats = [r.get("stats") or {} for r in recs]
    out.update(_acceptance_figures(recs, stats, is_ar))
    out.update(_engine_figures(stats))
    _add_quality_figures(out, recs, ar_recs, by_sample, ar_by_sample, common, is_ar)
    structured = structured_figures(recs, ar_recs)
    if structured is not None:
        out["structured"] = structured
    return out


def _sum_present(stats: list[dict], key: str) -> float | None:
    """The sum of ``key`` over the stats that carry it as a number; None when none does."""
    values = [s[key] for s in stats if isinstance(s.get(key), (int, float)) and not isinstance(s.get(key), bool)]
    return float(sum(values)) if values else None


def mask_figures(stats: list[dict]) -> dict[str, Any]:
    """The grammar mask's cost over ``stats`` (module docstring: ``structured``)."""
    mask, draft_mask = _sum_present(stats, "mask_seconds"), _sum_present(stats, "draft_mask_seconds")
    passes = sum(s.get("rounds", 0) for s in stats)
    verify, draft = _sum_present(stats, "verify_seconds"), _sum_present(stats, "draft_seconds")
    return {"mask_seconds": mask, "mask_ms_per_pass": None if mask is None else _ratio(1000 * mask, passes),
            "mask_share": None if mask is None or verify is None else _ratio(mask, verify),
            "draft_mask_seconds": draft_mask,
            "draft_mask_ms_per_pass": None if draft_mask is None else _ratio(1000 * draft_mask, passes),
            "draft_mask_share": None if draft_mask is None or draft is None else _ratio(draft_mask, draft)}


def structured_figures(recs: list[dict], ar_recs: list[dict]) -> dict[str, Any] | None:
    """Validity, truncations, text agreement with ``ar`` and the mask's cost of the records that
    decoded under a constraint (module docstring); None when there are none."""
    constrained = [r for r in recs if r.get("constraint")]
    if not constrained:
        return None
    scored = [r["quality"] for r in constrained if "json_valid" in (r.get("quality") or {})]
    valid = sum(bool(q["json_valid"]) for q in scored)
    ar_text = {(r["sample_id"], int(r["repeat"])): r.get("text") for r in ar_recs}
    same = [r.get("text") == ar_text[(r["sample_id"], int(r["repeat"]))] for r in constrained
            if (r["sample_id"], int(r["repeat"])) in ar_text]
    return {"n": len(scored), "valid": valid, "validity": _ratio(valid, len(scored)),
            "truncated": sum(bool(q.get("truncated")) for q in scored), "same_text_as_ar": _mean(same),
            "speedup_vs_ar_same_backend": None, "vs_ar": None,
            **mask_figures([r.get("stats") or {} for r in constrained])}


def same_backend_speedups(rows: dict[str, dict], recs_by_cfg: dict[str, list[dict]]) -> None:
    """Set each ``structured`` row's ``speedup_vs_ar_same_backend``: its tokens/s over that of
    plain decoding on the same backend (``ar``, or ``ar:backend=B`` for ``...:backend=B``), on
    the samples both finished; ``vs_ar`` names that configuration."""
    ars = {r.get("backend"): cid for cid, r in rows.items()
           if r.get("kind") == "specdec" and r.get("policy") == AR_ID and not r.get("params")}
    for cid, row in rows.items():
        base = ars.get(row.get("backend"))
        if row.get("structured") is None or base is None:
            continue
        mine, theirs = _per_sample(recs_by_cfg.get(cid, [])), _per_sample(recs_by_cfg.get(base, []))
        common = timed_common(mine, theirs)
        if common:
            row["structured"]["speedup_vs_ar_same_backend"] = _ratio(_speed(mine, common)[2] or 0.0,
                                                                     _speed(theirs, common)[2] or 0.0)
            row["structured"]["vs_ar"] = base


def _speedup_figures(by_sample: dict, ar_by_sample: dict, samples: list[str], common: list[str], tps: float | None,
                     is_ar: bool) -> dict[str, Any]:
    """``speedup_vs_ar`` (on the samples both finished) and ``time_speedup_vs_ar``, each with its
    min/max over repeats, ``length_vs_ar``, and the configuration's tokens/s min/max over repeats
    (module docstring)."""
    out: dict[str, Any] = {}
    speedup = spread = time_speedup = time_spread = length = None
    if common:
        c_tokens, c_seconds, c_tps = _speed(by_sample, common)
        a_tokens, a_seconds, a_tps = _speed(ar_by_sample, common)
        speedup = _ratio(c_tps or 0.0, a_tps or 0.0)
        time_speedup, length = _ratio(a_seconds, c_seconds), _ratio(c_tokens, a_tokens)
        c_rep, a_rep = _totals_by_repeat(by_sample, common), _totals_by_repeat(ar_by_sample, common)
        pairs = [(c_rep[r], a_rep[r]) for r in c_rep if r in a_rep and a_rep[r][0]]
        ratios = [(c[0] / c[1]) / (a[0] / a[1]) for c, a in pairs]
        spread = (min(ratios), max(ratios)) if ratios else None
        t_ratios = [a[1] / c[1] for c, a in pairs]
        time_spread = (min(t_ratios), max(t_ratios)) if t_ratios else None
    out["speedup_vs_ar"] = 1.0 if is_ar and common else speedup
    out["speedup_min"], out["speedup_max"] = (spread if spread and not is_ar else (out["speedup_vs_ar"],) * 2)
    out["time_speedup_vs_ar"] = 1.0 if is_ar and common else time_speedup
    out["time_speedup_min"], out["time_speedup_max"] = (time_spread if time_spread and not is_ar
                                                        else (out["time_speedup_vs_ar"],) * 2)
    out["time_speedup_ci"] = (None if is_ar or not common else
                              ratio_of_sums_ci(_median_seconds(ar_by_sample, common), _median_seconds(by_sample, common)))
    out["length_vs_ar"] = 1.0 if is_ar and common else length
    reps = _tps_by_repeat(by_sample, samples)
    out["tokens_per_second_min"] = min(reps.values()) if reps else tps
    out["tokens_per_second_max"] = max(reps.values()) if reps else tps
    return out


def _acceptance_figures(recs: list[dict], stats: list[dict], is_ar: bool) -> dict[str, Any]:
    """``tau``, per-position acceptance, drafted/accepted totals, the zero-accept share and, for
    token trees, ``tree`` (nodes and depth per tree, accepted depth per tree round)."""
    out: dict[str, Any] = {}
    if is_ar:
        out["tau"] = 1.0 if recs else None
    elif any("rounds" in s for s in stats):
        rounds = sum(s.get("rounds", 0) for s in stats)
        accepted = sum(s.get("accepted", 0) for s in stats)
        out["tau"] = tau_of(accepted, rounds)
    else:  # a peer: generated tokens per target forward pass, where counted
        fw = [s.get("target_forwards") or 0 for s in stats]
        produced = [s.get("produced_tokens", r.get("new_tokens", 0)) for s, r in zip(stats, recs)]
        out["tau"] = (sum(produced) / sum(fw)) if fw and all(fw) else None
    width = max((len(s.get("drafted_at") or []) for s in stats), default=0)
    drafted_at, accepted_at = [0] * width, [0] * width
    for s in stats:
        for i, v in enumerate(s.get("drafted_at") or []):
            drafted_at[i] += v
        for i, v in enumerate(s.get("accepted_at") or []):
            accepted_at[i] += v
    out["per_position_acceptance"] = [a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at)]
    out["drafted"] = sum(s.get("drafted", 0) for s in stats)
    out["accepted"] = sum(s.get("accepted", 0) for s in stats)
    out["zero_accept_share"] = _ratio(sum(s.get("zero_accept_rounds", 0) for s in stats), drafted_at[0]) if width else None
    depths = [d for s in stats for d in (s.get("tree_depths") or [])]
    if depths:  # token trees: nodes and depth per tree, accepted depth per tree round
        tree_drafted = sum(s.get("drafted", 0) for s in stats if s.get("tree_depths"))
        tree_accepted = sum(s.get("accepted", 0) for s in stats if s.get("tree_depths"))
        out["tree"] = {"rounds": len(depths), "mean_nodes": tree_drafted / len(depths),
                       "mean_depth": sum(depths) / len(depths), "mean_accepted_depth": tree_accepted / len(depths)}
    return out


def _engine_figures(stats: list[dict]) -> dict[str, Any]:
    """Draft, verify and prefill seconds with their shares of the engine's time (None where not
    recorded), ``lossy``, and the ``relaxed`` counts summed."""
    out: dict[str, Any] = {}
    engine_total = sum(s.get("total_seconds", 0.0) for s in stats)
    for part in ("draft", "verify", "prefill"):
        total = sum(s.get(f"{part}_seconds", 0.0) for s in stats)
        out[f"{part}_seconds"] = total if any(f"{part}_seconds" in s for s in stats) else None
        out[f"{part}_share"] = _ratio(total, engine_total) if out[f"{part}_seconds"] is not None else None
    out["lossy"] = any(bool(s.get("lossy")) for s in stats)
    relaxed: dict[str, int] = defaultdict(int)
    for s in stats:
        for k, v in (s.get("relaxed") or {}).items():
            relaxed[k] += v
    out["relaxed"] = dict(relaxed)
    return out


def _add_quality_figures(out: dict[str, Any], recs: list[dict], ar_recs: list[dict], by_sample: dict,
                         ar_by_sample: dict, common: list[str], is_ar: bool) -> None:
    """Adds to ``out`` the quality figures: ``quality``, ``quality_metric``, ``recovery`` and
    ``paired`` against ``ar`` on the common samples, and ``agreement`` with ``ar``."""
    out.update(_quality(recs))
    out.setdefault("quality", None)
    out.setdefault("quality_metric", None)
    ar_q = _quality([r for r in ar_recs if r["sample_id"] in set(common)]).get("quality")
    my_q = _quality([r for r in recs if r["sample_id"] in set(common)]).get("quality")
    out["recovery"] = (my_q / ar_q) if (my_q is not None and ar_q) else None
    key = OUTCOME_KEY.get(out["quality_metric"])
    out["paired"] = None if is_ar or key is None else paired_quality(_outcomes(by_sample, key),
                                                                    _outcomes(ar_by_sample, key))
    agree = [r["agreement"] for r in recs if r.get("agreement")]
    out["agreement"] = {"exact_match": _mean([bool(a["exact"]) for a in agree]),
                        "token_agreement": _mean([float(a["token"]) for a in agree]), "n": len(agree)}


def summarize(records: Iterable[dict], configs: list[dict], samples: Sequence[str] | None = None,
              repeats: int | None = None, categories: dict[str, str] | None = None) -> dict[str, Any]:
    """Aggregate per configuration (``configs``: ``Config.to_dict()`` rows, ``ar`` included),
    restricted to ``samples`` and repeat indices < ``repeats``; with per-category breakdowns when
    more than one category is present; best K per rule/drafter; the speed-quality Pareto front."""
    wanted = set(samples) if samples is not None else None
    recs_by_cfg: dict[str, list[dict]] = defaultdict(list)
    for r in with_agreement(records):
        if wanted is not None and r["sample_id"] not in wanted:
            continue
        if repeats is not None and int(r["repeat"]) >= repeats:
            continue
        recs_by_cfg[r["config"]].append(r)
    ar = recs_by_cfg.get(AR_ID, [])
    cats = sorted({r["category"] for rs in recs_by_cfg.values() for r in rs if r.get("category")})
    out: dict[str, Any] = {}
    for c in configs:
        cid = c["id"]
        recs = recs_by_cfg.get(cid, [])
        row = {**c, **aggregate(recs, ar, cid == AR_ID)}
        if len(cats) > 1:
            row["by_category"] = {
                cat: {k: v for k, v in aggregate([r for r in recs if r.get("category") == cat],
                                                 [r for r in ar if r.get("category") == cat], cid == AR_ID).items()
                      if k in ("samples", "tokens_per_second", "speedup_vs_ar", "tau", "agreement", "math_accuracy",
                               "pass_at_1")}
                for cat in cats
            }
        out[cid] = row
    best_ar = vs_best_ar(out, recs_by_cfg)
    same_backend_speedups(out, recs_by_cfg)
    return {"configs": out, "best_k": best_k_per_policy(out), "pareto_front": pareto_front(out),
            "vs_lossless": vs_lossless(out), "best_ar": best_ar}


def with_agreement(records: Iterable[dict]) -> list[dict]:
    """``records``, each that lacks an ``agreement`` (it ran before ``ar`` on its sample) given one
    from ``ar``'s record of the same sample and repeat, where there is one (a copy; others as they are)."""
    from ..scoring.quality import agreement

    records = list(records)
    ar = {(r["sample_id"], int(r["repeat"])): r for r in records if r["config"] == AR_ID}
    out = []
    for r in records:
        ref = ar.get((r["sample_id"], int(r["repeat"])))
        if r.get("agreement") is None and ref is not None and "token_ids" in r and "token_ids" in ref:
            exact, token = agreement(r["token_ids"], ref["token_ids"])
            r = {**r, "agreement": {"exact": exact, "token": token}}
        out.append(r)
    return out


def vs_best_ar(rows: dict[str, dict], recs_by_cfg: dict[str, list[dict]]) -> str | None:
    """With plain decoding in several dtypes (``ar``, ``ar[dtype=...]``), set each row's
    ``speedup_vs_best_ar``: its tokens/s over the fastest of them, on the samples both finished
    (the smallest of its speedups over each). Returns the fastest ar's id."""
    ars = [cid for cid, r in rows.items() if r.get("kind") == "specdec" and r.get("policy") == AR_ID]
    if not ars:
        return None
    best = max(ars, key=lambda cid: rows[cid].get("tokens_per_second") or 0.0)
    for cid, row in rows.items():
        ratios = []
        mine = _per_sample(recs_by_cfg.get(cid, []))
        for ar in ars:
            theirs = _per_sample(recs_by_cfg.get(ar, []))
            common = timed_common(mine, theirs)
            if common:
                ratios.append(_ratio(_speed(mine, common)[2] or 0.0, _speed(theirs, common)[2] or 0.0))
        known = [r for r in ratios if r is not None]
        row["speedup_vs_best_ar"] = min(known) if known else None
    return best


def vs_lossless(rows: dict[str, dict]) -> dict[str, dict]:
    """For each lossy configuration, its gain over ``lossless`` run with the same drafter, K and
    backend (when that configuration is in the run): tau ratio, tokens/s ratio (``speed_ratio``) and
    ``time_ratio``, the ratio of their ``time_speedup_vs_ar`` (how much sooner the same samples
    finish; below ``speed_ratio`` when the lossy rule writes longer answers)."""
    ref = {(r.get("drafter"), r.get("k"), r.get("backend")): r for r in rows.values()
           if r.get("kind") == "specdec" and r.get("policy") == "lossless" and not r.get("params")}
    out = {}
    for cid, r in rows.items():
        base = ref.get((r.get("drafter"), r.get("k"), r.get("backend")))
        if r.get("kind") != "specdec" or not r.get("lossy") or base is None:
            continue
        tau, speed, time_ratio = (None if r.get(key) is None or base.get(key) is None else _ratio(r[key], base[key])
                                  for key in ("tau", "tokens_per_second", "time_speedup_vs_ar"))
        out[cid] = {"lossless": base["id"], "tau_ratio": tau, "speed_ratio": speed, "time_ratio": time_ratio}
    return out


def best_k_per_policy(rows: dict[str, dict]) -> dict[str, dict]:
    """For each policy (with its parameters) and drafter run at two or more Ks: the K with the
    highest speedup over ar, among the configurations of this run's table (the summary's
    ``best_k``; not :func:`specdec.models.costmodel.best_k`, which picks K from measured costs)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for cid, row in rows.items():
        if row.get("kind") == "specdec" and row.get("policy") != AR_ID and row.get("speedup_vs_ar") is not None:
            base, at = cid.rsplit("/k", 1)[0], row.get("backend")
            groups[base if at is None else f"{base}@{at}"].append(row)  # one backend per group
    out = {}
    for name, rs in groups.items():
        if len({r["k"] for r in rs}) < 2:
            continue
        fixed = [r for r in rs if isinstance(r["k"], int)]
        auto = [r for r in rs if r["k"] == "auto"]
        best = max(rs, key=lambda r: r["speedup_vs_ar"])
        out[name] = {"k": best["k"], "id": best["id"], "speedup_vs_ar": best["speedup_vs_ar"], "tau": best["tau"]}
        if fixed and auto:  # k=auto against the best fixed K of the sweep
            top = max(fixed, key=lambda r: r["speedup_vs_ar"])
            out[name]["best_fixed_k"] = top["k"]
            out[name]["auto_vs_best_fixed"] = _ratio(auto[0]["speedup_vs_ar"], top["speedup_vs_ar"])
    return out


def quality_axis(row: dict) -> tuple[float | None, str]:
    """The quality a configuration is plotted/ranked by: its quality metric, else its token
    agreement with ar."""
    if row.get("quality") is not None:
        return row["quality"], row.get("quality_metric") or "quality"
    return (row.get("agreement") or {}).get("token_agreement"), "token agreement with ar"


def pareto_front(rows: dict[str, dict]) -> list[str]:
    """Configuration ids not dominated in (speed, quality): no other is at least as good on
    both and better on one. Speed is ``time_speedup_vs_ar`` (the same work done sooner), else
    ``speedup_vs_ar``: a rule that writes longer answers is not faster for its higher tokens/s."""
    pts = []
    for cid, row in rows.items():
        q, _ = quality_axis(row)
        speed = row.get("time_speedup_vs_ar", row.get("speedup_vs_ar"))
        if speed is not None and q is not None:
            pts.append((cid, speed, q))
    front = []
    for cid, s, q in pts:
        dominated = any((s2 >= s and q2 >= q) and (s2 > s or q2 > q) for c2, s2, q2 in pts if c2 != cid)
        if not dominated:
            front.append(cid)
    return front
