"""Every figure the README shows comes from a folder, and every folder's machine label is what it recorded.

- the "will it help me" tables in README.md and the figures docs/will-it-help.png draws (embedded
  in it as JSON) are what scripts/will_it_help.py computes from the folders today: a changed
  record, summary or replay fails here until the script is run again;
- every paragraph, list item or table row of README.md that holds a figure (a decimal number, a
  ratio, "N of M", minutes) names a folder under benchmarks/ (``benchmarks/NAME`` or a backticked
  name or pattern of one), or says it is "not from a folder";
- a folder's machine label (the kind its name ends in, its row in benchmarks/README.md, the README
  table row it feeds) is the kind its recorded CPU flags (or GPU) give;
- machine states: a table row of README.md or docs/*.md that cites folders of one target format whose
  recorded one-token steps (the bench's speed probe) differ by more than 25% says that they differ;
  rows of the README's measured table set side by side are one state;
- replayed and projected figures stay out of measured columns, and are never bold.

No model is loaded; the folders are read, never written.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT / "scripts"))

import benchmarks_index as index  # noqa: E402
import will_it_help  # noqa: E402

#: a figure in prose: a decimal number or ratio (not a version, a name like Qwen2.5 or an approximate
#: ~1.5 GB), "19 of 20", or minutes
FIGURE = re.compile(r"(?<![\w.~@/-])\d+\.\d+x?(?![\w.])|\b\d+ min\b|\b\d+ of \d+\b")


def folder_names() -> list[str]:
    return [p.relative_to(BENCH).as_posix() for p in [*BENCH.iterdir(), *BENCH.glob("*/*")] if p.is_dir()]


def blocks(markdown: str) -> list[str]:
    """Paragraphs, list items and table rows, without code blocks and HTML comments."""
    text = re.sub(r"<!--.*?-->", "", markdown, flags=re.S)
    text = re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)
    out, current = [], []
    for line in text.splitlines():
        if not line.strip() or line.startswith(("- ", "|", "#")):
            if current:
                out.append("\n".join(current))
            current = [line] if line.strip() else []
        else:
            current.append(line)
    return out + (["\n".join(current)] if current else [])


def unsourced_figures(markdown: str, names: list[str]) -> list[str]:
    """The blocks of ``markdown`` that hold a figure and name no folder of ``names``."""
    bad = []
    for block in blocks(markdown):
        prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", block))
        if not FIGURE.search(prose) or "not from a folder" in block:
            continue
        spans = [s.removeprefix("benchmarks/").rstrip("/") for s in re.findall(r"`([^`]+)`", block)]
        paths = [p.removeprefix("benchmarks/").rstrip("/") for p in re.findall(r"benchmarks/[\w.*/-]+", block)]
        if not any(fnmatch.filter(names, s) for s in [*spans, *paths]):
            bad.append(" ".join(block.split())[:160])
    return bad


def label_problems(folder: Path) -> list[str]:
    """Where ``folder``'s name or index row says another machine kind than its records."""
    recorded = index.recorded_kind(folder)
    if recorded is None:
        return []
    problems = [f"{folder.name}: named {suffix}, recorded {recorded}" for suffix, kind in index.NAME_KINDS.items()
                if (folder.name.endswith(suffix) or f"{suffix}-" in folder.name) and kind != recorded]
    row = next((line for line in (BENCH / "README.md").read_text(encoding="utf-8").splitlines()
                if line.startswith(f"| [`{folder.name}`]")), None)
    if folder.parent == BENCH and row is not None and row.split(" | ")[3] != recorded:
        problems.append(f"{folder.name}: the index says {row.split(' | ')[3]!r}, recorded {recorded}")
    return problems


def test_the_readme_table_and_picture_are_what_the_folders_give():
    spec = will_it_help.load_spec()
    figs = will_it_help.figures(spec)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert will_it_help.readme_table(readme) == will_it_help.table(spec, figs), \
        "README.md's table is stale: run PYTHONPATH=src python scripts/will_it_help.py"
    assert will_it_help.picture_figures() == json.loads(json.dumps(figs, sort_keys=True)), \
        "docs/will-it-help.png is stale: run PYTHONPATH=src python scripts/will_it_help.py"
    assert f"![" in readme and "(docs/will-it-help.png)" in readme


def test_the_table_shows_a_withheld_figure_as_withheld():
    figs = will_it_help.figures(will_it_help.load_spec())
    xeon = next(f for f in figs if f["kind"] == index.XEON_AMX)
    assert xeon["cells"]["code"]["how"] == "withheld" and "ratio" not in xeon["cells"]["code"]
    assert will_it_help.cell_text(xeon["cells"]["code"]).startswith("withheld")
    assert "1.28x" not in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_check_fails_on_a_stale_table(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    cell = will_it_help.readme_table(text)
    readme.write_text(text.replace(cell, cell.replace("| 1.11x [", "| 1.12x [", 1)), encoding="utf-8")
    monkeypatch.setattr(will_it_help, "README", readme)
    assert will_it_help.main(["--check"]) == 1
    assert "README.md's tables are not what the folders give" in capsys.readouterr().err
    monkeypatch.setattr(will_it_help, "PICTURE", tmp_path / "none.png")
    readme.write_text(text, encoding="utf-8")
    assert will_it_help.main(["--check"]) == 1
    assert "does not draw what the folders give" in capsys.readouterr().err


def test_every_readme_figure_names_its_folder():
    assert unsourced_figures((ROOT / "README.md").read_text(encoding="utf-8"), folder_names()) == []


def test_a_figure_without_a_folder_is_caught():
    names = folder_names()
    assert unsourced_figures("It ran 1.28x sooner on a Xeon.\n", names)
    assert unsourced_figures("- lossless matched plain on 19 of 20 answers\n", names)
    assert not unsourced_figures("It ran 1.28x sooner (`replay-xeon-amx`).\n", names)
    assert not unsourced_figures("It took 9 min, timed by hand (not from a folder).\n", names)
    assert not unsourced_figures("Qwen2.5-Coder 1.5B, `torch==2.13.0`, ~1.5 GB, Apache-2.0.\n", names)
    assert unsourced_figures("It ran 1.28x sooner (`no-such-folder`).\n", names)


def test_every_folder_label_is_what_its_flags_record():
    folders = [p for p in [*BENCH.iterdir(), *BENCH.glob("*/*")] if p.is_dir() and p.name != "exports"]
    recorded = {f.name: index.recorded_kind(f) for f in folders}
    assert sum(k is not None for k in recorded.values()) >= 60
    assert recorded["replay-xeon-amx"] == index.XEON_AMX and recorded["gpu-projection-h100"] == index.H100
    assert [p for f in folders for p in label_problems(f)] == []


def test_every_readme_table_row_is_of_the_kind_its_folders_record():
    spec = will_it_help.load_spec()
    for row in spec["measured"] + spec["replayed"]:
        assert index.recorded_kind(BENCH / row["costs"].split("/")[0]) in (None, row["kind"]), row["costs"]
        for cell in row["cells"].values():
            for name in will_it_help.cell_folders(cell):
                kind = index.recorded_kind(BENCH / name)
                assert kind in (None, row["kind"]), (row["machine"], row["weights"], name, kind)
    kinds = {row["kind"] for row in spec["measured"] + spec["replayed"]}
    assert kinds == {index.AVX2, index.AVX512, index.XEON_AMX, index.XEON, "GPU: NVIDIA H200"}


def test_a_mislabelled_folder_is_caught(tmp_path, monkeypatch):
    folder = tmp_path / "runs-avx512bf16"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"settings": {"cpu_flags": ["avx2", "avx512_bf16", "amx_bf16"]}}))
    assert label_problems(folder) == [f"runs-avx512bf16: named -avx512bf16, recorded {index.XEON_AMX}"]
    gpu = tmp_path / "costs-h100"
    shutil.copytree(BENCH / "gpu-projection-h100", gpu)
    assert label_problems(gpu) == []


# -- machine states ----------------------------------------------------------------------------------

def cited_folders(text: str, names: list[str]) -> list[str]:
    """The folders a piece of markdown names: backticked names or patterns, and benchmarks/ paths."""
    spans = [s.removeprefix("benchmarks/").rstrip("/") for s in re.findall(r"`([^`]+)`", text)]
    paths = [p.removeprefix("benchmarks/").rstrip("/") for p in re.findall(r"benchmarks/[\w.*/-]+", text)]
    return list(dict.fromkeys(f for s in [*spans, *paths] for f in fnmatch.filter(names, s)))


def state_problems(markdown: str, names: list[str]) -> list[str]:
    """Table rows that cite folders of one target format whose probed one-token steps differ by more
    than will_it_help.STATE_TOLERANCE and do not say that they differ."""
    bad = []
    for line in markdown.splitlines():
        if not line.startswith("|"):
            continue
        by_format: dict[str, dict[str, float]] = {}
        for name in cited_folders(line, names):
            probe = will_it_help.folder_probe(BENCH / name)
            if probe:
                by_format.setdefault(probe["target"], {})[name] = probe["step_ms"]
        for steps in by_format.values():
            if len(steps) > 1 and max(steps.values()) / min(steps.values()) > will_it_help.STATE_TOLERANCE \
                    and "differ" not in line:
                bad.append(f"{line[:100]}...: {steps}")
    return bad


def docs_with_tables() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_table_row_citing_runs_of_two_machine_states_says_so():
    names = folder_names()
    bad = [f"{doc.name}: {p}" for doc in docs_with_tables()
           for p in state_problems(doc.read_text(encoding="utf-8"), names)]
    assert bad == []


def test_a_row_mixing_machine_states_unsaid_is_caught():
    names = folder_names()
    # the same 4-bit file probed at 36 ms a step (2026-11-25) and at 71 ms (2026-11-27)
    row = "| 4-bit | 1.00x | 1.01x | `cpu-formats-humaneval20-256-q4_k_m-avx2`, `free-drafts-humaneval20-256-q4_k_m-avx2` |"
    assert state_problems(row, names)
    assert not state_problems(row.replace("| 4-bit |", "| 4-bit (machine states differ) |"), names)
    # different target formats are different steps, not different states
    assert not state_problems("| `cpu-formats-humaneval20-256-q4_k_m-avx2`, `cpu-formats-humaneval20-256-bf16-avx2` |", names)


def test_each_readme_row_carries_its_machine_state():
    spec = will_it_help.load_spec()
    figs = will_it_help.figures(spec)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for f in figs:
        text = will_it_help.state_text(f["state"])
        assert "16 tokens:" in text and " ms" in text
        assert f"| {text} |" in readme
    assert all(row.get("state") for row in spec["measured"])


def test_measured_rows_set_side_by_side_are_one_state():
    """Measured rows of one kind and target format share a state label only when their probed steps
    agree within the tolerance, and rows whose steps do not agree carry different labels."""
    figs = [f for f in will_it_help.figures(will_it_help.load_spec()) if f["table"] == "measured"]
    probed = []
    for f in figs:
        for name, step in f["state"]["probes"].items():
            probed.append((f["kind"], will_it_help.folder_probe(BENCH / name)["target"], f["state"]["label"], step, name))
    for kind, target, label, step, name in probed:
        for kind2, target2, label2, step2, name2 in probed:
            if (kind, target) != (kind2, target2) or name == name2:
                continue
            apart = max(step, step2) / min(step, step2) > will_it_help.STATE_TOLERANCE
            same_row = any(name in f["state"]["probes"] and name2 in f["state"]["probes"] for f in figs)
            if apart and not same_row:
                assert label != label2, (name, step, name2, step2, label)


def test_the_default_and_the_draft_model_rows_on_the_shipped_file_are_two_states():
    figs = [f for f in will_it_help.figures(will_it_help.load_spec()) if f["table"] == "measured"]
    default = next(f for f in figs if "today's default" in f["weights"] and f["kind"] == index.AVX2)
    model = next(f for f in figs if f["weights"].startswith("4-bit (as shipped), draft model") and f["kind"] == index.AVX2)
    assert default["state"]["label"] != model["state"]["label"]
    assert default["state"]["step_ms"] / model["state"]["step_ms"] > will_it_help.STATE_TOLERANCE


# -- replayed figures apart from timed ones ----------------------------------------------------------

REPLAYED_WORDS = ("replay", "project", "oracle", "fitted")


def _row_is_replayed(cells: list[str]) -> bool:
    """A row whose label cells (those without a figure; folder names left out) say replayed or projected."""
    labels = [re.sub(r"`[^`]*`", "", c).lower() for c in cells if not re.search(r"\d\.\d+x", c)]
    return any(w in label for label in labels for w in ("replayed", "projected"))


def _table_rows(markdown: str):
    """Each table's header (lowercased) and body rows, as cells."""
    header, rows = None, []
    for line in [*markdown.splitlines(), ""]:
        if not line.startswith("|"):
            if header is not None:
                yield header, rows
            header, rows = None, []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
        elif not set(line) <= set("|-: "):
            rows.append(cells)


def replayed_problems(markdown: str) -> list[str]:
    """Bold figures in a replayed or projected column or row, replayed cells in a measured column,
    and replayed rows sharing a column of figures with timed rows."""
    bad = []
    for header, rows in _table_rows(markdown):
        kinds = {_row_is_replayed(cells) for cells in rows if any(re.search(r"\d\.\d+x", c) for c in cells[1:])}
        columns_say = any(w in title for title in header for w in ("replay", "project", "measured"))
        if kinds == {True, False} and not columns_say:
            bad.append(f"replayed and timed rows in one table under {' | '.join(header)[:80]}")
        for cells in rows:
            bad += _cell_problems(header, cells)
    return bad


def _cell_problems(header: list[str], cells: list[str]) -> list[str]:
    bad, line = [], " | ".join(cells)
    row_replayed = _row_is_replayed(cells) or any(w in cells[0].lower() for w in REPLAYED_WORDS)
    for title, cell in zip(header, cells):
        replayed_col = any(w in title for w in REPLAYED_WORDS)
        if (replayed_col or row_replayed) and re.search(r"\*\*[^*]*\d\.\d+x?[^*]*\*\*", cell):
            bad.append(f"bold replayed figure {cell!r} in {line[:80]}")
        if "measured" in title and not replayed_col and any(w in cell.lower() for w in ("replayed", "projected")):
            bad.append(f"replayed figure {cell!r} in a measured column of {line[:80]}")
    return bad


def test_no_replayed_figure_is_bold_or_in_a_measured_column():
    bad = [f"{doc.name}: {p}" for doc in docs_with_tables() for p in replayed_problems(doc.read_text(encoding="utf-8"))]
    assert bad == []


def test_a_replayed_figure_made_to_look_measured_is_caught():
    table = "| workload | default, measured | replayed: suffix alone |\n|---|---:|---:|\n"
    assert replayed_problems(table + "| agent loop | 1.11x | **1.48x** |\n")
    assert replayed_problems(table + "| agent loop | 1.48x (replayed) | 1.48x |\n")
    assert replayed_problems("| what | HumanEval |\n|---|---:|\n| *replayed*: k=auto | **1.48x** |\n")
    assert not replayed_problems(table + "| agent loop | **1.11x** [0.98, 1.23] | 1.48x |\n")
    # a replayed row in a table of timed rows (the README's table before it was split)
    mixed = ("| machine | weights | code answers |\n|---|---|---:|\n| CPU | 16-bit | 1.11x [1.04, 1.19] |\n"
             "| CPU | 16-bit, *replayed*: k=auto | 1.48x [1.35, 1.60] |\n")
    assert replayed_problems(mixed)
    assert not replayed_problems(mixed.replace("| CPU | 16-bit | 1.11x [1.04, 1.19] |\n", ""))


def test_the_generator_refuses_a_replayed_cell_in_the_measured_table():
    spec = will_it_help.load_spec()
    replayed = spec["replayed"][0]
    moved = {**spec, "measured": [{**replayed, "state": "x"}], "replayed": []}
    with pytest.raises(SystemExit, match="does not belong in the measured table"):
        will_it_help.figures(moved)
    timed = {**spec, "measured": [], "replayed": [{**spec["measured"][0], "error": "-"}]}
    with pytest.raises(SystemExit, match="does not belong in the replayed table"):
        will_it_help.figures(timed)
