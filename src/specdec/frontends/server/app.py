"""The FastAPI app: ``create_app(pair, defaults, api_key, limits)``.

A request body is parsed and validated in a thread of its own (:func:`.schemas.parse`, bounded work
whatever its shape), never on the event loop; a generation request is then checked against the
server's defaults (``params.build``; a structured-output constraint is compiled for the tokenizer
in the tokenizer's thread) and queued for the one worker
thread, and answered from the events the worker sends back: as one JSON body, or as server-sent
events ending in ``data: [DONE]``. A task per request watches for the client going
away and cancels its job, so a disconnected client frees the engine before its next round; the
same task cancels it with a 503 once the request timeout passes. ``/tokenize`` and ``/detokenize``
run the tokenizer (and the chat template) in a thread of their own, never on the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import AsyncIterator, Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from ...errors import SpecdecError
from ...core.caller import Caller
from ...core.request import DecodeConfig
from ...core.settings import layer
from ...core.text import tokenizer_call
from .errors import APIError, error_body
from .gate import Gate, endpoint_label
from .origins import Access
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE, Metrics
from .params import SAMPLING, Limits, build
from .responses import Shaper, sse
from .schemas import ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest, parse, unknown_field
from .structured import available_kinds, servable
from .worker import Busy, Job, Worker

__all__ = ["Limits", "create_app"]
log = logging.getLogger("specdec.server")


class SafeJSONResponse(JSONResponse):
    """JSON as UTF-8; a string that UTF-8 cannot carry (a lone surrogate) goes out as a ``\\u``
    escape instead of failing the response."""

    def render(self, content) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def check_api_key(api_key: str | None) -> None:
    """Refuse a key that cannot protect anything: empty, or not sendable in a header."""
    if api_key is None:
        return
    if not api_key.strip():
        raise SpecdecError("the API key is empty (--api-key or $SPECDEC_API_KEY): set a key, or unset it to serve "
                           "without one")
    if not (api_key.isascii() and api_key.isprintable()) or any(c.isspace() for c in api_key):
        raise SpecdecError("the API key must be printable ASCII without spaces (it travels in an HTTP header)")


class EventStream(Response):
    """``text/event-stream`` from an async iterator of bytes; however it ends (done, error, client
    gone), the job is cancelled (a no-op once finished) and the disconnect watcher stopped."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], job: Job, watcher: asyncio.Task):
        self.events, self.job, self.watcher = events, job, watcher
        self.status_code, self.background = 200, None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def __call__(self, scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write
            pass
        finally:
            self.job.cancel()
            self.watcher.cancel()


async def _watch_disconnect(receive, job: Job) -> None:
    """Cancel ``job`` when the client disconnects (the body was already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            job.events.put_nowait(("cancelled",))
            return


async def _watch(receive, job: Job, timeout: float) -> None:
    """:func:`_watch_disconnect`, and once ``timeout`` seconds (0: never) have passed, cancel ``job``
    and answer it with a 503 (an error event when its stream already began)."""
    try:
        await asyncio.wait_for(_watch_disconnect(receive, job), timeout if timeout > 0 else None)
    except asyncio.TimeoutError:
        job.cancel()
        job.events.put_nowait(("error", 503, f"the request did not finish within the server's request timeout "
                                             f"({timeout:g} s); it was cancelled"))


def tokenizer_summary(tokenizer, max_model_len: int) -> dict:
    """``tokenizer_class``, the special tokens as text, ``chat_template``, lengths."""
    def text(name: str):
        tok = getattr(tokenizer, name, None)
        return None if tok is None else str(tok)

    template = getattr(tokenizer, "chat_template", None)
    return {"tokenizer_class": type(tokenizer).__name__, "eos_token": text("eos_token"),
            "bos_token": text("bos_token"), "pad_token": text("pad_token"), "unk_token": text("unk_token"),
            "chat_template": template if isinstance(template, str) else None, "vocab_size": len(tokenizer),
            "model_max_length": max_model_len}


def _validation_error(exc: RequestValidationError) -> SafeJSONResponse:
    """The 400 for a body FastAPI could not validate: bad JSON, a lone surrogate, or the first
    field that failed (its dotted path as ``param``)."""
    errors = exc.errors() or [{}]  # a union's branches each fail: the one that got furthest says most
    err = max(errors, key=lambda e: (len(e.get("loc", ())), not str(e.get("type", "")).endswith("_type")))
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    if err.get("type") == "json_invalid":
        where = f" at character {loc[0]}" if loc else ""
        reason = (err.get("ctx") or {}).get("error", err.get("msg", ""))
        return SafeJSONResponse(error_body(400, f"the body is not valid JSON: {reason}{where}"), 400)
    if err.get("type") == "too_complex":
        return SafeJSONResponse(error_body(400, err.get("msg", "the body is too complex")), 400)
    if err.get("type") == "surrogate":
        field = (err.get("ctx") or {}).get("field") or None
        return SafeJSONResponse(error_body(400, err.get("msg", "a lone surrogate is not Unicode text"), field), 400)
    loc = [p for p in loc if "[" not in p and p not in ("str", "int", "float", "bool", "none")]  # union branches
    param = ".".join(loc) or None
    if param is not None and err.get("type") == "extra_forbidden":
        return SafeJSONResponse(error_body(400, unknown_field(param), param[:80]), 400)
    if param is None:
        message = ("the body is empty" if err.get("type") == "missing" else "the body is not a JSON object")
        message += "; send a JSON object (Content-Type: application/json)"
    else:
        message = f"{param}: {err.get('msg', 'invalid value')}"
    return SafeJSONResponse(error_body(400, message, param), status_code=400)


def _checked_settings(pair, defaults: dict | None, api_key: str | None,
                      limits: Limits | None) -> tuple[dict, Limits]:
    """The server's request defaults and limits; bad ones (or a bad API key) fail here, at startup,
    not per request. The defaults (:func:`specdec.core.settings.layer`): ``defaults`` over the model's
    sampling settings (``pair.sampling_defaults``, as OpenAI clients and vLLM serving the same model
    get them) over the library's (:data:`specdec.core.request.DEFAULTS`: lossless, drafter auto, k=auto),
    but for the budget: with none (or None), an answer may run to the context's end, at most the
    server's ``max_tokens`` limit (as vLLM and OpenAI do when a request sets no max_tokens)."""
    check_api_key(api_key)
    limits = limits or Limits()
    given = {k: v for k, v in (defaults or {}).items() if not (k == "max_new_tokens" and v is None)}
    defaults = layer(given, model=getattr(pair, "sampling_defaults", {}), max_new_tokens=limits.max_tokens)
    DecodeConfig.from_options(**defaults)  # bad server defaults fail here, not per request
    if defaults["max_new_tokens"] > limits.max_tokens:
        raise SpecdecError(f"the default max_new_tokens ({defaults['max_new_tokens']}) is over the "
                           f"max_tokens limit ({limits.max_tokens})")
    return defaults, limits


def cache_scope(key: str, salt: str | None, shared: bool) -> Caller:
    """The request's caller (:attr:`~specdec.core.request.DecodeConfig.caller`): whom it shares cached
    state with (the engine keeps the prefix cache, the suffix drafters' cache and k=auto's state per
    caller, side by side, :mod:`specdec.core.scopes`; the server only names it): the requests of the
    same API key (``key``, the gate's digest of it; "" without one) and the same ``cache_salt``.
    Without a key, the requests that send no salt share one scope (``shared``, the default: one
    user's server, as vLLM's and llama-server's prefix caching), or each is on its own
    (:data:`Caller.ISOLATED`) when the operator turned that off (``--no-shared-caches``). The name is
    ``<key>|salt:<digest>``: the part before ``|`` is the client whose share of each cache's bound
    its salts split (:func:`specdec.core.fair.principal`)."""
    if not key and not shared and salt is None:
        return Caller.ISOLATED
    scope = key or "all"
    return Caller.named(scope if salt is None else f"{scope}|salt:{hashlib.sha256(salt.encode()).hexdigest()[:16]}")


class Served:
    """What the routes share: the pair and its served ``name``, the request ``defaults`` and
    ``limits``, the ``metrics``, the engine ``worker`` and the tokenizer's own thread."""

    def __init__(self, pair, defaults: dict, limits: Limits, name: str, shared_caches: bool = False):
        self.pair, self.defaults, self.limits, self.name = pair, defaults, limits, name
        self.shared_caches = shared_caches
        config = DecodeConfig.from_options(**defaults)
        positions = config.k.fixed if config.parsed.drafts and config.k.fixed is not None else 0  # k=auto: series appear as used
        self.metrics = Metrics(name, positions=positions)
        self.worker = Worker(pair, limits.max_queue, on_done=self.finished)
        self.tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-tokenizer")
        self.parsing = ThreadPoolExecutor(max_workers=2, thread_name_prefix="specdec-parse")

    def finished(self, job: Job, out) -> None:
        if out is not None:
            now = time.perf_counter()
            self.metrics.finished(out, (job.started or now) - job.submitted, now - job.submitted)

    @asynccontextmanager
    async def lifespan(self, app):
        self.worker.start()
        yield
        await asyncio.to_thread(self.worker.stop)
        self.tokenizing.shutdown(wait=False, cancel_futures=True)
        self.parsing.shutdown(wait=False, cancel_futures=True)

    async def parse(self, model, request: Request):
        """The request's body as ``model``, parsed and validated in a parsing thread (the gate has
        already capped its size): the event loop keeps answering meanwhile."""
        raw = await request.body()
        return await asyncio.get_running_loop().run_in_executor(self.parsing, parse, model, raw)

    async def generate(self, body: CompletionRequest | ChatRequest, request: Request) -> Response:
        try:
            return await self._generate(body, request)
        except (APIError, asyncio.CancelledError):
            raise
        except Exception:  # a bug: answer 500 here, so that the gate counts it
            log.exception("request failed")
            raise APIError(500, "internal error; see the server log") from None

    async def _submit(self, body: CompletionRequest | ChatRequest, key: str = "") -> Job:
        """Validate ``body`` and queue it. What the loaded models cannot serve (a structured-output
        constraint, compiled for the tokenizer here, cached; a drafter or rule the backend or the
        missing draft model cannot serve) is refused first, in the tokenizer's thread, so that it is
        a 400 before anything is queued or streamed, not an error event in a 200 stream."""
        req = build(body, self.defaults, self.limits)
        req.config = req.config.with_settings(caller=cache_scope(key, body.cache_salt, self.shared_caches))
        await self.tokenizer_thread(servable, self.pair.engine, req.config, req.constraint_param)
        job = Job(req, stream=body.stream, loop=asyncio.get_running_loop())
        try:
            self.worker.submit(job)
        except Busy as exc:
            raise APIError(503 if "shutting" in str(exc) else 429, str(exc)) from None
        return job

    def _shaper(self, body: CompletionRequest | ChatRequest) -> tuple[Shaper, bool]:
        """The response shaper for ``body``, and whether its stream ends with a usage chunk."""
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return Shaper(isinstance(body, ChatRequest), body.model or self.name, self.pair.tokenizer), usage

    async def _generate(self, body: CompletionRequest | ChatRequest, request: Request) -> Response:
        job = await self._submit(body, getattr(request.state, "key_id", ""))
        watcher = asyncio.create_task(_watch(request.receive, job, self.limits.request_timeout_seconds))
        getter = asyncio.ensure_future(job.events.get())
        try:
            if body.stream:
                done, _ = await asyncio.wait({getter}, timeout=self.limits.stream_wait_seconds)
                if not done:  # queued behind another request: headers now, keep-alive comments until it runs
                    shaper, usage = self._shaper(body)
                    return EventStream(self._pending(getter, job, shaper, usage), job, watcher)
            first = await getter
        except BaseException:
            getter.cancel()
            job.cancel()
            watcher.cancel()
            raise
        if first[0] != "delta":
            watcher.cancel()
        if first[0] == "error":
            about_prompt = any(w in first[2] for w in ("prompt", "chat template", "message"))
            param = ("messages" if isinstance(body, ChatRequest) else "prompt") if about_prompt else None
            raise APIError(first[1], first[2], param)
        if first[0] == "cancelled":
            self.metrics.cancel()
            return Response(status_code=499)
        shaper, usage = self._shaper(body)
        if not body.stream:
            return SafeJSONResponse(shaper.response(*first[1:]))
        return EventStream(self._events(job, first, shaper, usage), job, watcher)

    async def _pending(self, getter: asyncio.Future, job: Job, shaper: Shaper, usage: bool) -> AsyncIterator[bytes]:
        """A stream whose headers went out before the engine took the request: SSE comments until
        the first event; an error then arrives as an error event (the status is already 200)."""
        while not getter.done():
            done, _ = await asyncio.wait({getter}, timeout=self.limits.keepalive_seconds)
            if not done:
                yield b": keep-alive\n\n"
        async for chunk in self._events(job, getter.result(), shaper, usage):
            yield chunk

    async def _events(self, job: Job, event: tuple, shaper: Shaper, usage: bool) -> AsyncIterator[bytes]:
        """SSE chunks from ``event`` (the first) on. An error ends the stream with an error event, a
        cancellation ends it silently; a chat stream opens with the role chunk unless it begins so."""
        if shaper.chat and event[0] in ("delta", "done"):
            yield sse(shaper.chunk("", role=True, with_usage=usage))
        while True:
            if event[0] == "delta":
                yield sse(shaper.chunk(event[1], with_usage=usage))
            elif event[0] == "done":
                out = event[1]
                yield sse(shaper.chunk(None, finish_reason=out.finish_reason, with_usage=usage))
                if usage:
                    yield sse(shaper.usage_chunk(out))
                yield sse("[DONE]")
                return
            elif event[0] == "error":
                yield sse(error_body(event[1], event[2]))
                yield sse("[DONE]")
                return
            else:  # cancelled: the client is gone
                self.metrics.cancel()
                return
            event = await job.events.get()

    def card(self) -> dict:
        return {"id": self.name, "object": "model", "created": 0, "owned_by": "specdec",
                "max_model_len": self.pair.target.max_length, "draft": self.pair.draft_name,
                "backend": getattr(self.pair, "backend", None), "structured_outputs": available_kinds(),
                "speculative": {k: v for k, v in self.defaults.items() if k not in SAMPLING}}

    async def tokenizer_thread(self, fn, *args):
        """``fn(*args)`` in the tokenizer's own thread: the event loop keeps answering meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizing, fn, *args)

    def encode(self, body: TokenizeRequest) -> list[int]:
        tok = self.pair.tokenizer
        if body.messages is None:
            return list(tokenizer_call("the tokenizer refused the prompt", tok.encode, body.prompt,
                                       add_special_tokens=body.add_special_tokens))
        messages = [{"role": m.role, "content": m.content if isinstance(m.content, str) else ""} for m in body.messages]
        ids = tokenizer_call("the chat template refused the messages", tok.apply_chat_template, messages,
                             tokenize=True, add_generation_prompt=body.add_generation_prompt)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def _add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return SafeJSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        """Last resort (the gate answers first): a bug still gets OpenAI's error shape."""
        metrics.response(endpoint_label(request.url.path), 500)
        return SafeJSONResponse(error_body(500, "internal error; see the server log"), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _validation_error(exc)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        return SafeJSONResponse(error_body(exc.status_code, str(exc.detail)), exc.status_code, headers=exc.headers)

    @app.exception_handler(SpecdecError)
    async def _user(request: Request, exc: SpecdecError):
        return SafeJSONResponse(error_body(400, str(exc)), status_code=400)


#: the request body models, listed in ``/openapi.json`` (the routes parse bodies themselves, off the loop)
BODIES = (CompletionRequest, ChatRequest, TokenizeRequest, DetokenizeRequest)


def takes(model) -> dict:
    """A route's ``openapi_extra``: its JSON body is ``model`` (see :func:`_document_bodies`)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def _document_bodies(app: FastAPI) -> None:
    """``/openapi.json`` with the body models' schemas, which FastAPI lists only for bodies it parses."""
    make = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schemas = make().setdefault("components", {}).setdefault("schemas", {})
            for model in BODIES:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
        assert app.openapi_schema is not None  # make() keeps what it made
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


def _add_generation_routes(app: FastAPI, served: Served) -> None:
    @app.post("/v1/completions", openapi_extra=takes(CompletionRequest))
    async def completions(request: Request):
        """Complete a raw prompt (no chat template)."""
        return await served.generate(await served.parse(CompletionRequest, request), request)

    @app.post("/v1/chat/completions", openapi_extra=takes(ChatRequest))
    async def chat_completions(request: Request):
        """Answer chat messages through the tokenizer's chat template."""
        return await served.generate(await served.parse(ChatRequest, request), request)


def _add_model_routes(app: FastAPI, served: Served) -> None:
    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [served.card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        name = served.name
        if model_id != name:
            raise APIError(404, f"no model {model_id!r}; this server serves {name!r}", "model", "model_not_found")
        return served.card()


def _add_tokenizer_routes(app: FastAPI, served: Served) -> None:
    pair, limits = served.pair, served.limits

    @app.post("/tokenize", openapi_extra=takes(TokenizeRequest))
    async def tokenize(request: Request):
        """vLLM's shape: ``{"tokens": [...], "count": n, "max_model_len": L}``."""
        body = await served.parse(TokenizeRequest, request)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "send either prompt or messages", "prompt")
        size = len(body.prompt) if body.messages is None else sum(
            len(m.role) + len(m.content if isinstance(m.content, str) else "") for m in body.messages)
        if size > limits.max_tokenize_chars:
            raise APIError(400, f"the text has {size} characters; /tokenize takes at most {limits.max_tokenize_chars}",
                           "prompt" if body.messages is None else "messages")
        try:
            ids = await served.tokenizer_thread(served.encode, body)
        except SpecdecError as exc:
            raise APIError(400, str(exc), "prompt" if body.messages is None else "messages") from None
        return {"tokens": [int(t) for t in ids], "count": len(ids), "max_model_len": pair.target.max_length}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        """vLLM's ``/tokenizer_info`` fields that clients read (lm-evaluation-harness's remote
        tokenizer: special tokens and the chat template)."""
        return tokenizer_summary(pair.tokenizer, pair.target.max_length)

    @app.post("/detokenize", openapi_extra=takes(DetokenizeRequest))
    async def detokenize(request: Request):
        """vLLM's shape: ``{"prompt": text}``."""
        body = await served.parse(DetokenizeRequest, request)
        if len(body.tokens) > limits.max_tokenize_chars:
            raise APIError(400, f"{len(body.tokens)} token ids; /detokenize takes at most {limits.max_tokenize_chars}",
                           "tokens")
        vocab = len(pair.tokenizer)
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token ids out of range [0, {vocab}): {bad[:5]}", "tokens")
        try:
            text = await served.tokenizer_thread(tokenizer_call, "the tokenizer could not decode the ids",
                                                 pair.tokenizer.decode, body.tokens)
        except SpecdecError as exc:
            raise APIError(400, str(exc), "tokens") from None
        return {"prompt": text}


def _add_status_routes(app: FastAPI, served: Served) -> None:
    worker, metrics = served.worker, served.metrics

    @app.get("/health")
    async def health():
        ok = worker.alive
        body = {"status": "ok" if ok else "engine worker not running", "model": served.name,
                "waiting": worker.waiting, "running": worker.running, "worker_restarts": worker.restarts}
        return SafeJSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(worker.waiting, worker.running), media_type=METRICS_CONTENT_TYPE)


def _add_middleware(app: FastAPI, served: Served, api_key: str | None, allowed_hosts: list[str] | None,
                    allow_origins: Iterable[str]) -> None:
    access = Access(allowed_hosts, allow_origins)
    app.add_middleware(Gate, metrics=served.metrics, api_key=api_key, max_body_bytes=served.limits.max_body_bytes,
                       access=access)
    if access.origins:  # outermost: answers CORS preflights, adds CORS headers to allowed origins' answers
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=access.origins, allow_methods=["GET", "POST"],
                           allow_headers=["authorization", "content-type"])


def create_app(pair, defaults: dict | None = None, api_key: str | None = None, limits: Limits | None = None,
               model_name: str | None = None, allowed_hosts: list[str] | None = None,
               allow_origins: Iterable[str] = (), prefix_caching: bool = True, shared_caches: bool | None = None,
               caller_cache_bytes: int | None = None) -> FastAPI:
    """An app serving ``pair``. ``defaults``: decoding keyword arguments for requests that do not
    set them (:meth:`~specdec.core.request.DecodeConfig.from_options`' names; see :func:`_checked_settings`); ``api_key``: required as
    ``Authorization: Bearer <key>`` on every path but ``/health`` and ``/metrics`` when set (an
    empty key is refused); ``model_name``: the served name; ``allowed_hosts``: the names a ``Host``
    header may carry (default: the loopback names; ``"*"``: any); ``allow_origins``: browser
    origins allowed besides the server's own (``"*"``: any), which also get CORS headers;
    ``prefix_caching``: a request reads only the part of its prompt that the target's cache does not
    hold from the request before (:attr:`specdec.core.scopes.Caches.prefix_caching`; vLLM's and
    llama-server's default), reported as ``usage.prompt_tokens_details.cached_tokens``;
    ``shared_caches``: whether, without an API key, the requests that send no ``cache_salt`` share
    the caches (None, the default: yes without ``api_key``; False: each such request has its own,
    :func:`cache_scope`); ``caller_cache_bytes``: host memory for the target's cache parked per
    caller between its requests (:attr:`specdec.frontends.api.Pair.caller_cache_bytes`; None: the pair's)."""
    defaults, limits = _checked_settings(pair, defaults, api_key, limits)
    pair.prefix_caching = prefix_caching
    if caller_cache_bytes is not None:
        pair.caller_cache_bytes = caller_cache_bytes
    shared = not api_key if shared_caches is None else bool(shared_caches)
    served = Served(pair, defaults, limits, model_name or str(pair.target_name), shared)
    app = FastAPI(title="specdec", summary="Speculative decoding behind an OpenAI-compatible API",
                  lifespan=served.lifespan, docs_url=None, redoc_url=None, default_response_class=SafeJSONResponse)
    app.state.worker, app.state.metrics, app.state.defaults, app.state.limits = (
        served.worker, served.metrics, defaults, limits)
    _add_error_handlers(app, served.metrics)
    _add_generation_routes(app, served)
    _add_model_routes(app, served)
    _add_tokenizer_routes(app, served)
    _add_status_routes(app, served)
    _add_middleware(app, served, api_key, allowed_hosts, allow_origins)
    _document_bodies(app)
    return app
