"""``specdec serve``: the engine behind an OpenAI-compatible HTTP API (FastAPI + uvicorn).

One :class:`~specdec.frontends.api.Pair` serves one request at a time from a FIFO queue, in a worker
thread (:mod:`.worker`); the event loop only parses, queues and streams. Modules: ``app``
(routes), ``schemas`` (request bodies), ``params`` (request -> ``Pair.stream`` arguments),
``structured`` (structured-output fields -> a constraint), ``responses`` (OpenAI response and
chunk shapes), ``metrics`` (Prometheus text), ``gate`` (Host, Origin, API key, content type, body
size, status counting, the last-resort 500), ``origins`` (the Host names and Origins allowed),
``run`` (uvicorn in a thread), ``cli`` (the command).

FastAPI is imported only when an app is built, so ``specdec`` works without the server extra.
"""

from __future__ import annotations

__all__ = ["Limits", "create_app", "serve_in_thread"]


def __getattr__(name: str):
    if name in ("Limits", "create_app"):
        from . import app

        return getattr(app, name)
    if name == "serve_in_thread":
        from .run import serve_in_thread

        return serve_in_thread
    raise AttributeError(name)
