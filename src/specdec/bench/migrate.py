"""Bring a results folder written by an older specdec up to today's ``run.json``, so that the
command that made it (``specdec bench ... --report-only``, a resume, ``specdec tune ... --status``)
is accepted again: ``python -m specdec.bench.migrate FOLDER...`` (``--dry-run`` to only say what
it would do).

A folder is refused by today's code when its ``run.json`` lacks a setting today's code records, or
holds verdicts of an older scorer (:data:`specdec.bench.quality.SCORER_VERSION`). Migration:

- **fills a missing setting with what the run ran**, only where that is provable: ``backend`` is
  ``transformers`` when the key is missing, because the key came with the second backend (commit
  :data:`BACKEND_COMMIT`, llama.cpp); before it transformers was the only one (where git knows the
  run's commit, that it predates :data:`BACKEND_COMMIT` is checked too). ``cpu_flags`` comes from the
  run's own ``summary.json`` (its environment). A setting that cannot be told from the folder
  (``draft_dtype`` of a run older than the flag) is not invented: the folder is refused, naming it;
- **re-scores every record from its stored text** with today's scorer (HumanEval: the tests in
  today's sandbox; Spec-Bench math: the final answer; JSON: the schema), then sets ``scorer`` and
  ``sandbox`` (the isolation those verdicts were made under). Every verdict that changed is
  listed (key, before, after);
- **records the migration** in ``run.json`` (``migrations``: time, git commit, what was filled and
  why, records re-scored, verdicts changed, and ``command``: today's argv that re-reports or
  resumes the folder, ``--out`` its committed path, renamed ``--config`` files at their committed
  paths, ``--backend`` as it ran). ``invocations`` stay as they were (the history);
- checks that the command's settings now match the folder's (the check ``--report-only`` and a
  resume make, the machine's keys aside), then rewrites ``summary.json``/``report.md`` (and the
  plots the folder had, where matplotlib is installed) from the re-scored records, keeping the
  environment and models the original run recorded. A tune's stage folders (``proxy``,
  ``confirm``, ``validate``) are re-scored and recorded the same way; their report is ``specdec
  tune ... --status`` (a tune's ``tune.json`` is written once, at the end of a run).

A folder without ``results.jsonl`` (only a summary was kept) cannot be re-scored: it is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import SpecdecError
from .results import RESULTS, RUN, _refuse_other_settings, atomic_write_text, line_problem, lock_out

#: the commit that added the ``backend`` setting together with the second backend (llama.cpp):
#: a run.json without the key was written by code that had transformers only
BACKEND_COMMIT = "841b14450949b38baeec4f81006a37a591291b69"
TUNE_STAGES = ("proxy", "confirm", "validate")
#: per-configuration figures compared before and after a migration
FIGURES = ("quality", "recovery", "speedup_vs_ar", "time_speedup_vs_ar", "tau")


def read_run(folder: Path) -> dict:
    try:
        return json.loads((Path(folder) / RUN).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"{Path(folder) / RUN} is unreadable: {exc}") from None


def bench_root(folder: Path) -> Path | None:
    """The nearest folder named ``benchmarks`` that holds ``folder`` (None when none does)."""
    for p in [Path(folder).resolve(), *Path(folder).resolve().parents]:
        if p.name == "benchmarks":
            return p
    return None


def committed_path(folder: Path) -> str:
    """``benchmarks/NAME[/STAGE]``: the folder's path in the repository (as given when it is not
    under a ``benchmarks`` folder)."""
    root = bench_root(folder)
    if root is None:
        return str(folder)
    return (Path("benchmarks") / Path(folder).resolve().relative_to(root)).as_posix()


def is_tune_stage(folder: Path, run: dict | None = None) -> bool:
    run = run if run is not None else read_run(folder)
    argv = (run.get("invocations") or [{}])[-1].get("argv") or []
    return Path(folder).name in TUNE_STAGES and argv[:1] == ["tune"]


def _out_of(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--out" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--out="):
            return arg.split("=", 1)[1]
    return None


def _under_benchmarks(path: str) -> str:
    """``.../benchmarks/X`` -> ``benchmarks/X`` (other paths as they are)."""
    parts = Path(path).parts
    if "benchmarks" in parts:
        return Path(*parts[parts.index("benchmarks"):]).as_posix()
    return Path(path).as_posix()


def renamed_outs(root: Path) -> dict[str, str]:
    """Every ``--out`` an invocation under ``root`` wrote to (from ``benchmarks/`` on) -> the
    committed path of the folder it is now (a tune's stage -> its tune folder)."""
    found: dict[str, str] = {}
    for run_path in sorted(Path(root).rglob(RUN)):
        folder = run_path.parent
        try:
            run = read_run(folder)
        except SpecdecError:
            continue
        target = folder.parent if is_tune_stage(folder, run) else folder
        for inv in run.get("invocations") or []:
            out = _out_of(list(inv.get("argv") or []))
            if out:
                found.setdefault(_under_benchmarks(out), committed_path(target))
    return found


def canonical_command(folder: Path, run: dict | None = None, renames: dict[str, str] | None = None,
                      backend: str | None = None) -> list[str]:
    """Today's argv that names the run in ``folder``: the last invocation's, with ``--out`` the
    folder's committed path (its tune folder for a stage), ``--config`` files at their committed
    paths (``renames``: :func:`renamed_outs`), and ``--backend BACKEND`` added when given. A
    migrated folder's is stored in run.json (``migrations[-1].command``) and returned as is."""
    run = run if run is not None else read_run(folder)
    migrations = run.get("migrations") or []
    if migrations and migrations[-1].get("command"):
        return list(migrations[-1]["command"])
    argv = list((run.get("invocations") or [{}])[-1].get("argv") or [])
    if not argv:
        raise SpecdecError(f"{Path(folder) / RUN} records no invocation")
    out = committed_path(Path(folder).parent if is_tune_stage(folder, run) else folder)
    renames = renames or {}
    fixed: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--out", "--config") and i + 1 < len(argv):
            value = argv[i + 1]
            if arg == "--out":
                value = out
            else:
                value = _renamed_config(value, renames)
            fixed += [arg, value]
            i += 2
            continue
        fixed.append(arg)
        i += 1
    if backend is not None and "--backend" not in fixed:
        fixed[1:1] = ["--backend", backend]
    return fixed


def _renamed_config(path: str, renames: dict[str, str]) -> str:
    p = _under_benchmarks(path)
    for old, new in sorted(renames.items(), key=lambda kv: -len(kv[0])):
        if p == old or p.startswith(old + "/"):
            return new + p[len(old):]
    return p


def _ordered_ids(results: Path) -> list[str]:
    ids: dict[str, None] = {}
    from .results import ResultsFile

    for r in ResultsFile(results.parent).load(repair=False):
        ids.setdefault(r["sample_id"], None)
    return list(ids)


def tune_selection(command: list[str], tune_folder: Path) -> list[str]:
    """``command`` (a tune's) with ``--samples A..B`` added or replaced where today's default
    split would select other problems than the tune's confirm stage ran (the default split
    changed since the older tunes: they ran HumanEval/100..107 with ``--limit 8``)."""
    from .datasets import load_dataset
    from .tune import _plan_tune

    confirm = Path(tune_folder) / "confirm" / RESULTS
    if not confirm.is_file():
        return command
    ran = _ordered_ids(confirm)
    with contextlib.redirect_stderr(io.StringIO()):
        a = parse_command(_with_out(command, str(tune_folder)))
        today = {s.id for s in _plan_tune(a).dataset.samples}
    if not ran or set(ran) <= today:
        return command
    full = load_dataset(a.dataset, None, a.data, None)
    pos = {s.id: i for i, s in enumerate(full.samples)}
    if any(i not in pos for i in ran):
        raise SpecdecError(f"{tune_folder}: the confirm stage ran problems that {a.dataset!r} does not hold today")
    p = sorted(pos[i] for i in ran)
    if p != list(range(p[0], p[-1] + 1)):
        raise SpecdecError(f"{tune_folder}: the confirm stage ran problems that no --samples range selects")
    argv, i = [], 0
    while i < len(command):
        if command[i] == "--samples":
            i += 2
            continue
        argv.append(command[i])
        i += 1
    out = argv.index("--out")
    return [*argv[:out], "--samples", f"{p[0]}..{p[-1]}", *argv[out:]]


def check_tune_folder(tune_folder: Path, command: list[str]) -> None:
    """Refuse (one line) unless today's tune, given ``command``, plans every problem each stage
    folder of ``tune_folder`` holds and computes the settings its run.json stores (the machine's
    keys aside): what its resume compares, and what ``--status`` reports."""
    from .cli import MACHINE_KEYS
    from .tune import _plan_tune

    with contextlib.redirect_stderr(io.StringIO()):
        a = parse_command(_with_out(command, str(tune_folder)))
        plan = _plan_tune(a)
    splits = {"proxy": plan.proxy_set, "confirm": plan.dataset, "validate": plan.validation}
    for stage in TUNE_STAGES:
        folder = Path(tune_folder) / stage
        if not (folder / RUN).is_file():
            continue
        planned = {s.id for s in splits[stage].samples} if splits[stage] is not None else set()
        missing = [i for i in _ordered_ids(folder / RESULTS) if i not in planned]
        if missing:
            raise SpecdecError(f"{folder}: today's command plans no {', '.join(missing[:3])} for the {stage} stage "
                               f"({len(missing)} problem(s) it ran)")
        stored = read_run(folder)["settings"]
        _refuse_other_settings(folder, stored, today_settings(a, stage), ignore=MACHINE_KEYS,
                               hint="today's tune would refuse to resume it")


def _git_contains(commit: str, ancestor: str) -> bool | None:
    """Whether ``commit`` includes ``ancestor`` (None when git cannot tell)."""
    repo = Path(__file__).resolve().parents[3]
    try:
        r = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", ancestor, commit],
                           capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return {0: True, 1: False}.get(r.returncode)


def fill_missing(folder: Path, settings: dict, invocations: list) -> dict[str, dict]:
    """The settings a run.json lacks, filled with what the run ran: ``{key: {"value", "why"}}``;
    refuses (naming the key) where the folder cannot tell."""
    filled: dict[str, dict] = {}
    if "backend" not in settings:
        commits = sorted({(inv.get("git") or {}).get("commit") for inv in invocations} - {None})
        later = [c for c in commits if _git_contains(c, BACKEND_COMMIT)]
        if later:
            raise SpecdecError(f"{folder}: run.json has no backend, yet it was written at {later[0][:10]}, which has "
                               f"the backend setting ({BACKEND_COMMIT[:10]}); not migrated")
        checked = [c for c in commits if _git_contains(c, BACKEND_COMMIT) is False]
        filled["backend"] = {
            "value": "transformers",
            "why": f"the backend setting came with the second backend (llama.cpp, {BACKEND_COMMIT[:10]}); before it "
                   "transformers was the only one" + (f" (git: {', '.join(c[:10] for c in checked)} predate it)"
                                                      if checked else "")}
    summary = _read_summary(folder)
    if "cpu_flags" not in settings:
        flags = ((summary or {}).get("environment") or {}).get("hardware", {}).get("cpu_flags")
        if flags is None:
            raise SpecdecError(f"{folder}: run.json has no cpu_flags and summary.json does not record them; not migrated")
        filled["cpu_flags"] = {"value": flags, "why": "summary.json's environment (the run's own record)"}
    for key in ("draft_dtype",):
        if key not in settings:
            raise SpecdecError(f"{folder}: run.json has no {key} and the folder cannot tell what was asked; not "
                               "migrated (regenerate it)")
    return filled


def _read_summary(folder: Path) -> dict | None:
    try:
        return json.loads((Path(folder) / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def parse_command(command: list[str]) -> argparse.Namespace:
    """``command`` parsed by today's ``specdec`` parser (one line when it does not parse)."""
    from . import cli, tune

    parser = argparse.ArgumentParser(prog="specdec")
    sub = parser.add_subparsers(dest="command")
    cli.register(sub)  # the two commands that write run folders, as `specdec` parses them
    tune.register(sub)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(command)
    except SystemExit:
        raise SpecdecError(f"today's parser refuses {' '.join(command)!r}: {err.getvalue().strip()[-300:]}") from None


def verdict(quality: dict | None) -> Any:
    """The one verdict a quality dict carries (passed / correct / json_valid), None when none."""
    q = quality or {}
    for key in ("passed", "correct", "json_valid"):
        if key in q:
            return q[key]
    return None


def rescore(folder: Path, a: argparse.Namespace, unsafe: bool = False, progress: bool = True
            ) -> tuple[list[str], list[dict], int, str | None]:
    """Today's verdict for every record of ``folder`` from its stored text: (the results lines
    rewritten, the verdicts that changed, records scored, the sandbox label or None)."""
    from .datasets import load_dataset
    from .options import parse_float, sandbox_setting
    from .quality import Scorer
    from .configs import parse_int

    dataset = load_dataset(a.dataset, None, a.data, None)
    by_id = {s.id: s for s in dataset.samples}
    scorer = Scorer(timeout=parse_float(a.sandbox_timeout, "--sandbox-timeout"),
                    memory_mb=parse_int(a.sandbox_memory_mb, "--sandbox-memory-mb", 64), unsafe=unsafe)
    raw = (Path(folder) / RESULTS).read_text(encoding="utf-8").split("\n")
    lines, changed, scored = [], [], 0
    todo = sum(1 for line in raw if line.strip())
    for line in raw:
        if not line.strip():
            continue
        rec = json.loads(line)
        if line_problem(rec) is not None:
            lines.append(line)  # left as it is: the loader discards it, as before
            continue
        sample = by_id.get(rec["sample_id"])
        if sample is None:
            raise SpecdecError(f"{folder}: sample {rec['sample_id']!r} is not in {a.dataset!r} today; not migrated")
        new = scorer.score(sample, rec["text"], rec.get("finish_reason"))
        scored += 1
        if progress and scored % 50 == 0:
            print(f"specdec migrate: {folder}: {scored}/{todo} scored", file=sys.stderr, flush=True)
        if verdict(new) != verdict(rec["quality"]):
            changed.append({"key": rec["key"], "before": verdict(rec["quality"]), "after": verdict(new),
                            "status": new.get("exec_status")})
        rec["quality"] = new
        lines.append(json.dumps(rec, ensure_ascii=False, allow_nan=False, default=str))
    sandbox = sandbox_setting(dataset, unsafe) if any(s.kind == "code" for s in dataset.samples) else None
    return lines, changed, scored, sandbox


def today_settings(a: argparse.Namespace, stage: str | None = None) -> dict:
    """The settings today's code computes for the command ``a`` (a bench, or one stage of a
    tune): what ``--report-only`` and a resume compare with run.json."""
    from . import environment
    from .options import run_settings

    if a.command == "tune":
        from .tune import _plan_tune

        plan = _plan_tune(a)
        dataset, settings = {"proxy": (plan.proxy_set, plan.proxy_settings), "confirm": (plan.dataset, plan.settings),
                             "validate": (plan.validation, plan.settings)}[stage or "confirm"]
        if dataset is None:
            raise SpecdecError(f"today's tune plans no {stage} stage for this command")
        return run_settings(a, settings, dataset, plan.env)
    from .cli import parse_args
    from .datasets import load_dataset

    _, _, settings, (limit, positions) = parse_args(a)
    dataset = load_dataset(a.dataset, limit, a.data, positions)
    a.report_only = True
    return run_settings(a, settings, dataset, environment.describe())


def figures(summary: dict | None) -> dict[str, dict]:
    return {cid: {k: row.get(k) for k in FIGURES} for cid, row in ((summary or {}).get("configs") or {}).items()}


def figure_changes(before: dict | None, after: dict | None) -> list[str]:
    """``config: figure old -> new`` for every per-configuration figure that moved."""
    old, new = figures(before), figures(after)
    out = []
    for cid in sorted(set(old) | set(new)):
        for k in FIGURES:
            x, y = (old.get(cid) or {}).get(k), (new.get(cid) or {}).get(k)
            if isinstance(x, float) and isinstance(y, float) and abs(x - y) < 5e-4:
                continue
            if x != y:
                out.append(f"{cid}: {k} {x} -> {y}")
    return out


def rewrite_report(folder: Path, command: list[str], plots: bool) -> None:
    """summary.json, report.md (and plots) of a bench folder from its records, as ``--report-only``
    writes them, but with the environment and models the original run recorded."""
    from . import environment
    from .cli import parse_args, report_inputs, write_outputs
    from .datasets import load_dataset
    from .options import run_settings

    old = _read_summary(folder)
    argv = [*_with_out(command, str(folder)), "--report-only", "-q"] + ([] if plots else ["--no-plots"])
    a = parse_command(argv)
    configs, peers, settings, (limit, positions) = parse_args(a)
    everything = [*configs, *peers]
    dataset = load_dataset(a.dataset, limit, a.data, positions)
    planned = len(dataset.samples)
    env = environment.describe()
    stored = run_settings(a, settings, dataset, env)
    out, dataset, records, env, models = report_inputs(a, stored, env, dataset, everything, settings.repeats)
    if old:
        env = old.get("environment") or env
        models = (old.get("run") or {}).get("models") or models
        if (old.get("run") or {}).get("data_source"):  # where the run read it (this checkout's path says nothing)
            dataset = replace(dataset, source=old["run"]["data_source"])
    env = {**env, "argv": list(command)}  # the report's command: today's, that re-reports or resumes it
    with contextlib.redirect_stdout(io.StringIO()):
        write_outputs(a, records, everything, dataset, planned, settings, out, env, models)


def _with_out(command: list[str], out: str) -> list[str]:
    argv = list(command)
    i = argv.index("--out")
    argv[i + 1] = out
    return argv


def migrate(folder: Path, *, renames: dict[str, str] | None = None, dry_run: bool = False, unsafe: bool = False,
            progress: bool = True) -> dict:
    """Migrate one folder (module docstring); returns what was done (the migration record, and
    ``figures``: the per-configuration figures that moved, for a bench folder)."""
    from .quality import SCORER_VERSION
    from .cli import MACHINE_KEYS
    from . import environment

    folder = Path(folder)
    run = _migratable(folder)
    settings, invocations = dict(run["settings"]), list(run.get("invocations") or [])
    if renames is None:
        root = bench_root(folder)
        renames = renamed_outs(root) if root is not None else {}
    filled = fill_missing(folder, settings, invocations)
    stage = folder.name if is_tune_stage(folder, run) else None
    command = canonical_command(folder, {**run, "migrations": []}, renames,
                                backend=filled.get("backend", {}).get("value"))
    if stage:
        command = tune_selection(command, folder.parent)
    a = parse_command(_with_out(command, str(folder.parent if stage else folder)))
    old_scorer = settings.get("scorer")
    record: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git": environment.git_commit(), "tool": "specdec.bench.migrate",
        "filled": filled, "scorer": [old_scorer, SCORER_VERSION], "command": command}
    # verdicts of an older scorer, or of an unrecorded sandbox: made again here
    rescoring = old_scorer != SCORER_VERSION or "sandbox" not in settings
    if not (filled or rescoring):
        return {**record, "skipped": "up to date"}
    for key, f in filled.items():
        settings[key] = f["value"]
    if rescoring:
        if dry_run:
            record.update(rescored=None, verdicts_changed=None)
        else:
            with lock_out(folder, "specdec migrate"):
                lines, changed, scored, sandbox = rescore(folder, a, unsafe=unsafe, progress=progress)
            record.update(rescored=scored, verdicts_changed={"count": len(changed), "changes": changed})
            settings["scorer"] = SCORER_VERSION
            settings["sandbox"] = sandbox
            record["sandbox"] = sandbox
    if dry_run:
        return {**record, "dry_run": True}
    today = today_settings(a, stage)
    _refuse_other_settings(folder, settings, today, ignore=MACHINE_KEYS,
                           hint="the migrated settings still differ from today's command's; not written")
    before = _read_summary(folder)
    with lock_out(folder, "specdec migrate"):
        if rescoring:
            atomic_write_text(folder / RESULTS, "".join(line + "\n" for line in lines))
        run_out = {"settings": settings, "invocations": invocations,
                   "migrations": [*(run.get("migrations") or []), record]}
        atomic_write_text(folder / RUN, json.dumps(run_out, indent=2) + "\n")
    result = dict(record)
    if stage is None:
        result.update(_rewrite_reports(folder, command, before))
    return result


def _migratable(folder: Path) -> dict:
    """The folder's run.json, or a one-line refusal when there is nothing to migrate."""
    if not (folder / RUN).is_file():
        raise SpecdecError(f"{folder} has no {RUN}; nothing to migrate")
    if not (folder / RESULTS).is_file():
        raise SpecdecError(f"{folder} has no {RESULTS} (only a summary was kept): its records cannot be re-scored; "
                           "regenerate it")
    return read_run(folder)


def _rewrite_reports(folder: Path, command: list[str], before: dict | None) -> dict:
    """summary.json and report.md again (the plots where the folder had them): the figures that moved."""
    had_plots = bool((before or {}).get("plots"))
    plots = had_plots and _has_matplotlib()
    rewrite_report(folder, command, plots)
    return {"figures": figure_changes(before, _read_summary(folder)),
            "plots": "rewritten" if plots else ("kept (no matplotlib)" if had_plots else "none")}


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.bench.migrate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", metavar="FOLDER", help="results folders (with run.json and results.jsonl)")
    p.add_argument("--dry-run", action="store_true", help="say what would be filled and the command; write nothing")
    p.add_argument("--unsafe-exec", action="store_true",
                   help="where the sandbox cannot isolate code, re-score HumanEval with resource limits only")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    a = p.parse_args(argv)
    status = 0
    for folder in a.folders:
        try:
            r = migrate(Path(folder), dry_run=a.dry_run, unsafe=a.unsafe_exec, progress=not a.quiet)
        except SpecdecError as exc:
            print(f"specdec migrate: error: {exc}", file=sys.stderr)
            status = 2
            continue
        print(json.dumps({"folder": folder, **r}, default=str), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
