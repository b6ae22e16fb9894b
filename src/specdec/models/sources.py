"""Model sources: what ``target=``/``draft=`` and ``--target``/``--draft`` take, in one place.

A source is a bundled name (:data:`specdec.models.bundled.BUNDLED`), a Hugging Face model folder, a
``.gguf`` file (or a folder holding exactly one), or a hub id (``org/name``); on llama.cpp it may
end in ``@<format>`` (a copy of a GGUF model's weights in that format, made by the llama.cpp backend,
which declares the formats it makes: ``Backend.formats``). :func:`split_format` reads that suffix, :func:`locate` classifies a source
without loading anything, and :func:`resolve_draft` is what ``draft="auto"`` means. What a backend
reads for a source is its own: the GGUF file llama.cpp loads (:mod:`specdec.models.backends.llamacpp.formats`),
the folder transformers loads, a bundled model or a GGUF file dequantized once
(:mod:`specdec.models.backends.transformers.convert`). Backend-free: nothing here imports a backend.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import overload

from .bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET
from ..errors import SpecdecError

#: ``draft="auto"``: the bundled draft for the bundled target, no draft otherwise
AUTO = "auto"
SEPARATOR = "@"
_FORMAT = re.compile(r"^[A-Za-z0-9_]+$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@overload
def split_format(source: str) -> tuple[str, str | None]: ...
@overload
def split_format(source: None) -> tuple[None, None]: ...
def split_format(source: str | None) -> tuple[str | None, str | None]:
    """``"name@bf16"`` -> ``("name", "bf16")``; a source without a format suffix (or an existing path
    that holds ``@``) is returned whole with None. Which formats exist is each backend's to say
    (``Backend.formats``); a suffix that is not a word, or ``@`` with no model before it, is a one-line
    error here."""
    if source is None or SEPARATOR not in str(source):
        return source, None
    base, _, fmt = str(source).rpartition(SEPARATOR)
    if Path(str(source)).expanduser().exists():  # a path that happens to hold '@'
        return source, None
    if not _FORMAT.match(fmt):
        raise SpecdecError(f"{source!r}: {fmt!r} after '@' is not a weight format's name")
    if not base:
        raise SpecdecError(f"{source!r}: no model before '@{fmt}'")
    return base, fmt.lower()


def locate(source: str) -> tuple[str, Path | None]:
    """Classify a model source: ``('bundled', None)``, ``('folder', path)``, ``('gguf', path)`` or
    ``('hub', None)``. A path that does not exist is a user error."""
    if not isinstance(source, str) or not source.strip():
        raise SpecdecError("model source is empty; give a bundled name, a folder, a .gguf file or a hub id")
    if source in BUNDLED:
        return "bundled", None
    path = Path(source).expanduser()
    if path.exists():
        if path.is_dir():
            if not (path / "config.json").exists():
                raise SpecdecError(f"{source}: folder has no config.json; is it a Hugging Face model folder?")
            return "folder", path
        if path.suffix == ".gguf":
            return "gguf", path
        raise SpecdecError(f"{source}: not a model folder or a .gguf file")
    if source.startswith((".", "/", "~")) or source.endswith(".gguf") or not _HUB_ID.match(source):
        names = ", ".join(BUNDLED)
        raise SpecdecError(
            f"model not found: {source!r} is neither an existing path, a hub id (org/name), "
            f"nor a bundled model ({names})"
        )
    return "hub", None


def resolve_draft(target: str, draft: str | None) -> str | None:
    """The draft model :func:`specdec.load` loads: ``"auto"`` is the bundled draft for the bundled
    target (or a copy of it in another weight format) and none otherwise; anything else as given
    (None: no draft model)."""
    if draft == AUTO:
        return DEFAULT_DRAFT if split_format(target)[0] == DEFAULT_TARGET else None
    return draft
