"""``model@format`` on the llama.cpp backend: a copy of a GGUF file's weights in another format
(made once by llama.cpp's quantizer, cached), and a 16-bit target verifying a 4-bit draft's
proposals losslessly. Tiny GGUF files written by the tests."""

from __future__ import annotations

import pytest

from specdec.models.sources import split_format
from specdec.core.engine import DecodeConfig, Engine
from specdec.errors import SpecdecError
from tinymodels import byte_tokenizer, save_tiny_gguf, tiny_model


def test_split_format_table(tmp_path):
    assert split_format("qwen2.5-coder-1.5b@bf16") == ("qwen2.5-coder-1.5b", "bf16")
    assert split_format("m.gguf@Q8_0") == ("m.gguf", "q8_0")
    assert split_format("qwen2.5-coder-1.5b") == ("qwen2.5-coder-1.5b", None)
    assert split_format(None) == (None, None)
    odd = tmp_path / "a@b.gguf"
    odd.write_bytes(b"")
    assert split_format(str(odd)) == (str(odd), None)  # an existing path is taken as it is
    for bad in ("m.gguf@q-3", "@bf16"):
        with pytest.raises(SpecdecError) as err:
            split_format(bad)
        assert "\n" not in str(err.value)
    assert split_format("m.gguf@q3") == ("m.gguf", "q3")  # which formats exist is the backend's to say


def test_each_backend_declares_its_weight_formats_once():
    """llama.cpp's formats are its ``FTYPES``, the one table of how it makes each copy; transformers makes
    none. One check, the base backend's, refuses for every backend a format it does not make, before
    anything loads, in one line: naming the backend that makes it, or every format that exists."""
    import torch

    from specdec.models.backends import REGISTRY, Request
    from specdec.models.backends.llamacpp.formats import FTYPES

    llama, hf = REGISTRY.get("llama.cpp"), REGISTRY.get("transformers")
    assert llama.formats == tuple(FTYPES) == ("bf16", "f16", "q8_0", "q4_0", "iq4_nl")
    assert hf.formats == ()
    for backend in (llama, hf):
        with pytest.raises(SpecdecError, match=r"unknown weight format 'q3' after '@'; choose one of "
                                               r"bf16, f16, q8_0, q4_0, iq4_nl \(the llama.cpp backend\)$") as err:
            backend.check_format("m.gguf@q3")
        assert "\n" not in str(err.value)
    with pytest.raises(SpecdecError, match="unknown weight format 'q3'"):
        REGISTRY.choose("llama.cpp", Request("qwen2.5-coder-1.5b@q3", None, torch.device("cpu"), {}))
    with pytest.raises(SpecdecError, match="unknown weight format 'q3'"):
        llama.prepare("qwen2.5-coder-1.5b@q3")
    for source in ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b@BF16", None):
        llama.check_format(source)


def test_transformers_refuses_a_format_copy():
    import torch

    from specdec.models.backends import REGISTRY, Request

    for req in (Request("qwen2.5-coder-1.5b@bf16", None, torch.device("cpu"), {}),
                Request("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b@q4_0", torch.device("cpu"), {})):
        with pytest.raises(SpecdecError, match=r"a copy in weight format '(bf16|q4_0)' is made by the llama.cpp backend(, which is "
                                               r"not installed here: pip install 'specdec-rules\[llama\]'.*)?; on transformers choose the weights' "
                                               r"type with dtype=") as err:
            REGISTRY.choose("transformers", req)
        assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    root = tmp_path_factory.mktemp("formats")
    tok = byte_tokenizer()
    kw = dict(layers=1, hidden=64, initializer_range=0.2)
    target = tiny_model(31, **kw)
    return (save_tiny_gguf(target, tok, root / "target.gguf"),
            save_tiny_gguf(tiny_model(32, **kw), tok, root / "draft.gguf"))


def test_copies_are_made_once_and_cached(tiny_files):
    from specdec.models.backends.llamacpp.formats import model_file as gguf_path
    from specdec.models.backends.llamacpp.model import LlamaCppModel

    target, _ = tiny_files
    made = {}
    for fmt in ("bf16", "q8_0", "q4_0"):
        path = gguf_path(f"{target}@{fmt}", progress=False)
        made[fmt] = path
        assert path.is_file() and path != target and fmt in path.name
        mtime = path.stat().st_mtime_ns
        assert gguf_path(f"{target}@{fmt}", progress=False) == path and path.stat().st_mtime_ns == mtime
    types = {fmt: LlamaCppModel(p, fmt, n_ctx=64, threads=1).variant for fmt, p in made.items()}
    assert types == {"bf16": "gguf:BF16", "q8_0": "gguf:Q8_0", "q4_0": "gguf:Q4_0"}


@pytest.mark.parametrize("target_fmt,draft_fmt", [("bf16", "q4_0"), ("f16", "iq4_nl"), ("q8_0", "q4_0")])
def test_a_wide_target_with_a_4bit_draft_is_lossless(tiny_files, target_fmt, draft_fmt):
    from specdec.models.backends.llamacpp.formats import model_file as gguf_path
    from specdec.models.backends.llamacpp.model import LlamaCppModel

    t_path, d_path = tiny_files
    target = LlamaCppModel(gguf_path(f"{t_path}@{target_fmt}", progress=False), "t", n_ctx=256, threads=1)
    draft = LlamaCppModel(gguf_path(f"{d_path}@{draft_fmt}", progress=False), "d", n_ctx=256, threads=1)
    engine = Engine(target, draft, eos_ids=[])
    for prompt in (list(b"def fib(n):"), list(b"Hello, world. Hello, ")):
        ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=20)).token_ids
        for drafter in ("model", "model+pld"):
            out = engine.generate(prompt, DecodeConfig(policy="lossless", drafter=drafter, k=3, max_new_tokens=20,
                                                       drafter_params={"draft_window": 4}))
            assert out.token_ids == ar, (target_fmt, draft_fmt, drafter)


def test_draft_auto_takes_the_format_with_the_least_replayed_time(tiny_files, monkeypatch):
    """``draft="auto"``'s format choice (specdec.frontends.draft_formats): every candidate is
    measured and replayed under k=auto on the reference request with its own agreement and costs; the
    least time wins (a faster draft that agrees much less loses), and the measurements are cached by
    the files' identities."""
    from specdec.frontends import draft_formats
    from specdec.models.backends import REGISTRY
    from specdec.models.backends.llamacpp.formats import model_file
    from specdec.models.backends.llamacpp.model import LlamaCppModel
    from specdec.models.costmodel import CostTable

    t_path, d_path = tiny_files
    target = LlamaCppModel(t_path, "t", n_ctx=512, threads=1)
    step = {"draft.gguf": 0.030, "draft-q4_0.gguf": 0.010, "draft-iq4_nl.gguf": 0.020}  # made-up costs
    widths = list(range(1, 18)) + [24, 32]
    target_table = CostTable("t", "bf16", widths, [0.1 + 0.005 * (w - 1) for w in widths], context=32,
                             prefill_seconds=0.3)

    def load(source):
        lm = LlamaCppModel(model_file(source, progress=False), source, n_ctx=512, threads=1)
        s = step[lm.path.name]
        return lm, CostTable(lm.name, lm.variant, [1, 2], [s, 2 * s], context=32, prefill_seconds=s * 8)

    # q4_0 is fastest but agrees far less often; iq4_nl nearly as often as the file as shipped
    agree = {"draft.gguf": "1111111110" * 20, "draft-q4_0.gguf": "1000000000" * 20, "draft-iq4_nl.gguf": "1111111100" * 20}
    calls = []

    def along(t, d, ids):
        calls.append(d.path.name)
        a = agree[d.path.name]
        return {"agreement": a.count("1") / len(a), "agree": a, "top1": [0.9 if c == "1" else 0.3 for c in a]}

    monkeypatch.setattr(draft_formats, "along", along)
    llama = REGISTRY.get("llama.cpp")
    sources = (str(d_path), *llama.draft_variants(str(d_path)))
    assert sources[1:] == (f"{d_path}@q4_0", f"{d_path}@iq4_nl")
    choice, lm, t, prior = draft_formats.choose(target, byte_tokenizer(), sources, load, lambda line: None,
                                                llama.identity, target_table=target_table)
    assert choice.source == f"{d_path}@iq4_nl" and lm.path.name == "draft-iq4_nl.gguf" and t.forward(1) == 0.020
    assert "as shipped 30 ms / 0.90" in choice.why and prior.mean == 0.8
    assert sorted(calls) == sorted(step)
    again, *_ = draft_formats.choose(target, byte_tokenizer(), sources, load, lambda line: None,
                                     llama.identity, target_table=target_table)
    assert again == choice and sorted(calls) == sorted(step)  # cached: measured once


def test_along_counts_positions_where_both_models_pick_the_same_token(tiny_files):
    from specdec.frontends import draft_formats
    from specdec.models.backends.llamacpp.model import LlamaCppModel

    t_path, d_path = tiny_files
    target = LlamaCppModel(t_path, "t", n_ctx=512, threads=1)
    ids = list(b"def add(a, b):\n    return a + b\n")
    same = draft_formats.along(target, LlamaCppModel(t_path, "t2", n_ctx=512, threads=1), ids)
    assert same["agreement"] == 1.0 and set(same["agree"]) == {"1"} and len(same["top1"]) == len(ids) - 1
    other = draft_formats.along(target, LlamaCppModel(d_path, "d", n_ctx=512, threads=1), ids)
    assert 0.0 <= other["agreement"] < 1.0
