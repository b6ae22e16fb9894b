"""``specdec tune``'s table: ``report.md`` and the one printed at the end, from ``tune.json``'s
record."""

from __future__ import annotations

from ..outputs.report import fmt, speed_basis, with_ci


def _speed(row: dict | None) -> str:
    """Tokens/s over ar's, and (in brackets) ar's time over this setting's on the same problems."""
    if not row:
        return "–"
    return f"{fmt(row.get('speedup_vs_ar'), '.2f', 'x')} ({fmt(row.get('time_speedup_vs_ar'), '.2f', 'x')}){speed_basis(row)}"


def table_rows(record: dict) -> list[list[str]]:
    """One row per policy: pick, speed vs ar and recovery (95% CI; one-sided bound) on the
    tuning split, the same on the validation split, and whether the budget held there."""
    out = []
    for policy, p in record["policies"].items():
        pk = p["pick"]
        if pk is None:
            c = p.get("closest") or {}
            conf = record["confirm"].get(c.get("setting"), {})
            paired = conf.get("paired") or {}
            run = (f", stopped at {c['problems_run']}/{len(record['tuning_samples'])}" if c.get("stopped_early")
                   else "")
            out.append([policy, "none qualifies" + (f" (closest {c['setting']}{run})" if c.get("setting") else ""),
                        _speed(conf),
                        with_ci(c.get("recovery"), paired.get("recovery_ci")), fmt(c.get("bound"), ".3f"),
                        f"{fmt(c.get('certifies'), '.3f')} (needs ~{c.get('problems_needed') or '∞'} problems)"
                        if c else "–", *_validation_cells(c.get("validation"))])
            continue
        out.append([policy, pk["setting"], _speed(pk),
                    with_ci(pk["recovery"], (pk.get("paired_vs_ar") or {}).get("recovery_ci")),
                    fmt(pk["recovery_bound"], ".3f"),
                    "–" if pk["recovery_bound"] is None else f"{max(0.0, 1 - pk['recovery_bound']):.3f}",
                    *_validation_cells(pk.get("validation"))])
    return out


def _validation_cells(v: dict | None) -> list[str]:
    """Speed vs ar, recovery [CI] and whether the budget held, on the validation split."""
    if not v:
        return ["–", "–", "–"]
    held = ("yes" if v["held"] else "**no**") + (", certified" if v.get("certified") else "")
    return [_speed(v), with_ci(v.get("recovery"), v.get("recovery_ci")), held]


HEADER = ["policy", "pick", "speed vs ar, tokens/s (time) (tuning)", "recovery, tuning [95% CI]", "lower bound",
          "certified within", "speed vs ar, tokens/s (time) (validation)", "recovery, validation [95% CI]", "budget held (validation)"]


def _words(x) -> str:
    return ", ".join(map(str, x)) if isinstance(x, (list, tuple)) else str(x)


def _commit(git) -> str:
    if isinstance(git, dict):
        return str(git.get("commit") or "?")[:10] + (" (dirty)" if git.get("dirty") else "")
    return str(git)


def report_markdown(record: dict) -> str:
    f = record["feasibility"]
    lines = [f"# specdec tune: {', '.join(record['policies_asked'])}", "",
             f"Budget: loss <= {record['max_quality_loss']:g} of plain decoding, certified by the one-sided "
             f"{record['confidence']:g} lower bound of the paired recovery (Bonett-Price). Dataset "
             f"{record['dataset']}: {len(record['tuning_samples'])} tuning problems (ar solves {f['ar_solved']}), "
             f"{len(record['validation_samples'])} validation problems; {record['max_new_tokens']} new tokens; "
             f"backend {record['backend']}; CPU {record['cpu']} (flags: {_words(record['cpu_flags'])}); "
             f"git {_commit(record['git'])}.", ""]
    if not f["certifiable"]:
        lines += [f["message"] + ".", ""]
    lines += ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(record)]
    lines += ["", "Speed: tokens/s over plain decoding's; in brackets, plain decoding's time over the setting's on "
              "the same problems (how much sooner the same problems finish: lower than the tokens/s ratio when "
              "the setting writes longer answers)."]
    lines += [""] + [f"- {p}: {d['why_none']}" for p, d in record["policies"].items() if d.get("why_none")]
    return "\n".join(lines).rstrip() + "\n"


def print_table(record: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(stderr=True)
    if not record["feasibility"]["certifiable"]:
        return
    t = Table(title="specdec tune", title_justify="left")
    for h in HEADER:
        t.add_column(h, justify="left" if h in ("policy", "pick") else "right")
    for row in table_rows(record):
        t.add_row(*(escape(x) for x in row))
    console.print(t)
