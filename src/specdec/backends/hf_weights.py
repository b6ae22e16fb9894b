"""Loading a local safetensors folder with a load peak close to the weights kept.

``from_pretrained`` memory-maps each safetensors file and casts from the mapped pages: loading a
bf16 folder as float32 keeps the whole file's pages resident while the float32 copy grows, so the
load peaks at ~1.5x the weights kept (measured: 10.5 GB for a 6.8 GB float32 1.5B model). Here the
model is built with empty parameters (buffers such as rotary frequencies computed as usual), and
each tensor is read with plain file reads into its own buffer, cast, and put in place before the
next is read: the peak is the weights kept plus the largest tensor.

Only plain folders that need a cast take this path: safetensors weights (one file or an index of
shards) stored in another floating-point dtype than the one asked for, and a config without
quantization. A folder already in the asked dtype loads best through the memory map (the
parameters are the file's pages, no copy). Anything else (``.bin`` weights, quantized checkpoints, a model whose
tensor names do not match its parameters) returns None, and the caller uses ``from_pretrained``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator

import torch

#: safetensors dtype names -> torch dtypes (the ones a causal LM checkpoint holds)
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
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


def read_safetensors(path: Path, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor in the file, read with plain reads (no memory map, so no
    page of the file stays resident) straight into the tensor's own memory; with ``dtype``,
    floating-point tensors are cast to it ``CHUNK_BYTES`` at a time on the way in."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        header.pop("__metadata__", None)
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            stored = DTYPES.get(info["dtype"])
            if stored is None:
                raise ValueError(f"{path.name}: tensor {name} has dtype {info['dtype']}, which is not read here")
            start, end = info["data_offsets"]
            f.seek(base + start)
            want = dtype if dtype is not None and stored.is_floating_point else stored
            out = torch.empty(info["shape"], dtype=want)
            if want == stored:
                _read_into(f, out.reshape(-1).view(torch.uint8), end - start, path, name)
            else:
                _read_cast(f, out.reshape(-1), stored, end - start, path, name)
            yield name, out


def _read_into(f, dest: torch.Tensor, size: int, path: Path, name: str) -> None:
    """Fill ``dest`` (a flat uint8 view) with the next ``size`` bytes of ``f``."""
    if dest.numel() != size:
        raise ValueError(f"{path.name}: tensor {name} holds {size} bytes, its shape needs {dest.numel()}")
    if size and f.readinto(memoryview(dest.numpy())) != size:
        raise ValueError(f"{path.name}: tensor {name} is cut short")


def _read_cast(f, dest: torch.Tensor, stored: torch.dtype, size: int, path: Path, name: str) -> None:
    """Fill ``dest`` (flat, its own dtype) from the next ``size`` bytes of ``f``, stored as ``stored``,
    one chunk at a time."""
    item = torch.empty((), dtype=stored).element_size()
    if dest.numel() * item != size:
        raise ValueError(f"{path.name}: tensor {name} holds {size} bytes, its shape needs {dest.numel() * item}")
    step = max(1, CHUNK_BYTES // item)
    buf = torch.empty(min(step, dest.numel()), dtype=stored)
    for lo in range(0, dest.numel(), step):
        part = buf[: min(step, dest.numel() - lo)]
        _read_into(f, part.view(torch.uint8), part.numel() * item, path, name)
        dest[lo:lo + part.numel()].copy_(part)


def stored_dtypes(path: Path) -> set[torch.dtype | None]:
    """The dtypes of a safetensors file's tensors, from its header alone (None: not one of DTYPES)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {DTYPES.get(info["dtype"]) for info in header.values()}


def needs_cast(files: list[Path], dtype: torch.dtype) -> bool:
    """Whether some floating-point tensor is stored in another dtype than ``dtype``. When none is,
    ``from_pretrained``'s memory map is the better load: the parameters are the file's own pages,
    nothing is copied."""
    return any(d is not None and d.is_floating_point and d != dtype for f in files for d in stored_dtypes(f))


def load_lean(folder: Path, dtype: torch.dtype):
    """The folder's causal LM in ``dtype`` with a load peak of the weights plus the largest tensor,
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
