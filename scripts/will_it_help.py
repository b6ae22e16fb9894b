"""Write the README's "will it help me" tables and their picture from the benchmark folders.

    PYTHONPATH=src python scripts/will_it_help.py           # rewrite the tables in README.md and docs/will-it-help.png
    PYTHONPATH=src python scripts/will_it_help.py --check   # exit 1 when either is not what the folders give

scripts/will_it_help.json holds two lists of rows, each a machine kind, its state, the weights and
the configuration, with a column per workload (``columns``) and, per cell, the folder under
benchmarks/ it is read from; a cell left out is "not measured":

- ``measured``: timed runs only (cells ``bench``, ``plain``, ``agent``). A replayed or projected cell
  in a measured row is refused;
- ``replayed``: traces priced on cost tables (cells ``replay``, ``projection``), each row with the
  replay's own measured error (``error``: its text and the folder it comes from). A timed cell there
  is refused.

Every row carries its machine state (``costs``: the cost table measured on that machine in that
state): the one-token step the runs' speed probe read (the median of the records' ``step_ms``; a
row whose folders' probes differ by more than 25% says so), and what a 16-token pass of the target
cost in one-token steps on the table. Rows of one kind and target format whose probed steps differ
by more than 25% must carry different ``state`` labels (tests/test_figures.py), so that rows set
side by side are one run or one state. Kinds of cell:

- ``{"bench": FOLDER, "config": ID}``: a ``specdec bench`` folder's configuration against plain
  decoding: the time ratio with its 95% bootstrap interval over the prompts, as ``specdec bench
  --report-only --out benchmarks/FOLDER`` prints it (specdec's summary of the records, on the
  samples every configuration finished), plain decoding's tokens/s in parentheses, and the draft's
  format where it is not the shipped Q4_K_M. Where the bench withholds the figure (no prompt timed
  at plain decoding's machine speed) the cell says ``withheld``, never a number;
- ``{"plain": FOLDER}``: a folder that ran plain decoding only: its tokens/s;
- ``{"agent": FOLDER, "config": NAME}``: an agent-loop folder (``scripts/bench_agent_loop.py``):
  plain decoding's seconds over NAME's, interval over requests (the loop records no speed probe);
- ``{"replay": FOLDER/TRACES, "costs": FOLDER, "draft": NAME}``: the traces replayed with today's
  k=auto for draft NAME on the cost tables in ``costs`` (``specdec replay``): plain decoding's
  replayed seconds over k=auto's, with the same bootstrap interval over the prompts (the prompts'
  spread, not the replay's error); with ``"portfolio": true``, today's default (``drafter="auto"``:
  NAME, prompt lookup and suffix);
- ``{"projection": FOLDER, "traces": FILE, "draft": NAME}``: the k=auto figure of a
  ``projection.md`` (``scripts/gpu_projection.py project``) for those traces and draft; no interval.

Each row's ``kind`` must be the machine kind its folders recorded (tests/test_figures.py). The
picture embeds the figures it draws as JSON (the PNG text chunk ``figures``), so the check compares
tables, picture and folders without drawing; drawing needs matplotlib (the ``bench`` extra).
"""

from __future__ import annotations

import fnmatch
import json
import re
import struct
import sys
import zlib
from pathlib import Path

from benchmarks_index import folder_probe  # scripts/ is on the path of a script run from it

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SPEC = Path(__file__).with_suffix(".json")
README = ROOT / "README.md"
PICTURE = ROOT / "docs" / "will-it-help.png"
BEGIN, END = "<!-- will-it-help:", "<!-- /will-it-help -->"
MARK = (f"{BEGIN} written by `PYTHONPATH=src python scripts/will_it_help.py` from the folders named in "
        "scripts/will_it_help.json; edit that file and run it -->")
#: the draft format the bundled draft ships in (a cell names any other)
SHIPPED_DRAFT = "gguf:Q4_K_M"


def _records(folder: Path) -> list[dict]:
    from specdec.bench.outputs.results import ResultsFile

    return ResultsFile(folder).load(repair=False)


def _bench(cell: dict) -> dict:
    """A bench folder's configuration against ``ar``, through specdec's own summary."""
    from specdec.bench.outputs.summary import summarize

    records = _records(BENCH / cell["bench"])
    configs = list(dict.fromkeys(r["config"] for r in records))
    per_sample: dict[str, set] = {}
    for r in records:
        per_sample.setdefault(r["sample_id"], set()).add(r["config"])
    finished = [s for s, have in per_sample.items() if have >= set(configs)]   # as --report-only reports
    rows = summarize(records, [{"id": c, "kind": "specdec", "policy": c.split("/")[0].split("[")[0], "k": None}
                               for c in configs], finished)["configs"]
    row, ar = rows[cell["config"]], rows["ar"]
    drafts = {(r.get("dtypes") or {}).get("draft") for r in records if r["config"] == cell["config"]} - {None}
    out = {"how": "withheld" if row["speed_withheld"] else "measured", "plain_tps": _round(ar["tokens_per_second"]),
           "draft": None if drafts <= {SHIPPED_DRAFT} else "@" + ", @".join(sorted(d.split(":")[-1].lower() for d in drafts))}
    if not row["speed_withheld"]:
        out.update(ratio=_round(row["time_speedup_vs_ar"]), ci=_round(row["time_speedup_ci"]))
    return out


def _plain(cell: dict) -> dict:
    records = [r for r in _records(BENCH / cell["plain"]) if r["config"] == "ar"]
    from specdec.bench.outputs.summary import summarize

    row = summarize(records, [{"id": "ar", "kind": "specdec", "policy": "ar", "k": None}])["configs"]["ar"]
    return {"how": "plain only", "plain_tps": _round(row["tokens_per_second"])}


def _replay(cell: dict) -> dict:
    """The traces replayed with today's k=auto (as ``specdec replay`` does) for one draft."""
    from specdec.traces.runs import auto_k, read_tables
    from specdec.bench.outputs.summary import ratio_of_sums_ci
    from specdec.traces.replay import Clock, replay
    from specdec.traces.trace import read_traces

    head, traces = read_traces(str(BENCH / cell["replay"]))
    tables = read_tables([str(BENCH / cell["costs"])])
    draft, source = cell["draft"], cell["draft"].rsplit("|w", 1)[0]
    clock = Clock(tables[str(head["target"]).split("|")[0]], tables[source])
    prior = (head.get("priors") or {}).get(source)
    if cell.get("portfolio"):
        from specdec.traces.runs import replay_portfolio

        rows = replay_portfolio(traces, draft, clock.target, clock.draft, prior, stop_ids=head.get("stop_ids") or (),
                                clock=clock)["prompts"]
        plain, spec = [r["plain"] for r in rows], [r["auto"] for r in rows]
        return {"how": "replayed", "ratio": _round(sum(plain) / sum(spec)), "ci": _round(ratio_of_sums_ci(plain, spec))}
    auto = auto_k(clock.target, clock.draft, draft, prior=prior)
    plain = [replay(tr, None, None, clock).seconds for tr in traces]
    spec = [replay(tr, draft, auto, clock).seconds for tr in traces]
    return {"how": "replayed", "ratio": _round(sum(plain) / sum(spec)), "ci": _round(ratio_of_sums_ci(plain, spec))}


def _agent(cell: dict) -> dict:
    from specdec.bench.outputs.summary import ratio_of_sums_ci

    lines = (BENCH / cell["agent"] / "records.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(x) for x in lines if x.strip()]
    by = {c: {r["request"]: r for r in records if r["config"] == c} for c in ("ar", cell["config"])}
    requests = sorted(set(by["ar"]) & set(by[cell["config"]]))
    plain = [by["ar"][q]["seconds"] for q in requests]
    mine = [by[cell["config"]][q]["seconds"] for q in requests]
    tokens = sum(by["ar"][q]["completion_tokens"] for q in requests)
    return {"how": "measured", "ratio": _round(sum(plain) / sum(mine)), "ci": _round(ratio_of_sums_ci(plain, mine)),
            "plain_tps": _round(tokens / sum(plain))}


def _projection(cell: dict) -> dict:
    text = (BENCH / cell["projection"] / "projection.md").read_text(encoding="utf-8")
    for line in text.splitlines():
        m = re.match(r"\| (\S+) \| (.+?) \| [\d.]+ \| K=\d+ [\d.]+x \| ([\d.]+)x \|", line)
        if m and m.group(1) == cell["traces"] and m.group(2) == cell["draft"]:
            return {"how": "projected", "ratio": float(m.group(3))}
    raise SystemExit(f"{cell['projection']}/projection.md has no row for {cell['traces']}, {cell['draft']}")


READERS = {"bench": _bench, "plain": _plain, "agent": _agent, "replay": _replay, "projection": _projection}
#: the kinds of cell each table takes
MEASURED, REPLAYED = ("bench", "plain", "agent"), ("replay", "projection")
#: how far (max over min) the probed one-token steps of folders set side by side may differ unsaid
STATE_TOLERANCE = 1.25


def _round(x):
    if x is None:
        return None
    return [round(float(v), 6) for v in x] if isinstance(x, (list, tuple)) else round(float(x), 6)


def table_state(costs: str) -> dict:
    """The target's one-token step and its 16-token pass in one-token steps on a cost table file
    (a ``specdec calibrate --export`` file, or one cached table)."""
    data = json.loads((BENCH / costs).read_text(encoding="utf-8"))
    tables = data.get("tables") or [data]
    table = next((t for t in tables if t.get("role") == "target"), tables[0])
    seconds = dict(zip(table["widths"], table["seconds"]))
    return {"table_step_ms": round(seconds[1] * 1000, 1), "pass16_steps": round(seconds[16] / seconds[1], 2),
            "table": costs}


def row_state(row: dict) -> dict:
    """A row's machine state: its folders' probed one-token steps and its cost table's 16-token pass."""
    probes = {}
    for cell in row["cells"].values():
        name = cell.get("bench") or cell.get("plain")
        probe = folder_probe(BENCH / name) if name else None
        if probe:
            probes[name] = probe["step_ms"]
    state = {"label": row.get("state"), "probes": probes, **table_state(row["costs"])}
    if probes:
        state.update(step_ms=round(sorted(probes.values())[len(probes) // 2], 1),
                     spread=round(max(probes.values()) / min(probes.values()), 3))
    return state


def state_text(state: dict) -> str:
    """``N ms; 16 tokens: M steps``: the probed one-token step (a range, said to differ, where the
    row's runs differ by more than :data:`STATE_TOLERANCE`), else the table's."""
    probes = state["probes"]
    low, high = (min(probes.values()), max(probes.values())) if probes else (state["table_step_ms"],) * 2
    step = f"{_ms(low)}-{_ms(high)} ms" if _ms(low) != _ms(high) else f"{_ms(low)} ms"
    if not probes:
        step += " (table)"
    elif state["spread"] > STATE_TOLERANCE:
        step = f"runs differ: {step}"
    return f"{step}; 16 tokens: {state['pass16_steps']:.1f} steps"


def _ms(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def cell_folders(cell: dict) -> list[str]:
    """The folders (under benchmarks/) a cell is read from."""
    kind = next(k for k in READERS if k in cell)
    first = cell[kind].split("/")[0] if kind == "replay" else cell[kind]
    return [first, cell["costs"]] if kind == "replay" else [first]


def load_spec(path: Path = SPEC) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _row_figures(spec: dict, row: dict, table_name: str) -> dict:
    allowed = MEASURED if table_name == "measured" else REPLAYED
    cells = {}
    for col in spec["columns"]:
        cell = row["cells"].get(col)
        if cell is None:
            cells[col] = None
            continue
        kind = next(k for k in READERS if k in cell)
        if kind not in allowed:
            raise SystemExit(f"a {kind} cell ({row['machine']}, {row['weights']}, {col}) does not belong in "
                             f"the {table_name} table")
        cells[col] = READERS[kind](cell)
    folders = [f for c in row["cells"].values() for f in cell_folders(c)]
    folders = list(dict.fromkeys([*folders, row["costs"].split("/")[0], *row.get("error_folders", ())]))
    out = {"table": table_name, "machine": row["machine"], "kind": row["kind"], "weights": row["weights"],
           "cells": cells, "folders": folders, "state": row_state(row)}
    if table_name == "replayed":
        out["error"] = row["error"]
    return out


def figures(spec: dict) -> list[dict]:
    """Per row of both tables: its labels, kind, machine state, folders and each column's figure
    (None: not measured)."""
    return [_row_figures(spec, row, name) for name in ("measured", "replayed") for row in spec[name]]


def cell_text(fig: dict | None) -> str:
    if fig is None:
        return "not measured"
    how = fig["how"]
    if how == "plain only":
        return f"plain only ({fig['plain_tps']:.1f})"
    draft = f"; `{fig['draft']}` draft" if fig.get("draft") else ""
    if how == "withheld":
        return f"withheld ({fig['plain_tps']:.1f}{draft})"
    text = f"{fig['ratio']:.2f}x"
    if fig.get("ci"):
        text += f" [{fig['ci'][0]:.2f}, {fig['ci'][1]:.2f}]"
    if fig.get("plain_tps") is not None:
        text += f" ({fig['plain_tps']:.1f}{draft})"
    return text


def folders_text(folders: list[str]) -> str:
    """The row's folders, two that differ only in their middle written as one pattern."""
    every = [p.relative_to(BENCH).as_posix() for p in [*BENCH.iterdir(), *BENCH.glob("*/*")] if p.is_dir()]
    left, shown = list(folders), []
    while left:
        a = left.pop(0)
        for b in left:
            pre = len(_common(a, b))
            suf = len(_common(a[::-1], b[::-1]))
            pattern = f"{a[:pre]}*{a[len(a) - suf:]}" if pre + suf < min(len(a), len(b)) else None
            if pattern and pre and suf and set(fnmatch.filter(every, pattern)) == {a, b}:
                shown.append(pattern)
                left.remove(b)
                break
        else:
            shown.append(a)
    return ", ".join(f"`{s}`" for s in shown)


def _common(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _machine(f: dict) -> str:
    return f"{f['machine']}, {f['state']['label']}" if f["state"].get("label") else f["machine"]


def table(spec: dict, figs: list[dict]) -> str:
    """The README's two tables (measured; replayed and projected), between its markers."""
    titles = list(spec["columns"].values())
    head = " | ".join(titles)
    lines = [MARK, "", "Measured (timed runs):", "",
             f"| machine, state | weights, configuration | one-token step; 16-token pass | {head} | folders (`benchmarks/`) |",
             "|---|---|---|" + "---:|" * len(titles) + "---|"]
    for f in (f for f in figs if f["table"] == "measured"):
        cells = " | ".join(cell_text(f["cells"][c]) for c in spec["columns"])
        lines.append(f"| {_machine(f)} | {f['weights']} | {state_text(f['state'])} | {cells} | "
                     f"{folders_text(f['folders'])} |")
    lines += ["", "Replayed and projected (traces priced on cost tables: not timed runs):", "",
              f"| machine | weights, what is priced | one-token step; 16-token pass (table) | the replay's own error | "
              f"{head} | folders (`benchmarks/`) |",
              "|---|---|---|---|" + "---:|" * len(titles) + "---|"]
    for f in (f for f in figs if f["table"] == "replayed"):
        cells = " | ".join(cell_text(f["cells"][c]) for c in spec["columns"])
        lines.append(f"| {_machine(f)} | {f['weights']} | {state_text(f['state'])} | {f['error']} | {cells} | "
                     f"{folders_text(f['folders'])} |")
    return "\n".join([*lines, END])


def readme_table(text: str) -> str | None:
    start, end = text.find(BEGIN), text.find(END)
    return None if start < 0 or end < 0 else text[start:end + len(END)]


def picture_figures(path: Path | None = None) -> list | None:
    """The figures a picture (default :data:`PICTURE`) embeds, its PNG text chunk ``figures``;
    None without one."""
    path = PICTURE if path is None else path
    if not path.is_file():
        return None
    data = path.read_bytes()
    pos = 8
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + size]
        pos += 12 + size
        if kind == b"tEXt" and body.startswith(b"figures\0"):
            return json.loads(body[len(b"figures\0"):].decode("latin-1"))
        if kind == b"iTXt" and body.startswith(b"figures\0"):
            rest = body[len(b"figures\0"):]
            compressed, rest = rest[0], rest[2:]
            rest = rest.split(b"\0", 2)[2]   # language tag, translated keyword
            return json.loads(zlib.decompress(rest) if compressed else rest.decode("utf-8"))
    return None


def draw(spec: dict, figs: list[dict], path: Path | None = None) -> None:
    """Time against plain decoding per machine kind, weights, configuration and workload, intervals
    drawn; measured points filled, replayed and projected ones hollow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(f, col, f["cells"][col]) for f in figs for col in spec["columns"] if f["cells"][col] is not None]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(points) + 1.6))
    style = {"measured": ("o", "C0"), "replayed": ("D", "C1"), "projected": ("s", "C2")}
    shown = set()
    for y, (f, col, c) in enumerate(reversed(points)):
        label = f"{_short(_machine(f))}, {_short(f['weights']).split(':')[0]}: {spec['columns'][col]}"
        ax.text(0.0, y, label + "  ", ha="right", va="center", fontsize=8, transform=ax.get_yaxis_transform())
        above = points[len(points) - y][0] if y else None
        if above is not None and (f["kind"], f["table"]) != (above["kind"], above["table"]):
            ax.axhline(y - 0.5, color="0.85", lw=0.8)
        if c.get("ratio") is None:
            note = {"plain only": f"plain decoding only ({c.get('plain_tps') or 0:.1f} tokens/s)",
                    "withheld": "withheld: timed at another machine speed than plain decoding"}[c["how"]]
            ax.text(1.0, y, "  " + note, va="center", fontsize=8, color="0.35")
            continue
        marker, color = style[c["how"]]
        err = None if not c.get("ci") else [[c["ratio"] - c["ci"][0]], [c["ci"][1] - c["ratio"]]]
        ax.errorbar(c["ratio"], y, xerr=err, fmt=marker, color=color, capsize=3, mfc=color if c["how"] == "measured" else "white",
                    label=None if c["how"] in shown else {
                        "measured": "measured, 95% interval over prompts",
                        "replayed": "replayed on cost tables (interval: prompts only, not the replay's error)",
                        "projected": "projected on a GPU's pass costs (no interval)"}[c["how"]])
        shown.add(c["how"])
    ax.axvline(1.0, color="0.4", lw=1, ls="--")
    ax.set_yticks([])
    ax.set_ylim(-0.7, len(points) - 0.3)
    ax.set_xlabel("time of plain decoding / time of the row's configuration (above 1: sooner)")
    ax.set_title("Will speculation make my generation faster? (llama.cpp unless noted; bundled pair)", fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.savefig(PICTURE if path is None else path, dpi=110, bbox_inches="tight", metadata={"figures": json.dumps(figs, sort_keys=True)})
    plt.close(fig)


def _short(text: str) -> str:
    """A label without its markup and parenthesised details."""
    return re.sub(r"\s*\([^)]*\)|[`*]", "", text)


def main(argv: list[str]) -> int:
    spec = load_spec()
    figs = figures(spec)
    text = README.read_text(encoding="utf-8")
    want = table(spec, figs)
    if "--check" in argv:
        problems = []
        if readme_table(text) != want:
            problems.append("README.md's tables are not what the folders give")
        if picture_figures() != json.loads(json.dumps(figs, sort_keys=True)):
            problems.append(f"{PICTURE.name} does not draw what the folders give")
        for p in problems:
            print(f"{p}: run PYTHONPATH=src python scripts/will_it_help.py", file=sys.stderr)
        return 1 if problems else 0
    old = readme_table(text)
    if old is None:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    README.write_text(text.replace(old, want), encoding="utf-8")
    draw(spec, figs)
    print(f"wrote README.md's tables and {PICTURE.relative_to(ROOT)} ({len(figs)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
