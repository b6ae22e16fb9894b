"""The transformers backend: which dtype each model runs in, decided by the measured cost model
(``dtype="auto"``).

Candidates: on a CPU, the target in ``float32`` or ``bfloat16``, and the draft in ``float32`` or
``bfloat16+int8`` (weight-only int8, bf16 activations; ``bfloat16`` when ``draft_quant="none"``);
on a GPU, ``bfloat16`` (``float16`` without bf16 support) only. Each candidate's
:class:`~specdec.models.costmodel.CostTable` comes from the cache, or is measured once: a lone candidate
on the model loaded as that variant (which is then kept), several on a float32 master (exact for
bf16 checkpoints such as the bundled pair) and cast (and quantized) copies of it. :func:`specdec.models.costmodel.choose_dtypes` then picks the
pair with the fastest reference request, prefill and decoding both counted.

Kernel choices that change speed but not the weights are measured with the table and recorded in
it (``CostTable.kernels``), so the variant is rebuilt the same way whenever the table is used: for
a half-precision model on a CPU, whether a one-token pass runs faster with each one-row linear
padded to two rows (``pad1``, :class:`specdec.models.backends.transformers.kernels.RowPaddedLinear`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ...costmodel import CostTable, DtypeChoice, choose_dtypes, model_key, table_for, time_step
from ....errors import SpecdecError
from ..registry import Log
from .kernels import can_pad_rows, pack_linears, set_row_padding
from .load import Checkpoint, folder_config, load as load_model, load_config
from .execution import Execution
from .model import HFModel, variant_name
from .quant import quantize_int8, resolve_quant

#: the dtypes ``dtype=`` and ``draft_dtype=`` name (besides ``auto``)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


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


@dataclass
class Variants:
    """What :func:`choose_variants` decided: each role's variant (None: no draft), every candidate's
    table by role, the model measured in place by role (``(variant, loaded)`` or None), and why
    (None when there was nothing to choose)."""

    target: str
    draft: str | None
    tables: dict
    measured: dict
    why: str | None


def choose_variants(req, plan: Execution = Execution()) -> Variants:
    """The variant of each model for a load request (:class:`specdec.models.backends.registry.Request`,
    options ``dtype``, ``draft_dtype``, ``draft_quant``): the cost model's choice among the
    candidates when calibrating, else the default (bfloat16 for ``auto``). The tables are measured
    with the models run as ``plan`` says (:mod:`specdec.models.backends.transformers.execution`)."""
    from ...costmodel import FALLBACK_K

    dtype, draft_dtype, draft_quant = (req.options.get(k, "auto") for k in ("dtype", "draft_dtype", "draft_quant"))
    dev, draft, log = req.device, req.draft, req.log
    if draft_dtype != "auto":  # (dtype is checked by target_candidates)
        resolve_dtype(draft_dtype, dev)
    resolve_quant(draft_quant, dev, torch.float32)  # validates the name
    t_cands = target_candidates(dtype, dev)
    d_cands = draft_candidates(dtype, draft_dtype, draft_quant, dev) if draft is not None else []
    calibrate = req.calibrate or req.recalibrate
    tables: dict = {"target": {}, "draft": {}}
    measured: dict = {"target": None, "draft": None}
    if calibrate:
        for role, source, cands in (("target", req.target, t_cands), ("draft", draft, d_cands)):
            if source is not None:
                tables[role], measured[role] = candidate_tables(source, role, cands, dev, remeasure=req.recalibrate,
                                                                progress=req.progress, log=log, plan=plan)
    choice = pick(tables["target"], tables["draft"] if draft is not None else None) if calibrate else None
    t_variant = choice.target if choice is not None else (t_cands[-1] if dtype == "auto" else t_cands[0])
    d_variant = None
    if draft is not None:
        d_variant = choice.draft if choice is not None else d_cands[-1]
    why = choice.reason() if choice is not None and (len(t_cands) > 1 or len(d_cands) > 1) else None
    if choice is None and len(t_cands) > 1:
        why = f"not measured (calibration {'off' if not calibrate else 'failed'}); bfloat16 as before"
        if calibrate:
            log(f"specdec: warning: no cost model, so dtype=auto is bfloat16 and k=auto is k={FALLBACK_K}")
    return Variants(t_variant, d_variant, tables, measured, why)


def split_variant(name: str) -> tuple[torch.dtype, str]:
    """``"bfloat16+int8"`` -> ``(torch.bfloat16, "int8")``; ``"float32"`` -> ``(torch.float32, "none")``."""
    dt, _, quant = name.partition("+")
    if dt not in DTYPES or quant not in ("", "int8"):
        raise SpecdecError(f"unknown model variant {name!r}")
    return DTYPES[dt], quant or "none"


def target_candidates(dtype: str | torch.dtype, device: torch.device) -> list[str]:
    if dtype == "auto" and device.type == "cpu":
        return ["float32", "bfloat16"]
    return [variant_name(resolve_dtype(dtype, device), "none")]


def draft_candidates(dtype: str | torch.dtype, draft_dtype: str | torch.dtype, draft_quant: str,
                     device: torch.device) -> list[str]:
    """``draft_dtype="auto"`` follows ``dtype`` when that is explicit, and is measured when both are auto."""
    if draft_dtype == "auto" and dtype == "auto" and device.type == "cpu":
        if draft_quant == "int8":
            return ["bfloat16+int8", "float32+int8"]
        return ["float32", "bfloat16" if draft_quant == "none" else "bfloat16+int8"]
    chosen = resolve_dtype(dtype if draft_dtype == "auto" else draft_dtype, device)
    return [variant_name(chosen, resolve_quant(draft_quant, device, chosen))]


#: A kernel choice is taken only when it makes a plain decoding step at least this much faster.
KERNEL_GAIN = 0.05


def build_variant(model: torch.nn.Module, name: str, kernels: tuple[str, ...] | list[str] = ()) -> torch.nn.Module:
    """``model`` as variant ``name``, in place: cast, then int8-quantized, or for float32 on a
    CPU with its linears packed (:mod:`specdec.models.backends.transformers.kernels`); then the measured ``kernels`` choices."""
    dtype, quant = split_variant(name)
    model = model.to(dtype)
    if quant == "int8":
        quantize_int8(model)
    elif dtype == torch.float32:
        pack_linears(model)  # same float32 arithmetic, no per-call weight repacking
    if "pad1" in kernels:
        set_row_padding(model, True)
    return model


def choose_kernels(model: torch.nn.Module, lm: HFModel, repeats: int = 5) -> list[str]:
    """Measure, on this machine, the kernel choices that apply to ``model`` and leave the faster
    in force; returns their names for the cost table. ``pad1``: one-token passes with every
    one-row half-precision linear run as two rows, against as they are (interleaved, best of
    ``repeats``), taken when it is at least ``KERNEL_GAIN`` faster."""
    if not can_pad_rows(model):
        return []
    plain = padded = float("inf")
    for _ in range(2):  # interleaved: a slow spell of a shared machine hits both
        set_row_padding(model, False)
        plain = min(plain, time_step(lm, repeats=repeats))
        set_row_padding(model, True)
        padded = min(padded, time_step(lm, repeats=repeats))
    on = padded < (1 - KERNEL_GAIN) * plain
    set_row_padding(model, on)
    return ["pad1"] if on else []


def candidate_tables(source: str, role: str, cands: list[str], device: torch.device, vocab_limit: int | None = None,
                     *, remeasure: bool = False, progress: bool = True, log: Log | None = None,
                     plan: Execution = Execution()) -> tuple[dict[str, CostTable | None], tuple[str, Checkpoint] | None]:
    """Every candidate's table: cached where it exists, else measured (the model run as ``plan``
    says for it). One candidate to measure loads in its own variant; several load one float32
    master, each other variant measured on a cast copy, float32 last on the master itself. Returns
    the tables and the model measured in place as ``(variant, loaded)`` (so choosing that variant
    loads nothing again), or None."""
    from ...costmodel import fingerprint, load_cached

    config = load_config(source, progress)
    key = model_key(source, config)
    run = plan.for_config(config)
    fp = fingerprint(device, run.fingerprint())
    tables: dict[str, CostTable | None] = {c: None if remeasure else load_cached(fp, key, c) for c in cands}
    todo = sorted((c for c in cands if tables[c] is None), key=lambda c: c == "float32")
    if not todo:
        return tables, None
    if len(todo) == 1:
        only = todo[0]
        loaded = load_model(source, split_variant(only)[0], device, progress=progress)
        loaded.model = build_variant(loaded.model, only)
        tables[only] = _measure(run.wrap(loaded.model, f"{role} {source}", vocab_limit), key, only, log)
        return tables, (only, loaded)
    master = load_model(source, torch.float32, device, progress=progress)
    for c in todo:
        last = c == "float32"
        model = build_variant(master.model if last else copy.deepcopy(master.model), c)
        tables[c] = _measure(run.wrap(model, f"{role} {source}", vocab_limit), key, c, log)
        del model
    return tables, (("float32", master) if "float32" in todo else None)


def _measure(lm: HFModel, key: str, variant: str, log: Log | None) -> CostTable | None:
    try:
        return table_for(lm, key, variant, log=log, kernels=choose_kernels(lm.model, lm))
    finally:
        lm.close()


def materialize(source: str, variant: str, device: torch.device, measured: tuple[str, Checkpoint] | None = None,
                progress: bool = True, table: CostTable | None = None) -> Checkpoint:
    """The model as ``variant``: the one measured in place when it is that variant (its kernel
    choices already in force), else loaded in its dtype (and quantized or packed) with the kernel
    choices recorded in its cost ``table``."""
    if measured is not None and measured[0] == variant:
        return measured[1]
    dtype, _ = split_variant(variant)
    loaded = load_model(source, dtype, device, progress=progress)
    loaded.model = build_variant(loaded.model, variant, table.kernels if table is not None else ())
    return loaded


def cached_choice(target: str, draft: str | None, device: torch.device) -> DtypeChoice | None:
    """The transformers backend's ``dtype="auto"`` choice for these models from cost tables
    already cached on this machine, without converting or loading anything; None when a model has
    no converted folder yet or a candidate's table is missing (``backend="auto"`` compares it with
    llama.cpp's measured tables when it exists)."""
    from pathlib import Path

    from ...bundled import BUNDLED, cache_dir
    from ...cache import check_folder
    from ...costmodel import fingerprint, load_cached
    from .convert import gguf_cache_dir

    def folder(source: str) -> Path | None:
        if source in BUNDLED:
            f = cache_dir(source)
        elif str(source).endswith(".gguf") and Path(source).expanduser().is_file():
            f = gguf_cache_dir(Path(source).expanduser())
        else:
            return None
        return f if (f / "config.json").exists() and check_folder(f) is None else None

    fp = fingerprint(device)
    tables: list[dict] = []
    for source, cands in ((target, target_candidates("auto", device)),
                          (draft, draft_candidates("auto", "auto", "auto", device) if draft else [])):
        if source is None:
            tables.append({})
            continue
        f = folder(source)
        if f is None:
            return None
        key = model_key(source, folder_config(f))
        found = {c: load_cached(fp, key, c) for c in cands}
        if any(t is None for t in found.values()):
            return None
        tables.append(found)
    return choose_dtypes(tables[0], tables[1] or None)


def pick(targets: dict[str, CostTable | None], drafts: dict[str, CostTable | None] | None) -> DtypeChoice | None:
    """The measured choice, or None when a table is missing (a failed measurement)."""
    t = {k: v for k, v in targets.items() if v is not None}
    d = None if drafts is None else {k: v for k, v in drafts.items() if v is not None}
    if not t or len(t) != len(targets) or (d is not None and len(d) != len(drafts or {})):
        return None
    return choose_dtypes(t, d)
