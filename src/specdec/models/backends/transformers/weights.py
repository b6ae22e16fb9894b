"""Loading a local safetensors folder with a load peak close to the weights kept.

``from_pretrained`` memory-maps each safetensors file and casts from the mapped pages: loading a
bf16 folder as float32 keeps the whole file's pages resident while the float32 copy grows, so the
load peaks at ~1.5x the weights kept (measured: 10.5 GB for a 6.8 GB float32 1.5B model). Here the
model is built with empty parameters (buffers such as rotary frequencies computed as usual), and
each tensor is read through the ``safetensors`` library with plain reads (its ``pread`` backend:
no memory map), cast a few megabytes of rows at a time into its own buffer, and put in place
before the next is read: the peak is the weights kept plus one chunk (tested).

Only plain folders that need a cast take this path: safetensors weights (one file or an index of
shards) stored in another floating-point dtype than the one asked for, and a config without
quantization. A folder already in the asked dtype loads best through the memory map (the
parameters are the file's pages, no copy). Anything else (``.bin`` weights, quantized checkpoints, a model whose
tensor names do not match its parameters) returns None, and the caller uses ``from_pretrained``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterator

import torch

#: the dtype names a safetensors header stores -> torch dtypes (the ones a causal LM checkpoint holds;
#: the names ``dtype=`` takes are :data:`specdec.models.backends.transformers.dtypes.DTYPES`)
STORED = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def safetensors_files(folder: Path) -> list[Path]:
    """The folder's safetensors files (the shards its index names, or the single file); [] if none."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


#: bytes read at a time when a tensor is cast on the way in (the only transient memory of a load)
CHUNK_BYTES = 8 << 20


def _open(path: Path):
    """The file through the ``safetensors`` library, read with ``pread`` (no memory map, so no page
    of the file stays resident; a slice reads only its own bytes)."""
    from safetensors import safe_open

    return safe_open(str(path), framework="pt", backend="pread")


def read_safetensors(path: Path, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor in the file, in file order; with ``dtype``, floating-point
    tensors are cast to it on the way in, ``CHUNK_BYTES`` of rows at a time."""
    with _open(path) as f:
        names = f.offset_keys() if hasattr(f, "offset_keys") else f.keys()
        for name in names:
            part = f.get_slice(name)
            stored = STORED.get(part.get_dtype())
            if stored is None:
                raise ValueError(f"{path.name}: tensor {name} has dtype {part.get_dtype()}, which is not read here")
            want = dtype if dtype is not None and stored.is_floating_point else stored
            shape = list(part.get_shape())
            if want == stored or not shape:
                yield name, f.get_tensor(name).to(want)
                continue
            out = torch.empty(shape, dtype=want)
            row = stored.itemsize * max(1, math.prod(shape[1:]))
            step = max(1, CHUNK_BYTES // row)
            for lo in range(0, shape[0], step):
                hi = min(lo + step, shape[0])  # (a slice past the end is an error here)
                out[lo:hi].copy_(part[lo:hi])
            yield name, out


def stored_dtypes(path: Path) -> set[torch.dtype | None]:
    """The dtypes of a safetensors file's tensors, from its header alone (None: not one of :data:`STORED`)."""
    with _open(path) as f:
        return {STORED.get(f.get_slice(name).get_dtype()) for name in f.keys()}


def needs_cast(files: list[Path], dtype: torch.dtype) -> bool:
    """Whether some floating-point tensor is stored in another dtype than ``dtype``. When none is,
    ``from_pretrained``'s memory map is the better load: the parameters are the file's own pages,
    nothing is copied."""
    return any(d is not None and d.is_floating_point and d != dtype for f in files for d in stored_dtypes(f))


def load_lean(folder: Path, dtype: torch.dtype):
    """The folder's causal LM in ``dtype`` with a load peak of the weights plus one chunk,
    or None when the folder is not a plain safetensors checkpoint (module docstring)."""
    try:
        from accelerate import init_empty_weights
    except ImportError:  # accelerate comes with the models extra; without it, transformers' loader
        return None
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    files = safetensors_files(folder)
    if not files or not needs_cast(files, dtype):
        return None
    config = AutoConfig.from_pretrained(str(folder))
    if getattr(config, "quantization_config", None):
        return None
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    for path in files:
        for name, tensor in read_safetensors(path, dtype):
            if name not in names:
                return None  # a checkpoint whose names need transformers' own key mapping
            module_name, _, leaf = name.rpartition(".")
            module = model.get_submodule(module_name)
            module._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)
            del tensor
    model.tie_weights()
    missing = [n for n, p in model.named_parameters(remove_duplicate=False) if p.device.type == "meta"]
    if missing:
        return None
    if (folder / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
    return model.eval()
