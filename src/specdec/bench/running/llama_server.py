"""llama.cpp's own server as a peer: the prebuilt ``xllamacpp`` wheel, its speculative modes.

What a user who picks llama.cpp's server gets, on the same GGUF files, prompt ids and greedy
settings as ours: ``llama-server`` (plain decoding), ``llama-server-ngram-mod`` (its rolling-hash
copies of up to 64 tokens), ``llama-server-ngram-simple``, ``llama-server-ngram-map-k``, and
``llama-server-draft`` (the pair's draft model). Each mode is one server (``xllamacpp.Server``,
llama.cpp's ``llama-server`` embedded in Python, listening on a free loopback port), started once per
bench run and kept in :class:`~specdec.bench.running.loaded.BenchModels`; a generation is one POST to its
native ``/completion`` endpoint with our prompt token ids (no template applied again), ``n_predict``,
greedy at T=0 (sampling otherwise), our stop strings, and ``cache_prompt`` off, so that each
request reads its whole prompt as ours does in the bench. ``seconds`` is the request's wall time,
loopback HTTP included (about a millisecond). Its acceptance figures are its own (``timings``:
``draft_n``, ``draft_n_accepted``); ``target_forwards`` counts one pass per kept draft run plus one
(produced tokens minus accepted drafts).

The wheel is built without ``-march=native`` (:data:`BUILD`): its kernels are the ones its build
flags allow (``xllamacpp.get_system_info()`` is recorded with every figure), not the ones a build on
the machine would use.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from typing import Any, Sequence

from ...errors import SpecdecError

#: what the prebuilt wheel is, said beside its figures
BUILD = "xllamacpp's prebuilt CPU wheel (llama.cpp's server, built without -march=native)"

#: peer name -> its speculative type (``xllamacpp.common_speculative_type``'s name) or None (plain)
MODES: dict[str, str | None] = {
    "llama-server": None,
    "llama-server-ngram-mod": "COMMON_SPECULATIVE_TYPE_NGRAM_MOD",
    "llama-server-ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE",
    "llama-server-ngram-map-k": "COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K",
    "llama-server-draft": "COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE",
}
#: the context a server is started with (the bench's longest prompt plus its answer fit)
N_CTX = 8192
#: seconds a request may take before the peer gives up on the server
REQUEST_TIMEOUT = 3600.0


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_params(xl, mode: str, target: str, draft: str | None, threads: int, port: int, params: dict):
    """``xllamacpp.CommonParams`` for ``mode`` (a :data:`MODES` name) on the ``target`` GGUF file:
    one slot, ``threads`` threads for steps and prompts, the loopback ``port``; the speculative type,
    the draft file for ``llama-server-draft``, and ``params``' ``n_max``/``n_min`` (the draft length
    limits of the mode, llama.cpp's defaults where not given)."""
    p = xl.CommonParams()
    p.model.path = target
    p.n_ctx = N_CTX
    p.n_parallel = 1
    p.port = port
    p.cpuparams.n_threads = threads
    p.cpuparams_batch.n_threads = threads
    p.warmup = True
    spec = MODES[mode]
    if spec is not None:
        p.speculative.types = [getattr(xl.common_speculative_type, spec)]
        if mode == "llama-server-draft":
            if draft is None:
                raise SpecdecError(f"peer {mode} needs a draft model; load one or drop it from --peers")
            p.speculative.draft.mparams.path = draft
            p.speculative.draft.cpuparams.n_threads = threads
            p.speculative.draft.cpuparams_batch.n_threads = threads
        limits = p.speculative.draft if mode == "llama-server-draft" else getattr(p.speculative, _section(mode))
        for key in ("n_max", "n_min"):
            if key in params and hasattr(limits, key):
                setattr(limits, key, int(params[key]))
    return p


def _section(mode: str) -> str:
    return mode.removeprefix("llama-server-").replace("-", "_")


class LlamaServer:
    """One running server (:func:`server_params`), and its ``settings`` for the record.
    :meth:`close` stops it and frees its models; one that does not come up is closed before the
    error is raised."""

    #: the embedded ``xllamacpp.Server``; None before it starts and once closed
    server: Any = None

    def __init__(self, mode: str, target: str, draft: str | None, threads: int, params: dict):
        import xllamacpp as xl

        port = free_port()
        self.mode, self.url = mode, f"http://127.0.0.1:{port}"
        self.server = xl.Server(server_params(xl, mode, target, draft, threads, port, params))
        try:
            self.settings = {**params, "n_threads": threads, "mode": MODES[mode] or "none",
                             "gguf": target.rsplit("/", 1)[-1], "build": BUILD,
                             "xllamacpp": getattr(xl, "__version__", None), "system_info": xl.get_system_info().strip()}
            if draft is not None and mode == "llama-server-draft":
                self.settings["draft_gguf"] = draft.rsplit("/", 1)[-1]
            self._wait()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the server and free it (its models and threads); again, or on one that never
        started, nothing. xllamacpp's server has no stop call: it stops when the last reference
        to it goes, which is this object's."""
        server, self.server = self.server, None
        del server

    def _wait(self, seconds: float = 300.0) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SpecdecError(f"peer {self.mode}: llama.cpp's server did not come up at {self.url}")
            time.sleep(0.2)

    def complete(self, body: dict) -> dict:
        req = urllib.request.Request(self.url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as r:
            return json.loads(r.read())


def request_body(prompt_ids: Sequence[int], stops: Sequence[str], *, max_new_tokens: int, temperature: float,
                 top_p: float, top_k: int, seed: int | None) -> dict:
    """The ``/completion`` body: our prompt ids, the length, greedy (T=0) or our sampling settings,
    our stop strings, no prompt cache (each request reads its whole prompt, as ours in the bench)."""
    body: dict[str, Any] = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(max_new_tokens),
                            "temperature": float(temperature), "stop": list(stops), "cache_prompt": False,
                            "return_tokens": True, "stream": False, "repeat_penalty": 1.0}
    if temperature > 0:
        body.update(top_p=float(top_p), top_k=int(top_k))
        if seed is not None:
            body["seed"] = int(seed)
    else:
        body.update(top_k=1, top_p=1.0)
    return body


def server_for(pair, mode: str, params: dict, threads: int, models, gguf_of) -> LlamaServer:
    """The run's server for ``mode`` and ``params`` on the pair's GGUF files (``gguf_of(source)``),
    started once (kept in ``models.servers``)."""
    key = (mode, tuple(sorted(params.items())), threads)
    if key not in models.servers:
        draft = gguf_of(pair.draft_name) if mode == "llama-server-draft" and pair.draft_name else None
        models.servers[key] = LlamaServer(mode, gguf_of(pair.target_name), draft, threads, params)
    return models.servers[key]


def run_llama_server(pair, peer, prompt_ids: Sequence[int], stops: Sequence[str], *, max_new_tokens: int,
                     temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                     models, threads: int, defaults: dict, gguf_of, cut) -> dict[str, Any]:
    """One generation by llama.cpp's server in ``peer``'s mode (module docstring): its text and
    token ids cut as ours are (``cut(pair, ids, eos, stops)``: through the first EOS, before the
    first stop string), the request's wall time, and its own counts (``timings``) in the settings."""
    params = {**defaults, **peer.params}
    threads = int(params.pop("n_threads", 0) or threads)
    server = server_for(pair, peer.policy, params, threads, models, gguf_of)
    body = request_body(prompt_ids, stops, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        top_k=top_k, seed=seed)
    start = time.perf_counter()
    res = server.complete(body)
    seconds = time.perf_counter() - start
    new = [int(t) for t in res.get("tokens") or []]
    eos = list(pair.eos_ids)
    if res.get("stop_type") == "eos" and eos and (not new or new[-1] not in eos):
        new.append(int(eos[0]))  # the server leaves the end-of-generation token out; ours keeps it
    produced = len(new)
    new, finish, text = cut(pair, new, eos, stops)
    if finish == "length" and res.get("stop_type") in ("word", "eos"):
        finish = "stop"
    timings = res.get("timings") or {}
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    forwards = produced - int(accepted or 0)
    return {
        "text": text, "token_ids": new, "finish_reason": finish, "prompt_tokens": len(prompt_ids),
        "new_tokens": len(new), "produced_tokens": produced, "seconds": seconds, "target_forwards": forwards,
        "tau": produced / forwards if forwards > 0 else None,
        "peer_settings": {**server.settings, "draft_n": drafted, "draft_n_accepted": accepted,
                          "prompt_ms": timings.get("prompt_ms"), "predicted_ms": timings.get("predicted_ms"),
                          "predicted_n": timings.get("predicted_n")},
    }
