"""The output folder's durable state: ``results.jsonl`` and ``run.json``.

``results.jsonl`` is append-only: one line per (sample, configuration, repeat), written with a
single ``write`` then flushed and fsynced, so a run killed at any moment loses at most the line
being written. On load every line is checked (:func:`line_problem`: JSON, an object, the fields
a record needs with their types, a key that matches them); a torn, unparsable or incomplete line is
discarded (the file is rewritten atomically without it, and the run reports it in one line), so
its (sample, configuration, repeat) runs again; finished keys are skipped by the rerun. While a run
writes a folder it holds :func:`lock_out` (``fcntl.flock`` on ``.specdec.lock``; the kernel releases it
when the process ends, killed or not), so a second run on the same folder is refused in one line. ``run.json`` holds the settings that make
results comparable (models, dtype, device, draft quantization, budget, sampling, prompt format,
data file, hardware, library versions); a rerun whose settings differ is refused rather than
mixed. The configuration set, ``--limit`` and ``--repeats`` may change between runs: lines are
keyed by the full configuration id.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from ...errors import SpecdecError
from ...models.files import read_regular

RESULTS = "results.jsonl"
RUN = "run.json"
LOCK = ".specdec.lock"

#: the fields every results line has (runner._base, _our_record, _peer_record) and what each must be
_NUMBER = (int, float)
REQUIRED: dict[str, tuple[type, ...]] = {
    "key": (str,), "sample_id": (str,), "config": (str,), "repeat": (int,), "text": (str,),
    "token_ids": (list,), "new_tokens": (int,), "seconds": _NUMBER, "stats": (dict,), "quality": (dict,),
}
#: what a record's own figures may be: seconds and counts beyond these are no measurement
MAX_SECONDS = 1e7
MAX_COUNT = 10**12
#: the figures of ``stats`` the summary adds up, by kind (any other field is not read)
STATS_COUNTS = ("rounds", "accepted", "drafted", "zero_accept_rounds", "target_forwards", "produced_tokens")
STATS_SECONDS = ("total_seconds", "draft_seconds", "verify_seconds", "prefill_seconds", "mask_seconds",
                 "draft_mask_seconds")
STATS_LISTS = ("drafted_at", "accepted_at", "accepted_per_round", "tree_depths")
#: the verdicts of ``quality`` (true or false where present)
VERDICTS = ("passed", "correct", "json_valid", "truncated")
#: the most bytes read from results.jsonl and run.json (a link to /dev/zero or a FIFO is refused)
RESULTS_LIMIT = 4 << 30
RUN_LIMIT = 64 << 20


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


def line_problem(rec: Any) -> str | None:
    """Why a parsed results line cannot be used (None when it can): a record missing a field the
    summary reads, a field of the wrong type, or a key that does not match its own fields."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    for name, types in REQUIRED.items():
        if name not in rec:
            return f"no {name!r}"
        v = rec[name]
        if isinstance(v, bool) or not isinstance(v, types):
            return f"{name!r} is {type(v).__name__}, not {'/'.join(t.__name__ for t in types)}"
    if rec["repeat"] < 0 or rec["new_tokens"] < 0:
        return "a negative 'repeat' or 'new_tokens'"
    if not (_count(rec["repeat"]) and _count(rec["new_tokens"])):
        return "'repeat' or 'new_tokens' is too large"
    if not _seconds(rec["seconds"]):
        return f"'seconds' is {rec['seconds']}, not a number of seconds in [0, {MAX_SECONDS:g}]"
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in rec["token_ids"]):
        return "'token_ids' holds a non-integer"
    if rec["key"] != record_key(rec["sample_id"], rec["config"], rec["repeat"]):
        return f"key {rec['key']!r} does not match its sample_id, config and repeat"
    step = rec.get("step_ms")
    if step is not None and (isinstance(step, bool) or not isinstance(step, _NUMBER) or not math.isfinite(step)
                             or step <= 0):
        return f"'step_ms' is {step!r}, not a positive number of milliseconds"
    if rec.get("agreement") is not None and not isinstance(rec["agreement"], dict):
        return "'agreement' is not an object"
    return _fields_problem(rec)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT


def _seconds(v: Any) -> bool:
    return isinstance(v, _NUMBER) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= MAX_SECONDS


def _fields_problem(rec: dict) -> str | None:
    """Why the optional fields the summary and the exports read are unusable (None when they are)."""
    for name in ("category", "constraint", "policy", "drafter", "backend", "finish_reason"):
        if rec.get(name) is not None and not isinstance(rec[name], str):
            return f"{name!r} is {type(rec[name]).__name__}, not a string"
    dtypes = rec.get("dtypes")
    if dtypes is not None and not (isinstance(dtypes, dict) and all(
            isinstance(dtypes.get(k), (str, type(None))) for k in ("target", "draft"))):
        return "'dtypes' is not an object naming the target's and the draft's dtypes"
    stats = rec["stats"]
    for name in STATS_COUNTS:
        if name in stats and not _count(stats[name]):
            return f"'stats.{name}' is {stats[name]!r:.40}, not a count"
    for name in STATS_SECONDS:
        if name in stats and not _seconds(stats[name]):
            return f"'stats.{name}' is {stats[name]!r:.40}, not a number of seconds in [0, {MAX_SECONDS:g}]"
    for name in STATS_LISTS:
        v = stats.get(name)
        if v is not None and not (isinstance(v, list) and all(_count(x) for x in v)):
            return f"'stats.{name}' is not a list of counts"
    relaxed = stats.get("relaxed")
    if relaxed is not None and not (isinstance(relaxed, dict) and all(_count(x) for x in relaxed.values())):
        return "'stats.relaxed' is not an object of counts"
    for name in VERDICTS:
        if name in rec["quality"] and not isinstance(rec["quality"][name], bool):
            return f"'quality.{name}' is {type(rec['quality'][name]).__name__}, not true or false"
    agreement = rec.get("agreement")
    if agreement:
        token = agreement.get("token")
        if not isinstance(agreement.get("exact"), bool) or isinstance(token, bool) or \
                not isinstance(token, _NUMBER) or not 0 <= token <= 1:
            return "'agreement' needs 'exact' (true or false) and 'token' (a number in [0, 1])"
    return None


@contextlib.contextmanager
def lock_out(out_dir: Path, what: str = "specdec bench") -> Iterator[None]:
    """Hold the output folder for this process: an exclusive ``fcntl.flock`` on ``.specdec.lock``
    in it, taken without waiting. A folder another run holds is refused in one line naming that
    run (pid, host, start time, command, written into the lock file by its holder). The kernel
    drops the lock when the holder's file is closed, so a killed run never leaves the folder
    locked (the file itself stays, harmless)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking
        yield
        return
    path = Path(out_dir) / LOCK
    f = open_append(path, "a+")
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read(400).strip().replace("\n", " ") or "another process"
            raise SpecdecError(f"{out_dir} is in use by another run ({holder}); wait for it to finish, "
                               "or use another --out folder") from None
        f.seek(0)
        f.truncate()
        import sys

        f.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                f"{what} {' '.join(sys.argv[1:])[:200]}\n")
        f.flush()
        yield
    finally:
        f.close()  # releases the lock


class ResultsFile:
    """``results.jsonl``: load (tolerating a torn tail), then append durable lines."""

    def __init__(self, out_dir: Path):
        self.path = Path(out_dir) / RESULTS
        self.discarded = 0  # unusable lines dropped by the last load()
        self.problems: list[str] = []  # "line N: why" for each of them
        self._f: Any = None  # the open file (open_append's), once a record is appended

    def load(self, repair: bool = True) -> list[dict]:
        """The usable records (the last per key). ``repair``: rewrite the file without the unusable
        lines (a run about to append, holding the folder's lock); without it nothing is written
        (a report of the folder as it is)."""
        self.discarded, self.problems = 0, []
        if not os.path.lexists(self.path):
            return []
        raw = read_regular(self.path, RESULTS_LIMIT, "results file")
        good: list[bytes] = []
        records: list[dict] = []
        lines = raw.split(b"\n")
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            if i == len(lines) - 1:  # no newline after it: the write never finished
                why: str | None = "torn (no end of line: the write never finished)"
            else:
                try:
                    rec = json.loads(line)
                    why = line_problem(rec)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    why = "not JSON"
                except RecursionError:
                    why = "nested too deep"
            if why is None:
                good.append(line)
                records.append(rec)
            else:
                self.problems.append(f"line {i + 1}: {why}")
        self.discarded = len(self.problems)
        if repair and (self.problems or (raw and not raw.endswith(b"\n"))):
            atomic_write_text(self.path, "".join(g.decode("utf-8") + "\n" for g in good))
        # the last line per key wins (a key is never written twice by this code, but be tolerant)
        by_key: dict[str, dict] = {}
        for rec in records:
            by_key[rec["key"]] = rec
        return list(by_key.values())

    def report(self, then: str = "their runs are made again") -> str | None:
        """One line on what the last load discarded (None when nothing was)."""
        if not self.problems:
            return None
        shown = "; ".join(p[:120] for p in self.problems[:3])
        more = f"; and {len(self.problems) - 3} more" if len(self.problems) > 3 else ""
        return (f"specdec: warning: {self.path}: discarded {len(self.problems)} unusable line(s) ({shown}{more}); "
                f"{then}")

    def append(self, record: dict) -> None:
        try:
            line = json.dumps(record, ensure_ascii=False, allow_nan=False, default=str) + "\n"
        except ValueError:  # a NaN/inf somewhere: store null rather than non-standard JSON
            line = json.dumps(_finite(record), ensure_ascii=False, allow_nan=False, default=str) + "\n"
        if self._f is None:
            new = not self.path.exists()
            self._f = open_append(self.path)
            if new:
                _fsync_dir(self.path.parent)
        self._f.write(line)
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def open_append(path: Path, mode: str = "a"):
    """``path`` opened to append (``mode`` "a" or "a+"), never through a link nor into a file
    with another name elsewhere (a hard link): a one-line error instead."""
    flags = os.O_CREAT | os.O_APPEND | (os.O_RDWR if "+" in mode else os.O_WRONLY) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o644)
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot write it ({exc.strerror or exc}; a link is not followed)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise SpecdecError(f"{path} is not a plain file of this folder (a special file or a hard link); "
                           "refusing to write through it")
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode, encoding="utf-8")


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _read_run(path: Path) -> tuple[dict, list]:
    raw = read_regular(path, RUN_LIMIT, "run.json")
    try:
        stored = json.loads(raw.decode("utf-8"))
        return dict(stored["settings"]), list(stored.get("invocations", []))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
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
