"""llama.cpp's own server as a peer (``llama-server`` and its speculative modes, through the
``xllamacpp`` wheel): the keys, the missing-library line, the server's parameters per mode, and one
generation's request and record, with a fake ``xllamacpp`` whose server is a small HTTP server on
loopback answering llama.cpp's ``/completion`` as llama.cpp does; one slow test runs the real wheel
on the bundled GGUF where it is installed."""

import importlib.util
import json
import sys
import threading
import types
import urllib.request
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specdec.bench.running import llama_server, peers
from specdec.bench.running.configs import Config, build_peers, check_peer_available, needs_draft_model
from specdec.bench.running.loaded import BenchModels
from specdec.errors import SpecdecError

MODES = ("llama-server", "llama-server-ngram-mod", "llama-server-ngram-simple", "llama-server-ngram-map-k",
         "llama-server-draft")


def ns(**kw):
    return types.SimpleNamespace(**kw)


class FakeParams:
    """``xllamacpp.CommonParams``: the nested parameter objects the peer sets."""

    def __init__(self):
        limits = lambda: ns(n_max=64, n_min=48, n_match=24)  # noqa: E731
        self.model, self.cpuparams, self.cpuparams_batch = ns(path=""), ns(n_threads=-1), ns(n_threads=-1)
        self.speculative = ns(types=["NONE"], ngram_mod=limits(), ngram_simple=ns(size_n=12, size_m=48),
                              ngram_map_k=ns(size_n=12, size_m=48),
                              draft=ns(mparams=ns(path=""), cpuparams=ns(n_threads=-1), cpuparams_batch=ns(n_threads=-1),
                                       n_max=16, n_min=0))
        self.n_ctx = self.n_parallel = self.port = 0
        self.warmup = False


class Handler(BaseHTTPRequestHandler):
    reply: dict = {}
    bodies: list = []

    def log_message(self, *a):
        pass

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"status": "ok"})

    def do_POST(self):
        Handler.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self._send(Handler.reply)


class FakeServer:
    """``xllamacpp.Server``: listens until the last reference to it goes, as the real one (whose
    C++ destructor stops it); ``made`` holds a weak reference to each."""

    made: list = []

    def __init__(self, params):
        self.params = params
        self.http = ThreadingHTTPServer(("127.0.0.1", params.port), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        FakeServer.made.append(weakref.ref(self))

    def stop(self):
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
            self.http = None

    __del__ = stop


@pytest.fixture
def fake_xl(monkeypatch, tmp_path):
    xl = types.ModuleType("xllamacpp")
    xl.__version__ = "0.0-fake"
    xl.CommonParams = FakeParams
    xl.Server = FakeServer
    xl.get_system_info = lambda: "CPU : AVX2 = 1 | "
    xl.common_speculative_type = ns(**{name: name for name in llama_server.MODES.values() if name})
    monkeypatch.setitem(sys.modules, "xllamacpp", xl)
    monkeypatch.setattr(peers, "gguf_of", lambda source: str(tmp_path / f"{source}.gguf"))
    FakeServer.made, Handler.bodies = [], []
    yield FakeServer
    for ref in FakeServer.made:
        if ref() is not None:
            ref().stop()


def test_keys_defaults_and_missing_library(monkeypatch):
    got = build_peers(",".join(MODES[:-1]) + ",llama-server-draft:n_max=8")
    assert [c.policy for c in got] == list(MODES) and all(c.kind == "peer" for c in got)
    assert got[-1].params == {"n_max": 8}
    assert [needs_draft_model(c) for c in got] == [False] * 4 + [True]
    with pytest.raises(SpecdecError, match="takes n_threads"):
        build_peers("llama-server:n_max=3")
    with pytest.raises(SpecdecError, match="n_max must be an integer >= 1"):
        build_peers("llama-server-ngram-mod:n_max=0")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xllamacpp" else real(name, *a))
    for name in MODES:
        with pytest.raises(SpecdecError, match="pip install xllamacpp"):
            check_peer_available(Config(name, kind="peer"))


def test_each_mode_s_server_parameters(fake_xl):
    xl = sys.modules["xllamacpp"]
    plain = llama_server.server_params(xl, "llama-server", "/t.gguf", None, 2, 5000, {})
    assert plain.speculative.types == ["NONE"] and plain.model.path == "/t.gguf" and plain.n_parallel == 1
    assert plain.cpuparams.n_threads == plain.cpuparams_batch.n_threads == 2 and plain.port == 5000
    mod = llama_server.server_params(xl, "llama-server-ngram-mod", "/t.gguf", None, 2, 5000, {"n_max": 32})
    assert mod.speculative.types == ["COMMON_SPECULATIVE_TYPE_NGRAM_MOD"] and mod.speculative.ngram_mod.n_max == 32
    assert mod.speculative.ngram_mod.n_min == 48  # llama.cpp's own default where not given
    draft = llama_server.server_params(xl, "llama-server-draft", "/t.gguf", "/d.gguf", 2, 5000, {})
    assert draft.speculative.types == ["COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE"]
    assert draft.speculative.draft.mparams.path == "/d.gguf" and draft.speculative.draft.cpuparams.n_threads == 2
    with pytest.raises(SpecdecError, match="needs a draft model"):
        llama_server.server_params(xl, "llama-server-draft", "/t.gguf", None, 2, 5000, {})


def run(pair, spec, stops=(), max_new_tokens=8, **kw):
    (cfg,) = build_peers(spec)
    return peers.run_peer(pair, cfg, [5, 6, 7], stops, max_new_tokens=max_new_tokens, **kw)


def test_a_generation_s_request_and_record(tiny_pair, fake_xl):
    eos = min(tiny_pair.eos_ids)
    models = BenchModels()
    words = tiny_pair.encode("abcdef", chat=False)
    Handler.reply = {"content": "abcdef", "tokens": words, "stop_type": "eos",
                     "timings": {"draft_n": 10, "draft_n_accepted": 4, "prompt_ms": 3.0, "predicted_ms": 9.0,
                                 "predicted_n": len(words)}}
    res = run(tiny_pair, "llama-server-ngram-mod:n_threads=1", models=models)
    body = Handler.bodies[-1]
    assert body["prompt"] == [5, 6, 7] and body["n_predict"] == 8 and body["cache_prompt"] is False
    assert body["temperature"] == 0.0 and body["top_k"] == 1 and body["return_tokens"] is True
    assert res["token_ids"] == words + [eos] and res["finish_reason"] == "stop"  # its EOS kept, as ours
    assert res["produced_tokens"] == len(words) + 1 and res["target_forwards"] == len(words) + 1 - 4
    settings = res["peer_settings"]
    assert settings["draft_n"] == 10 and settings["draft_n_accepted"] == 4 and settings["n_threads"] == 1
    assert "without -march=native" in settings["build"] and settings["system_info"].startswith("CPU")
    assert settings["mode"] == "COMMON_SPECULATIVE_TYPE_NGRAM_MOD"
    run(tiny_pair, "llama-server-ngram-mod:n_threads=1", models=models)
    assert len(fake_xl.made) == 1  # one server per mode and settings for the whole run
    Handler.reply = {"content": "xy```", "tokens": tiny_pair.encode("xy```", chat=False), "stop_type": "limit",
                     "timings": {}}
    res = run(tiny_pair, "llama-server:n_threads=1", stops=("```",), models=models)
    assert res["text"] == "xy" and res["finish_reason"] == "stop" and res["tau"] == 1.0
    assert Handler.bodies[-1]["stop"] == ["```"] and len(fake_xl.made) == 2


@pytest.mark.slow
def test_the_real_server_decodes_the_bundled_target_greedily():
    """The wheel's server, plain and ``ngram-mod``, on the bundled target from our prompt ids, in the
    process that runs llama-cpp-python too; skipped where xllamacpp or llama-cpp-python is missing."""
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("xllamacpp is not installed (pip install xllamacpp)")
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("the bundled GGUF is assembled by the llama.cpp backend (pip install llama-cpp-python)")
    import specdec

    pair = specdec.load(draft=None, backend="llama.cpp", calibrate=False, progress=False,
                        generation_config="specdec")
    ids = pair.encode("def add(a, b):\n    return a + b\n\n# the same function again, verbatim:\n", chat=False)
    ar = pair.generate(ids, policy="ar", max_new_tokens=12)
    models = BenchModels()
    plain = peers.run_peer(pair, build_peers("llama-server")[0], ids, (), max_new_tokens=12, models=models)
    mod = peers.run_peer(pair, build_peers("llama-server-ngram-simple")[0], ids, (), max_new_tokens=12,
                         models=models)
    assert plain["produced_tokens"] == 12 and plain["seconds"] > 0 and mod["new_tokens"] > 0
    assert "draft_n" in mod["peer_settings"] and "AVX2" in mod["peer_settings"]["system_info"]
    # another build's kernels: the first tokens agree, not necessarily all
    assert plain["token_ids"][:2] == list(ar.token_ids)[:2]
    urls = [s.url for s in models.servers.values()]
    assert len(urls) == 2 and all(answers(u) for u in urls)
    models.close()  # the wheel's servers stop when freed
    assert not any(answers(u) for u in urls)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def test_close_stops_and_frees_the_server(fake_xl):
    server = llama_server.LlamaServer("llama-server", "/t.gguf", None, 1, {})
    (made,) = fake_xl.made
    assert made() is server.server and answers(server.url)
    server.close()
    assert server.server is None and made() is None and not answers(server.url)
    server.close()  # again: nothing
    llama_server.LlamaServer.__new__(llama_server.LlamaServer).close()  # never started: nothing


def test_a_server_that_does_not_come_up_is_closed(fake_xl, monkeypatch):
    def never(self, seconds=300.0):
        raise SpecdecError("did not come up")

    monkeypatch.setattr(llama_server.LlamaServer, "_wait", never)
    with pytest.raises(SpecdecError, match="did not come up") as error:
        llama_server.LlamaServer("llama-server-ngram-mod", "/t.gguf", None, 1, {})
    # stopped even while the error's traceback (which holds the half-made object) is kept
    assert error.traceback and len(fake_xl.made) == 1 and fake_xl.made[0]() is None


def test_the_run_s_servers_stop_with_it(tiny_pair, fake_xl, tmp_path):
    """BenchModels.close stops every server it holds; a generation or a bench run given none stops
    the servers it started when it ends."""
    Handler.reply = {"content": "ab", "tokens": tiny_pair.encode("ab", chat=False), "stop_type": "limit",
                     "timings": {}}
    models = BenchModels()
    run(tiny_pair, "llama-server:n_threads=1", models=models)
    run(tiny_pair, "llama-server-ngram-mod:n_threads=1", models=models)
    assert len(fake_xl.made) == 2 and all(ref() is not None for ref in fake_xl.made)
    models.close()
    assert models.servers == {} and all(ref() is None for ref in fake_xl.made)
    models.close()
    run(tiny_pair, "llama-server:n_threads=1")  # a generation of its own
    assert len(fake_xl.made) == 3 and fake_xl.made[-1]() is None
    from specdec.bench.tasks.datasets import load_dataset
    from specdec.bench.running.runner import Settings
    from specdec.bench.running.runner import run as bench_run

    def bench(out):
        return bench_run(tiny_pair, load_dataset("fixture", 1), [], build_peers("llama-server:n_threads=1"),
                         Settings(max_new_tokens=4, warmup=False, sandbox_timeout=5), out, progress=False)

    with pytest.raises(SpecdecError, match="cannot write it"):  # a run that fails midway (no such folder)
        bench(tmp_path / "missing")
    assert len(fake_xl.made) == 4 and fake_xl.made[-1]() is None
    assert len(bench(tmp_path)) == 1 and len(fake_xl.made) == 5 and fake_xl.made[-1]() is None
