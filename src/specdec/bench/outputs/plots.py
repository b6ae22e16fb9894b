"""PNG figures (matplotlib, Agg backend) from the summary: speedup vs quality with the Pareto
front marked (horizontal bars: the 95% interval of the recovery, vertical: the spread over
repeats), tau per configuration, per-position acceptance curves, and the K sweep (speedup and tau
against K for each rule/drafter)."""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

from ...core.names import AR
from ...models.files import write_inside


FILES = ("speedup_vs_quality.png", "tau.png", "acceptance.png", "k_sweep.png")


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def make_plots(summary: dict, out_dir: Path) -> list[str]:
    """Write the four figures into ``out_dir``; returns the file names written."""
    rows = summary["configs"]
    plt = _plt()
    written = []
    for name, fn in zip(FILES, (_speed_quality, _tau, _acceptance, _k_sweep)):
        fig = fn(plt, rows, summary)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        write_inside(out_dir, name, png.getvalue())  # a link of that name is replaced, never followed
        written.append(name)
    return written


#: marker, color and legend name per kind of configuration
STYLES = {AR: ("D", "black", "plain decoding"), "lossless": ("o", "tab:blue", "lossless"),
          "lossy": ("^", "tab:orange", "lossy (loose rules)"), "peer": ("s", "tab:grey", "peers")}


def _style_of(row: dict) -> str:
    if row.get("kind") == "peer":
        return "peer"
    if row.get("policy") == AR:
        return AR
    return "lossy" if row.get("lossy") else "lossless"


def speed_quality_axis(rows: dict) -> tuple[str, str]:
    """``("recovery", label)`` when every scored configuration has a recovery against ar (quality
    defined and ar's quality above 0), else ``("agreement", label)``: token agreement with ar."""
    scored = [r for r in rows.values() if r.get("quality") is not None]
    if scored and all(r.get("recovery") is not None for r in scored):
        metric = scored[0].get("quality_metric") or "quality"
        return "recovery", f"recovery: {metric} / ar's {metric}"
    return "agreement", "token agreement with ar (task quality undefined here)"


def _bar(x: float, lo, hi) -> list[list[float]] | None:
    """An errorbar ``xerr``/``yerr`` from x to [lo, hi]; None without a range."""
    if lo is None or hi is None or hi <= lo:
        return None
    return [[max(0.0, x - lo)], [max(0.0, hi - x)]]


def recovery_ci(row: dict) -> tuple[float | None, float | None]:
    """The 95% interval of a configuration's recovery against ar (summary ``paired``), or Nones."""
    ci = (row.get("paired") or {}).get("recovery_ci")
    return (ci[0], ci[1]) if ci else (None, None)


def _speed_quality(plt, rows, summary):
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    axis, label = speed_quality_axis(rows)
    pts = []
    for cid, row in rows.items():
        x = row.get("recovery") if axis == "recovery" else (row.get("agreement") or {}).get("token_agreement")
        y = row.get("time_speedup_vs_ar", row.get("speedup_vs_ar"))
        if x is None or y is None:
            continue
        pts.append((cid, x, y, row))
    seen = set()
    for i, (cid, x, y, row) in enumerate(pts, 1):
        marker, color, name = STYLES[_style_of(row)]
        yerr = (_bar(y, row.get("time_speedup_min"), row.get("time_speedup_max")) if "time_speedup_vs_ar" in row
                else _bar(y, row.get("speedup_min"), row.get("speedup_max")))
        xerr = _bar(x, *recovery_ci(row)) if axis == "recovery" else None
        ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt=marker, color=color, ms=7, capsize=3, zorder=3,
                    label=name if name not in seen else None)
        seen.add(name)
        ax.annotate(str(i), (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    front = set(summary.get("pareto_front") or []) if axis == "recovery" else set()
    fp = sorted((x, y) for cid, x, y, _ in pts if cid in front)
    if len(fp) > 1:
        ax.plot([p[0] for p in fp], [p[1] for p in fp], color="tab:red", lw=1, ls="--", label="Pareto front")
    xs = [x for _, x, _, _ in pts] or [0.0, 1.0]
    if axis == "recovery":  # room for the interval bars
        xs += [v for _, _, _, row in pts for v in recovery_ci(row) if v is not None]
    pad = max(0.02, 0.08 * (max(xs) - min(xs)))
    ax.set_xlim(max(0.0, min(xs) - pad), max(xs) + pad)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel(label + ("; bars: 95% CI, paired by sample" if axis == "recovery" else ""))
    ax.set_ylabel("speedup over ar (ar's time / this one's on the same samples; bars: spread over repeats)")
    ax.set_title("Speed vs quality")
    ax.grid(alpha=0.3)
    key = "\n".join(f"{i}  {cid}" for i, (cid, _, _, _) in enumerate(pts, 1))
    if key:
        ax.text(1.02, 1.0, key, transform=ax.transAxes, fontsize=7, va="top", family="monospace")
    ax.legend(fontsize=8, loc="lower left")
    return fig


def _tau(plt, rows, summary):
    items = [(cid, r["tau"]) for cid, r in rows.items() if r.get("tau") is not None]
    fig, ax = plt.subplots(figsize=(7.5, max(2.5, 0.35 * len(items) + 1)))
    ax.barh([c for c, _ in items][::-1], [t for _, t in items][::-1], color="tab:green")
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("tau (tokens per target verify pass)")
    ax.set_title("Mean acceptance length per configuration")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(alpha=0.3, axis="x")
    return fig


def _acceptance(plt, rows, summary):
    fig, ax = plt.subplots(figsize=(7.5, 5))
    drawn = 0
    for cid, row in rows.items():
        curve = row.get("per_position_acceptance") or []
        if curve:
            ax.plot(range(1, len(curve) + 1), curve, marker="o", ms=3, lw=1, label=cid)
            drawn += 1
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate (kept / drafted at that position)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Per-position acceptance")
    if drawn:
        ax.legend(fontsize=6, ncol=2)
    else:
        ax.text(0.5, 0.5, "no drafting configuration", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    return fig


def _k_sweep(plt, rows, summary):
    groups = defaultdict(list)
    for cid, row in rows.items():
        if row.get("kind") == "specdec" and row.get("policy") != AR and isinstance(row.get("k"), int) and row["k"]:
            groups[cid.rsplit("/k", 1)[0]].append(row)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for name, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["k"])
        ks = [r["k"] for r in rs]
        a1.plot(ks, [r.get("speedup_vs_ar") or float("nan") for r in rs], marker="o", label=name)
        a2.plot(ks, [r.get("tau") or float("nan") for r in rs], marker="o", label=name)
    a1.axhline(1.0, color="grey", lw=0.8, ls=":")
    a1.set_xlabel("K (draft tokens per round)")
    a1.set_ylabel("speedup over ar")
    a2.set_xlabel("K (draft tokens per round)")
    a2.set_ylabel("tau")
    a1.set_title("K sweep: speedup")
    a2.set_title("K sweep: tau")
    from matplotlib.ticker import MaxNLocator

    for a in (a1, a2):
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
        a.grid(alpha=0.3)
        if groups:
            a.legend(fontsize=7)
    return fig
