"""The GGUF files llama.cpp reads for a model source (:func:`model_file`): a bundled model's, a
``.gguf`` file, a folder holding one (:func:`gguf_file`, :func:`is_gguf`), and the weight formats:
``<model>@<format>`` is a copy of a GGUF model's weights in another format, made once by llama.cpp's
own quantizer and cached.

Why: on a CPU the weight format decides whether speculation can pay. A one-token pass streams
the weights (memory-bound) and a pass over many tokens is compute-bound; 4-bit weights reach the
compute limit at about 2 tokens, 16-bit ones at about 8 (docs/speculation-on-cpus.md). So a
16-bit or 8-bit copy of the bundled 4-bit target verifies K drafts for far less than K steps.

A copy made from a 4-bit file holds the 4-bit weights dequantized (``bf16``, ``f16``) or
re-quantized (``q8_0``, ``q4_0``, ``iq4_nl``): it is *not* the original full-precision checkpoint.
Its outputs differ from the 4-bit file's by the re-rounding (none for the 16-bit formats, beyond
llama.cpp's arithmetic), and it is named as what it is: ``qwen2.5-coder-1.5b@bf16``.

Copies live under ``$SPECDEC_HOME/gguf-formats/<file stem>-<file key>-<format>/<file stem>-<format>.gguf``,
keyed by the source file's identity (:func:`specdec.models.backends.llamacpp.model.file_key`), built atomically.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable

from ... import bundled
from ...bundled import BUNDLED
from ....errors import SpecdecError
from ...sources import locate, split_format
from ..registry import stderr_log

#: the weight formats ``<model>@<format>`` names on llama.cpp (declared here once: the backend's
#: ``formats``), each -> (llama_ftype value, every tensor in that type ("pure"), what it is, for people).
#: The 4-bit ones are pure: llama.cpp's Q4_K_M mixes types per tensor, these do not.
FTYPES: dict[str, tuple[int, bool, str]] = {
    "bf16": (32, False, "bfloat16"),
    "f16": (1, False, "float16"),
    "q8_0": (7, False, "8-bit (Q8_0)"),
    "q4_0": (2, True, "4-bit (Q4_0, every tensor)"),
    "iq4_nl": (25, True, "4-bit (IQ4_NL, every tensor)"),
}
#: the formats ``draft="auto"`` also measures for a draft stored in another one (pure 4-bit copies:
#: measured faster one-token passes than the shipped Q4_K_M file; :mod:`specdec.frontends.draft_formats`)
DRAFT_FORMATS = ("q4_0", "iq4_nl")


def model_file(source: str, progress: bool = True, verify: bool = False) -> Path:
    """The GGUF file llama.cpp loads for a model source (:func:`gguf_file`), or for
    ``<source>@<format>`` the copy in that format (:func:`formatted`); the format is one of :data:`FTYPES`
    (the backend's ``check_format`` said so)."""
    base, fmt = split_format(source)
    path = gguf_file(base, progress=progress, verify=verify)
    return path if fmt is None else formatted(path, fmt, log=stderr_log if progress else (lambda line: None))


def gguf_file(source: str, progress: bool = True, verify: bool = False) -> Path:
    """The GGUF file of a model source: a bundled name (assembled once from its chunk packages;
    ``verify``: hashed again), a ``.gguf`` path, or a folder holding exactly one ``.gguf``. Anything
    else is a one-line error. (``model@format`` copies: :func:`model_file`.)"""
    kind, path = locate(source) if not (Path(str(source)).expanduser().is_dir()) else ("dir", Path(source).expanduser())
    if kind == "bundled":
        return bundled.gguf_file(source, progress=progress, verify=verify)
    if kind == "gguf":
        assert path is not None  # locate's GGUF file
        return path
    if kind in ("dir", "folder"):
        assert path is not None  # the folder
        files = sorted(path.glob("*.gguf"))
        if len(files) == 1:
            return files[0]
        if len(files) > 1:
            raise SpecdecError(f"{source}: the folder holds {len(files)} .gguf files; give the one to use")
    raise SpecdecError(f"backend 'llama.cpp' needs a GGUF model (a bundled name, a .gguf file or a folder with one), "
                       f"not {source!r}; use backend='transformers' for Hugging Face models")


def is_gguf(source: str | None) -> bool:
    """Whether a model source is a GGUF file (bundled models are; None, no model, counts as one),
    without loading anything."""
    if source is None:
        return True
    source, fmt = split_format(source)
    if fmt is not None or source in BUNDLED or str(source).endswith(".gguf"):
        return True
    path = Path(str(source)).expanduser()
    return path.is_dir() and not (path / "config.json").exists() and len(list(path.glob("*.gguf"))) == 1


def copy_path(source_file: Path, fmt: str) -> Path:
    """Where the ``fmt`` copy of ``source_file`` is cached."""
    from ...cache import specdec_home
    from .model import file_key

    return (specdec_home() / "gguf-formats" / f"{source_file.stem}-{file_key(source_file)}-{fmt}"
            / f"{source_file.stem}-{fmt}.gguf")


def formatted(source_file: Path, fmt: str, log: Callable[[str], None] = lambda line: None) -> Path:
    """The ``fmt`` copy of the GGUF file ``source_file``, made on first use (llama.cpp's
    ``llama_model_quantize``, ``allow_requantize``; seconds to a minute) and cached."""
    from ...cache import build_atomically, check_folder
    from .model import default_threads, lib

    dest = copy_path(source_file, fmt)
    if dest.parent.is_dir() and check_folder(dest.parent) is None:
        return dest
    dest.parent.parent.mkdir(parents=True, exist_ok=True)
    ftype, pure, what = FTYPES[fmt]
    log(f"specdec: making a {what} copy of {source_file.name} (once; the weights as stored there, re-rounded, "
        f"not the original checkpoint) under {dest.parent}")

    def build(tmp: Path) -> dict:
        L = lib()
        params = L.llama_model_quantize_default_params()
        params.nthread = default_threads()
        params.ftype = ftype
        params.allow_requantize = True
        params.pure = pure
        out = tmp / dest.name
        rc = L.llama_model_quantize(str(source_file).encode(), str(out).encode(), ctypes.byref(params))
        if rc != 0 or not out.is_file():
            raise SpecdecError(f"{source_file}: llama.cpp could not make a {what} copy (status {rc})")
        return {"source": str(source_file), "format": fmt, "made_by": "llama_model_quantize (allow_requantize)",
                "note": f"a {what} copy of the source file's weights, not the original checkpoint"}

    build_atomically(dest.parent, build)
    return dest
