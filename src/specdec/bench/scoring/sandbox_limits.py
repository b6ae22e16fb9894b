"""What the kernel enforces on the sandbox beyond bubblewrap's namespaces (see :mod:`.sandbox`).

- **A seccomp filter** (libseccomp, through ``pyseccomp``; bwrap's ``--seccomp FD`` loads it just
  before the program starts) that refuses, with ``EPERM``, what a per-process memory limit does
  not count or what the read-only tree does not stop: ``memfd_create`` and ``memfd_secret``
  (memory held by a file no mount limits), ``shmget`` (System V shared memory, kept after the
  program detaches it), ``socket(AF_UNIX, ...)`` (a socket file in a bound folder is reachable on a
  read-only mount, and the network namespace does not cover paths) and ``io_uring_setup`` (its
  operations pass by the filter). Every other call is allowed; calls of another architecture
  (32-bit ones) kill the process.
- **A cgroup v2 memory limit**, where the machine allows one: when ``$SPECDEC_SANDBOX_CGROUP``
  names a cgroup v2 folder (delegated to this user) whose ``cgroup.subtree_control`` holds
  ``memory``, or this process's own cgroup does (the root cgroup of a machine or of a container
  that has one), each sandboxed process runs in a fresh cgroup under it with ``memory.max`` (and
  no swap): the kernel then counts everything the process and its children hold, shared memory,
  pipes and the files of its tmpfs included. Elsewhere (cgroup v1, or no delegation) the limits
  are the per-process ``RLIMIT_AS`` (shared mappings count while mapped), the filter above, and
  the tmpfs's size for files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import tempfile
import time
from pathlib import Path
from typing import Iterator

#: refused by the filter, if the kernel and libseccomp know them
REFUSED = ("memfd_create", "memfd_secret", "shmget", "io_uring_setup")
CGROUP_ENV = "SPECDEC_SANDBOX_CGROUP"
MOUNTINFO = "/proc/self/mountinfo"
OWN_CGROUP = "/proc/self/cgroup"
SECCOMP_MISSING = ("the sandbox's seccomp filter needs libseccomp and pyseccomp: "
                   "apt-get install libseccomp2 && pip install pyseccomp")


def seccomp_available() -> str:
    """Why the filter cannot be made here ("" when it can)."""
    try:
        _filter()
    except (ImportError, OSError, RuntimeError) as exc:
        return f"{SECCOMP_MISSING} ({type(exc).__name__}: {exc})"
    return ""


def _filter():
    import pyseccomp as seccomp

    f = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in REFUSED:
        try:
            f.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (ValueError, RuntimeError, OSError):  # a call this libseccomp does not know: none to refuse
            pass
    f.add_rule(seccomp.ERRNO(errno.EPERM), "socket", seccomp.Arg(0, seccomp.EQ, socket.AF_UNIX))
    return f


def seccomp_file():
    """The filter as a compiled BPF program in an unnamed temporary file, at its start (for
    bwrap's ``--seccomp``: pass its ``fileno()``; close it after the sandbox started)."""
    f = tempfile.TemporaryFile()
    _filter().export_bpf(f)
    f.flush()
    f.seek(0)
    return f


# ----------------------------------------------------------------------------------- cgroup v2
def _cgroup2_mount(mountinfo: str = MOUNTINFO) -> Path | None:
    try:
        with open(mountinfo) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    return Path(left.split()[4])
    except OSError:
        pass
    return None


def own_cgroup(mountinfo: str = MOUNTINFO, cgroup: str = OWN_CGROUP) -> Path | None:
    """This process's cgroup v2 folder (None without a cgroup v2 mount)."""
    mount = _cgroup2_mount(mountinfo)
    try:
        with open(cgroup) as f:
            rel = next((line[3:].strip() for line in f if line.startswith("0::")), None)
    except OSError:
        return None
    if mount is None or rel is None:
        return None
    return mount / rel.lstrip("/")


def cgroup_parent() -> Path | None:
    """A cgroup v2 folder to make the sandboxes' cgroups in, with the memory controller given to
    its children: ``$SPECDEC_SANDBOX_CGROUP``, else this process's own cgroup; None where neither."""
    given = os.environ.get(CGROUP_ENV)
    folder = Path(given) if given else own_cgroup()
    if folder is None:
        return None
    try:
        controls = (folder / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    return folder if "memory" in controls and os.access(folder, os.W_OK | os.X_OK) else None


@contextlib.contextmanager
def memory_cgroup(memory_mb: int | None) -> Iterator[Path | None]:
    """A fresh cgroup with ``memory.max`` = ``memory_mb`` MiB and no swap, for the processes of one
    sandbox: yields its ``cgroup.procs`` (a process joins by writing its pid there, see
    :func:`joined`), or None where no cgroup can be made (module docstring). Removed on the way out,
    any process left in it killed first."""
    parent = cgroup_parent() if memory_mb else None
    if parent is None:
        yield None
        return
    folder = parent / f"specdec-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        folder.mkdir()
        (folder / "memory.max").write_text(f"{int(memory_mb or 0) << 20}\n")
        with contextlib.suppress(OSError):  # absent without swap accounting
            (folder / "memory.swap.max").write_text("0\n")
    except OSError:
        with contextlib.suppress(OSError):
            folder.rmdir()
        yield None
        return
    try:
        yield folder / "cgroup.procs"
    finally:
        _remove(folder)


def _remove(folder: Path) -> None:
    with contextlib.suppress(OSError):
        (folder / "cgroup.kill").write_text("1\n")
    for _ in range(50):  # the killed processes leave it within milliseconds
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                return
            time.sleep(0.01)


def joined(procs: Path | None, command: list[str]) -> list[str]:
    """``command`` run from inside the cgroup whose ``cgroup.procs`` is ``procs`` (a shell writes
    its own pid there, then becomes the command), or as is when ``procs`` is None."""
    if procs is None:
        return command
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *command]
