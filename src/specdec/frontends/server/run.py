"""Run an app with uvicorn: in the foreground (``specdec serve``) or in a background thread
(tests, ``scripts/bench_server.py``) on a loopback port picked by the OS."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from typing import Iterator


def _config(app, log_level: str, **kw):
    import uvicorn

    return uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5, lifespan="on", **kw)


def serve(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve until interrupted (Ctrl-C: stop taking requests, finish or cancel, exit)."""
    import uvicorn

    uvicorn.Server(_config(app, log_level, host=host, port=port)).run()


@contextmanager
def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                    start_timeout: float = 30.0) -> Iterator[str]:
    """Serve ``app`` in a daemon thread; yields the base URL (``http://127.0.0.1:PORT``). The
    server stops (and its engine worker with it) when the block exits."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(_config(app, log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="specdec-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(start_timeout)
        sock.close()
