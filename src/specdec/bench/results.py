"""The output folder's durable state: ``results.jsonl`` and ``run.json``.

``results.jsonl`` is append-only: one line per (sample, configuration, repeat), written with a
single ``write`` then flushed and fsynced, so a run killed at any moment loses at most the line
being written. On load a torn or unparsable line is discarded (the file is rewritten atomically
without it), and finished keys are skipped by the rerun. ``run.json`` holds the settings that make
results comparable (models, dtype, device, draft quantization, budget, sampling, prompt format,
data file, hardware, library versions); a rerun whose settings differ is refused rather than
mixed. The configuration set, ``--limit`` and ``--repeats`` may change between runs: lines are
keyed by the full configuration id.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from ..errors import SpecdecError

RESULTS = "results.jsonl"
RUN = "run.json"


def record_key(sample_id: str, config_id: str, repeat: int) -> str:
    return f"{sample_id}|{config_id}|{repeat}"


def prepare_dir(path: str | os.PathLike) -> Path:
    """Create the output folder and prove it is writable (a one-line error otherwise)."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise SpecdecError(f"output folder {str(out)!r} is not writable: {exc.strerror or exc}") from None
    return out


def atomic_write_text(path: Path, text: str) -> None:
    """Write a whole file via a temporary sibling, fsync and rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class ResultsFile:
    """``results.jsonl``: load (tolerating a torn tail), then append durable lines."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / RESULTS
        self.discarded = 0  # unparsable lines dropped by the last load()
        self._f = None

    def load(self) -> list[dict]:
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        good: list[bytes] = []
        records: list[dict] = []
        bad = 0
        lines = raw.split(b"\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            torn = i == len(lines) - 1  # no newline after it: the write never finished
            try:
                rec = json.loads(line)
                ok = isinstance(rec, dict) and isinstance(rec.get("key"), str) and not torn
            except (json.JSONDecodeError, UnicodeDecodeError):
                ok = False
            if ok:
                good.append(line)
                records.append(rec)
            else:
                bad += 1
        self.discarded = bad
        if bad or (raw and not raw.endswith(b"\n")):
            atomic_write_text(self.path, "".join(g.decode("utf-8") + "\n" for g in good))
        # the last line per key wins (a key is never written twice by this code, but be tolerant)
        by_key: dict[str, dict] = {}
        for rec in records:
            by_key[rec["key"]] = rec
        return list(by_key.values())

    def append(self, record: dict) -> None:
        try:
            line = json.dumps(record, ensure_ascii=False, allow_nan=False, default=str) + "\n"
        except ValueError:  # a NaN/inf somewhere: store null rather than non-standard JSON
            line = json.dumps(_finite(record), ensure_ascii=False, allow_nan=False, default=str) + "\n"
        if self._f is None:
            new = not self.path.exists()
            self._f = open(self.path, "a", encoding="utf-8")
            if new:
                _fsync_dir(self.path.parent)
        self._f.write(line)
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _read_run(path: Path) -> tuple[dict, list]:
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        return dict(stored["settings"]), list(stored.get("invocations", []))
    except (OSError, ValueError, KeyError, TypeError):
        raise SpecdecError(f"{path} is unreadable; use a new --out folder") from None


def _refuse_other_settings(out_dir: Path, old: dict, new: dict, ignore: tuple = (), hint: str = "") -> None:
    diffs = [k for k in sorted(set(old) | set(new)) if k not in ignore and old.get(k) != new.get(k)]
    if diffs:
        shown = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diffs[:4])
        raise SpecdecError(f"{out_dir} holds results made with different settings ({shown}); {hint}")


def check_run_settings(out_dir: Path, settings: dict[str, Any], invocation: dict[str, Any]) -> None:
    """Store ``settings`` in ``run.json``, or refuse when the folder holds results made with
    different ones. Each invocation (argv, time, git commit) is appended to the history."""
    path = Path(out_dir) / RUN
    results = Path(out_dir) / RESULTS
    history: list = []
    if path.exists():
        old, history = _read_run(path)
        _refuse_other_settings(out_dir, old, settings, hint="use a new --out folder or the same settings to resume")
    elif results.exists() and results.stat().st_size > 0:
        raise SpecdecError(f"{results} exists but {RUN} does not; refusing to mix unknown results, use a new --out")
    history.append({**invocation, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    atomic_write_text(path, json.dumps({"settings": settings, "invocations": history}, indent=2) + "\n")


def read_run_settings(out_dir: Path, settings: dict[str, Any], ignore: tuple = ()) -> tuple[dict, list]:
    """The settings and invocations stored in ``run.json``, after checking that ``settings`` match
    them except the keys in ``ignore`` (a report of a run made elsewhere); writes nothing."""
    path = Path(out_dir) / RUN
    if not path.exists():
        raise SpecdecError(f"{path} is missing; the folder's results cannot be told apart from others")
    old, history = _read_run(path)
    _refuse_other_settings(out_dir, old, settings, ignore, hint="give the command that made them")
    return old, history
