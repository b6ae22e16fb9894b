"""The server tests' shared helper: the tiny pair behind ``specdec serve``'s app, in a thread."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import openai

from specdec import load
from specdec.frontends.server import Limits, create_app, serve_in_thread


@contextlib.contextmanager
def tiny_server(target_dir, draft_dir, **limits):
    """The tiny pair loaded from ``save_tiny_pair``'s folders behind the app (defaults k=4, 16 new
    tokens; ``limits``: :class:`specdec.frontends.server.Limits` fields, max_tokens 500 unless given):
    ``SimpleNamespace(url, pair, client)`` (an ``openai`` client, no retries)."""
    pair = load(str(target_dir), draft=str(draft_dir), dtype="float32", device="cpu", progress=False)
    app = create_app(pair, {"k": 4, "max_new_tokens": 16}, limits=Limits(**{"max_tokens": 500, **limits}),
                     model_name="tiny")
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        yield SimpleNamespace(url=url, pair=pair, client=client)
