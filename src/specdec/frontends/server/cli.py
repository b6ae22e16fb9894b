"""``specdec serve``: the model and decoding flags of ``specdec generate`` (the decoding flags
become the defaults of requests that do not set them), plus the server's own flags."""

from __future__ import annotations

import argparse
import os
import sys

from ..cliargs import (add_decode_args, add_model_args, decode_config, decode_kwargs, flag_names, load_pair,
                       startup_summary)
from ...core.scopes import PARKED_BYTES
from ...errors import SpecdecError


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help="serve the engine behind an OpenAI-compatible HTTP API",
        description="Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics. "
                    "One engine answers one request at a time; concurrent requests wait in a queue.",
    )
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    g.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    g.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every path but /health (/metrics included) "
                        "(default: $SPECDEC_API_KEY, else none; an empty key is refused)")
    g.add_argument("--allowed-host", action="append", default=None, metavar="NAME",
                   help="a name the Host header may carry, repeatable; '*' = any (default: the loopback names "
                        "when bound to loopback, the bound address and the loopback names when bound to one "
                        "other address, any when bound to 0.0.0.0 or ::). Other Hosts get 400 (DNS rebinding)")
    g.add_argument(*flag_names("--allow-origin"), dest="allow_origin", action="append", default=[], metavar="ORIGIN",
                   help="a browser origin allowed to call the API (e.g. http://localhost:3000), repeatable; "
                        "'*' = any (default: none; requests with another Origin get 403)")
    g.add_argument("--request-timeout", type=float, default=1800.0, metavar="SECONDS",
                   help="cancel a request not finished this long after it arrived, queue included, with a "
                        "503; 0 = no limit (default: 1800)")
    g.add_argument("--served-model-name", default=None,
                   help="the model name in responses and /v1/models (default: the --target value)")
    g.add_argument("--max-tokens-limit", type=int, default=4096,
                   help="largest max_tokens a request may ask for, and the budget of one that sets none (its "
                        "answer may run to the context's end, as with vLLM and OpenAI, up to this; --max-new-tokens "
                        "sets a smaller default) (default: 4096)")
    g.add_argument("--max-body-bytes", type=int, default=2 * 1024 * 1024,
                   help="largest request body; larger ones get 413 (default: 2 MiB)")
    g.add_argument("--max-queue", type=int, default=64,
                   help="requests queued or running at once; more get 429 (default: 64)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the target's cached positions a request's prompt shares with the request before, "
                        "and read only the rest (an agent's or a chat's next turn re-sends the conversation); "
                        "usage.prompt_tokens_details.cached_tokens counts them. Output is the same up to "
                        "floating-point differences of batched against incremental passes (default: on, as "
                        "vLLM and llama-server)")
    g.add_argument("--shared-caches", action=argparse.BooleanOptionalAction, default=None,
                   help="whether, without --api-key, the requests that send no cache_salt share the prefix cache, "
                        "the suffix drafters' cache and k=auto's state (a standard client's next turn reuses its "
                        "prefix, as with vLLM and llama-server); --no-shared-caches gives each such request its "
                        "own. A cache_salt always isolates; with a key, the requests of one key and salt share "
                        "(default: on without --api-key)")
    g.add_argument("--caller-cache-mb", type=int, default=PARKED_BYTES >> 20,
                   help="host memory for the target's cache parked per caller between its requests, all callers "
                        "together: another caller's request in between neither empties nor reveals it; over it, "
                        "the caller holding the most gives up its copy first; 0: none parked, a caller switch "
                        f"empties the cache (default: {PARKED_BYTES >> 20})")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn log level (default: info)")
    add_model_args(p)
    add_decode_args(p)
    p.set_defaults(func=cmd_serve)


def cmd_serve(a: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise SpecdecError("specdec serve needs the server extra: pip install 'specdec-rules[server]'") from None
    from .app import check_api_key, create_app
    from .origins import default_hosts, is_loopback
    from .params import Limits
    from .run import serve

    # the requests' defaults, each request's fields layered over them; a request without max_tokens may
    # run to the context's end (the limit caps it) unless --max-new-tokens or the --config file sets a budget
    kwargs = decode_kwargs(a, max_new_tokens=a.max_tokens_limit)
    decode_config(a, kwargs)  # bad flags fail here, before the models load
    if not 0 < a.port < 65536:
        raise SpecdecError(f"--port must be in 1..65535, got {a.port}")
    for flag in ("max_tokens_limit", "max_body_bytes", "max_queue"):
        if getattr(a, flag) < 1:
            raise SpecdecError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(a, flag)}")
    if a.caller_cache_mb < 0:
        raise SpecdecError(f"--caller-cache-mb must be >= 0, got {a.caller_cache_mb}")
    if not a.request_timeout >= 0 or a.request_timeout == float("inf"):
        raise SpecdecError(f"--request-timeout must be a number of seconds >= 0 (0 = no limit), got {a.request_timeout}")
    check_api_key(a.api_key)
    if kwargs["max_new_tokens"] > a.max_tokens_limit:
        raise SpecdecError(f"--max-new-tokens ({kwargs['max_new_tokens']}) is over --max-tokens-limit "
                           f"({a.max_tokens_limit})")
    if not is_loopback(a.host) and not a.api_key:
        shared = "" if a.shared_caches is False else (", and its requests without a cache_salt share the caches "
                                                       "(--no-shared-caches gives each its own)")
        print(f"specdec: warning: serving on {a.host} without --api-key: anyone who can reach it can use it{shared}",
              file=sys.stderr)
    pair = load_pair(a)
    print(startup_summary(pair), file=sys.stderr, flush=True)
    limits = Limits(max_tokens=a.max_tokens_limit, max_body_bytes=a.max_body_bytes, max_queue=a.max_queue,
                    request_timeout_seconds=a.request_timeout)
    app = create_app(pair, kwargs, api_key=a.api_key, limits=limits, model_name=a.served_model_name or a.target,
                     allowed_hosts=a.allowed_host or default_hosts(a.host), allow_origins=a.allow_origin,
                     prefix_caching=a.enable_prefix_caching, shared_caches=a.shared_caches,
                     caller_cache_bytes=a.caller_cache_mb << 20)
    print(f"specdec: serving on http://{a.host}:{a.port}/v1 (one request at a time; Ctrl-C stops)",
          file=sys.stderr, flush=True)
    serve(app, a.host, a.port, a.log_level)
    return 0

