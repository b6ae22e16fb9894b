"""Decoding settings in a JSON file: what ``specdec tune`` writes and ``generate``, ``serve``,
``bench`` (``--config FILE``) and the API (``config="file.json"``) read.

Format (``"format": "specdec-config/1"``)::

    {"format": "specdec-config/1",
     "decode": {"policy": "mars", "drafter": "model", "k": 8, "mars_theta": 0.8},
     "tuned": {...}}

``decode`` holds keywords of :func:`specdec.make_config`: ``policy``, ``drafter``, ``k``,
``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, drafter options and the
policy's parameters (prefixed by their rule, ``mars_theta``, or plain when unambiguous). It is
validated as a whole when read: an unknown key, a bad value or a wrong policy is one
``SpecdecError`` naming the file. ``tuned`` (optional, free-form) records how the settings were
chosen; nothing reads it back. Settings given next to a file (flags, keywords) override the file's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import SpecdecError
from .request import DecodeConfig

FORMAT = "specdec-config/1"
TOP_KEYS = ("format", "decode", "tuned")


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``decode`` keywords of a config file, validated (:meth:`specdec.core.request.DecodeConfig.from_options`)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecdecError(f"config file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecdecError(f"config file {str(p)!r} cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SpecdecError(f"config file {str(p)!r} is not JSON: {exc.msg} at line {exc.lineno}") from None
    return check_config(data, str(p))


def check_config(data: Any, where: str = "config") -> dict[str, Any]:
    """Validate a parsed config object; returns a copy of its ``decode`` keywords (loose options:
    a caller layers flags or keywords over them, :func:`specdec.core.request.overlay`, and builds its
    :class:`~specdec.core.request.DecodeConfig` from the result)."""
    if not isinstance(data, dict):
        raise SpecdecError(f"{where}: expected a JSON object with {', '.join(TOP_KEYS)}")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise SpecdecError(f"{where}: unknown key(s) {unknown}; a config has {', '.join(TOP_KEYS)}")
    if data.get("format") != FORMAT:
        raise SpecdecError(f"{where}: 'format' must be {FORMAT!r}, got {data.get('format')!r}")
    decode = data.get("decode")
    if not isinstance(decode, dict) or not decode:
        raise SpecdecError(f"{where}: 'decode' must be a non-empty object of decoding settings")
    try:
        DecodeConfig.from_options(**decode)
    except TypeError as exc:  # a key from_options cannot take
        raise SpecdecError(f"{where}: {exc}") from None
    except SpecdecError as exc:
        raise SpecdecError(f"{where}: {exc}") from None
    return dict(decode)


def write_config(path: str | os.PathLike, decode: dict[str, Any], tuned: dict[str, Any] | None = None) -> Path:
    """Write (atomically) a config file that :func:`read_config` accepts; returns its path."""
    data = {"format": FORMAT, "decode": dict(decode)}
    if tuned is not None:
        data["tuned"] = tuned
    check_config(data, str(path))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(p)
    return p
