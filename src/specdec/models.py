"""Where models come from and what they run on: sources (bundled names, folders, ``.gguf`` files,
hub ids), devices and dtypes, and the shared-tokenizer check. Backend-free: the models themselves
live behind :class:`specdec.backends.Model` (:mod:`specdec.backends.hf`, :mod:`specdec.backends.llamacpp`).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .errors import SpecdecError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu. ``cuda`` without a GPU is a user error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecdecError("device 'cuda' was asked for, but torch sees no CUDA GPU; use --device cpu")
    if device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise SpecdecError(f"unknown device {device!r}; choose cpu, cuda, cuda:N or auto")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 (float16 on a GPU without bf16 support)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return torch.float16
        return torch.bfloat16
    if dtype not in DTYPES:
        raise SpecdecError(f"unknown dtype {dtype!r}; choose one of: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def tensor_bytes(tensors) -> int:
    """Bytes of distinct tensors (shared storage counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        try:
            key = ("dense", t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # oneDNN (mkldnn) tensors have no storage
            key = ("id", id(t))
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def output_rows(head: torch.nn.Module) -> int:
    """Rows of an LM head (plain, int8-quantized or packed linear)."""
    rows = getattr(head, "out_features", None)
    return int(rows) if rows is not None else int(head.weight.shape[0])


# -------------------------------------------------------------------------- loading
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def locate(source: str) -> tuple[str, Path | None]:
    """Classify a model source: ``('bundled', None)``, ``('folder', path)``, ``('gguf', path)`` or
    ``('hub', None)``. A path that does not exist is a user error."""
    from .bundled import BUNDLED

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


def check_same_vocabulary(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose token table differs from the target's: its ids would mean other text."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv == dv:
        return
    differing = sorted(set(tv.items()) ^ set(dv.items()), key=lambda kv: kv[1])
    examples = ", ".join(f"{tok!r}->{idx}" for tok, idx in differing[:3])
    raise SpecdecError(
        f"draft {draft_name!r} and target {target_name!r} do not share a tokenizer: vocabularies of "
        f"{len(dv)} and {len(tv)} tokens differ in {len(differing)} entries (e.g. {examples}). "
        "Speculative decoding needs the same token table; pick a draft from the target's family, "
        "or use --drafter pld, which needs no draft model."
    )
