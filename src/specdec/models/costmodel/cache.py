"""The cost tables cached as JSON under ``$SPECDEC_HOME/costs/``, one file per machine, model and dtype.

The file's name hashes the machine fingerprint (:mod:`.fingerprints`), the model key and the
dtype, and the fingerprint inside must match too; a missing, unreadable or foreign file means a
new measurement (:func:`table_for`), never a failed load. A table is measured again when it is
``noisy`` and the machine is quiet now.

:func:`table_for` calls :func:`.timing.measure` and :func:`.timing.machine_load` through the
:mod:`.timing` module, so a test that replaces them there replaces them here too.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from . import timing
from .decide import FALLBACK_K
from .fingerprints import model_fingerprint
from .table import FORMAT, CostTable

#: sha256 hex digits of (fingerprint, model, dtype) naming a table's file (96 bits); changing it orphans every table
CACHE_NAME_CHARS = 24


def costs_dir() -> Path:
    """``$SPECDEC_HOME/costs``, where the tables live."""
    from ..cache import specdec_home

    return specdec_home() / "costs"


def cache_path(fp: Mapping, model: str, dtype: str) -> Path:
    """The file of the table for this fingerprint, model and dtype."""
    key = json.dumps({"fingerprint": fp, "model": model, "dtype": dtype}, sort_keys=True)
    return costs_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:CACHE_NAME_CHARS]}.json"


def read_table(path: Path) -> CostTable | None:
    """The table in ``path``, or None when it is missing or unreadable (corrupt: the caller
    measures again and overwrites it)."""
    try:
        return CostTable.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_cached(fp: Mapping, model: str, dtype: str) -> CostTable | None:
    """The cached table for this machine, model and dtype, or None (missing, corrupt, or made on
    another machine: the fingerprint inside must match too)."""
    table = read_table(cache_path(fp, model, dtype))
    if table is None or table.fingerprint != dict(fp) or table.model != model or table.dtype != dtype:
        return None
    if table.format != FORMAT:  # an older format (no wide passes): measure again
        return None
    if table.noisy and timing.machine_load(int(fp.get("threads") or 1)) is None:
        return None  # measured on a busy machine, and this one is quiet now: measure again
    return table


def save(table: CostTable) -> None:
    """Write ``table`` to its file (whole or not at all: a temporary file renamed over it)."""
    path = cache_path(table.fingerprint, table.model, table.dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table.to_dict(), indent=1))
    os.replace(tmp, path)


def cached_tables(fp: Mapping | None = None) -> list[CostTable]:
    """Every readable table in the cache (only this machine's when ``fp`` is given)."""
    tables = [read_table(p) for p in (sorted(costs_dir().glob("*.json")) if costs_dir().is_dir() else [])]
    return [t for t in tables if t is not None and (fp is None or t.fingerprint == dict(fp))]


def table_for(lm, model: str, dtype: str, log: Callable[[str], None] | None = None,
              kernels: Sequence[str] = ()) -> CostTable | None:
    """Measure the cost table of ``lm`` now and cache it (the caller looked in the cache first);
    ``kernels`` names the kernel choices already applied to ``lm``'s model.
    A failed measurement warns through ``log`` and returns None: the caller falls back, nothing
    breaks."""
    fp = model_fingerprint(lm)
    try:
        if log:
            log(f"specdec: measuring {model.split('|')[0]} in {dtype} on this machine (once; cached)")
        busy = timing.machine_load(int(fp.get("threads") or 1))
        result = timing.measure(lm)
        widths, seconds, context, prefill = result
        report = getattr(result, "report", {}) or {}
        busy = busy or timing.machine_load(int(fp.get("threads") or 1))
        noisy = "; ".join(x for x in (busy, report.get("noisy")) if x)
        table = CostTable(model, dtype, widths, seconds, context, fp, time.strftime("%Y-%m-%dT%H:%M:%S"),
                          prefill_seconds=prefill, kernels=list(kernels), spread=list(report.get("spread") or []),
                          noisy=noisy, long_read=report.get("long_read"), **(report.get("wide") or {}))
        if noisy and log:
            log(f"specdec: warning: this machine looks busy ({noisy}); the timings of {model.split('|')[0]} in "
                f"{dtype} may be off, so the choice of dtype and K may be too: they are measured again at a "
                "later load that finds the machine quiet (or run 'specdec calibrate' then)")
    except Exception as exc:  # noqa: BLE001 - a measurement must never break a load
        if log:
            log(f"specdec: warning: could not measure {model.split('|')[0]} in {dtype} ({type(exc).__name__}: "
                f"{exc}); k=auto falls back to k={FALLBACK_K}")
        return None
    try:
        save(table)
    except OSError as exc:
        if log:
            log(f"specdec: warning: could not cache the cost table ({exc})")
    return table
