"""Every folder under benchmarks/ is accepted by today's code.

- a ``specdec bench`` folder (``run.json``): its command (``run.json``'s migration command, else its
  last invocation with ``--out`` the folder) with ``--report-only --no-plots -q``, run on a copy,
  is not refused and reports what the committed summary says (same problems, quality, tau, speed);
- a ``specdec tune`` folder (``run.json`` in its stages): today's tune plans every problem each
  stage ran and computes the settings each stage's run.json stores (what its resume compares, the
  machine's keys aside), and ``specdec tune ... --status`` on a copy reports the stages;
- any other folder carries a README.md naming the command or script that made it, and any
  ``specdec bench`` command it prints parses and passes today's checks.

No model is loaded; the folders are copied, never written.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import shutil
from pathlib import Path

import pytest

from specdec.bench.running import command as bench_cli
from specdec.bench.tune import command as tune
from specdec.bench.tune.plan import plan_tune
from specdec.bench.running.options import run_settings
from specdec.bench.outputs.results import ResultsFile, _refuse_other_settings
from specdec.bench.tune.status import STAGES
from specdec.cli import main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
FOLDERS = sorted(p for p in BENCH.iterdir() if p.is_dir())
RUNS = [p.name for p in FOLDERS if (p / "run.json").is_file()]
TUNES = [p.name for p in FOLDERS if any((p / s / "run.json").is_file() for s in STAGES)]
OTHERS = [p.name for p in FOLDERS if p.name not in RUNS and p.name not in TUNES]


def _argv(command: list[str], out: Path | str, *extra: str) -> list[str]:
    argv = list(command)
    argv[argv.index("--out") + 1] = str(out)
    return [*argv, *extra]


def folder_command(folder: Path, name: str) -> list[str]:
    """The command ``folder``'s run.json records (what the bare ``--report-only`` reads), with
    ``--out`` the committed folder ``benchmarks/NAME``."""
    command = bench_cli.recorded_command(folder)
    assert command and "--out" in command, folder
    return _argv(command, f"benchmarks/{name}")


def parse_command(command: list[str]) -> argparse.Namespace:
    """``command`` parsed by today's ``specdec`` parser, as ``specdec bench``/``tune`` parse it."""
    parser = argparse.ArgumentParser(prog="specdec")
    sub = parser.add_subparsers(dest="command")
    bench_cli.register(sub)
    tune.register(sub)
    with contextlib.redirect_stderr(io.StringIO()):
        return parser.parse_args(command)


def check_tune_folder(tune_folder: Path, command: list[str]) -> None:
    """Today's tune, given ``command``, plans every problem each stage folder of ``tune_folder``
    holds and computes the settings its run.json stores, the machine's keys aside: what its resume
    compares, and what ``--status`` reports."""
    with contextlib.redirect_stderr(io.StringIO()):
        a = parse_command(_argv(command, tune_folder))
        plan = plan_tune(a)
    splits = {"proxy": (plan.proxy_set, plan.proxy_settings), "confirm": (plan.dataset, plan.settings),
              "validate": (plan.validation, plan.settings)}
    for stage in STAGES:
        folder = Path(tune_folder) / stage
        if not (folder / "run.json").is_file():
            continue
        dataset, settings = splits[stage]
        planned = {s.id for s in dataset.samples} if dataset is not None else set()
        ran = {r["sample_id"] for r in ResultsFile(folder).load(repair=False)}
        assert ran <= planned, (stage, sorted(ran - planned)[:3])
        stored = json.loads((folder / "run.json").read_text())["settings"]
        _refuse_other_settings(folder, stored, run_settings(a, settings, dataset, plan.env),
                               ignore=bench_cli.MACHINE_KEYS)


def test_the_folders_are_found():
    assert len(RUNS) >= 30 and len(TUNES) >= 6 and OTHERS


@pytest.mark.parametrize("name", RUNS)
def test_report_only_accepts_the_folder(name, tmp_path, monkeypatch, capsys):
    src = BENCH / name
    command = folder_command(src, name)
    assert command[0] == "bench", command
    copy = tmp_path / name
    shutil.copytree(src, copy)
    monkeypatch.chdir(ROOT)  # --config paths are the committed ones
    rc = main(_argv(command, copy, "--report-only", "--no-plots", "-q"))
    err = capsys.readouterr().err
    assert rc == 0, err
    old = json.loads((src / "summary.json").read_text())
    new = json.loads((copy / "summary.json").read_text())
    assert new["run"]["samples"] == old["run"]["samples"]
    assert list(new["configs"]) == list(old["configs"])
    for cid, row in old["configs"].items():
        for k in ("quality", "tau", "speedup_vs_ar", "recovery"):
            want = row.get(k)
            assert new["configs"][cid].get(k) == (want if want is None else pytest.approx(want, rel=1e-6)), (cid, k)


@pytest.mark.parametrize("name", RUNS)
def test_bare_report_only_reports_the_folder(name, tmp_path, monkeypatch, capsys):
    """``specdec bench --report-only --out FOLDER``, typed as a user would (no flag of the original
    command given again), re-reports a copy of the folder from the command its run.json records."""
    src = BENCH / name
    copy = tmp_path / name
    shutil.copytree(src, copy)
    monkeypatch.chdir(ROOT)  # --config paths are the committed ones
    rc = main(["bench", "--report-only", "--out", str(copy), "--no-plots", "-q"])
    err = capsys.readouterr().err
    assert rc == 0, err
    old = json.loads((src / "summary.json").read_text())
    new = json.loads((copy / "summary.json").read_text())
    assert new["run"]["samples"] == old["run"]["samples"]
    assert list(new["configs"]) == list(old["configs"])
    for cid, row in old["configs"].items():
        for k in ("quality", "tau", "speedup_vs_ar"):
            want = row.get(k)
            assert new["configs"][cid].get(k) == (want if want is None else pytest.approx(want, rel=1e-6)), (cid, k)


def test_bare_report_only_refuses_a_flag_that_disagrees(tmp_path, monkeypatch, capsys):
    """A flag typed beside the bare form must agree with run.json (as before); one that agrees is taken."""
    name = "humaneval20-128-avx2"   # transformers backend, 128 new tokens
    copy = tmp_path / name
    shutil.copytree(BENCH / name, copy)
    monkeypatch.chdir(ROOT)
    assert main(["bench", "--report-only", "--out", str(copy), "--no-plots", "-q", "--max-new-tokens", "64"]) == 2
    assert "different settings" in capsys.readouterr().err
    assert main(["bench", "--report-only", "--out", str(copy), "--no-plots", "-q", "--backend", "llama.cpp"]) == 2
    assert "backend" in capsys.readouterr().err
    assert main(["bench", "--report-only", "--out", str(copy), "--no-plots", "-q", "--max-new-tokens", "128"]) == 0
    assert main(["bench", "--report-only", "--out", str(copy), "--no-plots"]) == 0
    assert "settings its run.json records" in capsys.readouterr().err


def test_bare_report_only_on_a_tune_folder_points_to_status(tmp_path, monkeypatch, capsys):
    copy = tmp_path / "confirm"
    shutil.copytree(BENCH / "tune-readme-example-avx2" / "confirm", copy)
    assert main(["bench", "--report-only", "--out", str(copy), "-q"]) == 2
    assert "--status" in capsys.readouterr().err


@pytest.mark.parametrize("name", TUNES)
def test_tune_accepts_the_folder(name, tmp_path, monkeypatch, capsys):
    src = BENCH / name
    stages = [s for s in STAGES if (src / s / "run.json").is_file()]
    commands = {s: folder_command(src / s, name) for s in stages}
    command = commands[stages[-1]]
    assert all(c == command for c in commands.values()), commands
    assert command[0] == "tune", command
    copy = tmp_path / name
    shutil.copytree(src, copy)
    monkeypatch.chdir(ROOT)
    # --unsafe-exec: where this machine cannot isolate code; --status executes none, and the sandbox
    # label is a machine key
    command = [*command, "--unsafe-exec"]
    check_tune_folder(copy, command)
    rc = main(_argv(command, copy, "--status"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    for s in stages:
        assert f"## {s} (" in out, out


@pytest.mark.parametrize("name", OTHERS)
def test_other_folders_name_what_made_them(name, monkeypatch):
    from specdec.bench.running.command import parse_args

    readme = BENCH / name / "README.md"
    assert readme.is_file(), f"benchmarks/{name} has no run.json: its README.md must name what made it"
    text = readme.read_text()
    assert "scripts/" in text or "specdec " in text
    monkeypatch.chdir(ROOT)
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("specdec bench "):
            a = parse_command(shlex.split(line)[1:])
            parse_args(a)  # raises on a configuration today's code refuses


def _documented_runs() -> list[tuple[str, list[str]]]:
    """(where, argv) of every specdec bench/tune command printed in README.md and docs/*.md whose
    --out is a folder under benchmarks/."""
    from test_docs_commands import all_commands, argvs

    found = []
    for c in all_commands():
        for argv in argvs(c.text, ["bench", "tune"]):
            if argv[:1] in (["bench"], ["tune"]) and "--out" in argv:
                out = argv[argv.index("--out") + 1]
                if out.startswith("benchmarks/"):
                    found.append((c.where, argv))
    return found


DOCUMENTED = _documented_runs()


def test_documented_runs_are_found():
    assert len(DOCUMENTED) >= 15


@pytest.mark.parametrize("where,argv", DOCUMENTED, ids=[w for w, _ in DOCUMENTED])
def test_documented_command_names_its_folder(where, argv, tmp_path, monkeypatch, capsys):
    """A command printed beside a table re-reports its folder (bench: --report-only on a copy;
    tune: its settings and --status); a summary-only folder's command passes today's checks (it
    regenerates the folder)."""
    from specdec.bench.running.command import parse_args

    name = argv[argv.index("--out") + 1].split("/", 1)[1]
    if name.startswith("tune-P-"):  # the tune runs' template: each policy's folder
        for policy, folder in (("mars", "mars"), ("fly", "fly"), ("dropmatch", "dropmatch"), ("typical", "typical")):
            test_documented_command_names_its_folder(
                where, [policy if w == "lossless" else w.replace("tune-P-", f"tune-{folder}-") for w in argv],
                tmp_path / policy, monkeypatch, capsys)
        return
    src = BENCH / name
    assert src.is_dir(), f"{where}: --out {name} is no folder under benchmarks/"
    monkeypatch.chdir(ROOT)
    copy = tmp_path / name
    shutil.copytree(src, copy)
    if argv[0] == "tune":
        command = [*argv, "--unsafe-exec"]
        check_tune_folder(copy, command)
        assert main(_argv(command, copy, "--status")) == 0, capsys.readouterr().err
    elif (src / "run.json").is_file():
        rc = main(_argv(argv, copy, "--report-only", "--no-plots", "-q"))
        assert rc == 0, f"{where}: {capsys.readouterr().err}"
        assert json.loads((copy / "summary.json").read_text())["configs"].keys() == \
            json.loads((src / "summary.json").read_text())["configs"].keys()
    else:
        assert (src / "README.md").is_file()
        parse_args(parse_command(argv))


@pytest.mark.parametrize("time, want", [
    ("2026-11-25T21:55:17+0000", {"drafter": "model"}),   # before the portfolio became the default
    ("2026-11-27T12:00:00+0000", {}),
    (1795780694, {}), (["2026"], {}), (None, {}),          # a malformed time changes nothing, raises nothing
])
def test_a_recorded_command_runs_under_the_defaults_of_its_time(tmp_path, time, want):
    run = {"invocations": [{"argv": ["bench", "--out", "x"], "time": time}]}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert bench_cli.recorded_defaults(tmp_path) == want
    (tmp_path / "run.json").write_text("[1, 2]")            # not an object: no record, no default
    assert bench_cli.recorded_defaults(tmp_path) == {}
