"""PNG figures (matplotlib, Agg backend) from the summary: speedup vs quality with the Pareto
front marked, tau per configuration, per-position acceptance curves, and the K sweep (speedup and
tau against K for each rule/drafter)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .summary import quality_axis

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
        fig.savefig(Path(out_dir) / name, dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(name)
    return written


def _speed_quality(plt, rows, summary):
    fig, ax = plt.subplots(figsize=(7.5, 5))
    front = set(summary.get("pareto_front") or [])
    label = "quality"
    pts = []
    for cid, row in rows.items():
        q, label_ = quality_axis(row)
        s = row.get("speedup_vs_ar")
        if q is None or s is None:
            continue
        label = label_ if row.get("quality") is not None or label == "quality" else label
        pts.append((q, s, cid))
        ax.scatter([q], [s], s=40, color="tab:red" if cid in front else "tab:blue", zorder=3,
                   marker="s" if row.get("kind") == "peer" else "o")
        ax.annotate(cid, (q, s), textcoords="offset points", xytext=(4, 4), fontsize=7)
    fp = sorted((q, s) for q, s, c in pts if c in front)
    if len(fp) > 1:
        ax.plot([p[0] for p in fp], [p[1] for p in fp], color="tab:red", lw=1, ls="--", label="Pareto front")
        ax.legend(fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlim(-0.03, 1.03)  # every quality axis here is a rate
    ax.set_xlabel(label)
    ax.set_ylabel("speedup over ar (tokens/s ratio)")
    ax.set_title("Speed vs quality (red: Pareto front; squares: transformers peers)")
    ax.grid(alpha=0.3)
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
        if row.get("kind") == "specdec" and row.get("policy") != "ar" and isinstance(row.get("k"), int) and row["k"]:
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
