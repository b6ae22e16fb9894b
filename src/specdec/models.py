"""What models run on: devices and dtypes, and the shared-tokenizer check. Backend-free: the models
themselves live behind :class:`specdec.backends.Model` (:mod:`specdec.backends.hf`,
:mod:`specdec.backends.llamacpp`); where they come from: :mod:`specdec.sources`.
"""

from __future__ import annotations

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
