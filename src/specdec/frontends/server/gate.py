"""Pure ASGI middleware in front of the routes, in this order: counts every response's status;
refuses a ``Host`` the server does not answer to (400) and a cross-site ``Origin`` not allowed
(403) (see :mod:`.origins`); checks the API key (401) on every path but ``/health``
(``/metrics``, ``/openapi.json`` and the docs included, as vLLM does), and records a digest of it
(``request.state.key_id``), of which the routes name the request's caller (requests of one key share
what the engine keeps across requests, :func:`specdec.frontends.server.app.cache_scope`); requires ``Content-Type:
application/json`` on a body (415); caps the request body (413) before anything parses it: by
``Content-Length`` when given, else by counting a chunked body as it arrives. An exception that
escapes the routes before the response began is answered here: a 500 in OpenAI's error shape."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging

from .errors import error_body
from .metrics import Metrics
from .origins import Access

log = logging.getLogger("specdec.server")
ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize", "/tokenizer_info",
             "/health", "/metrics")
#: paths open without the API key: the liveness probe (everything else needs it when one is set,
#: /metrics too: its counters tell what other clients ask for)
OPEN = ("/health",)


def endpoint_label(path: str) -> str:
    if path in ENDPOINTS:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"


def shown(value: str, limit: int = 80) -> str:
    """A header value quoted for an error message, cut at ``limit`` characters."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def key_id(key: bytes) -> str:
    """The API key that let a request in, as the routes name its caller by
    (:func:`specdec.frontends.server.app.cache_scope`): a digest of it, never the key itself."""
    return "key:" + hashlib.sha256(key).hexdigest()[:16]


def bearer_token(value: bytes) -> bytes | None:
    """The token of ``Authorization: Bearer TOKEN`` (the scheme in any case, RFC 9110), else None."""
    scheme, _, token = value.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" and token.strip() else None


def is_json(content_type: bytes | None) -> bool:
    """``application/json`` or ``application/<x>+json``, parameters (``; charset=utf-8``) aside."""
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


async def send_error(send, status: int, message: str, code: str | None = None, headers=()) -> None:
    body = json.dumps(error_body(status, message, None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


class Gate:
    def __init__(self, app, metrics: Metrics, api_key: str | None, max_body_bytes: int, access: Access | None = None):
        self.app, self.metrics, self.max_body = app, metrics, max_body_bytes
        self.key = None if api_key is None else api_key.encode()
        self.access = access or Access()

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
        except Exception:
            if statuses:  # mid-response: nothing to answer with; the server closes the connection
                raise
            log.exception("request failed")  # a bug: OpenAI's error shape, and the connection stays usable
            await send_error(counted, 500, "internal error; see the server log")
        finally:
            if statuses:
                self.metrics.response(endpoint_label(scope["path"]), statuses[0])

    async def _gate(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        host = headers[b"host"].decode("latin-1") if b"host" in headers else None
        if not self.access.host_ok(host):
            return await send_error(send, 400, f"this server does not answer to Host {shown(host)} (allowed: "
                                    f"{', '.join(self.access.hosts)}; see --allowed-host)", "host_not_allowed")
        origin = headers[b"origin"].decode("latin-1") if b"origin" in headers else None
        if not self.access.origin_ok(origin, host):
            return await send_error(send, 403, f"cross-origin request from {shown(origin)} refused (start the server "
                                    "with --allow-origin to allow it)", "origin_not_allowed")
        if self.key is not None and scope["path"] not in OPEN:
            given = bearer_token(headers.get(b"authorization", b""))
            if given is None or not hmac.compare_digest(given, self.key):
                return await send_error(send, 401, "missing or wrong API key (send 'Authorization: Bearer <key>')",
                                        "invalid_api_key", [(b"www-authenticate", b"Bearer")])
            scope.setdefault("state", {})["key_id"] = key_id(given)  # the routes' request.state.key_id
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        if not is_json(headers.get(b"content-type")):
            given = headers.get(b"content-type", b"none").decode("latin-1")
            return await send_error(send, 415, f"send the body as JSON with 'Content-Type: application/json' "
                                    f"(got {shown(given)})", "unsupported_media_type")
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
