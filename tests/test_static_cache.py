"""The transformers backend's static KV cache and its replayed passes, on a CPU: the model interface's
contract on them, greedy output identical to plain decoding (chains and trees), caches equal to a
fresh prefill after every round, rollback as an index move, the graph buffers' protocol (CUDA
graphs themselves need a GPU: ``replay_eagerly`` stands in for the capture), and the options. The
caches after every round: tests/test_kv_rollback.py and tests/test_tree.py, on both caches."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.models.backends.transformers.execution import choose_execution, switch
from specdec.models.backends.transformers.graphs import WidthGraphs, replay_eagerly
from specdec.models.backends.transformers.model import HFModel
from specdec.models.backends.transformers.static import StaticHFModel, capacity_for, static_refusal
from specdec.core.engine import DecodeConfig, Engine
from specdec.errors import SpecdecError
from specdec.core.sampling import SamplingParams
from test_backends import (  # noqa: F401 - the contract's tests, run again here on the static cache
    test_extended_tree_and_kept_path_equal_a_prefill, test_hidden_states_feed_the_lm_head,
    test_logits_at_every_position_equal_one_token_passes, test_rollback_equals_a_fresh_prefill,
    test_tree_rows_equal_each_path_alone, test_truncate_drops_an_open_tree,
)
from test_kv_rollback import assert_cache_matches, static_with_graphs
from tinymodels import perturbed_copy, tiny_config, tiny_model


KINDS = {"static": lambda m: StaticHFModel(m, "tiny"), "graphs": static_with_graphs}


@pytest.fixture(params=list(KINDS))
def lm(request):
    model = KINDS[request.param](tiny_model(0))
    yield model
    model.close()


# ----------------------------------------------------------------------------- the engine on it
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("drafter", ["model", "pld", "model+pld", "tree"])
def test_greedy_output_on_the_static_cache_equals_plain_decoding(kind, drafter):
    target = tiny_model(1)
    plain = Engine(HFModel(target), eos_ids=[258])
    engine = Engine(KINDS[kind](target), KINDS[kind](perturbed_copy(target, 0.1, 11)), eos_ids=[258])
    accepted = 0
    for prompt in ([5, 17, 99, 3, 5, 17], list(b"def hello(): return hello")):
        ar = plain.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=40))
        assert engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=40)).token_ids == ar.token_ids
        for k in (1, 3, 6):
            out = engine.generate(prompt, DecodeConfig(drafter=drafter, k=k, max_new_tokens=40))
            assert out.token_ids == ar.token_ids, (prompt, k)
            accepted += out.stats.accepted
    assert accepted > 0
    if kind == "graphs":
        graphs = engine.target.graphs
        assert graphs.captures > 0 and graphs.replays > graphs.captures and not graphs.failed


def test_seeded_sampling_on_the_static_cache_repeats_and_matches_the_dynamic_cache():
    t = tiny_model(3)
    d = perturbed_copy(t, 0.2, 4)
    cfg = DecodeConfig(drafter="model", k=4, max_new_tokens=30, sampling=SamplingParams(temperature=0.8, seed=5))
    dynamic = Engine(HFModel(t), HFModel(d), eos_ids=[258]).generate([1, 2, 3, 4], cfg).token_ids
    static = Engine(StaticHFModel(t), StaticHFModel(d), eos_ids=[258])
    assert static.generate([1, 2, 3, 4], cfg).token_ids == dynamic == static.generate([1, 2, 3, 4], cfg).token_ids
    # with graphs the draft's steps run as one loop, drawing by Gumbel-max (other draws, the same law:
    # tests/test_fused_step.py): a seed still repeats
    graphs = Engine(static_with_graphs(t), static_with_graphs(d), eos_ids=[258])
    assert graphs.generate([1, 2, 3, 4], cfg).token_ids == graphs.generate([1, 2, 3, 4], cfg).token_ids
    assert graphs.draft.loop.replays > 0


# ----------------------------------------------------------------------------- the cache itself
def test_truncate_moves_an_index_and_copies_nothing():
    lm = StaticHFModel(tiny_model(0))
    lm.forward(list(range(30)))
    layer = lm.cache.layers[0]
    where, before = layer.keys.data_ptr(), layer.keys.clone()
    lm.truncate(12)
    assert lm.tokens == list(range(12)) and layer.keys.data_ptr() == where
    assert torch.equal(layer.keys, before)  # the stale entries stay until overwritten
    after = lm.forward([7, 8, 9], num_logits=3)
    assert lm.cache.layers[0].keys.data_ptr() == where
    fresh = HFModel(tiny_model(0)).forward(list(range(12)) + [7, 8, 9], num_logits=3)
    torch.testing.assert_close(after, fresh, rtol=1e-4, atol=1e-5)
    assert_cache_matches(lm)


def test_capacity_grows_in_powers_of_two_and_keeps_what_it_holds():
    assert capacity_for(1, 32768) == 256 and capacity_for(300, 32768) == 512 and capacity_for(300, 400) == 400
    assert capacity_for(500, 400) == 500 and capacity_for(100, None, current=512) == 512
    lm = static_with_graphs(tiny_model(0))
    lm.forward(list(range(200)))
    assert lm.capacity == 256 and lm.cache_bytes() == 2 * 2 * 2 * 256 * 16 * 4  # layers x k,v x heads x slots x dim
    lm.forward([1])
    lm.forward([2])  # width 1 captured
    assert lm.graphs.graphs
    lm.forward(list(range(100)))  # past 256: a cache of 512 (the model's limit), the held entries copied over
    assert lm.capacity == 512 and not lm.graphs.graphs
    assert_cache_matches(lm)
    lm.reset()
    assert lm.capacity == 512 and lm.tokens == []  # kept for the next generation


def test_a_returned_row_is_a_copy_a_later_pass_cannot_change():
    lm = static_with_graphs(tiny_model(0))
    lm.forward(list(range(10)))
    rows = [lm.forward([t])[0] for t in (3, 4, 5, 6)]  # width 1: eager, captured, then replayed
    assert lm.graphs.captures == 1 and lm.graphs.replays == 3
    ref = HFModel(tiny_model(0))
    ref.forward(list(range(10)))
    for got, t in zip(rows, (3, 4, 5, 6)):
        torch.testing.assert_close(got, ref.forward([t])[0], rtol=1e-4, atol=1e-5)


def test_a_sliding_window_model_is_refused_by_the_static_cache():
    assert static_refusal(tiny_config()) is None
    why = static_refusal(tiny_config(use_sliding_window=True, sliding_window=8, max_window_layers=0))
    assert why is not None and "full attention" in why
    plan = choose_execution("auto", "auto", "cuda")
    assert plan.for_config(tiny_config(use_sliding_window=True, sliding_window=8, max_window_layers=0)).static is False
    with pytest.raises(SpecdecError, match="static_cache=on: .*full attention"):
        choose_execution("on", "auto", "cpu").for_config(tiny_config(use_sliding_window=True, sliding_window=8,
                                                                     max_window_layers=0))


def test_the_replayed_step_holds_no_host_sync():
    """What a CUDA graph captures must never read a device value on the host: dynamo traces the
    step whole (an ``.item()`` or a branch on a tensor would break its graph)."""
    lm = StaticHFModel(tiny_model(0))
    lm.forward(list(range(10)))
    try:
        with torch.inference_mode():
            explained = torch._dynamo.explain(lm.step)(torch.tensor([[5, 6], [10, 11]]))
    finally:
        torch._dynamo.reset()
    assert explained.graph_break_count == 0, explained.break_reasons


# ----------------------------------------------------------------------------- the graph buffers
def test_width_graphs_run_eagerly_once_then_capture_then_replay():
    calls = []

    def step(inputs):
        calls.append(inputs.shape[-1])
        return (inputs.sum(0, keepdim=True) * 2,)

    graphs = WidthGraphs(step, torch.device("cpu"), max_width=4, capture=replay_eagerly)
    assert graphs.takes(4) and not graphs.takes(5) and not graphs.takes(0)
    first = graphs.run(torch.tensor([[1, 2], [3, 4]]))[0]
    assert graphs.graphs == {} and first.tolist() == [[8, 12]]
    second = graphs.run(torch.tensor([[1, 1], [1, 1]]))[0]
    third = graphs.run(torch.tensor([[2, 0], [0, 2]]))[0]
    assert set(graphs.graphs) == {2} and third is second and third.tolist() == [[4, 4]]  # static outputs
    assert (graphs.captures, graphs.replays) == (1, 2)
    graphs.clear()
    assert graphs.graphs == {} and graphs.run(torch.tensor([[1], [1]]))[0].tolist() == [[4]]


def test_a_width_that_cannot_be_captured_runs_eagerly_and_says_why():
    def refuse(run, pool):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    lm = StaticHFModel(tiny_model(0), graphs=lambda step, device: WidthGraphs(step, device, capture=refuse))
    ref = HFModel(tiny_model(0))
    for lm_ in (lm, ref):
        lm_.forward(list(range(10)))
    for t in (3, 4, 5):
        torch.testing.assert_close(lm.forward([t]), ref.forward([t]), rtol=1e-4, atol=1e-5)
    assert lm.graphs.failed == {1: "RuntimeError: operation not permitted when stream is capturing"}
    assert not lm.graphs.takes(1) and "not captured: 1: RuntimeError" in lm.graphs.describe()


# ----------------------------------------------------------------------------- the options
def test_the_options_choose_how_passes_run():
    cpu = choose_execution("auto", "auto", "cpu")
    assert not cpu.static and cpu.why == "dynamic KV cache (on cpu the static cache is off unless static_cache=on)"
    on_cpu = choose_execution("on", "auto", "cpu")
    assert on_cpu.static and on_cpu.graph_width == 0 and "no CUDA graphs (they need CUDA)" in on_cpu.why
    cuda = choose_execution("auto", "auto", "cuda")
    assert cuda.static and cuda.graph_width == 16 and cuda.fingerprint() == {"kv_cache": "static", "graphs": 16,
                                                                                        "step": "fused"}
    eager = choose_execution(True, "off", torch.device("cuda:0"))
    assert eager.static and eager.graph_width == 0 and "cuda_graphs=off" in eager.why
    assert choose_execution("off", "auto", "cuda").why == "dynamic KV cache (static_cache=off)"
    assert cpu.fingerprint() == {} and on_cpu.fingerprint() == {"kv_cache": "static", "step": "fused"}
    compiled = choose_execution("auto", "auto", "cuda", compile_step="on")
    assert compiled.compiled and compiled.fingerprint()["step"] == "fused+compiled" and "the step compiled" in compiled.why
    assert not cuda.compiled
    with pytest.raises(SpecdecError, match="compile_step=on needs the static KV cache"):
        choose_execution("auto", "auto", "cpu", compile_step="on")
    with pytest.raises(SpecdecError, match="static_cache=off was given"):
        choose_execution("off", "auto", "cuda", compile_step="on")
    with pytest.raises(SpecdecError, match="cuda_graphs=on needs a CUDA device, not cpu"):
        choose_execution("auto", "on", "cpu")
    with pytest.raises(SpecdecError, match="cuda_graphs=on needs the static KV cache"):
        choose_execution("off", "on", "cuda")
    assert switch("x", "TRUE") == "on" and switch("x", False) == "off"
    with pytest.raises(SpecdecError, match="static_cache must be one of auto, on, off, got 'yes'"):
        switch("static_cache", "yes")


def test_load_runs_the_static_cache_when_asked_and_says_so(tiny_dirs):
    target, draft = tiny_dirs
    pair = specdec.load(str(target), draft=str(draft), dtype="float32", device="cpu", static_cache="on",
                        progress=False, calibrate=False)
    assert isinstance(pair.target, StaticHFModel) and isinstance(pair.draft, StaticHFModel)
    assert pair.target.graphs is None and pair.backend_why.endswith("; static KV cache, no CUDA graphs (they need CUDA)")
    plain = specdec.load(str(target), draft=str(draft), dtype="float32", device="cpu", progress=False, calibrate=False)
    assert type(plain.target) is HFModel and plain.backend_why.endswith("dynamic KV cache (on cpu the static cache is "
                                                                        "off unless static_cache=on)")
    a = plain.generate("abc abc", chat=False, policy="ar", max_new_tokens=16).token_ids
    assert pair.generate("abc abc", chat=False, k=3, max_new_tokens=16).token_ids == a
    with pytest.raises(SpecdecError, match="cuda_graphs=on needs a CUDA device"):
        specdec.load(str(target), draft=None, device="cpu", cuda_graphs="on", progress=False, calibrate=False)
    with pytest.raises(SpecdecError, match="static_cache must be one of auto, on, off"):
        specdec.load(str(target), draft=None, device="cpu", static_cache="fast", progress=False, calibrate=False)


def test_a_table_measured_on_the_static_cache_is_kept_apart(tiny_dirs):
    target, _ = tiny_dirs
    pair = specdec.load(str(target), draft=None, dtype="float32", device="cpu", static_cache="on", progress=False)
    assert pair.costs.target is not None and pair.costs.target.fingerprint["kv_cache"] == "static"
    plain = specdec.load(str(target), draft=None, dtype="float32", device="cpu", progress=False)
    assert "kv_cache" not in plain.costs.target.fingerprint  # measured again, for the dynamic cache


def test_the_cuda_capture_warms_up_on_a_side_stream_then_records_into_the_shared_pool(monkeypatch):
    """:func:`capture_cuda_graph` against a stand-in of ``torch.cuda`` (no GPU here): its warm-up
    runs, then one recorded run into the pool it was given, and the graph's replay and pool back."""
    from specdec.models.backends.transformers import graphs as graphs_module

    events = []

    class Stream:
        def wait_stream(self, other):
            events.append("wait")

    class Graph:
        def replay(self):
            events.append("replay")

        def pool(self):
            return "pool-1"

    class Recording:
        def __init__(self, graph, pool=None):
            events.append(f"capture into {pool}")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            events.append("captured")

    class OnStream:
        def __init__(self, stream):
            pass

        def __enter__(self):
            events.append("side stream")

        def __exit__(self, *exc):
            pass

    for name, value in {"Stream": Stream, "CUDAGraph": Graph, "graph": Recording, "stream": OnStream,
                        "current_stream": lambda: Stream()}.items():
        monkeypatch.setattr(torch.cuda, name, value, raising=False)
    replay, outputs, pool = graphs_module.capture_cuda_graph(lambda: (events.append("run") or torch.ones(1),), "pool-0")
    assert events == ["wait", "side stream", "run", "run", "wait", "capture into pool-0", "run", "captured"]
    replay()
    assert events[-1] == "replay" and pool == "pool-1" and outputs[0].tolist() == [1.0]



def test_the_backend_fingerprint_of_the_defaults_follows_the_device(monkeypatch):
    """``specdec models`` lists the tables of a model loaded with the defaults: on CUDA, the static cache's."""
    from specdec.models import costmodel
    from specdec.models.backends import REGISTRY

    backend = REGISTRY.get("transformers")
    assert "kv_cache" not in backend.fingerprint("cpu")
    monkeypatch.setattr(costmodel, "fingerprint", lambda device, extra=None: dict(extra or {}, device=str(device)))
    assert backend.fingerprint("cuda") == {"kv_cache": "static", "graphs": 16, "step": "fused", "device": "cuda"}
