"""``specdec tune --status``: where a tune run stands, from the records in its folder alone.

A certified tune runs for hours on a CPU; this reads each stage's ``results.jsonl`` (without
writing or locking anything, so it is safe beside the running tune) and shows, per setting, what
the stage has measured so far against plain decoding (``ar``) on the same problems:

- proxy: problems run, the share whose tokens leave ``ar``'s, token agreement, and the steady-state
  speed that orders the confirm stage (:func:`specdec.bench.tune.certify.decode_speedup`);
- confirm and validate: problems run of the split, lost and gained (:func:`specdec.bench.outputs.summary.paired_quality`),
  recovery with its 95% interval, the one-sided bound at the run's confidence, tokens/s and time
  against ``ar`` with the length ratio, and the state: ``qualifies`` (the whole split run and the
  bound clears the budget), ``can still qualify`` or ``cannot qualify`` (:func:`specdec.bench.tune.certify.can_still_qualify`,
  the confirm stage's stop rule); on the validation split, whether the budget holds so far.
"""

from __future__ import annotations

from pathlib import Path

from . import certify
from ..outputs.report import fmt, speed_basis, with_ci
from ..outputs.results import ResultsFile
from ..outputs.summary import AR_ID, summarize, verdicts

STAGES = ("proxy", "confirm", "validate")
CONFIG_KEYS = ("kind", "policy", "drafter", "k", "params")


def stage_records(folder: Path) -> list[dict]:
    """A stage folder's usable records, read as they are (nothing is repaired or locked)."""
    return ResultsFile(folder).load(repair=False)


def configs_of(records: list[dict]) -> list[dict]:
    """The configurations the records hold (``ar`` first, then in order of first record), as the
    rows :func:`specdec.bench.outputs.summary.summarize` takes."""
    seen: dict[str, dict] = {}
    for r in records:
        seen.setdefault(r["config"], {"id": r["config"], **{k: r.get(k) for k in CONFIG_KEYS}})
    return sorted(seen.values(), key=lambda c: c["id"] != AR_ID)


def _state(row: dict, ar: dict[str, bool], split: list[str], mine: dict[str, bool], stage: str,
           max_loss: float, confidence: float) -> str:
    paired = row.get("paired")
    if stage == "validate":
        return "–" if paired is None else ("holds so far" if certify.clears(row.get("recovery"), max_loss)
                                           else "below budget so far")
    c = certify.counts(paired) or (0, 0, 0)
    if len(mine) == len(split) and paired:
        return "qualifies" if certify.qualifies(paired, max_loss, confidence) else "does not qualify"
    if any(s not in ar for s in split):
        return "running (ar not complete)"
    left = [ar[s] for s in split if s not in mine]
    if certify.can_still_qualify(*c, sum(left), len(left) - sum(left), max_loss, confidence):
        return "can still qualify"
    return "cannot qualify (the stop rule leaves it)"


def stage_table(records: list[dict], split: list[str], stage: str, max_loss: float, confidence: float) -> list[str]:
    """Markdown lines: one row per configuration of one stage (module docstring)."""
    wanted = set(split)
    records = [r for r in records if r["sample_id"] in wanted and int(r.get("repeat", 0)) == 0]
    rows = summarize(records, configs_of(records), split, 1)["configs"]
    by_cfg: dict[str, list[dict]] = {}
    for r in records:
        by_cfg.setdefault(r["config"], []).append(r)
    ar = verdicts(by_cfg.get(AR_ID, []))
    if stage == "proxy":
        lines = ["| setting | problems | tokens leave ar's on | token agreement | steady-state speed vs ar |",
                 "|---|---:|---:|---:|---:|"]
        for cid, row in rows.items():
            d = certify.divergence(records, cid) if cid != AR_ID else {}
            lines.append(f"| {cid} | {row.get('samples') or 0}/{len(split)} | {fmt(d.get('diverged'), '.0%')} | "
                         f"{fmt((row.get('agreement') or {}).get('token_agreement'))} | "
                         f"{fmt(1.0 if cid == AR_ID else certify.decode_speedup(records, cid), '.2f', 'x')} |")
        return lines
    lines = ["| setting | problems | passed | lost / gained vs ar | recovery [95% CI] | "
             f"bound at {confidence:g} | tokens/s vs ar | time vs ar (length) | state |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for cid, row in rows.items():
        mine = verdicts(by_cfg.get(cid, []))
        if cid == AR_ID:
            lines.append(f"| ar | {len(mine)}/{len(split)} | {sum(mine.values())} | – | – | – | 1.00x | 1.00x | – |")
            continue
        paired = row.get("paired") or {}
        rec = with_ci(row.get("recovery"), paired.get("recovery_ci"))
        lost_gained = f"{paired['lost']} / {paired['gained']}" if paired else "–"
        lines.append(
            f"| {cid} | {len(mine)}/{len(split)} | {sum(mine.values())} | {lost_gained} | {rec} | "
            f"{fmt(certify.paired_bound(row.get('paired'), confidence), '.3f')} | "
            f"{fmt(row.get('speedup_vs_ar'), '.2f', 'x')} | "
            f"{fmt(row.get('time_speedup_vs_ar'), '.2f', 'x')} ({fmt(row.get('length_vs_ar'), '.2f', 'x')}){speed_basis(row)} | "
            f"{_state(row, ar, split, mine, stage, max_loss, confidence)} |")
    return lines


def status_markdown(out: Path, splits: dict[str, list[str]], max_loss: float, confidence: float) -> str:
    """The status of the tune run in ``out``: a table per stage that has records. ``splits``:
    each stage's problem ids (the run's plan)."""
    lines = [f"# specdec tune: status of {out}", "",
             f"Budget: loss <= {max_loss:g} of plain decoding, certified at one-sided confidence {confidence:g}. "
             "Figures are on the problems each setting has run so far (first repeat).", ""]
    found = False
    for stage in STAGES:
        folder = Path(out) / stage
        records = stage_records(folder) if splits.get(stage) else []
        if not records:
            continue
        found = True
        done = max((r.get("time") or "" for r in records), default="")
        lines += [f"## {stage} ({len(records)} generations; last at {done or '?'})", "",
                  *stage_table(records, splits[stage], stage, max_loss, confidence), ""]
    if not found:
        lines.append(f"No records yet under {out} (stages: {', '.join(STAGES)}).")
    return "\n".join(lines).rstrip() + "\n"
