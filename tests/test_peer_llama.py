"""The llama-cpp peer's logic (stop at EOS, stop strings, budget, timing fields, an empty KV cache
per request) with a fake ``llama_cpp`` module, so it runs without building llama.cpp."""

import re
import subprocess
import sys
import types

import pytest

from specdec.bench.running import peers
from specdec.bench.running.configs import Config, build_peers, check_peer_available
from specdec.bench.running.loaded import BenchModels
from specdec.errors import SpecdecError


class FakeLlama:
    made: list = []
    script: list = []

    def __init__(self, model_path, **kw):
        self.model_path, self.kw = model_path, kw
        FakeLlama.made.append(self)
        self.seeds = []
        self.resets = 0

    def reset(self):
        self.resets += 1

    def set_seed(self, seed):
        self.seeds.append(seed)

    def generate(self, tokens, reset=True, **sampling):
        self.last = (list(tokens), sampling)
        yield from FakeLlama.script


@pytest.fixture
def fake_llama(monkeypatch, tmp_path):
    module = types.ModuleType("llama_cpp")
    module.Llama = FakeLlama
    monkeypatch.setitem(sys.modules, "llama_cpp", module)
    monkeypatch.setattr(peers, "gguf_of", lambda source: str(tmp_path / "model.gguf"))
    FakeLlama.made = []
    return FakeLlama


def run(pair, stops=(), max_new_tokens=8, **kw):
    (cfg,) = build_peers("llama-cpp:n_threads=1")
    return peers.run_peer(pair, cfg, [5, 6, 7], stops, max_new_tokens=max_new_tokens, **kw)


def test_budget_eos_and_stop_strings(tiny_pair, fake_llama):
    eos = min(tiny_pair.eos_ids)
    models = BenchModels()  # the run's: the llama.cpp model is kept there between generations
    fake_llama.script = tiny_pair.encode("abcdefghijklmnop", chat=False)
    res = run(tiny_pair, max_new_tokens=5, models=models)
    assert res["new_tokens"] == 5 and res["finish_reason"] == "length" and res["tau"] == 1.0
    assert res["target_forwards"] == res["produced_tokens"] == 5 and res["seconds"] >= 0
    llm = fake_llama.made[0]
    assert llm.last[0] == [5, 6, 7] and llm.last[1]["temp"] == 0.0 and llm.last[1]["top_k"] == 1  # greedy
    assert llm.kw["n_threads"] == 1 and llm.model_path.endswith("model.gguf")
    fake_llama.script = tiny_pair.encode("ab", chat=False) + [eos] + tiny_pair.encode("zz", chat=False)
    res = run(tiny_pair, models=models)
    assert res["finish_reason"] == "stop" and res["token_ids"][-1] == eos and res["text"] == "ab"
    fake_llama.script = tiny_pair.encode("xy```zzzz", chat=False)
    res = run(tiny_pair, stops=("```",), models=models)
    assert res["finish_reason"] == "stop" and res["text"] == "xy"
    run(tiny_pair, temperature=0.8, top_p=0.9, top_k=20, seed=3, models=models)
    assert fake_llama.made[0].seeds == [3] and fake_llama.made[0].last[1]["temp"] == 0.8
    assert len(fake_llama.made) == 1  # the model loads once per run and settings
    assert fake_llama.made[0].resets == 4  # each request starts from an empty KV cache (no prefix reuse)
    assert len(models.llama) == 1 and not hasattr(tiny_pair, "_llama")  # kept by the run, not on the pair
    run(tiny_pair)  # without the run's models: loaded for that generation only
    assert len(fake_llama.made) == 2


def test_missing_library_and_non_gguf_target(monkeypatch, tiny_pair):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(SpecdecError, match="pip install llama-cpp-python"):
        check_peer_available(Config("llama-cpp", kind="peer"))
    with pytest.raises(SpecdecError, match="needs a GGUF target"):
        peers.gguf_of("/some/folder")
    with pytest.raises(SpecdecError, match="takes n_threads, n_batch"):
        build_peers("llama-cpp:threads=2")


@pytest.mark.parametrize("peers, message", [
    ("hf-assisted:num_assistant_tokens=99999999999999999999999",
     "peer 'hf-assisted': num_assistant_tokens must be an integer <= 256, got an integer of about 24 digits"),
    ("llama-cpp:n_threads=100000", "peer 'llama-cpp': n_threads must be an integer <= 1024"),
    ("llama-cpp:n_batch=5000", "peer 'llama-cpp': n_batch must be an integer <= 4096"),
    ("llama-cpp-spec:draft_p_min=2", "peer 'llama-cpp-spec': draft_p_min must be a number in [0.0, 1.0], got 2"),
    ("llama-cpp-spec:draft_p_min=low", "peer 'llama-cpp-spec': draft_p_min must be a number, got 'low'"),
    ("hf-assisted:num_assistant_tokens_schedule=fast",
     "num_assistant_tokens_schedule must be constant, heuristic or heuristic_transient, got 'fast'"),
    ("llama-cpp,llama-cpp", "peer llama-cpp is given twice in --peers"),
    ("hf-pld:prompt_lookup_num_tokens=5,hf-pld:prompt_lookup_num_tokens=5", "is given twice in --peers"),
    ("", "--peers is empty"),
    ("  ", "--peers is empty"),
    (",", "empty item"),
])
def test_peers_are_checked_whole_before_any_model_loads(peers, message):
    """Upper limits, duplicates and an empty list were accepted (the models loaded for 17 s before
    ``num_assistant_tokens=99999999999999999999999`` failed); each is now one line from the parser."""
    with pytest.raises(SpecdecError, match=re.escape(message)) as err:
        build_peers(peers)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300
    assert build_peers(None) == []
    assert len(build_peers("hf-pld,hf-pld:prompt_lookup_num_tokens=5")) == 2  # two configurations, not one twice


@pytest.mark.parametrize("peers", ["x" * 10_000, "llama-cpp:" + "n" * 10_000, "llama-cpp:n_threads=" + "9" * 10_000,
                                   "llama-cpp:" + "k" * 10_000 + "=1", "hf-pld," + "," * 10_000, "ß" * 10_000])
def test_a_long_peer_item_is_cut_in_the_error_line(peers):
    with pytest.raises(SpecdecError) as err:
        build_peers(peers)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300, str(err.value)[:400]


def test_the_cli_refuses_bad_peers_before_loading_anything(tmp_path):
    """``--peers ''`` and a duplicated peer loaded the models; now a one-line error, status 2, with
    a target that does not exist (so nothing could have loaded)."""
    for value, message in (("", "--peers is empty"), ("hf-ar,hf-ar", "peer hf-ar is given twice")):
        res = subprocess.run([sys.executable, "-m", "specdec", "bench", "--target", str(tmp_path / "none"),
                              "--peers", value, "--out", str(tmp_path / "run")],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 2 and message in res.stderr, res.stderr[-2000:]
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
