"""specdec's cache on disk: its home folder, locks, file hashes, and folders written atomically
and checked on every load.

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


MANIFEST = "specdec.json"
FORMAT = 1


def specdec_home() -> Path:
    """Where specdec keeps what it caches (converted models, cost tables, ...): ``$SPECDEC_HOME``, default
    ``~/.cache/specdec``."""
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


def write_manifest(folder: Path, source: dict | None) -> None:
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


def build_atomically(final: Path, build: Callable[[Path], dict | None], full_check: bool = False) -> Path:
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
