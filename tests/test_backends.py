"""The model interface's contract, on both backends: a tiny random transformers model (float32) and
the same weights written as a tiny GGUF file run by llama.cpp.

Tolerances (max |difference| of logits whose magnitude is <= ~1): transformers float32 against
itself 1e-4; llama.cpp 1e-3, since it keeps its KV cache in float16 by default and a batched pass
reduces in another order than one-token passes (measured here: ~2e-4, see ``test_tiny_gguf.py``).
"""

from __future__ import annotations

import pytest
import torch

from specdec.models.backends import REGISTRY, Capabilities, check_backend
from specdec.models.backends.transformers.model import HFModel
from specdec.errors import SpecdecError
from tinymodels import byte_tokenizer, save_tiny_gguf, tiny_model

TOL = {"transformers": 1e-4, "llama.cpp": 1e-3}
CONTEXT = list(b"def add(a, b):\n    return")


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return save_tiny_gguf(tiny_model(0), byte_tokenizer(), path)


def _hf(request):
    return HFModel(tiny_model(0), "tiny")


def _llama(request):
    from specdec.models.backends.llamacpp.model import LlamaCppModel

    return LlamaCppModel(request.getfixturevalue("gguf_path"), "tiny", n_ctx=512, threads=1)


#: how each registered backend's model of the tiny test weights is made (one entry per backend)
TINY = {"transformers": _hf, "llama.cpp": _llama}


def test_every_registered_backend_has_a_tiny_model_here():
    assert set(TINY) == set(REGISTRY.names())


@pytest.fixture(params=list(REGISTRY.names()))
def lm(request):
    model = TINY[request.param](request)
    yield model
    model.close()


def close(a: torch.Tensor, b: torch.Tensor, backend: str) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= TOL[backend]


def one_at_a_time(lm, ids):
    lm.reset()
    return torch.cat([lm.forward([t]) for t in ids])


def test_logits_at_every_position_equal_one_token_passes(lm):
    batched = (lm.reset(), lm.forward(CONTEXT, num_logits=len(CONTEXT)))[1]
    assert batched.shape == (len(CONTEXT), lm.vocab_limit) and batched.dtype == torch.float32
    assert close(batched, one_at_a_time(lm, CONTEXT), lm.backend)


def test_both_backends_compute_the_same_model(gguf_path):
    from specdec.models.backends.llamacpp.model import LlamaCppModel

    hf, ll = HFModel(tiny_model(0), "tiny"), LlamaCppModel(gguf_path, "tiny", n_ctx=512, threads=1)
    try:
        a = hf.forward(CONTEXT, num_logits=len(CONTEXT))
        b = ll.forward(CONTEXT, num_logits=len(CONTEXT))
        assert close(a, b, "llama.cpp")
        assert ll.vocab_size == hf.vocab_size == 259 and ll.max_length == 512
        assert ll.eos_ids() and 258 in ll.eos_ids()
        assert ll.variant == "gguf:ALL_F32" and ll.parameter_bytes() > 0 and ll.cache_bytes() > 0
    finally:
        ll.close()


def test_rollback_equals_a_fresh_prefill(lm):
    lm.reset()
    lm.forward(CONTEXT + [1, 2, 3, 4, 5])
    lm.truncate(len(CONTEXT))
    assert lm.tokens == CONTEXT
    after = lm.forward([7, 8, 9], num_logits=3)
    lm.reset()
    fresh = lm.forward(CONTEXT + [7, 8, 9], num_logits=3)
    assert close(after, fresh, lm.backend)
    # logits_for reuses the cached prefix and feeds only what differs
    calls = lm.forward_calls
    again = lm.logits_for(CONTEXT + [7, 8, 9], 3)
    assert lm.forward_calls == calls + 1 and close(again, fresh, lm.backend)


# a tree under the context: 0 and 1 at depth 1; 2, 3 under 0; 4 under 1; 5 under 3
TREE_IDS, TREE_PARENTS = [40, 41, 42, 43, 44, 45], [-1, -1, 0, 0, 1, 3]


def path_to(node, parents):
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def test_tree_rows_equal_each_path_alone(lm):
    lm.reset()
    lm.forward(CONTEXT[:5])  # part of the context cached, the rest fed with the tree
    rows = lm.tree_logits(CONTEXT, TREE_IDS, TREE_PARENTS)
    assert rows.shape == (1 + len(TREE_IDS), lm.vocab_limit)
    alone = []
    for node in range(len(TREE_IDS)):
        lm.reset()
        alone.append(lm.forward(CONTEXT + [TREE_IDS[n] for n in path_to(node, TREE_PARENTS)])[0])
    lm.reset()
    first = lm.forward(CONTEXT)[0]
    assert close(rows, torch.stack([first, *alone]), lm.backend)


def test_extended_tree_and_kept_path_equal_a_prefill(lm):
    lm.reset()
    lm.tree_logits(CONTEXT, TREE_IDS[:2], TREE_PARENTS[:2])
    more = lm.extend_tree(TREE_IDS[2:], TREE_PARENTS[2:])  # new branches under cached nodes
    ids = [*TREE_IDS]
    path = path_to(5, TREE_PARENTS)  # 0 -> 3 -> 5
    lm.keep_path(path)
    assert lm.tokens == CONTEXT + [ids[n] for n in path] and lm.tree is None
    after = lm.forward([9, 10], num_logits=2)
    lm.reset()
    fresh = lm.forward(CONTEXT + [ids[n] for n in path] + [9, 10], num_logits=2)
    assert close(after, fresh, lm.backend)
    # each extended node's row equals its path alone
    for j, node in enumerate(range(2, len(TREE_IDS))):
        lm.reset()
        alone = lm.forward(CONTEXT + [ids[n] for n in path_to(node, TREE_PARENTS)])[0]
        assert close(more[j], alone, lm.backend)


def test_truncate_drops_an_open_tree(lm):
    lm.reset()
    lm.tree_logits(CONTEXT, TREE_IDS, TREE_PARENTS)
    lm.truncate(len(CONTEXT) - 2)
    assert lm.tree is None and lm.tokens == CONTEXT[:-2]
    after = lm.forward(CONTEXT[-2:] + [5])
    lm.reset()
    assert close(after, lm.forward(CONTEXT + [5]), lm.backend)


def test_hidden_states_feed_the_lm_head(lm):
    lm.reset()
    logits, hidden = lm.score(CONTEXT, num_logits=3, hidden=True)
    assert hidden.shape == (3, 64)
    assert close(lm.head_logits(hidden), logits, lm.backend)
    rows, h = lm.score_tree(CONTEXT + [3], TREE_IDS[:2], TREE_PARENTS[:2], hidden=True)
    assert h.shape == (3, 64) and close(lm.head_logits(h), rows, lm.backend)
    assert lm.score(CONTEXT, num_logits=2).hidden is None  # one return type: Scores, hidden only when asked


class _NoTrees(HFModel):
    capabilities = Capabilities()  # declares nothing: capabilities are opt-in


def test_capabilities_are_opt_in():
    assert Capabilities() == Capabilities(trees=False, hidden=False, max_tree_leaves=None)
    assert HFModel.capabilities.trees and HFModel.capabilities.hidden


def test_an_unsupported_capability_is_a_one_line_error_before_any_work():
    from specdec.core.engine import DecodeConfig, Engine

    target, draft = _NoTrees(tiny_model(0), "t"), _NoTrees(tiny_model(1), "d")
    engine = Engine(target, draft, eos_ids=[258])
    with pytest.raises(SpecdecError, match="cannot score"):
        next(engine.run([1, 2, 3], DecodeConfig(drafter="tree", k=3)))
    with pytest.raises(SpecdecError, match="hidden states"):
        next(engine.run([1, 2, 3], DecodeConfig(policy="dropmatch", k=3)))
    assert target.forward_calls == 0 and draft.forward_calls == 0


def test_tree_width_over_the_llama_cpp_limit_is_refused_up_front():
    from specdec.core.engine import DecodeConfig, Engine

    class Limited(HFModel):
        capabilities = Capabilities(trees=True, hidden=True, max_tree_leaves=16)

    engine = Engine(Limited(tiny_model(0), "t"), Limited(tiny_model(1), "d"), eos_ids=[258])
    with pytest.raises(SpecdecError, match="limit of 16"):
        engine.check_config(DecodeConfig(drafter="tree", k="auto", drafter_params={"tree_nodes": 32}))
    engine.check_config(DecodeConfig(drafter="tree", k=3, drafter_params={"tree_nodes": 8, "tree_width": 2}))


@pytest.mark.parametrize("bad", ["cuda-graphs", "", None, 3, "LLAMA"])
def test_bad_backend_names_are_one_line_errors(bad):
    with pytest.raises(SpecdecError, match="unknown backend"):
        check_backend(bad)
    assert check_backend("llama-cpp") == "llama.cpp" and check_backend(" Transformers ") == "transformers"


def test_llama_cpp_without_the_package_names_the_extra(monkeypatch):
    import specdec
    from specdec.models.backends.llamacpp.backend import LlamaCppBackend

    monkeypatch.setattr(LlamaCppBackend, "available", lambda self: False)
    with pytest.raises(SpecdecError, match=r"specdec-rules\[llama\]"):
        specdec.load("qwen2.5-coder-1.5b", backend="llama.cpp")


def test_llama_cpp_refuses_transformers_options_and_non_gguf_models(tmp_path):
    import specdec
    from tinymodels import save_tiny_pair

    pytest.importorskip("llama_cpp")
    with pytest.raises(SpecdecError, match="dtype"):
        specdec.load("qwen2.5-coder-1.5b", backend="llama.cpp", dtype="float32")
    target, _ = save_tiny_pair(tmp_path)
    with pytest.raises(SpecdecError, match="needs GGUF"):
        specdec.load(str(target), draft=None, backend="llama.cpp")


def test_auto_backend_choice_says_why(tmp_path, monkeypatch):
    from specdec.models.backends import REGISTRY, Request
    from tinymodels import save_tiny_pair

    cpu = torch.device("cpu")

    def choose(target, draft, device, options):
        backend, why = REGISTRY.choose("auto", Request(target, draft, device, options))
        return backend.name, why

    target, _ = save_tiny_pair(tmp_path)
    assert choose(str(target), None, cpu, {}) == ("transformers", "auto: not a GGUF model")
    assert choose("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", cpu, {"dtype": "float32"}) == (
        "transformers", "auto: dtype given (transformers options)")
    llama = type(REGISTRY.get("llama.cpp"))
    monkeypatch.setattr(llama, "available", lambda self: False)
    chosen, why = choose("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", cpu, {})
    assert chosen == "transformers" and "specdec-rules[llama]" in why
    monkeypatch.setattr(llama, "available", lambda self: True)
    assert choose("qwen2.5-coder-1.5b", None, cpu, {})[0] == "llama.cpp"
    assert choose("qwen2.5-coder-1.5b", None, cpu, {"context_length": 512})[0] == "llama.cpp"
    assert choose("qwen2.5-coder-1.5b", None, torch.device("meta"), {})[0] == "transformers"
    with pytest.raises(SpecdecError, match="context_length=512: applies to the llama.cpp backend"):
        choose(str(target), None, cpu, {"context_length": 512})


def test_auto_follows_the_measurement_when_both_backends_are_measured(gguf_path, monkeypatch):
    """auto picks llama.cpp for a GGUF on a CPU, and says so; when the transformers backend's
    tables for the same models are cached here and predict a faster request, it follows them."""
    import specdec
    from specdec.models.backends.transformers.backend import TransformersBackend
    from specdec.models.costmodel import DtypeChoice

    pair = specdec.load(str(gguf_path), draft=None, progress=False)
    assert pair.backend == "llama.cpp" and pair.backend_why.startswith("auto: GGUF models on a CPU")
    assert pair.costs.target is not None and pair.costs.target.dtype == "gguf:ALL_F32"
    out = pair.generate([1, 2, 3], policy="ar", max_new_tokens=4)
    assert len(out.token_ids) == 4
    pair.target.close()
    monkeypatch.setattr(TransformersBackend, "cached_estimate", lambda self, req: DtypeChoice("float32", None, 1e-9, 0, {}))
    pair = specdec.load(str(gguf_path), draft=None, progress=False)
    assert pair.backend == "transformers" and "measured on this machine, transformers" in pair.backend_why
    monkeypatch.setattr(TransformersBackend, "cached_estimate", lambda self, req: DtypeChoice("float32", None, 1e9, 0, {}))
    pair = specdec.load(str(gguf_path), draft=None, progress=False)
    assert pair.backend == "llama.cpp" and "measured on this machine, llama.cpp" in pair.backend_why


def test_bad_load_options_are_one_line_errors(gguf_path):
    """A load option no backend declares, and llama.cpp's context_length below its floor, are
    refused before any model loads."""
    import specdec
    from specdec.models.backends import REGISTRY, Request

    with pytest.raises(SpecdecError, match=r"unknown load option\(s\) bogus; known: context_length, exact, dtype"):
        REGISTRY.choose("auto", Request(str(gguf_path), None, torch.device("cpu"), {"bogus": 1}))
    with pytest.raises(SpecdecError, match="context_length") as err:
        specdec.load(str(gguf_path), draft=None, backend="llama.cpp", context_length=4, progress=False)
    assert "\n" not in str(err.value)


def test_callers_reach_a_backends_files_through_its_hooks(tmp_path):
    """The CLI, the vLLM plug-in and the bench's peers ask a registry entry what its library reads for a
    source (``prepare``), for a peer's model object and for its threads, and never import its package;
    a backend without a hook refuses in one line."""
    from tinymodels import save_tiny_pair

    target, _ = save_tiny_pair(tmp_path)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    hf, llama = REGISTRY.get("transformers"), REGISTRY.get("llama.cpp")
    assert hf.prepare(str(target)) == str(target) and hf.prepare("org/name") == "org/name"
    assert llama.prepare(str(gguf)) == str(gguf)
    with pytest.raises(SpecdecError, match="backend 'llama.cpp' needs a GGUF model"):
        llama.prepare(str(target))
    assert llama.threads() >= 1 and hf.threads() is None
    assert hf.peer_model(str(target), torch.float32, torch.device("cpu")).config.vocab_size > 0
    with pytest.raises(SpecdecError, match="lends no model object to peers"):
        llama.peer_model(str(gguf), torch.float32, torch.device("cpu"))
