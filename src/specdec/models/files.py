"""Files in folders someone else may have made (a bench folder sent to you, a trace, a folder of
cost tables): read only regular files of a bounded size, and write only inside the folder.

- :func:`read_regular` opens without blocking (a FIFO does not hang the open), refuses anything
  but a regular file (a FIFO, ``/dev/zero``, a folder) and a file over its size limit, and reads
  at most that many bytes: a one-line :class:`~specdec.errors.SpecdecError` naming the file.
- :func:`write_inside` writes a file under a folder: every folder on the way below it is opened
  without following a link (one that is a link, or not a folder, is refused in one line), and the
  file is written to a fresh temporary name and renamed over the old one, which replaces a link
  or a hard link of that name instead of writing through it. So nothing is ever written outside.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from ..errors import SpecdecError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def read_regular(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes (module docstring)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpecdecError(f"{path}: not a regular file (a {_kind(st.st_mode)}); refusing to read it as a {what}")
        if st.st_size > limit:
            raise SpecdecError(f"{path}: {st.st_size} bytes, over the {limit} a {what} may have")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:  # grew while read
            raise SpecdecError(f"{path}: over the {limit} bytes a {what} may have")
        return b"".join(chunks)
    except OSError as exc:
        raise SpecdecError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISDIR, "folder"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def write_inside(folder: str | os.PathLike, relative: str, data: bytes | str) -> Path:
    """Write ``data`` to ``folder/relative`` without ever writing outside ``folder`` (module
    docstring); ``relative``'s folders are made as needed. Returns the path written."""
    folder = Path(folder)
    *parts, name = Path(relative).parts
    if not name or any(p in ("..", "/") for p in (*parts, name)):
        raise ValueError(f"{relative!r} is not a plain relative path")
    where = folder
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SpecdecError(f"{folder}: cannot write into it ({exc.strerror or exc})") from None
    try:
        for part in parts:
            where = where / part
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                raise SpecdecError(f"{where} is a link or not a folder; refusing to write outside {folder}") from None
            os.close(fd)
            fd = inner
        _replace(fd, name, data.encode("utf-8") if isinstance(data, str) else data, where / name, folder)
    finally:
        os.close(fd)
    return where / name


def _replace(dir_fd: int, name: str, data: bytes, shown: Path, folder: Path) -> None:
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise SpecdecError(f"{shown}: cannot write it inside {folder} ({exc.strerror or exc})") from None
