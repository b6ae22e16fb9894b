"""Lookahead decoding (drafter ``lookahead``): the pass's attention mask against references built by
hand, the Jacobi window and the n-gram pool on hand-made target outputs, greedy identity with
plain decoding on both backends, exactness at T>0, k=auto's pricing by width, and bad options."""

from __future__ import annotations

import pytest
import torch

from specdec.core.autok import KPolicy, PassGate
from specdec.models.costmodel import CostTable
from specdec.core.drafters import LookaheadDrafter
from specdec.core.drafters.lookahead import MAX_NODES, pass_nodes
from specdec.core.rounds import RoundRecord
from specdec.core.engine import DecodeConfig, Engine
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.core.sampling import SamplingParams
from tinymodels import (byte_tokenizer, chisquare_joint, engine_sample, per_rule, save_tiny_gguf, tiny_engine,
                             tiny_model)

GREEDY = SamplingParams(temperature=0.0)
P_MIN = 1e-3  # a correct implementation fails a seeded test with this probability
ROOT = 9  # the last committed token in the hand-made cases


def drafter_with(window: int, ngram: int, guesses: int, pool_tails: list[tuple[int, ...]]) -> LookaheadDrafter:
    """A drafter whose window holds distinct tokens ``100 + 10 j + i`` (level j, column i) and
    whose pool holds ``pool_tails`` under ROOT, least recent first."""
    d = LookaheadDrafter(window, ngram, guesses)
    d.start([1, 2, 3, ROOT])
    d.levels = [[100 + 10 * j + i for i in range(window)] for j in range(ngram - 1)]
    d.pool = {ROOT: list(pool_tails)} if pool_tails else {}
    return d


# ----------------------------------------------------------------------------- the pass's layout and mask
def captured_pass(draft, context):
    """The 4D mask (True = attends) and positions the transformers backend builds for the tree
    pass over ``draft`` after ``context`` (the context's last token is the pass's first row)."""
    lm = CausalLM(tiny_model(0, vocab_size=259, layers=1, hidden=16))
    lm.forward(context[:-1])
    seen = {}
    real = lm.model.forward

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    lm.model.forward = spy
    lm.score_tree(context, draft.tokens, draft.parents)
    mask = seen["attention_mask"][0, 0] == 0  # [rows, past + rows]
    base = len(context) - 1
    assert mask[:, :base].all()  # every row sees the whole committed context before the root
    return mask[:, base:], (seen["position_ids"][0] - base).tolist()


def test_pass_layout_and_mask_match_the_hand_built_reference_w3_n3_g2():
    d = drafter_with(3, 3, 2, [(51, 52), (61, 62)])
    draft = d.propose([1, 2, 3, ROOT], 64, GREEDY, None)
    # guesses first (most recent first), then level 0 (its column 0 is the root), then level 1 by column
    names = ["g61", "g62", "g51", "g52", "L0c1", "L0c2", "L1c0", "L1c1", "L1c2"]
    assert draft.tokens == [61, 62, 51, 52, 101, 102, 110, 111, 112]
    assert draft.parents == [-1, 0, -1, 2, -1, 4, -1, 4, 5]
    assert len(draft) == pass_nodes(3, 3, 2) == 9
    mask, positions = captured_pass(draft, [1, 2, 3, ROOT])
    hand = torch.tensor([  # rows and columns: root, then the nodes above
        # r  g61 g62 g51 g52 L01 L02 L10 L11 L12
        [1,  0,  0,  0,  0,  0,  0,  0,  0,  0],  # root (the last committed token)
        [1,  1,  0,  0,  0,  0,  0,  0,  0,  0],  # guess 1, token 1
        [1,  1,  1,  0,  0,  0,  0,  0,  0,  0],  # guess 1, token 2
        [1,  0,  0,  1,  0,  0,  0,  0,  0,  0],  # guess 2, token 1
        [1,  0,  0,  1,  1,  0,  0,  0,  0,  0],  # guess 2, token 2
        [1,  0,  0,  0,  0,  1,  0,  0,  0,  0],  # level 0, column 1
        [1,  0,  0,  0,  0,  1,  1,  0,  0,  0],  # level 0, column 2: level 0 to its left
        [1,  0,  0,  0,  0,  0,  0,  1,  0,  0],  # level 1, column 0: over the root
        [1,  0,  0,  0,  0,  1,  0,  0,  1,  0],  # level 1, column 1: level 0 up to column 1
        [1,  0,  0,  0,  0,  1,  1,  0,  0,  1],  # level 1, column 2: level 0 up to column 2
    ], dtype=torch.bool)
    assert torch.equal(mask, hand), names
    assert positions == [0, 1, 2, 1, 2, 1, 2, 1, 2, 3]  # level j, column i at i + j; guess token t at t


def seq_reference(window: int, ngram: int, tails: list[tuple[int, ...]]):
    """The mask and positions of llama.cpp's ``examples/lookahead`` batch, built from its sequence
    ids: the root belongs to every sequence, level-0 column i (i >= 1) to sequences i+1..W, level
    j >= 1 column i to sequence i+1, guess g to sequence W+1+g; a row sees a cell holding its
    first sequence at a position not after its own. Keyed by token (all distinct)."""
    entries = [(ROOT, 0, set(range(window + len(tails) + 1)))]
    for g, tail in enumerate(reversed(tails)):
        entries += [(t, p + 1, {window + 1 + g}) for p, t in enumerate(tail)]
    entries += [(100 + i, i, set(range(i + 1, window + 1))) for i in range(1, window)]
    entries += [(100 + 10 * j + i, i + j, {i + 1}) for j in range(1, ngram - 1) for i in range(window)]
    first = [min(s) for _, _, s in entries]
    allowed = {(a[0], b[0]): first[x] in b[2] and b[1] <= a[1] for x, a in enumerate(entries) for b in entries}
    return allowed, {t: p for t, p, _ in entries}


@pytest.mark.parametrize("window, ngram, tails", [(4, 4, [(51, 52, 53), (61, 62, 63), (71, 72, 73)]),
                                                  (3, 2, [(51,)]), (1, 5, [(51, 52, 53, 54)])])
def test_pass_mask_matches_llama_cpp_sequence_layout(window, ngram, tails):
    d = drafter_with(window, ngram, len(tails), tails)
    draft = d.propose([1, 2, 3, ROOT], 64, GREEDY, None)
    mask, positions = captured_pass(draft, [1, 2, 3, ROOT])
    allowed, pos = seq_reference(window, ngram, tails)
    order = [ROOT, *draft.tokens]
    assert len(order) == len(pos)  # every window and guess token is in the pass, once
    assert [pos[t] for t in order] == positions
    for r, a in enumerate(order):
        for c, b in enumerate(order):
            assert bool(mask[r, c]) == allowed[(a, b)], (a, b)


def test_equal_paths_share_nodes_and_k_caps_the_depth():
    d = drafter_with(3, 3, 2, [(101, 102), (110, 55)])  # guesses repeat window paths
    draft = d.propose([1, 2, 3, ROOT], 64, GREEDY, None)
    assert draft.tokens == [110, 55, 101, 102, 111, 112]  # L1c0 = guess (110, ...), L0 chain = guess (101, 102)
    assert draft.parents == [-1, 0, -1, 2, 2, 3]
    shallow = drafter_with(3, 3, 2, [(51, 52)]).propose([1, 2, 3, ROOT], 2, GREEDY, None)
    depth = {-1: 0}
    for i, p in enumerate(shallow.parents):
        depth[i] = depth[p] + 1
    assert max(depth.values()) == 2 and 112 not in shallow.tokens  # level 1, column 2 sits at depth 3


# ----------------------------------------------------------------------------- Jacobi window and n-gram pool
def test_jacobi_step_and_pool_on_hand_made_target_outputs():
    d = drafter_with(3, 3, 2, [])
    draft = d.propose([1, 2, 3, ROOT], 64, GREEDY, None)
    assert draft.tokens == [101, 102, 110, 111, 112]  # empty pool: the window alone
    # the target's argmax after each row: the root, then each node; the tops are level 1's nodes
    argmax = [7, 0, 0, 201, 202, 203]
    d.observe(draft, argmax)
    # levels shift down one; the new top level is the target's tokens after each column's top
    assert d.levels == [[110, 111, 112], [201, 202, 203]]
    # each column's n-gram: its level-0 token (the root for column 0), level 1, the new token
    assert d.pool == {ROOT: [(110, 201)], 101: [(111, 202)], 102: [(112, 203)]}
    # the next pass after 101 verifies the pooled n-gram; its window is the shifted one
    draft = d.propose([1, 2, 3, ROOT, 101], 64, GREEDY, None)
    # (the guess 111, 202 is also level 0's first token and column 1's level 1: shared nodes)
    assert draft.tokens == [111, 202, 112, 201, 203]
    assert draft.parents == [-1, 0, 0, -1, 2]


def test_pool_keeps_the_g_most_recent_ngrams_per_first_token():
    d = LookaheadDrafter(2, 3, 2)
    d.start([1, 2])
    for tail in [(1, 2), (3, 4), (1, 2), (5, 6)]:
        d._remember(7, tail)
    assert d.pool[7] == [(1, 2), (5, 6)]  # (3, 4) was the least recently seen
    draft = d.propose([0, 7], 64, GREEDY, None)
    assert draft.tokens[:4] == [5, 6, 1, 2]  # most recent first


def test_a_column_left_out_by_k_skips_its_jacobi_step():
    d = drafter_with(3, 3, 0, [])
    draft = d.propose([1, 2, 3, ROOT], 2, GREEDY, None)  # level 1, column 2 (depth 3) left out
    assert draft.tokens == [101, 102, 110, 111]
    d.observe(draft, [7, 0, 0, 201, 202])
    assert d.levels == [[110, 111, 112], [201, 202, 112]]  # column 2 keeps its old top token (112)
    assert d.pool == {}  # G = 0: no pool


def test_two_levels_is_plain_jacobi_decoding():
    d = drafter_with(3, 2, 1, [])
    draft = d.propose([1, 2, 3, ROOT], 64, GREEDY, None)
    assert draft.tokens == [101, 102] and draft.parents == [-1, 0]
    d.observe(draft, [7, 8, 9])  # column 0's top is the root: row 0
    assert d.levels == [[7, 8, 9]]
    assert d.pool == {ROOT: [(7,)], 101: [(8,)], 102: [(9,)]}


# ----------------------------------------------------------------------------- the engine, both backends
def hf_engine(seed=2):
    return Engine(CausalLM(tiny_model(seed)), None, eos_ids=[258])


PROMPTS = ([5, 17, 99, 3], [200, 1, 1, 1, 40, 41], list(b"Hello, world. Hello, "))


@pytest.mark.parametrize("options", [{}, {"lookahead_window": 3, "lookahead_ngram": 3, "lookahead_guesses": 2},
                                     {"lookahead_ngram": 2, "lookahead_guesses": 0},
                                     {"lookahead_window": 1, "lookahead_ngram": 5, "lookahead_guesses": 3}])
@pytest.mark.parametrize("k", ["auto", 2])
def test_greedy_lookahead_is_token_identical_to_plain_decoding(options, k):
    engine = hf_engine()
    accepted = 0
    for prompt in PROMPTS:
        ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=30))
        out = engine.generate(prompt, DecodeConfig(drafter="lookahead", drafter_params=options, k=k,
                                                   max_new_tokens=30))
        assert out.token_ids == ar.token_ids
        assert out.stats.tree_depths and max(out.stats.tree_depths) <= (2 if k == 2 else 64)
        accepted += out.stats.accepted
    assert accepted > 0  # the tiny model repeats itself: the window and the pool pay


def test_greedy_lookahead_equals_plain_decoding_on_llama_cpp(tmp_path):
    pytest.importorskip("llama_cpp")
    from specdec.models.backends.llamacpp.model import LlamaCppModel

    path = save_tiny_gguf(tiny_model(21, layers=1, hidden=16, initializer_range=0.2), byte_tokenizer(),
                          tmp_path / "target.gguf")
    engine = Engine(LlamaCppModel(path, "tiny", n_ctx=256, threads=1), None, eos_ids=[258])
    accepted = 0
    for prompt in PROMPTS:
        ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=24)).token_ids
        for options in ({}, {"lookahead_window": 3, "lookahead_ngram": 3, "lookahead_guesses": 2}):
            out = engine.generate(prompt, DecodeConfig(drafter="lookahead", drafter_params=options, max_new_tokens=24))
            assert out.token_ids == ar
            accepted += out.stats.accepted
    assert accepted > 0


@pytest.mark.parametrize("policy", ["mars", "typical", "dropmatch", "fly+mars"])
def test_loose_rules_take_lookahead_trees(policy):
    engine = hf_engine()
    # FLy's window (6) needs paths deeper than it: W = 6 makes the window 5 + 2 deep
    cfg = DecodeConfig(policy=policy, drafter="lookahead", drafter_params={"lookahead_window": 6}, max_new_tokens=20,
                       sampling=SamplingParams(temperature=0.8, seed=3))
    out = engine.generate(PROMPTS[1], cfg)
    assert 1 <= len(out.token_ids) <= 20 and out.stats.tree_depths


def test_chain_only_rules_refuse_lookahead_in_one_line():
    with pytest.raises(SpecdecError, match="verifies chains only") as err:
        DecodeConfig(policy="block", drafter="lookahead")
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_sampled_lookahead_reproduces_the_target_distribution():
    """Exactness at T>0 through the engine (K = 2: depth <= 2, three tokens), lossless and a loose
    rule with its relaxation off; the tiny 4-token vocabulary makes the window and pool hit often."""
    engine = tiny_engine(vocab=4)
    for policy, params in (("lossless", {}), ("mars", per_rule("mars", {"mars": {"theta": 1.0}}))):
        counts, expected, accepted, relaxed = engine_sample(
            engine, 2000, SamplingParams(temperature=1.0), policy=policy, policy_params=params, drafter="lookahead",
            drafter_params={"lookahead_window": 2, "lookahead_ngram": 3, "lookahead_guesses": 2})
        pvalue, outside = chisquare_joint(counts, expected)
        assert outside == 0 and pvalue > P_MIN, (policy, pvalue, accepted)
        assert accepted > 0.1 and relaxed == 0


def test_lookahead_stays_inside_a_grammar():
    """Structured output: guesses are cut where the grammar refuses them, and the target's masks
    keep the window's paths out; every committed token is one the grammar allows."""
    pytest.importorskip("llguidance")
    from specdec.frontends.api import Pair, make_config
    from specdec.core.constrain import make_guide

    tok = byte_tokenizer()
    pair = Pair(CausalLM(tiny_model(5, layers=1, hidden=32, initializer_range=0.2)), tok)
    for temperature in (0.0, 0.8):
        cfg = make_config(drafter="lookahead", max_new_tokens=30, temperature=temperature, seed=1,
                          regex=r"[a-c]{2,5}(-[0-9]{1,2}){1,3}")
        out = pair.engine.generate(list(b"abc-12 abc-3"), cfg)
        guide = make_guide(tok, cfg.constraint, pair.engine.target.vocab_limit, sorted(pair.engine.eos_ids))
        assert out.token_ids and guide.valid_prefix(out.token_ids) == len(out.token_ids)
        assert out.stats.tree_depths


# ----------------------------------------------------------------------------- k=auto: priced by width
def table(seconds_at):
    widths = [1, 2, 4, 8, 16, 32]
    return CostTable("tiny", "float32", widths, [seconds_at(w) for w in widths], 32)


def test_gate_prices_the_pass_by_its_nodes_not_by_k():
    flat = PassGate(table(lambda w: 0.01))  # a GPU: any width costs one step
    steep = PassGate(table(lambda w: 0.01 * w))  # a compute-bound CPU: each token costs a step
    for gate in (flat, steep):
        assert isinstance(gate, KPolicy)  # a K policy like the others
        assert gate.choose()  # nothing drafted yet: the first round drafts
        gate.observe(RoundRecord(drafted=29, accepted=1, verify_seconds=gate.target.forward(30)))  # 29 nodes, 2 tokens
    assert flat.choose()
    assert not steep.choose()  # 2 tokens for 30 steps' seconds
    plain = [steep.choose() for _ in range(2000)]
    assert 0 < sum(plain) < 10  # probes, ever rarer
    # paid from the credit: a probe's extra seconds stay within 2% of the plain steps' (+ one probe)
    probe_extra = steep.target.forward(30) - steep.target.forward(1)
    assert sum(plain) * probe_extra <= 0.02 * 2000 * steep.target.forward(1) + probe_extra
    for _ in range(10):
        steep.observe(RoundRecord(drafted=29, accepted=40, verify_seconds=steep.target.forward(30)))
    assert steep.choose()  # a pass that yields more than it costs pays again


def test_k_auto_with_a_cost_table_steps_plainly_where_wide_passes_cost_too_much():
    engine = hf_engine()
    prompt = PROMPTS[1]
    ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=30)).token_ids
    engine.target_costs = table(lambda w: 0.01 * w)
    out = engine.generate(prompt, DecodeConfig(drafter="lookahead", max_new_tokens=30))
    assert out.token_ids == ar
    assert 0 in out.stats.k_chosen and len(out.stats.k_chosen) == out.stats.rounds
    engine.target_costs = table(lambda w: 0.01)
    out = engine.generate(prompt, DecodeConfig(drafter="lookahead", max_new_tokens=30))
    assert out.token_ids == ar and 0 not in out.stats.k_chosen[:-1]


# ----------------------------------------------------------------------------- options, bench, server
@pytest.mark.parametrize("options, match", [
    ({"lookahead_window": 0}, "lookahead_window"),
    ({"lookahead_window": 65}, "lookahead_window"),
    ({"lookahead_ngram": 1}, "lookahead_ngram"),
    ({"lookahead_guesses": -1}, "lookahead_guesses"),
    ({"lookahead_window": 2.5}, "lookahead_window"),
    ({"lookahead_window": 1, "lookahead_ngram": 2, "lookahead_guesses": 0}, "drafts nothing"),
    ({"lookahead_window": 64, "lookahead_ngram": 16, "lookahead_guesses": 64}, f"limit of {MAX_NODES}"),
    ({"tree_nodes": 4}, "takes lookahead_window, lookahead_ngram, lookahead_guesses"),
])
def test_bad_lookahead_options_are_one_line_errors(options, match):
    with pytest.raises(SpecdecError, match=match) as err:
        DecodeConfig(drafter="lookahead", drafter_params=options)
    assert "\n" not in str(err.value)


def test_bench_and_server_take_lookahead_options():
    from specdec.bench.running.configs import build_configs, needs_draft_model, validate
    from specdec.core.request import DEFAULTS
    from specdec.frontends.server.errors import APIError
    from specdec.frontends.server.params import Limits, build
    from specdec.frontends.server.schemas import CompletionRequest

    def served(spec):
        return build(CompletionRequest(prompt="x", speculative=spec), dict(DEFAULTS), Limits()).config

    configs = validate(build_configs("ar,lossless:drafter=lookahead:lookahead_window=3", "model", "auto"),
                       max_new_tokens=8)
    la = configs[-1]
    assert la.drafter == "lookahead" and la.request.drafter_params == {"lookahead_window": 3}
    assert not needs_draft_model(la)
    cfg = served({"drafter": "lookahead", "lookahead_ngram": 3})
    assert cfg.drafter == "lookahead" and cfg.drafter_params == {"lookahead_ngram": 3}
    with pytest.raises(APIError, match="lookahead_ngram"):
        served({"drafter": "lookahead", "lookahead_ngram": 0})


def test_bench_runs_lookahead_without_a_draft_model(tiny_dirs, tmp_path):
    import json

    from specdec.cli import main

    target, _ = tiny_dirs
    out = tmp_path / "run"
    argv = ["bench", "--dataset", "fixture", "--policies", "ar,lossless:drafter=lookahead:lookahead_window=3",
            "--max-new-tokens", "8", "--no-warmup", "--out", str(out), "-q", "--no-plots",
            "--target", str(target), "--draft", "none", "--dtype", "float32", "--device", "cpu"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    (name,) = [c for c in summary["configs"] if "lookahead" in c]
    assert summary["configs"][name]["agreement"]["exact_match"] == 1.0


def test_the_gate_is_kept_across_requests():
    """What k=auto learned of the lookahead pass is kept for the next request (as the chain
    controller's state), so each request does not pay its first optimistic pass again."""
    engine = hf_engine()
    engine.target_costs = table(lambda w: 0.01 * w)
    cfg = DecodeConfig(drafter="lookahead", max_new_tokens=20)
    first = engine.generate(PROMPTS[1], cfg)
    second = engine.generate(PROMPTS[1], cfg)
    assert len(engine.caches.controllers) == 1
    assert first.stats.k_chosen[0] != 0 and second.stats.k_chosen[0] == 0  # learned: no optimistic first pass
