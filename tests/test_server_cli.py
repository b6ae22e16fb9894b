"""``specdec serve``: flags, early validation, and (slow) the real command on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from specdec.cli import main  # noqa: E402


def test_serve_help_lists_server_model_and_decoding_flags(capsys):
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--api-key", "--max-tokens-limit", "--max-body-bytes", "--max-queue",
                 "--allowed-host", "--allow-origin", "--request-timeout", "--shared-caches", "--no-shared-caches",
                 "--caller-cache-mb",
                 "--target", "--draft", "--dtype", "--policy", "--drafter", "--k", "--max-new-tokens", "--temperature"):
        assert flag in out
    assert "127.0.0.1" in out


@pytest.mark.parametrize("argv", [
    ["--policy", "nope"],
    ["-k", "0"],
    ["--temperature", "-1"],
    ["--max-new-tokens", "100", "--max-tokens-limit", "50"],
    ["--port", "0"],
    ["--max-body-bytes", "0"],
    ["--api-key", ""],
    ["--api-key", "  "],
    ["--request-timeout", "-1"],
    ["--request-timeout", "nan"],
    ["--caller-cache-mb", "-1"],
], ids=["policy", "k", "temperature", "limit", "port", "body", "empty key", "blank key", "timeout", "timeout nan",
        "caller cache"])
def test_bad_flags_fail_before_loading(argv, capsys):
    assert main(["serve", "--target", "/nonexistent/model", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: ") and "nonexistent" not in err
    assert len(err.strip().splitlines()) == 1


def test_an_empty_key_in_the_environment_is_refused(monkeypatch, capsys):
    """SPECDEC_API_KEY= (set, but empty) served with no key at all."""
    monkeypatch.setenv("SPECDEC_API_KEY", "")
    assert main(["serve", "--target", "/nonexistent/model"]) == 2
    assert "the API key is empty" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_serve_command_end_to_end(tiny_dirs, tmp_path):
    target, draft = tiny_dirs
    port = _free_port()
    cmd = [sys.executable, "-m", "specdec", "serve", "--target", str(target), "--draft", str(draft),
           "--dtype", "float32", "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
           "--api-key", "k3y", "--policy", "ar", "--max-new-tokens", "5", "--served-model-name", "tiny",
           "--log-level", "warning"]
    env = {**os.environ, "SPECDEC_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        assert httpx.post(base + "/v1/completions", json={"prompt": "abc"}).status_code == 401
        r = httpx.post(base + "/v1/completions", json={"prompt": "abc"}, headers={"authorization": "Bearer k3y"})
        body = r.json()
        assert r.status_code == 200 and body["model"] == "tiny"
        assert body["usage"]["completion_tokens"] <= 5  # --max-new-tokens is the default
        assert body["usage"]["speculative"]["policy"] == "ar"  # --policy is the default
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
            raise
    assert proc.returncode in (0, 130), proc.stderr.read()
