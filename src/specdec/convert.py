"""GGUF -> cached bf16 safetensors folders, written atomically and checked on every load.

A cache folder is built in a temporary sibling and renamed into place only when complete, with a
manifest (``specdec.json``) listing every file's size, mtime and sha256. A folder without a valid
manifest is never loaded: an interrupted build leaves only a temporary folder (removed by the next
build), and a folder whose files no longer match their manifest is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from .errors import SpecdecError

MANIFEST = "specdec.json"
FORMAT = 1


def specdec_home() -> Path:
    """Where specdec keeps converted models: ``$SPECDEC_HOME``, default ``~/.cache/specdec``."""
    return Path(os.environ.get("SPECDEC_HOME") or Path.home() / ".cache" / "specdec").expanduser()


def sha256_file(path: Path, progress: Callable[[int], None] | None = None, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            if progress:
                progress(len(block))
    return h.hexdigest()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so two processes never build the same folder at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_manifest(folder: Path, source: dict) -> None:
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            st = p.stat()
            files[str(p.relative_to(folder))] = {
                "size": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "sha256": sha256_file(p),
            }
    manifest = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "source": source, "files": files}
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, folder / MANIFEST)


def check_folder(folder: Path, full: bool = False) -> str | None:
    """None if ``folder`` is a complete cache entry, else why not.

    Always checks that the manifest parses and that every listed file exists with its size; hashes a
    file when its mtime changed since the build, or every file when ``full``.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not files:
            return "manifest of an unknown format"
    except FileNotFoundError:
        return "no manifest (never finished building)"
    except (OSError, ValueError, KeyError, TypeError):
        return "unreadable manifest"
    for rel, meta in files.items():
        p = folder / rel
        try:
            st = p.stat()
        except OSError:
            return f"{rel} is missing"
        if st.st_size != meta["size"]:
            return f"{rel} has {st.st_size} bytes, expected {meta['size']}"
        if (full or st.st_mtime_ns != meta["mtime_ns"]) and sha256_file(p) != meta["sha256"]:
            return f"{rel} does not match its checksum"
    return None


def build_atomically(final: Path, build: Callable[[Path], dict], full_check: bool = False) -> Path:
    """Make ``final`` a complete cache folder, building it with ``build(tmp_dir) -> source info``
    when it is missing or corrupt. Safe against interruption and concurrent builders."""
    final = final.expanduser()
    with file_lock(final.parent / f".{final.name}.lock"):
        problem = check_folder(final, full=full_check) if final.exists() else "missing"
        if problem is None:
            return final
        for stale in final.parent.glob(f".{final.name}.tmp-*"):  # left by a killed build
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            trash = final.parent / f".{final.name}.tmp-corrupt"
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            source = build(tmp)
            write_manifest(tmp, source)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


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
