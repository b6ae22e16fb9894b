"""What a benchmark ran on: library versions, CPU model and cores, GPU, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path


def gpu_name() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except Exception:  # noqa: BLE001 - a broken CUDA setup is "no GPU" here
        return None
    return None


def git_commit() -> dict:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout specdec runs from."""
    repo = Path(__file__).resolve().parents[4]
    try:
        sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return {"commit": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def versions() -> dict:
    import torch
    import transformers

    from ... import __version__

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "specdec": __version__}


def hardware() -> dict:
    import torch

    from ...models.costmodel import KEY_FLAGS, cpu_flags, cpu_model

    flags = cpu_flags()
    return {"cpu": cpu_model(), "cpu_flags": [f for f in KEY_FLAGS if f in flags], "cpu_cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "gpu": gpu_name(), "platform": platform.platform()}


def describe(argv: list[str] | None = None) -> dict:
    """The versions, hardware and git commit, and ``argv``: the command (after ``specdec``) as
    :func:`specdec.cli.main` was given it (``sys.argv[1:]`` when not given: ``main`` called with an
    argv of its own, as tests and scripts do, ran that command, not the process's)."""
    return {"versions": versions(), "hardware": hardware(), "git": git_commit(),
            "argv": list(sys.argv[1:] if argv is None else argv)}
