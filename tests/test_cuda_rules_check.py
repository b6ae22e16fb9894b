"""scripts/cuda_rules_check.py refuses bad flags in one line before it builds anything (its checks
are meant for a GPU, and are run on one: benchmarks/cuda-rules-check-h100; ``--device cpu --cache
static`` runs them on a CPU with the static KV cache, by hand: they take many minutes there)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "cuda_rules_check.py"), *args],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("args, says", [
    (["--device", "gpu0"], "--device 'gpu0'"),
    (["--device", "cpu", "--out", "no/such/folder/checks.json"], "--out 'no/such/folder/checks.json': its folder does not exist"),
    (["--device", "cpu", "--cache", "graphs"], "--cache graphs: cuda_graphs=on needs a CUDA device, not cpu"),
    (["--device", "cpu", "--cache", "fast"], "invalid choice: 'fast'"),
])
def test_bad_flags_are_one_line_errors(args, says):
    done = run_script(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert says in last and "Traceback" not in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_a_device_says_so():
    done = run_script("--device", "cuda")
    assert done.returncode == 2
    assert done.stderr.strip() == "no CUDA device"
