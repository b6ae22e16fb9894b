"""scripts/gpu_projection.py on a CPU with the tiny models: the one command runs its stages, each in
its time box, and writes what it measured as it goes (the GPU itself measures on a lent machine:
benchmarks/gpu-projection-h100); the projection says it is one."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_projection.py"


def run_script(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def script_module():
    spec = importlib.util.spec_from_file_location("gpu_projection", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def configs(tiny_dirs):
    """CONFIGS as the lead copies it: each model's folder (the script never reads its weights)."""
    target, draft = tiny_dirs
    return target.parent


def test_one_command_runs_the_stages_and_writes_as_it_goes(configs, tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    done = run_script("all", str(configs), str(out), "--device", "cpu", "--work", str(work), "--tokens", "6",
                      "--repeats", "1", "--stages", "build,passes,rounds-graphs", "--traces")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    status = json.loads((out / "status.json").read_text())
    assert list(status) == ["build", "passes", "rounds-graphs"] and all(s["rc"] == 0 for s in status.values())
    passes = json.loads((out / "passes.json").read_text())
    rows = {(r["mode"], r["role"]): r for r in passes["rows"]}
    assert set(rows) == {(m, r) for m in ("graphs", "dynamic") for r in ("target", "draft")}
    assert "static KV cache" in rows["graphs", "target"]["why"] and "dynamic KV cache" in rows["dynamic", "draft"]["why"]
    assert set(rows["graphs", "draft"]["median_ms"]) == {str(w) for w in passes["widths"]}
    rounds = json.loads((out / "graphs" / "rounds.json").read_text())
    assert len(rounds["rows"]) == 8 and {r["k"] for r in rounds["rows"]} == {0, 1, 3, 7}
    assert all(r["new_tokens"] == 6 for r in rounds["rows"])
    summary = (out / "summary.md").read_text()
    assert "| w | target graphs | draft graphs | target dynamic | draft dynamic |" in summary
    assert "goal on an H100: a one-token pass of the target <= 4.0 ms" in summary and "not an H100" in summary
    log = (out / "log.txt").read_text()
    assert "build: exit 0" in log and "passes, graphs, target:" in log and "graphs never  lossless k=7" in log


def test_a_stage_past_its_time_box_is_stopped_and_its_output_kept(tmp_path):
    logged = script_module().Logged(tmp_path)
    code = "import time; print('started', flush=True); time.sleep(60)"
    rc, seconds = logged.run([sys.executable, "-c", code], timeout=3, env=dict(os.environ))
    assert rc is None and seconds < 30
    assert "started" in (tmp_path / "log.txt").read_text()


def test_the_projection_says_it_is_one(tmp_path):
    """``project`` on the committed H100 measurement and two of the HumanEval traces."""
    lines = (ROOT / "benchmarks/replay-avx512bf16/traces-humaneval20-bf16.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["count"] = 2
    traces = tmp_path / "traces.jsonl"
    traces.write_text("\n".join([json.dumps(head), *lines[1:3]]) + "\n")
    done = run_script("project", str(ROOT / "benchmarks/gpu-projection-h100"), str(traces))
    assert done.returncode == 0, done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("Projection, not a run: the CPU traces replayed on the pass costs measured on NVIDIA H100")
    assert "engine's own seconds (fitted): step_overhead" in done.stdout
    assert "| traces.jsonl | pld + engine |" in done.stdout


@pytest.mark.parametrize("args, says", [
    (["all", "no/such/configs", "out"], "CONFIGS: no no/such/configs/target/config.json"),
    (["all", ".", "out", "--stages", "build,bogus"], "--stages: unknown bogus"),
])
def test_bad_arguments_are_one_line_errors(args, says, tmp_path):
    done = run_script(*args)
    assert done.returncode == 2 and says in done.stderr.strip().splitlines()[-1]
