"""Run an untrusted program (model-written code) against its tests, isolated from the machine.

Isolation (``isolation()`` probes it once; the bench records its ``label`` in ``run.json``), the
same as root (``ISOLATED``) and as any other user (``ISOLATED_USERNS``) but for identity:

- **namespaces**: ``unshare --pid --fork --kill-child --mount --mount-proc --net --ipc --uts``
  starts the supervisor (:mod:`.sandbox_child`) as pid 1 of its own pid namespace, with a
  network namespace holding only a downed loopback (no route anywhere, abstract unix sockets
  cut off) and a mount namespace where everything is read-only and nosuid except a tmpfs work
  folder (``/tmp/work``, ``TMP_MB``); ``/tmp``, ``/run``, ``/root``, ``/home`` and the like are
  covered by empty tmpfs, so no socket file or scratch file of the host is reachable, and
  ``/dev`` holds only null, zero, full, random and urandom (no terminal, no disk). Not root,
  ``--user --map-root-user`` comes first: a new user namespace, where the supervisor is root
  over these namespaces only, owns them (as ``unshare -r`` does). The program then runs in a pid
  namespace of its own inside, with a ``/proc`` that shows it alone.
- **an identity of its own** for the program (and another for its tester), with no
  capabilities and ``no_new_privs``; ``RLIMIT_NPROC`` (``NPROC``) bounds the processes it can
  start. As root: a fresh unprivileged uid per run, with no groups, that owns nothing. Not root:
  a user namespace of its own (nested in the sandbox's) with every capability dropped, so it has
  none over the sandbox's namespaces; its uid outside is the user's, so the supervisor and the
  tester are non-dumpable (not to be traced or read) and, being in another pid namespace, cannot
  be named, let alone signalled. Either way root-only files (``/etc/shadow``) cannot be read and
  no process outside can be signalled or traced. What the user's uid adds, not root: the program
  can read what the user can read outside the covered folders (root's fresh uid reads only
  world-readable files), with the user's supplementary groups (an unprivileged process cannot
  drop them). It can write nothing outside the work folder either way.
- **limits**: memory (``RLIMIT_AS``), CPU seconds, file size, no core dumps, 256 open files, and
  a wall-clock timeout after which the ``unshare`` process is killed; ``--kill-child`` then kills
  pid 1, and the kernel kills every process of the pid namespace (``setsid`` does not help). Should
  the caller die first, pid 1 exits on its own alarm 5 s after the timeout.
- a weaker in-process layer as before: Python's sockets and the destructive ``os``/``shutil``/
  ``subprocess`` functions are removed in the program process (ctypes gets past it; the layers
  above do not depend on it).

``unshare`` (util-linux) is the one tool for both, not bubblewrap: ``bwrap`` would set up the
outer namespaces, but the program and tester each need namespaces and an identity of their own
inside, which the supervisor makes anyway; and one code path is one set of tests.

**Verdict.** A program that shares a process with the code deciding "passed" can always forge it
(any secret in its memory or any pipe it holds can be found with ctypes). So the tests run in a
separate *tester* process, with an identity of its own, that never shares memory with the
program: ``check(candidate)`` runs there, and ``candidate`` (and every other name the tests use
without defining it) is a proxy that sends the arguments to the program process and gets the
result back as plain data (see :func:`.sandbox_child.encode`; exact types only, so an object that
equals everything is refused). The program never sees the tests or their expected values, cannot
signal, trace or read the tester or the supervisor, and has no handle on the verdict pipe; the
supervisor (pid 1) reads the verdict from the tester alone. To pass, a program has to return the
right values. ``run_program`` without tests (a plain script) can only report "ran to the end" from
the program's own process, which a hostile program can fake: the bench always passes tests.

**Without isolation** (no ``unshare``, unprivileged user namespaces turned off for a non-root user,
a kernel without ``mount_setattr``, a container that forbids the namespaces) ``run_program`` raises
:class:`SandboxUnavailable`, whose one line says how to get isolation (the sysctl to set, or root),
unless called with ``unsafe=True`` (``specdec bench --unsafe-exec``): then the same processes run
without namespaces or uid change, with the limits and the in-process layer only, and a timeout
kills their process group (a ``setsid`` child escapes it), label ``unsafe: rlimits only``.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecdecError

DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024
OUTPUT_LIMIT = 8 << 20  # bytes a program may write to stdout/stderr or one file
TMP_MB = 64  # the work folder's tmpfs
NPROC = 16  # processes (and threads) the program's uid may have at once
UNSHARE_FLAGS = ("--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--net", "--ipc", "--uts")
USERNS_FLAGS = ("--user", "--map-root-user")  # first, when not root: the other namespaces belong to it
ISOLATED = "namespaces (pid, mount, net, ipc, uts) + fresh uid"  # as root
ISOLATED_USERNS = "user namespaces (pid, mount, net, ipc, uts), no capabilities"  # not root
UNSAFE = "unsafe: rlimits only"
PROC_SYS = "/proc/sys"
_CHILD = Path(__file__).with_name("sandbox_child.py")


class SandboxUnavailable(SpecdecError):
    """The machine cannot isolate untrusted code and ``unsafe`` was not given."""


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: str  # "passed" | "timed out" | "failed: <why>"
    returncode: int | None
    seconds: float
    isolation: str  # ISOLATED, ISOLATED_USERNS or UNSAFE


@dataclass(frozen=True)
class Isolation:
    available: bool
    why: str  # empty when available; else one line: what failed and how to get isolation
    label: str = ISOLATED  # when available: ISOLATED (as root) or ISOLATED_USERNS


@functools.lru_cache(maxsize=None)
def isolation() -> Isolation:
    """Whether the full isolation works here: checked once by running a small check in it."""
    if not hasattr(os, "geteuid"):
        return Isolation(False, "the sandbox needs Linux namespaces")
    return probe(ISOLATED if os.geteuid() == 0 else ISOLATED_USERNS)


def probe(mode: str) -> Isolation:
    """Run a small check isolated as ``mode`` (ISOLATED or ISOLATED_USERNS); say why not if it fails."""
    if shutil.which("unshare") is None:
        return Isolation(False, "unshare is not installed: install util-linux")
    try:
        res = _run("def f():\n    return 41 + 1\n", "def check(c):\n    assert c() == 42\n", "f",
                   timeout=30, memory_mb=DEFAULT_MEMORY_MB, mode=mode)
    except OSError as e:
        res = SandboxResult(False, f"unshare failed: {e}", None, 0.0, mode)
    if res.passed:
        return Isolation(True, "", mode)
    why = res.status.removeprefix("failed: ").removeprefix("sandbox error: ")
    return Isolation(False, why if mode == ISOLATED else f"{why}; {userns_hint()}", mode)


def userns_hint(proc_sys: str | None = None) -> str:
    """How to get unprivileged user namespaces here, from the sysctls (under ``proc_sys``, default
    ``PROC_SYS``) that turn them off."""
    def value(name: str) -> str | None:
        try:
            with open(os.path.join(proc_sys or PROC_SYS, name)) as f:
                return f.read().strip()
        except OSError:
            return None

    if value("kernel/unprivileged_userns_clone") == "0":
        return ("unprivileged user namespaces are off: enable them with "
                "'sudo sysctl -w kernel.unprivileged_userns_clone=1', or run as root")
    if value("user/max_user_namespaces") == "0":
        return ("user namespaces are off: enable them with 'sudo sysctl -w user.max_user_namespaces=10000', "
                "or run as root")
    if value("kernel/apparmor_restrict_unprivileged_userns") == "1":
        return ("AppArmor restricts unprivileged user namespaces: lift it with "
                "'sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0', or run as root")
    return "unprivileged user namespaces are unavailable here (a container may forbid them): run as root"


def label(unsafe: bool = False) -> str:
    """The isolation a run gets here (what ``run.json`` records), or SandboxUnavailable."""
    iso = isolation()
    if iso.available:
        return iso.label
    if not unsafe:
        raise SandboxUnavailable(f"cannot isolate model-written code here ({iso.why}); pass --unsafe-exec to run "
                                 "it with resource limits only")
    return UNSAFE


def run_program(
    program: str, *, tests: str | None = None, entry_point: str | None = None, timeout: float = DEFAULT_TIMEOUT,
    memory_mb: int | None = DEFAULT_MEMORY_MB, unsafe: bool = False,
) -> SandboxResult:
    """Execute ``program`` (Python source) and, with ``tests``, ``check(entry_point)`` against it;
    see the module docstring. Raises SandboxUnavailable without isolation unless ``unsafe``."""
    if tests is not None and not entry_point:
        raise ValueError("tests need an entry_point")
    return _run(program, tests, entry_point, timeout=timeout, memory_mb=memory_mb, mode=label(unsafe))


def _command(mode: str) -> list[str]:
    """The supervisor's command line: under ``unshare`` unless ``mode`` is UNSAFE."""
    child = [sys.executable, "-I", "-c", _CHILD.read_text()]
    if mode == UNSAFE:
        return child
    userns = USERNS_FLAGS if mode == ISOLATED_USERNS else ()
    return [shutil.which("unshare") or "unshare", *userns, *UNSHARE_FLAGS, *child]


def _run(program: str, tests: str | None, entry_point: str | None, *, timeout: float, memory_mb: int | None,
         mode: str) -> SandboxResult:
    prog = program.encode("utf-8", "replace")
    test_bytes = None if tests is None else tests.encode("utf-8", "replace")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specdec-sandbox-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            header = json.dumps({
                "memory_bytes": int(memory_mb) << 20 if memory_mb else None,
                "cpu_seconds": max(1, math.ceil(timeout)) + 1, "wall_seconds": math.ceil(timeout) + 5,
                "output_bytes": OUTPUT_LIMIT, "nproc": NPROC,
                "tmp_mb": TMP_MB, "uid": 1_000_000_000 + 2 * secrets.randbelow(500_000_000),
                "isolated": mode != UNSAFE, "userns": mode == ISOLATED_USERNS,
                "out_fd": out.fileno(), "entry_point": entry_point,
                "program_bytes": len(prog), "tests_bytes": None if test_bytes is None else len(test_bytes),
            }).encode()
            payload = struct.pack(">Q", len(header)) + header + prog + (test_bytes or b"")
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
            proc = subprocess.Popen(_command(mode), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, cwd=tmp, env=env, start_new_session=True,
                                    pass_fds=(out.fileno(),))
            timed_out = False
            try:
                report, _ = proc.communicate(input=payload, timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out, report = True, b""
            finally:
                _kill_group(proc.pid)
                proc.wait()
        seconds = time.perf_counter() - start
        stderr_tail = _tail(err_path)
    iso = mode
    rc = proc.returncode
    if timed_out:
        return SandboxResult(False, "timed out", rc, seconds, iso)
    try:
        result = json.loads(report.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        lines = [ln for ln in stderr_tail.splitlines() if ln.strip()]
        return SandboxResult(False, f"failed: sandbox error: {lines[-1] if lines else f'exit status {rc}'}"[:300],
                             rc, seconds, iso)
    if "error" in result:
        return SandboxResult(False, f"failed: sandbox error: {result['error']}"[:300], rc, seconds, iso)
    verdict = result.get("verdict") or {}
    if verdict.get("passed") is True:
        return SandboxResult(True, "passed", rc, seconds, iso)
    statuses = (result.get("status"), result.get("program_status"))
    if "killed by SIGXCPU" in statuses:  # the CPU limit (the wall-clock one is handled above)
        return SandboxResult(False, "timed out", rc, seconds, iso)
    why = verdict.get("why") or f"{result.get('status')} before the end"
    if "exited" in why and str(statuses[1]).startswith("killed"):
        why += f" ({statuses[1]})"
    return SandboxResult(False, f"failed: {str(why).strip()}"[:300], rc, seconds, iso)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str, n: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
