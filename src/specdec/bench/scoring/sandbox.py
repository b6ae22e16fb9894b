"""Run an untrusted program (model-written code) against its tests, isolated from the machine.

The program and the tests that judge it run in two processes, each in a bubblewrap sandbox of its
own (``bwrap``, Debian's ``bubblewrap``), joined only by two pipes; ``isolation()`` probes it once
and the bench records its ``label`` in ``run.json``, the same as root (``ISOLATED``) and as any
other user (``ISOLATED_USERNS``) but for identity:

- **namespaces** (``BWRAP_FLAGS``): pid, mount, network, IPC, UTS and cgroup namespaces of its
  own; the program is pid 2 after bwrap's reaper, and ``/proc`` shows those two alone (the tester,
  in another sandbox, cannot even be named). The network holds only a loopback of its own (no
  route anywhere, abstract unix sockets cut off). The whole tree is bound read-only, nosuid and
  nodev; ``/tmp`` is a size-limited tmpfs (``TMP_MB``) holding the work folder, the one place it
  can write; ``/var/tmp``, ``/run``, ``/root``, ``/home`` and the like are covered by empty
  read-only tmpfs (the interpreter's own folders, :func:`interpreter_folders`, bound back where
  they lie under one of them; never the caller's ``sys.path`` or ``PYTHONPATH`` folders), so no
  socket file or scratch file of the host there is reachable; ``/dev`` holds only null, zero, full,
  random and urandom (no terminal, no disk). ``--new-session`` (no terminal to push input into),
  ``--die-with-parent`` (the sandbox dies with its caller), ``no_new_privs``.
- **an identity of its own** for the program and another for its tester, with no capabilities.
  As root: bwrap keeps only CAP_SETUID and CAP_SETGID, and the process takes a fresh unprivileged
  uid, with no groups, that owns nothing (the change of uid clears the two). Not root: a user
  namespace of its own (``--unshare-user``, ``--disable-userns``: it can make no other) with no
  capability; its uid outside is the user's, but being in another pid namespace the sandboxes
  cannot name each other or the caller, let alone signal or trace them. Either way root-only
  files (``/etc/shadow``) cannot be read and no process outside can be signalled. What the user's
  uid adds, not root: the program can read what the user can read outside the covered folders
  (root's fresh uid reads only world-readable files), with the user's supplementary groups (an
  unprivileged process cannot drop them). It can write nothing outside the work folder either way.
- **limits**: memory (``RLIMIT_AS``), CPU seconds, file size, no core dumps, 256 open files,
  ``RLIMIT_NPROC`` (``NPROC``) on the processes it starts, set in the process before the program
  runs; and a wall-clock timeout after which both bwrap processes are killed; their reapers die
  with them, and with the reaper the kernel kills every process of its pid namespace (``setsid``
  does not help).
- **what the kernel adds** (:mod:`.sandbox_limits`): a seccomp filter (bwrap's ``--seccomp``)
  refusing ``memfd_create``, ``shmget``, ``socket(AF_UNIX)`` and ``io_uring_setup``, so memory
  cannot be held outside the per-process limit and no unix socket in a bound folder can be
  reached; and, where the machine allows one, a cgroup v2 ``memory.max`` per process that counts
  all its memory (shared memory and its files included).
- **output**: the program's stdout and stderr are files of its own, the tester's others, so
  ``/proc/self/fd/1`` shows the program its own output only.
- a weaker in-process layer: Python's sockets and the destructive ``os``/``shutil``/
  ``subprocess`` functions are removed in the program process (ctypes gets past it; the layers
  above do not depend on it).

Why bubblewrap and nothing of our own: the namespace code this replaced (a supervisor that split
one ``unshare`` sandbox into the program's and the tester's) argued that the two need namespaces
and an identity each inside, which bwrap would not make; two sandboxes side by side give them
that, with no nesting (a nested bwrap would need a user namespace inside the first) and no
supervisor (the caller reads the verdict), and every guarantee above is one of bwrap's options.
The one step bwrap cannot take is as root: ``--uid`` needs a user namespace, and a user namespace
made by root maps the sandbox to root's own uid, which still owns root's files (``/etc/shadow``
would be readable); so as root the process takes its fresh uid itself, with the two capabilities
bwrap leaves it for that (``os.setresuid``: no namespace code is kept). Not used: ``--as-pid-1``
(bwrap's reaper as pid 1 is what reaps the program's orphans).

**Verdict.** A program that shares a process with the code deciding "passed" can always forge it
(any secret in its memory or any pipe it holds can be found with ctypes). So the tests run in the
*tester*, a process in a sandbox of its own that never shares memory with the program:
``check(candidate)`` runs there, and ``candidate`` (and every other name the tests use without
defining it) is a proxy that sends the arguments to the program process and gets the result back
as plain data (see :func:`.sandbox_child.encode`; exact types only, so an object that equals
everything is refused). The program never sees the tests or their expected values (they are never
in its sandbox), cannot signal, trace or read the tester, and has no handle on the verdict pipe;
the caller reads the verdict from the tester alone. To pass, a program has to return the right
values, and the helpers of the problem's prompt that the tests call are the prompt's own, run in
the tester (``helpers``), not the program's, which it may have redefined to suit a wrong answer.
``run_program`` without tests (a plain script) can only report "ran to the end" from the
program's own process, which a hostile program can fake: the bench always passes tests.

**Without isolation** (bwrap not installed, unprivileged user namespaces turned off for a non-root
user, a container that forbids the namespaces, no libseccomp) ``run_program`` raises :class:`SandboxUnavailable`,
whose one line says how to get isolation (``apt-get install bubblewrap``, the sysctl to set, or
root) and names ``--unsafe-exec``; with ``unsafe=True`` (``specdec bench --unsafe-exec``) the same
two processes run without bwrap or uid change, with the limits and the in-process layer only, and
a timeout kills their process groups (a ``setsid`` child escapes it), label ``unsafe: rlimits only``.
"""

from __future__ import annotations

import contextlib
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
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ...errors import SpecdecError
from .sandbox_limits import joined, memory_cgroup, seccomp_available, seccomp_file

DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024
OUTPUT_LIMIT = 8 << 20  # bytes a program may write to stdout/stderr or one file
TMP_MB = 64  # the work folder's tmpfs
NPROC = 16  # processes (and threads) the program's uid may have at once
WORK = "/tmp/work"
HIDDEN = ("/var/tmp", "/run", "/root", "/home", "/mnt", "/media", "/srv")  # covered, read-only
DEVICES = ("null", "zero", "full", "random", "urandom")  # all of /dev the program gets
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}
BWRAP_FLAGS = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
               "--die-with-parent", "--new-session")
USERNS_FLAGS = ("--unshare-user", "--disable-userns")  # not root
ROOT_FLAGS = ("--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID")  # to take a fresh uid
ISOLATED = "namespaces (pid, mount, net, ipc, uts) + fresh uid"  # as root
ISOLATED_USERNS = "user namespaces (pid, mount, net, ipc, uts), no capabilities"  # not root
UNSAFE = "unsafe: rlimits only"
PROC_SYS = "/proc/sys"
INSTALL = "bubblewrap is not installed: apt-get install bubblewrap"
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
    if shutil.which("bwrap") is None:
        return Isolation(False, INSTALL)
    missing = seccomp_available()
    if missing:
        return Isolation(False, missing)
    try:
        res = _run("def f():\n    return 41 + 1\n", "def check(c):\n    assert c() == 42\n", "f",
                   timeout=30, memory_mb=DEFAULT_MEMORY_MB, mode=mode)
    except OSError as e:
        res = SandboxResult(False, f"bwrap failed: {e}", None, 0.0, mode)
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
    memory_mb: int | None = DEFAULT_MEMORY_MB, unsafe: bool = False, helpers: str | None = None,
) -> SandboxResult:
    """Execute ``program`` (Python source) and, with ``tests``, ``check(entry_point)`` against it;
    see the module docstring. ``helpers``: trusted source the tests may call (a problem's prompt),
    run beside the tests, so that the program cannot replace what they call. Raises
    SandboxUnavailable without isolation unless ``unsafe``."""
    if tests is not None and not entry_point:
        raise ValueError("tests need an entry_point")
    return _run(program, tests, entry_point, timeout=timeout, memory_mb=memory_mb, mode=label(unsafe),
                helpers=helpers)


def bwrap_args(mode: str, cwd: str, seccomp_fd: int | None = None) -> list[str]:
    """bwrap's options for one of the two processes (the module docstring's namespaces), with the
    seccomp filter read from ``seccomp_fd`` (:mod:`.sandbox_limits`)."""
    args = [shutil.which("bwrap") or "bwrap", *BWRAP_FLAGS, *(USERNS_FLAGS if mode == ISOLATED_USERNS else ROOT_FLAGS),
            *(("--seccomp", str(seccomp_fd)) if seccomp_fd is not None else ()),
            "--ro-bind", "/", "/", "--proc", "/proc", "--tmpfs", "/dev"]
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in DEV_LINKS.items():
        args += ["--symlink", target, f"/dev/{name}"]
    args += ["--dir", "/dev/shm", "--remount-ro", "/dev",
             "--size", str(TMP_MB << 20), "--tmpfs", "/tmp", *_python_under("/tmp"), "--perms", "01777", "--dir", WORK]
    for h in HIDDEN:
        if os.path.isdir(h) and not os.path.islink(h):
            args += ["--tmpfs", h, *_python_under(h), "--remount-ro", h]
    return [*args, "--chdir", cwd, "--"]


def _interpreter_paths() -> list[str]:
    """This Python installation's folders and executable as the interpreter names them (links not
    resolved): its prefixes, its standard library and site-packages, its executable's folder."""
    paths = sysconfig.get_paths()
    found = (sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(os.path.abspath(sys.executable)),
             *(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths))
    return [os.path.abspath(p) for p in found if p and os.path.exists(p)]


def interpreter_folders() -> set[str]:
    """The folders of this Python installation the sandbox's ``python -I`` reads: its prefixes and
    its standard library and site-packages, never the caller's ``sys.path`` (a script's folder,
    ``PYTHONPATH``), which may hold anything."""
    return {os.path.realpath(p) for p in _interpreter_paths()}


def interpreter_links() -> dict[str, str]:
    """Where the interpreter reaches its folders or executable through a symbolic link (a virtual
    environment reached through a link to the real one): each path as it names it -> the real one.
    The sandbox binds the real folders and executes ``sys.executable``, so it binds each real one at
    the linked path too (it bound one path and executed the other before, refusing every program)."""
    named = [*_interpreter_paths(), os.path.abspath(sys.executable)]
    return {p: os.path.realpath(p) for p in named if os.path.realpath(p) != p}


def _python_under(folder: str) -> list[str]:
    """bwrap's options that bind this Python installation (:func:`interpreter_folders`, and the
    real folders at the paths it names through links, :func:`interpreter_links`) back where it lies
    under ``folder``, once ``folder`` is covered; the folders on the way readable."""
    links = interpreter_links()
    binds = {p: p for p in interpreter_folders()} | links  # where -> what
    args = []
    for p in sorted(binds):  # the outermost only: what lies inside one comes with it
        if p.startswith(folder + "/") and not any(p.startswith(q + "/") for q in binds):
            between = [q for q in Path(p).parents if Path(folder) in q.parents]  # bwrap would make them 0700
            for q in reversed(between):
                args += ["--perms", "0755", "--dir", str(q)]
            args += ["--ro-bind", binds[p], p]
    return args


def _command(mode: str, role: str, cwd: str, seccomp_fd: int | None = None) -> list[str]:
    """One process's command line: the child under bwrap, unless ``mode`` is UNSAFE."""
    child = [sys.executable, "-I", "-c", _CHILD.read_text(), role]
    return child if mode == UNSAFE else [*bwrap_args(mode, cwd, seccomp_fd), *child]


def _run(program: str, tests: str | None, entry_point: str | None, *, timeout: float, memory_mb: int | None,
         mode: str, helpers: str | None = None) -> SandboxResult:
    isolated = mode != UNSAFE
    uid = 1_000_000_000 + 2 * secrets.randbelow(500_000_000) if mode == ISOLATED else None
    limits = {"memory_bytes": int(memory_mb) << 20 if memory_mb else None,
              "cpu_seconds": max(1, math.ceil(timeout)) + 1, "output_bytes": OUTPUT_LIMIT,
              "nproc": NPROC if isolated else None, "entry_point": entry_point}
    start = time.perf_counter()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="specdec-sandbox-") as tmp, contextlib.ExitStack() as stack:

        def spawn(role: str, source: str, own_uid: int | None, fds: dict, cwd: str, **extra) -> None:
            """One process, its stdin a file: ``<8-byte length><JSON header><source>``; its output
            files its own (what one writes, the other cannot read through ``/proc/self/fd``)."""
            header = json.dumps({**limits, **fds, **extra, "uid": own_uid}).encode()
            Path(tmp, role).write_bytes(struct.pack(">Q", len(header)) + header + source.encode("utf-8", "replace"))
            seccomp = stack.enter_context(seccomp_file()) if isolated else None  # one each: bwrap reads it later
            cgroup = stack.enter_context(memory_cgroup(memory_mb)) if isolated else None
            command = joined(cgroup, _command(mode, role, cwd, None if seccomp is None else seccomp.fileno()))
            with open(Path(tmp, role), "rb") as stdin, open(Path(tmp, f"{role}.out"), "ab") as out, \
                    open(Path(tmp, f"{role}.err"), "ab") as err:
                procs.append(subprocess.Popen(
                    command, stdin=stdin, stdout=out, stderr=err, cwd=tmp,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}, start_new_session=True,
                    pass_fds=[fd for fd in (*fds.values(), seccomp and seccomp.fileno()) if fd is not None]))

        verdict_w: int | None  # None once handed to the children
        verdict_r, verdict_w = os.pipe()
        pipes: tuple[int | None, ...] = os.pipe() + os.pipe() if tests is not None else (None,) * 4
        req_r, req_w, rep_r, rep_w = pipes
        cwd = WORK if isolated else tmp
        try:
            if tests is None:
                spawn("program", program, uid, {"verdict": verdict_w, "requests": None, "replies": None}, cwd)
            else:
                spawn("program", program, uid, {"verdict": None, "requests": req_r, "replies": rep_w}, cwd)
                spawn("tester", tests, uid and uid + 1, {"verdict": verdict_w, "requests": req_w, "replies": rep_r},
                      "/" if isolated else cwd, helpers=helpers)
            _close(verdict_w, *pipes)  # theirs alone now: a process's end is an end of file to the other
            verdict_w, pipes = None, ()
            timed_out, statuses = _wait(procs, timeout - (time.perf_counter() - start))
        finally:
            for p in procs:
                _kill_group(p.pid)
                p.wait()
            _close(verdict_w, *pipes)
        verdict = _read_verdict(verdict_r)
        seconds = time.perf_counter() - start
        errors = "".join(_tail(os.path.join(tmp, f"{role}.err")) for role in ("program", "tester"))
        status = _outcome(timed_out, verdict, statuses, errors)
    return SandboxResult(status == "passed", status, procs[-1].returncode, seconds, mode)


def _wait(procs: list[subprocess.Popen], timeout: float) -> tuple[bool, list[str]]:
    """Wait for the judge (the tester, or the lone program) until ``timeout``: whether it timed out,
    and how each process ended (or "running"), the program's given half a second more."""
    try:
        procs[-1].wait(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        return True, []
    if len(procs) > 1:
        try:  # how the program ended, when it did (a CPU limit reads as a timeout)
            procs[0].wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    return False, [_status(p.poll()) for p in procs]


def _outcome(timed_out: bool, verdict: dict | None, statuses: list[str], stderr_tail: str) -> str:
    """``passed``, ``timed out`` or ``failed: <why>`` (a sandbox that could not be made says so)."""
    if timed_out:
        return "timed out"
    if verdict and verdict.get("passed") is True:
        return "passed"
    setup = [ln for ln in stderr_tail.splitlines() if ln.startswith("bwrap: ")]
    if setup:  # bwrap's own error: the sandbox could not be made
        return f"failed: sandbox error: {setup[-1]}"[:300]
    if "killed by SIGXCPU" in statuses:  # the CPU limit (the wall-clock one is handled above)
        return "timed out"
    why = (verdict or {}).get("why") or f"{statuses[-1]} before the end"
    if "exited" in why and statuses[0].startswith("killed"):
        why += f" ({statuses[0]})"
    return f"failed: {str(why).strip()}"[:300]


def _read_verdict(fd: int) -> dict | None:
    """The one message the judge wrote on the verdict pipe (a 4-byte length and JSON), if any."""
    os.set_blocking(fd, False)
    try:
        data = os.read(fd, 1 << 16)
        (m,) = struct.unpack(">I", data[:4])
        verdict = json.loads(data[4:4 + m])
        return verdict if isinstance(verdict, dict) else None
    except (OSError, ValueError, struct.error):
        return None
    finally:
        os.close(fd)


def _status(rc: int | None) -> str:
    """A process's end as bwrap reports it (a signal as 128 + its number, as a shell does)."""
    if rc is None:
        return "running"
    if rc < 0:  # killed itself (no bwrap around it)
        rc = 128 - rc
    if rc > 128:
        try:
            return f"killed by {signal.Signals(rc - 128).name}"
        except ValueError:
            pass
    return f"exit status {rc}"


def _close(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


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
