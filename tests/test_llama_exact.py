"""llama.cpp's exact passes (``exact=True``): a position's logits are the same bits whatever the width
of the pass that scores it, so lossless greedy speculation equals plain decoding token for token;
token trees' paths equal their chains; the widening rules themselves."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from specdec.core.engine import DecodeConfig, Engine
from specdec.models.backends.llamacpp.exact import PAD_SEQ, chunks, widen
from tinymodels import byte_tokenizer, save_tiny_gguf, tiny_model

llama_cpp = pytest.importorskip("llama_cpp")

WIDTHS = (1, 2, 4, 8, 16)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny F32 GGUF (hidden 64), and a Q4_K_M copy of a wider one (hidden 256: k-quant blocks)
    whose products run the repacked and tiled kernels the exact passes avoid."""
    root = tmp_path_factory.mktemp("llama-exact")
    tok = byte_tokenizer()
    f32 = save_tiny_gguf(tiny_model(0, max_positions=1024), tok, root / "tiny.gguf")
    wide = save_tiny_gguf(tiny_model(0, hidden=256, initializer_range=0.1, max_positions=1024), tok, root / "wide.gguf")
    q4 = root / "wide-q4_k_m.gguf"
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread, params.ftype, params.allow_requantize = 1, 15, True  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert llama_cpp.llama_model_quantize(str(wide).encode(), str(q4).encode(), ctypes.byref(params)) == 0
    return {"f32": f32, "q4_k_m": q4}


def model(path, exact: bool, threads: int = 2):
    from specdec.models.backends.llamacpp.model import LlamaCppModel

    return LlamaCppModel(path, path.stem, n_ctx=1024, threads=threads, exact=exact)


def logits_by_width(m, ids: list[int], prefix: int, width: int) -> np.ndarray:
    """Logits of ``ids[prefix:]``: the prefix in one pass, then passes of ``width`` tokens."""
    m.reset()
    m.forward(ids[:prefix], 1)
    rows = [m.forward(ids[s:s + width], len(ids[s:s + width])).numpy() for s in range(prefix, len(ids), width)]
    return np.concatenate(rows)


def token_ids(n: int, seed: int = 1) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 250, n)]


@pytest.mark.parametrize("prefix", [24, 300])  # 300: over 256 cells in use, where one-token attention splits
def test_exact_logits_are_the_same_bits_at_every_width(files, prefix):
    m = model(files["f32"], exact=True)
    ids = token_ids(prefix + 32)
    one = logits_by_width(m, ids, prefix, 1)
    for width in WIDTHS[1:]:
        got = logits_by_width(m, ids, prefix, width)
        same = (got == one).all(axis=1)
        assert same.all(), f"width {width}: positions {np.flatnonzero(~same).tolist()} differ from width 1"


def test_exact_k_quant_logits_are_the_same_bits_at_every_width(files):
    """Q4_K/Q6_K weights: repacked (4 columns at a time) and tiled (8+) kernels are avoided."""
    m = model(files["q4_k_m"], exact=True)
    ids = token_ids(300 + 24, seed=2)
    one = logits_by_width(m, ids, 300, 1)
    for width in (2, 3, 4, 5, 8, 16, 24):
        assert np.array_equal(logits_by_width(m, ids, 300, width), one), width


def test_exact_tree_paths_equal_their_chains(files):
    """Each root-to-leaf path's rows in one tree pass are the bits of the same tokens scored as a chain,
    and after keeping a path the next position's logits are plain decoding's."""
    m = model(files["q4_k_m"], exact=True)
    context = token_ids(40, seed=3)
    ids, parents = [5, 6, 7, 8, 9, 10, 11], [-1, -1, 0, 0, 1, 2, 4]
    tree = m.tree_logits(context, ids, parents).numpy()
    for leaf in (3, 5, 6):
        path = [leaf]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        m.reset()
        chain = m.logits_for(context + [ids[n] for n in path], len(path) + 1).numpy()
        assert np.array_equal(chain, tree[[0, *(n + 1 for n in path)]]), leaf
    m.reset()
    m.tree_logits(context, ids, parents)
    m.keep_path([1, 4, 6])
    after_tree = m.forward([42], 1).numpy()
    m.reset()
    m.forward(context + [ids[1], ids[4], ids[6]], 1)
    assert np.array_equal(m.forward([42], 1).numpy(), after_tree)


def test_exact_cache_is_rebuilt_when_discarded_branches_fill_it(files):
    """A tree's discarded branches stay in the cache (masked); past a quarter of the context the cache
    is rebuilt from its tokens, and the next logits are still plain decoding's bits."""
    from specdec.models.backends.llamacpp.model import LlamaCppModel

    m = LlamaCppModel(files["q4_k_m"], "small", n_ctx=256, threads=2, exact=True)
    context = token_ids(20, seed=5)
    m.tree_logits(context, list(range(3, 83)), [-1] * 80)  # 80 siblings: 79 discarded
    m.keep_path([0])
    assert m._grave == 79
    after = m.forward([42], 1).numpy()
    assert m._grave == 0  # 79 >= 256 // 4: rebuilt before that pass
    m.reset()
    m.forward(context + [3], 1)
    assert np.array_equal(m.forward([42], 1).numpy(), after)


@pytest.mark.parametrize("drafter,k", [("model", 3), ("model", 7), ("pld", 4), ("tree", 3)])
def test_exact_lossless_greedy_equals_plain_decoding(files, drafter, k):
    target = model(files["q4_k_m"], exact=True, threads=1)
    draft = model(files["f32"], exact=False, threads=1)
    engine = Engine(target, draft, eos_ids=[258])
    for prompt in (list(b"def fib(n):"), token_ids(300, seed=4)):
        ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=24)).token_ids
        spec = engine.generate(prompt, DecodeConfig(policy="lossless", drafter=drafter, k=k, max_new_tokens=24))
        assert spec.token_ids == ar


@pytest.mark.parametrize("policy", ["mars", "dropmatch", "typical", "fly+mars"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_loose_rules_run_on_exact_passes(files, policy, temperature):
    from specdec.core.sampling import SamplingParams

    engine = Engine(model(files["q4_k_m"], exact=True, threads=1), model(files["f32"], exact=False, threads=1),
                    eos_ids=[258])
    cfg = DecodeConfig(policy=policy, drafter="model", k=8 if "fly" in policy else 4, max_new_tokens=20,
                       sampling=SamplingParams(temperature=temperature, seed=3))
    out = engine.generate(list(b"def fib(n):"), cfg)
    assert 1 <= len(out.token_ids) <= 20 and out.stats.rounds >= 1


@pytest.mark.parametrize("drafter", ["model", "tree"])
def test_structured_output_on_exact_passes_equals_constrained_plain_decoding(files, drafter):
    """Structured output keeps working on the exact path: greedy constrained lossless writes
    constrained plain decoding's tokens, and they match the grammar."""
    import re

    from specdec.frontends.api import Pair

    regex = r"[a-c]{2,5}(-[0-9]{1,2}){1,3}"
    pair = Pair(model(files["q4_k_m"], exact=True, threads=1), byte_tokenizer(),
                model(files["f32"], exact=False, threads=1))
    for prompt in ("def hello():", "abc-12 abc-3"):
        ar = pair.generate(prompt, chat=False, policy="ar", max_new_tokens=24, regex=regex)
        spec = pair.generate(prompt, chat=False, policy="lossless", drafter=drafter, k=4, max_new_tokens=24, regex=regex)
        assert spec.token_ids == ar.token_ids and spec.stats.rounds >= 1
        assert ar.finish_reason == "stop" and re.fullmatch(regex, ar.text), ar.text


def test_widen_pads_a_lone_token_and_asks_two_rows():
    entries, flags = widen([(7, 10, (0,), True)])
    assert entries == [(7, 10, (0,), True), (7, 10, (PAD_SEQ,), False)] and flags == [True, True]
    entries, flags = widen([(1, 0, (0,), False), (2, 1, (0,), False), (3, 2, (0,), True)])
    assert len(entries) == 3 and flags == [False, True, True]
    assert widen([(1, 0, (0,), True), (2, 1, (0,), True)])[1] == [True, True]


def test_chunks_stay_within_the_width_and_leave_no_lone_token():
    cut = chunks(list(range(127)), 63)
    assert [len(c) for c in cut] == [63, 62, 2] and sum(cut, []) == list(range(127))
    assert [len(c) for c in chunks(list(range(5)), 63)] == [5]
    assert [len(c) for c in chunks([0], 63)] == [1]


def test_exact_is_a_llama_cpp_load_option_and_a_flag(files):
    import specdec
    from specdec.cli import build_parser
    from specdec.errors import SpecdecError

    assert build_parser().parse_args(["generate", "hi", "--exact"]).exact is True
    assert build_parser().parse_args(["serve", "--no-exact"]).exact is False
    assert build_parser().parse_args(["generate", "hi"]).exact is None
    pair = specdec.load(str(files["f32"]), draft=None, backend="llama.cpp", exact=True, calibrate=False, progress=False)
    assert pair.target.exact and pair.target.fingerprint_extra()["exact"]
    with pytest.raises(SpecdecError, match="exact=True: applies to the llama.cpp backend"):
        specdec.load(str(files["f32"]), draft=None, backend="transformers", exact=True, progress=False)
