"""The engine on the llama.cpp backend, on tiny GGUF files the tests write themselves: lossless
greedy equals plain decoding, every rule and drafter runs, and at T>0 lossless speculation samples
the target's distribution (seeded chi-square through the engine)."""

from __future__ import annotations

import pytest

from specdec.core.caller import Caller
from specdec.core.engine import DecodeConfig, Engine
from specdec.core.sampling import SamplingParams
from tinymodels import byte_tokenizer, chisquare_joint, engine_sample, save_tiny_gguf, tiny_model

pytest.importorskip("llama_cpp")

PROMPTS = [list(b"def fib(n):"), list(b"Hello, world. Hello, "), [1, 2, 3, 4, 5, 6, 7, 8]]


@pytest.fixture(scope="module")
def pair_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama-engine")
    tok = byte_tokenizer()
    kw = dict(layers=1, hidden=16, initializer_range=0.2)
    return (save_tiny_gguf(tiny_model(21, **kw), tok, root / "target.gguf"),
            save_tiny_gguf(tiny_model(22, **kw), tok, root / "draft.gguf"))


def engine_on(paths, vocab_limit=None, eos=(258,)):
    """An engine over the tiny GGUF pair, one thread each (a second thread of a tiny model only
    spins against the other test worker: the sampling test took 6 minutes under -n 2 with two)."""
    from specdec.models.backends.llamacpp.model import LlamaCppModel

    target, draft = (LlamaCppModel(p, f"tiny-{i}", vocab_limit=vocab_limit, n_ctx=256, threads=1)
                     for i, p in enumerate(paths))
    return Engine(target, draft, eos_ids=list(eos))


@pytest.mark.parametrize("drafter,k", [("model", 2), ("model", 5), ("pld", 3), ("model+pld", 4), ("tree", 3)])
def test_lossless_greedy_equals_plain_decoding(pair_paths, drafter, k):
    engine = engine_on(pair_paths)
    for prompt in PROMPTS:
        ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=24)).token_ids
        spec = engine.generate(prompt, DecodeConfig(policy="lossless", drafter=drafter, k=k, max_new_tokens=24))
        assert spec.token_ids == ar
        assert spec.stats.rounds < 24 or spec.stats.drafted > 0


@pytest.mark.parametrize("policy", ["mars", "dropmatch", "typical", "fly", "fly+mars", "block"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_rule_runs_on_llama_cpp(pair_paths, policy, temperature):
    engine = engine_on(pair_paths)
    k = 8 if "fly" in policy else 4
    cfg = DecodeConfig(policy=policy, drafter="model", k=k, max_new_tokens=20,
                       sampling=SamplingParams(temperature=temperature, seed=3))
    out = engine.generate(PROMPTS[0], cfg)
    assert 1 <= len(out.token_ids) <= 20 and all(0 <= t < 259 for t in out.token_ids)
    assert out.stats.rounds >= 1


def test_k_auto_runs_from_a_llama_cpp_cost_table(pair_paths):
    from specdec.models.costmodel import CostTable, measure

    engine = engine_on(pair_paths)
    widths, seconds, context, prefill = measure(engine.target)
    assert widths[0] == 1 and all(s > 0 for s in seconds) and engine.target.tokens == []
    engine.target_costs = CostTable("tiny", "gguf:ALL_F32", widths, seconds, context, prefill_seconds=prefill)
    engine.draft_costs = CostTable("tiny-d", "gguf:ALL_F32", *measure(engine.draft)[:3])
    ar = engine.generate(PROMPTS[1], DecodeConfig(policy="ar", max_new_tokens=24)).token_ids
    out = engine.generate(PROMPTS[1], DecodeConfig(policy="lossless", k="auto", max_new_tokens=24))
    assert out.token_ids == ar and len(out.stats.k_chosen) == out.stats.rounds


@pytest.mark.slow
def test_engine_sampling_on_llama_cpp_matches_target_distribution(pair_paths):
    """T = 0.9, top-p 0.95, K = 2 over the first 4 tokens of the tiny GGUF pair (logits cut to 4
    rows: a 4-token model): the joint of the first three generated tokens equals the target's, as
    llama.cpp itself computes it one token at a time."""
    engine = engine_on(pair_paths, vocab_limit=4, eos=())
    counts, expected, accept_rate, _ = engine_sample(engine, 6000, SamplingParams(temperature=0.9, top_p=0.95))
    assert 0.2 < accept_rate < 0.97
    pvalue, outside = chisquare_joint(counts, expected)
    assert pvalue > 1e-3 and outside == 0


def test_prefix_caching_reads_only_the_new_part_of_a_prompt(pair_paths):
    """llama.cpp keeps the cached positions a prompt shares with the request before (the server's
    default); plain decoding's output is that of a fresh cache."""
    engine = engine_on(pair_paths)
    cfg = DecodeConfig(policy="ar", max_new_tokens=12)
    fresh = [engine.generate(p, cfg).token_ids for p in (PROMPTS[0], PROMPTS[0] + list(b" return"))]
    engine.caches.prefix_caching = True
    engine.target.reset()
    outs = [engine.generate(p, cfg) for p in (PROMPTS[0], PROMPTS[0] + list(b" return"))]
    assert [o.stats.cached_prompt_tokens for o in outs] == [0, len(PROMPTS[0])]
    assert [o.token_ids for o in outs] == fresh


def test_a_callers_parked_cache_comes_back_after_another_callers_request(pair_paths):
    """llama.cpp copies its cache aside (llama_state_seq_get_data) when a caller's generation ends
    and back when that caller comes again: alice's second turn after bob's request reads only its new
    part, through a token tree too, and its output is that of a fresh cache."""
    engine = engine_on(pair_paths)
    turns = [PROMPTS[0], PROMPTS[0] + list(b" return")]
    for run, kw in enumerate((dict(policy="ar"), dict(policy="lossless", drafter="tree", k=3))):
        fresh = [engine.generate(p, DecodeConfig(max_new_tokens=12, **kw)).token_ids for p in turns]
        engine.caches.prefix_caching = True
        alice, bob = (DecodeConfig(max_new_tokens=12, **kw).with_settings(caller=f"{c}{run}") for c in ("alice", "bob"))
        first = engine.generate(turns[0], alice)
        other = engine.generate(PROMPTS[1], bob)
        again = engine.generate(turns[1], alice)
        assert [first.stats.cached_prompt_tokens, other.stats.cached_prompt_tokens] == [0, 0]
        assert again.stats.cached_prompt_tokens == len(turns[0])
        assert [first.token_ids, again.token_ids] == fresh
        assert engine.caches.parked.get(Caller.named(f"alice{run}")).nbytes > 0
        engine.caches.prefix_caching = False


def test_a_busy_core_is_said_at_startup(monkeypatch):
    """Other work on a core llama.cpp's threads run on slows every step many times over: the
    startup names the busy cores and the free ones to run on; nothing is said when none is busy or
    llama.cpp runs on fewer threads than the cores."""
    import os

    from specdec.models.backends.llamacpp import model

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    note = model.busy_note(2, [0])
    assert note and "1 of the 2 cores" in note and "taskset -c 1" in note and "\n" not in note
    assert "free some" in model.busy_note(2, [0, 1])
    assert model.busy_note(2, []) is None and model.busy_note(1, [0]) is None
    assert isinstance(model.busy_cores(0.01), list)
