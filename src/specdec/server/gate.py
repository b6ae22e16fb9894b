"""Pure ASGI middleware in front of the routes: counts every response's status, checks the API
key on ``/v1/`` paths (401), and caps the request body (413) before anything parses it: by
``Content-Length`` when given, else by counting a chunked body as it arrives."""

from __future__ import annotations

import hmac
import json

from .errors import error_body
from .metrics import Metrics

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/tokenizer_info",
             "/health", "/metrics")
#: paths that need the API key when one is set (health and metrics stay open)
KEYED = ("/v1/", "/tokenize", "/detokenize", "/tokenizer_info")


def endpoint_label(path: str) -> str:
    if path in ENDPOINTS:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"


async def send_error(send, status: int, message: str, code: str | None = None, headers=()) -> None:
    body = json.dumps(error_body(status, message, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class Gate:
    def __init__(self, app, metrics: Metrics, api_key: str | None, max_body_bytes: int):
        self.app, self.metrics, self.max_body = app, metrics, max_body_bytes
        self.key = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        statuses: list[int] = []

        async def counted(message):
            if message["type"] == "http.response.start":
                statuses.append(message["status"])
            await send(message)

        try:
            await self._gate(scope, receive, counted)
        finally:
            if statuses:
                self.metrics.response(endpoint_label(scope["path"]), statuses[0])

    async def _gate(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        if self.key is not None and scope["path"].startswith(KEYED):
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.key):
                return await send_error(send, 401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                                        "invalid_api_key", [(b"www-authenticate", b"Bearer")])
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return await send_error(send, 400, "bad Content-Length header")
            if int(length) > self.max_body:
                return await send_error(send, 413, f"request body over {self.max_body} bytes", "request_too_large")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away while sending
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return await send_error(send, 413, f"request body over {self.max_body} bytes", "request_too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
