"""``specdec replay``'s tables: the replayed seconds and speedups per draft (and per category), the
portfolio beside its sources, and measured against replayed seconds for a bench folder."""

from __future__ import annotations

import math
from pathlib import Path

from ...core.drafters.model import ModelDrafter
from ...core.names import AR
from ...traces.runs import LOOKUP_DRAFTERS


def _x(plain: float, s: float | None) -> str:
    """A speedup, or "-" where either time is not a finite positive number (never a nonsense figure)."""
    if s is None:
        return "-"
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (plain, s))
    return f"{plain / s:.2f}x" if ok else "-"


def report(results: dict, by_category: bool) -> list[str]:
    lines = ["| draft | plain s | best fixed K | best stop threshold | k=auto (default) | oracle | k=auto / oracle |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        t = r["total"]
        best_k = min(t["fixed"], key=lambda k: t["fixed"][k])
        th = min(t["threshold"], key=lambda k: t["threshold"][k]) if t["threshold"] else None
        stop = f"p<{th} {_x(t['plain'], t['threshold'][th])}" if th else "-"
        lines.append(f"| {name} | {t['plain']:.1f} | K={best_k} {_x(t['plain'], t['fixed'][best_k])} | {stop} | "
                     f"{_x(t['plain'], t['auto'])} (tau {t['auto_tau']:.2f}) | {_x(t['plain'], t['oracle'])} | "
                     + (f"{t['oracle'] / t['auto']:.2f} |" if t["oracle"] else "- |"))
    if by_category:
        for name, r in results.items():
            lines += ["", f"{name}, per category:", "| category | plain s | k=auto | oracle | best fixed K |",
                      "|---|---:|---:|---:|---:|"]
            for cat, c in sorted(r["categories"].items()):
                best_k = min(c["fixed"], key=lambda k: c["fixed"][k])
                lines.append(f"| {cat} | {c['plain']:.1f} | {_x(c['plain'], c['auto'])} | {_x(c['plain'], c['oracle'])} | "
                             f"K={best_k} {_x(c['plain'], c['fixed'][best_k])} |")
    return lines


def portfolio_report(results: dict, model: str | None, by_category: bool) -> list[str]:
    """The portfolio (``drafter="auto"``, the default) beside each of its sources alone at k=auto
    and its oracle: in total and, ``by_category``, per category."""
    cols = [n for n in (model, *LOOKUP_DRAFTERS) if n is not None and n in results]
    head = (f"portfolio (default, drafter auto: {' + '.join(cols)}) against each source alone at k=auto; time vs plain:",
            "| prompts | plain s | " + " | ".join(f"{c} alone" for c in cols)
            + " | default (auto) | fitted bound | portfolio oracle | default / fitted | default / oracle |",
            "|---|---:|" + "---:|" * (len(cols) + 5))

    def row(label: str, get) -> str:
        auto = get("auto")
        return (f"| {label} | {auto['plain']:.1f} | " + " | ".join(_x(auto["plain"], get(c)["auto"]) for c in cols)
                + f" | {_x(auto['plain'], auto['auto'])} (tau {auto['auto_tau']:.2f}) | {_x(auto['plain'], auto['fitted'])}"
                + f" | {_x(auto['plain'], auto['oracle'])} | {auto['fitted'] / auto['auto']:.2f}"
                + f" | {auto['oracle'] / auto['auto']:.2f} |")

    lines = list(head) + [row(f"all {results['auto']['total']['prompts']}", lambda n: results[n]["total"])]
    if by_category:
        for cat in sorted(results["auto"]["categories"]):
            lines.append(row(cat, lambda n, cat=cat: results[n]["categories"][cat]))
    return lines


def compare(folder: Path, traces, results: dict) -> list[str]:
    """Measured (the folder's records) against replayed seconds, for the configurations a replay
    models: ar, lossless with the model drafter at a fixed K or k=auto."""
    from ..outputs.results import ResultsFile

    ids = {t.sample_id for t in traces}
    measured: dict[str, float] = {}
    for rec in ResultsFile(folder).load():
        if rec.get("sample_id") not in ids or rec.get("repeat", 0) != 0:
            continue
        cfg = rec["config"]
        if cfg == AR or (rec.get("policy") == "lossless" and rec.get("drafter") == ModelDrafter.name
                           and not rec.get("params")):
            measured[cfg] = measured.get(cfg, 0.0) + float(rec["stats"]["total_seconds"])
    name = next(iter(results))
    r = results[name]["total"]
    lines = ["", f"measured ({folder}) against replayed ({name}):", "| configuration | measured s | replayed s | replayed / measured |",
             "|---|---:|---:|---:|"]
    for cfg, sec in sorted(measured.items()):
        if cfg == AR:
            rep = r["plain"]
        elif cfg.endswith("kauto"):
            rep = r["auto"]
        else:
            try:
                k = int(cfg.rsplit("/k", 1)[1])
            except (IndexError, ValueError):
                continue
            rep = r["fixed"].get(str(k))
            if rep is None:
                continue
        lines.append(f"| {cfg} | {sec:.1f} | {rep:.1f} | {rep / sec:.3f} |" if sec > 0 else f"| {cfg} | {sec:.1f} | {rep:.1f} | - |")
    return lines
