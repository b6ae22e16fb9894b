"""GGUF -> cached bf16 safetensors folders (built atomically by :mod:`specdec.cache`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .cache import build_atomically, specdec_home
from .errors import SpecdecError


def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = True) -> None:
    """Dequantize a GGUF file with transformers and save model + tokenizer as bf16 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
        )
    except (OSError, ValueError, KeyError) as exc:
        raise SpecdecError(f"could not read GGUF file {gguf_path}: {exc}") from exc
    finally:
        if not progress:
            hf_logging.enable_progress_bar()
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def gguf_cache_dir(gguf_path: Path) -> Path:
    """Cache folder for a user's GGUF file, keyed by its resolved path, size and mtime."""
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return specdec_home() / "gguf" / f"{gguf_path.stem}-{key}"


def ensure_converted(gguf_path: Path, progress: bool = True) -> Path:
    """The cached bf16 folder for a GGUF file, converting it (once) when needed."""

    def build(tmp: Path) -> dict:
        if progress:
            print(f"specdec: converting {gguf_path} to a cached bf16 folder (once)", flush=True)
        convert_gguf(gguf_path, tmp, progress=progress)
        return {"gguf": str(gguf_path.resolve())}

    return build_atomically(gguf_cache_dir(gguf_path), build)
