#!/usr/bin/env python3
"""Figures that `specdec bench`'s report does not print, from a run folder's
results.jsonl (finished samples only: those every configuration has a record of):

- the headline row per configuration (docs/results.md), from the folder's summary.json (write it
  first with `specdec bench ... --report-only`): tau, tokens/s, speedup vs ar, quality, recovery
  with its 95% interval, and lost / gained against ar sample by sample;
- per configuration: samples, how many generations hit the max_new_tokens limit
  (finish_reason "length"), pass@1 (HumanEval) or final-answer accuracy (Spec-Bench
  math_reasoning; other Spec-Bench categories have no verdict and are left out, "–" if none),
  and the same without the tuning split of scripts/tune_loose_rules.sh (HumanEval/100..107,
  which the tuned thresholds were picked on);
- time against ar: per configuration, tokens/s vs ar, time vs ar (ar's seconds over its own on the
  same samples: the same work done sooner) and length vs ar (its tokens over ar's), computed from
  the records with today's summary code, so folders made by older versions get it too. A lossy
  rule that writes longer answers is faster in tokens/s than in time;
- speed per invocation: a run resumed over several invocations may have run on different
  machines of the same kind (run.json's invocations); tokens/s and speedup vs ar over the samples
  each invocation finished, so a slower or faster machine shows instead of hiding in the pooled
  figure.

    python scripts/bench_extra_tables.py benchmarks/humaneval164-512-avx512bf16
"""
import json
import sys
from pathlib import Path

TUNING = {f"HumanEval/{i}" for i in range(100, 108)}


def headline(folder: str, finished: int) -> None:
    """The headline row per configuration; warns when summary.json is older than results.jsonl
    (its sample count is not the number every configuration has finished)."""
    from specdec.bench.outputs.report import fmt, pct, with_ci

    path = Path(folder) / "summary.json"
    if not path.is_file():
        print(f"({path} missing: run specdec bench ... --report-only first)")
        return
    configs = json.loads(path.read_text())["configs"]
    if any(c["samples"] != finished for c in configs.values()):
        print(f"WARNING: {path} is stale ({finished} samples finished); rerun specdec bench ... --report-only")
    print("| configuration | n | tau | tokens/s | vs ar | quality | recovery [95% CI] | lost / gained vs ar |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for c in configs.values():
        paired = c.get("paired") or {}
        lost = f"{paired['lost']} / {paired['gained']}" if paired else "–"
        print(f"| {c['id']} | {c['samples']} | {fmt(c['tau'])} | {fmt(c['tokens_per_second'])} | "
              f"{fmt(c['speedup_vs_ar'], suffix='x')} | {pct(c.get('quality'))} | "
              f"{with_ci(c.get('recovery'), paired.get('recovery_ci'))} | {lost} |")
    print()


def time_table(recs: list, done: list, configs: list) -> None:
    """Tokens/s, time and length against ar per configuration, on the samples all finished."""
    from specdec.bench.outputs.summary import summarize

    if "ar" not in configs:
        return
    keys = ("kind", "policy", "drafter", "k", "params")
    first = {r["config"]: r for r in reversed(recs)}
    rows = summarize(recs, [{"id": c, **{k: first[c].get(k) for k in keys}} for c in configs], done)["configs"]
    print("Time against ar (the same samples; time vs ar = ar's seconds / this one's)")
    print("| configuration | tokens/s vs ar | time vs ar | length vs ar |")
    print("|---|---:|---:|---:|")
    for c, r in rows.items():
        print(f"| {c} | {r['speedup_vs_ar']:.2f}x | {r['time_speedup_vs_ar']:.2f}x | {r['length_vs_ar']:.2f}x |")
    print()


def by_session(folder: str, by_sample: dict, done: list, configs: list) -> None:
    """Tokens/s per configuration and speedup vs ar over the samples each invocation finished
    (a sample belongs to the last invocation started before its ar record was written)."""
    run = json.loads((Path(folder) / "run.json").read_text())
    starts = sorted(inv["time"][:19] for inv in run.get("invocations", []))
    if len(starts) < 2 or "ar" not in configs:
        return
    groups: dict[str, list] = {}
    for s in done:
        t = by_sample[s]["ar"].get("time", "")
        groups.setdefault(max((x for x in starts if x <= t), default=starts[0]), []).append(s)
    print("Speed per invocation (tokens/s; speedup vs ar over that invocation's samples)")
    print("| invocation started | samples | " + " | ".join(configs) + " |")
    print("|---|---:|" + "---:|" * len(configs))
    for start, ids in sorted(groups.items()):
        tps = {c: sum(by_sample[s][c]["new_tokens"] for s in ids) / sum(by_sample[s][c]["seconds"] for s in ids)
               for c in configs}
        cells = [f"{tps[c]:.2f}" if c == "ar" else f"{tps[c]:.2f} ({tps[c] / tps['ar']:.2f}x)" for c in configs]
        print(f"| {start} | {len(ids)} | " + " | ".join(cells) + " |")
    print()


def verdict(quality: dict) -> bool | None:
    """Pass/fail of one record, or None when its sample has no quality measure."""
    from specdec.bench.outputs.summary import OUTCOME_KEY

    for key in OUTCOME_KEY.values():
        if key in quality:
            return bool(quality[key])
    return None


def main(folder: str) -> int:
    if not (Path(folder) / "results.jsonl").is_file():
        sys.exit(f"{folder} holds no results.jsonl: name a specdec bench run folder")
    recs = [json.loads(x) for x in (Path(folder) / "results.jsonl").read_text().splitlines() if x.strip()]
    configs = list(dict.fromkeys(r["config"] for r in recs))
    by_sample: dict[str, dict[str, dict]] = {}
    for r in recs:
        by_sample.setdefault(r["sample_id"], {})[r["config"]] = r
    done = [s for s, rows in by_sample.items() if all(c in rows for c in configs)]
    rest = [s for s in done if s not in TUNING]
    headline(folder, len(done))
    time_table(recs, done, configs)
    by_session(folder, by_sample, done, configs)
    print(f"{len(done)} samples finished by every configuration ({len(done) - len(rest)} of them in the tuning split)")
    print("| configuration | samples | hit the token limit | pass@1 (or math accuracy) | same without HumanEval/100-107 |")
    print("|---|---:|---:|---:|---:|")
    for c in configs:
        rows = [by_sample[s][c] for s in done]
        limit = sum(r.get("finish_reason") == "length" for r in rows)

        def passed(ids):
            # only samples with a verdict count; Spec-Bench categories without a quality
            # measure carry an empty quality dict
            verdicts = [verdict(by_sample[s][c].get("quality") or {}) for s in ids]
            ok = [v for v in verdicts if v is not None]
            return f"{sum(ok)}/{len(ok)} ({sum(ok) / len(ok):.1%})" if ok else "–"
        print(f"| {c} | {len(rows)} | {limit} | {passed(done)} | {passed(rest)} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/bench_extra_tables.py RUN_FOLDER")
    sys.exit(main(sys.argv[1]))
