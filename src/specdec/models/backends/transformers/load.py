"""Loading a transformers checkpoint: a model source (:mod:`specdec.models.sources`) -> what
``from_pretrained`` reads (a bundled model or a GGUF file converted once into a cached bf16 folder,
:mod:`specdec.models.backends.transformers.convert`) -> the torch module and its tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ....errors import SpecdecError
from ...sources import locate
from .convert import ensure_converted, prepare
from .weights import load_lean

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class Checkpoint:
    """A checkpoint loaded into torch: the module and its tokenizer, with where they came from."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str
    path: Path | None


def resolve(source: str, progress: bool = True, verify: bool = False) -> tuple[str, str, Path | None]:
    """``(kind, ref, path)``: what ``from_pretrained`` should read for ``source`` (bundled models and
    GGUF files are prepared into their cached folders first; ``verify``: a bundled model's cached
    files hashed again). ``kind`` is ``folder`` or ``hub``."""
    kind, path = locate(source)
    if kind == "bundled":
        path = prepare(source, progress=progress, verify=verify)
        kind = "folder"
    if kind == "gguf":
        assert path is not None  # locate gives a GGUF file's path
        path = ensure_converted(path, progress=progress)
        kind = "folder"
    return kind, (str(path) if path is not None else source), path


def folder_config(folder: Path):
    """The transformers config in a model folder (no weights)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder))


def load_config(source: str, progress: bool = True):
    """The model's transformers config (no weights), e.g. to key a cost table before loading."""
    kind, ref, _ = resolve(source, progress)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(ref)
    except OSError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecdecError(f"could not load the config of model {source!r} ({first_line})") from exc


def load(source: str, dtype: torch.dtype, device: torch.device, progress: bool = True) -> Checkpoint:
    """Load a causal LM and its tokenizer from a bundled name, folder, .gguf file or hub id."""
    kind, ref, path = resolve(source, progress)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(ref)
        model = load_lean(path, dtype) if kind == "folder" and path is not None else None
        if model is None:  # not a plain safetensors folder: transformers' own loader
            model = AutoModelForCausalLM.from_pretrained(ref, dtype=dtype)
    except OSError as exc:
        where = "the hub: no such local path, and the hub did not answer or has no such id" if kind == "hub" else ref
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecdecError(f"could not load model {source!r} from {where} ({first_line})") from exc
    finally:
        if not progress:
            hf_logging.enable_progress_bar()
    model.to(device)
    return Checkpoint(model=model, tokenizer=tokenizer, source=source, path=path)


