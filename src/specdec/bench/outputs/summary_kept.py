"""What ``specdec bench --report-only`` keeps of a folder's own ``summary.json``.

A full run writes into ``summary.json`` what it learned by loading the models and looking at the
machine: the backend and why it was chosen, the cost tables, the draft and quantization ``auto``
resolved to, the dtype's reason, the cores, threads, platform and Python version. ``run.json``
holds only what was asked, so a re-report that read run.json alone dropped them. A re-report
keeps them from the summary.json the folder already holds, where that file is the run's (the
same dataset, made on the machine and software run.json records); figures that come from the
records are computed again, as is where the report was written and who re-reported it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ...errors import SpecdecError

#: the most bytes a folder's summary.json may have to be read back
SUMMARY_LIMIT = 64 << 20

#: (section, key) of the earlier summary's environment that must match run.json's setting (the value)
SAME_MACHINE = ((("hardware", "cpu"), "cpu"), (("hardware", "cpu_flags"), "cpu_flags"), (("hardware", "gpu"), "gpu"),
                (("versions", "torch"), "torch"), (("versions", "transformers"), "transformers"))


def read_summary(out: Path) -> dict | None:
    """The folder's summary.json as a dict, or None where there is none, it is a link or no plain
    file, over :data:`SUMMARY_LIMIT`, or not a JSON object (a re-report then keeps nothing of it)."""
    from ...models.files import read_regular

    path = Path(out) / "summary.json"
    if not os.path.lexists(path) or os.path.islink(path):
        return None
    try:
        summary = json.loads(read_regular(path, SUMMARY_LIMIT, "summary.json").decode("utf-8"))
    except (SpecdecError, ValueError, RecursionError):
        return None
    return summary if isinstance(summary, dict) else None


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None))) or (
        isinstance(value, list) and all(isinstance(v, str) for v in value))


def _section(summary: Any, *keys: str) -> dict:
    for key in keys:
        summary = summary.get(key) if isinstance(summary, dict) else None
    return summary if isinstance(summary, dict) else {}


def kept(summary: dict | None, made: dict, dataset: str) -> dict[str, dict]:
    """The sections of ``summary`` (the folder's earlier summary.json) a re-report keeps:
    ``{"models": ..., "versions": ..., "hardware": ...}``, plain values only (``cost_model`` may be
    a table). Empty where ``summary`` is None, names another dataset, or another machine or
    software than ``made`` (run.json's settings)."""
    empty: dict[str, dict] = {"models": {}, "versions": {}, "hardware": {}}
    if summary is None or _section(summary, "run").get("dataset") != dataset:
        return empty
    env = _section(summary, "environment")
    if any((_section(env, section).get(key) or None) != (made.get(setting) or None)
           for (section, key), setting in SAME_MACHINE):
        return empty
    models = {k: v for k, v in _section(summary, "run", "models").items()
              if _plain(v) or (k == "cost_model" and isinstance(v, dict))}
    return {"models": models,
            **{section: {k: v for k, v in _section(env, section).items() if _plain(v)}
               for section in ("versions", "hardware")}}


def over(earlier: dict, computed: dict) -> dict:
    """``earlier``'s values in its order, then what only ``computed`` has (a re-reported summary.json
    reads as the run's, key for key)."""
    return {**earlier, **{k: v for k, v in computed.items() if k not in earlier}}
