"""The OpenVINO GenAI peers (``ov``, ``ov-pld``): their keys, the missing-library error, and the
peer's logic (prompt ids in, greedy, EOS and stop strings cut as ours, tau, the pipeline loaded once
per run with prefix caching off) with fake ``openvino``/``openvino_genai`` modules; one slow test runs
the real library on the bundled GGUF where it is installed."""

import importlib.util
import re
import sys
import types

import pytest

from specdec.bench.running import peers
from specdec.bench.running.configs import Config, build_peers, check_peer_available, needs_draft_model
from specdec.bench.running.loaded import BenchModels
from specdec.errors import SpecdecError


class FakeTensor:
    def __init__(self, array):
        self.data = array


class FakeConfig:
    pass


class FakePipeline:
    made: list = []
    script: list = []
    steps: list = []

    def __init__(self, path, device, **kw):
        self.path, self.device, self.kw = path, device, kw
        self.calls = []
        FakePipeline.made.append(self)

    def generate(self, inputs, cfg):
        self.calls.append((inputs, cfg))
        raw = types.SimpleNamespace(m_batch_sizes=list(FakePipeline.steps))
        return types.SimpleNamespace(tokens=[list(FakePipeline.script)],
                                     perf_metrics=types.SimpleNamespace(raw_metrics=raw))


@pytest.fixture
def fake_ov(monkeypatch, tmp_path):
    ov = types.ModuleType("openvino")
    ov.Tensor = FakeTensor
    og = types.ModuleType("openvino_genai")
    og.__version__ = "0.0-fake"
    og.LLMPipeline = FakePipeline
    og.GenerationConfig = FakeConfig
    og.SchedulerConfig = FakeConfig
    og.TokenizedInputs = lambda ids, mask: types.SimpleNamespace(input_ids=ids, attention_mask=mask)
    monkeypatch.setitem(sys.modules, "openvino", ov)
    monkeypatch.setitem(sys.modules, "openvino_genai", og)
    monkeypatch.setattr(peers, "gguf_of", lambda source: str(tmp_path / "model.gguf"))
    FakePipeline.made, FakePipeline.steps = [], []
    return FakePipeline


def run(pair, spec="ov:n_threads=1", stops=(), max_new_tokens=8, **kw):
    (cfg,) = build_peers(spec)
    return peers.run_peer(pair, cfg, [5, 6, 7], stops, max_new_tokens=max_new_tokens, **kw)


def test_keys_defaults_and_missing_library(monkeypatch):
    got = build_peers("ov,ov-pld:num_assistant_tokens=8:max_ngram_size=2")
    assert [c.policy for c in got] == ["ov", "ov-pld"] and all(c.kind == "peer" for c in got)
    assert got[1].params == {"num_assistant_tokens": 8, "max_ngram_size": 2}
    assert peers.PEERS["ov-pld"]["defaults"] == {"num_assistant_tokens": 5, "max_ngram_size": 3}
    assert not any(needs_draft_model(c) for c in got)  # no draft model loaded for them
    with pytest.raises(SpecdecError, match="takes n_threads"):
        build_peers("ov:num_assistant_tokens=3")
    with pytest.raises(SpecdecError, match="takes num_assistant_tokens, max_ngram_size, n_threads"):
        build_peers("ov-pld:draft_max=3")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "openvino_genai" else real(name, *a))
    for name in ("ov", "ov-pld"):
        with pytest.raises(SpecdecError, match="pip install openvino-genai"):
            check_peer_available(Config(name, kind="peer"))


@pytest.mark.parametrize("item, message", [
    ("ov:n_threads=abc", "peer 'ov': n_threads must be an integer >= 0, got 'abc'"),
    ("ov-pld:num_assistant_tokens=0", "peer 'ov-pld': num_assistant_tokens must be an integer >= 1, got 0"),
    ("ov-pld:max_ngram_size=2.5", "peer 'ov-pld': max_ngram_size must be an integer >= 1, got 2.5"),
    ("llama-cpp:n_batch=-3", "peer 'llama-cpp': n_batch must be an integer >= 0, got -3"),
    ("llama-cpp-spec:draft_max=x", "peer 'llama-cpp-spec': draft_max must be an integer >= 1, got 'x'"),
])
def test_a_peer_s_bad_integer_is_a_one_line_error_before_any_model_loads(item, message):
    with pytest.raises(SpecdecError, match=re.escape(message)):
        build_peers(item)
    assert build_peers("ov:n_threads=0")[0].params == {"n_threads": 0}  # 0: the backend's default


def test_a_folder_with_ov_peers_re_reports_without_openvino(monkeypatch, tmp_path):
    """``--report-only`` runs no peer, so a machine without OpenVINO GenAI (CI's) re-reports a folder
    that ran them; a run that would run them fails first, naming the install."""
    import argparse

    from specdec.bench.running import command as bench_cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "openvino_genai" else real(name, *a))
    parser = argparse.ArgumentParser(prog="specdec")
    bench_cli.register(parser.add_subparsers(dest="command"))
    argv = ["bench", "--dataset", "edits", "--policies", "ar", "--peers", "ov,ov-pld", "--out", str(tmp_path)]
    _, peers, _, _ = bench_cli.parse_args(parser.parse_args([*argv, "--report-only"]))
    assert [c.policy for c in peers] == ["ov", "ov-pld"]
    with pytest.raises(SpecdecError, match="pip install openvino-genai"):
        bench_cli.parse_args(parser.parse_args(argv))


def test_plain_ids_eos_stops_and_one_pipeline(tiny_pair, fake_ov):
    eos = min(tiny_pair.eos_ids)
    models = BenchModels()
    fake_ov.script = tiny_pair.encode("abcdefgh", chat=False)[:5]
    res = run(tiny_pair, max_new_tokens=5, models=models)
    assert res["new_tokens"] == 5 and res["finish_reason"] == "length" and res["tau"] == 1.0
    assert res["target_forwards"] == res["produced_tokens"] == 5 and res["seconds"] >= 0
    pipe = fake_ov.made[0]
    inputs, cfg = pipe.calls[-1]
    assert inputs.input_ids.data.tolist() == [[5, 6, 7]]  # our prompt ids, not text
    assert inputs.attention_mask.data.tolist() == [[1, 1, 1]]
    assert cfg.do_sample is False and cfg.max_new_tokens == 5 and cfg.apply_chat_template is False
    assert cfg.stop_token_ids == set(tiny_pair.eos_ids) and cfg.eos_token_id in tiny_pair.eos_ids
    assert pipe.kw["INFERENCE_NUM_THREADS"] == 1 and "prompt_lookup" not in pipe.kw
    assert pipe.kw["scheduler_config"].enable_prefix_caching is False  # each request from an empty cache
    assert pipe.path.endswith("model.gguf") and pipe.device == "CPU"
    assert res["peer_settings"]["n_threads"] == 1 and "u4" in res["peer_settings"]["format"]
    fake_ov.script = tiny_pair.encode("ab", chat=False) + [eos] + tiny_pair.encode("zz", chat=False)
    res = run(tiny_pair, models=models)
    assert res["finish_reason"] == "stop" and res["token_ids"][-1] == eos and res["text"] == "ab"
    assert res["produced_tokens"] == len(fake_ov.script)
    fake_ov.script = tiny_pair.encode("xy```", chat=False)  # the pipeline keeps the stop string: cut here
    res = run(tiny_pair, stops=("```",), models=models)
    assert res["finish_reason"] == "stop" and res["text"] == "xy"
    assert pipe.calls[-1][1].stop_strings == {"```"} and pipe.calls[-1][1].include_stop_str_in_output is True
    run(tiny_pair, temperature=0.8, top_p=0.9, top_k=20, seed=3, models=models)
    cfg = pipe.calls[-1][1]
    assert cfg.do_sample is True and cfg.temperature == 0.8 and cfg.top_k == 20 and cfg.rng_seed == 3
    assert len(fake_ov.made) == 1 and len(models.openvino) == 1  # loaded once per run, kept by the run


def test_pld_settings_and_tau(tiny_pair, fake_ov):
    models = BenchModels()
    fake_ov.script = tiny_pair.encode("abcdefgh", chat=False)[:8]
    fake_ov.steps = [1, 4, 3]  # the pipeline's steps: prefill, then two verified drafts
    res = run(tiny_pair, spec="ov-pld:n_threads=1", max_new_tokens=8, models=models)
    pipe = fake_ov.made[0]
    cfg = pipe.calls[-1][1]
    assert pipe.kw["prompt_lookup"] is True and cfg.num_assistant_tokens == 5 and cfg.max_ngram_size == 3
    assert res["target_forwards"] == 3 and res["tau"] == pytest.approx(8 / 3)
    fake_ov.steps = []  # no metrics reported: no tau
    res = run(tiny_pair, spec="ov-pld:n_threads=1", max_new_tokens=8, models=models)
    assert res["tau"] is None and res["target_forwards"] is None
    run(tiny_pair, models=models)  # plain decoding: a pipeline of its own
    assert len(fake_ov.made) == 2


@pytest.mark.slow
def test_real_openvino_on_the_bundled_gguf():
    """OpenVINO GenAI's plain decoding of the bundled target from our prompt ids; skipped where
    openvino-genai or the bundled GGUF (assembled by the llama.cpp backend) is missing."""
    if importlib.util.find_spec("openvino_genai") is None:
        pytest.skip("openvino-genai is not installed (pip install openvino-genai)")
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("the bundled GGUF is assembled by the llama.cpp backend (pip install llama-cpp-python)")
    import specdec

    pair = specdec.load(draft=None, backend="llama.cpp", calibrate=False, progress=False,
                        generation_config="specdec")
    ids = pair.encode("Write a Python function that returns the sum of two numbers.")
    ar = pair.generate(ids, policy="ar", max_new_tokens=8)
    (cfg,) = build_peers("ov")
    res = peers.run_peer(pair, cfg, ids, (), max_new_tokens=8, models=BenchModels())
    assert res["produced_tokens"] == 8 and res["peer_settings"]["openvino_genai"]
    # another runtime's kernels and weight layout: the first tokens agree, not necessarily all
    assert res["token_ids"][:2] == list(ar.token_ids)[:2]
