"""Token trees: the tree attention mask, the KV gather, the tree drafter, and tree verification
(greedy identity with plain decoding, exactness at T>0, loose rules per node, FLy along the path)."""

import random

import pytest
import torch

from specdec.core.engine import DecodeConfig, Engine
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.core.sampling import SamplingParams
from tinymodels import chisquare_joint, engine_sample, per_rule, perturbed_copy, tiny_engine, tiny_model
from specdec.core.verify import Round, make_policy
from specdec.core.verify.tree import TreeRound, tree_children, tree_depth, walk_tree

from test_kv_rollback import CACHES, assert_cache_matches

GREEDY = SamplingParams(temperature=0.0)
P_MIN = 1e-3  # a correct implementation fails a seeded test with this probability


def random_tree(rng: random.Random, n: int, vocab: int = 259) -> tuple[list[int], list[int]]:
    """``n`` nodes, parents first, distinct tokens among siblings."""
    tokens, parents = [], []
    for i in range(n):
        parent = rng.randint(-1, i - 1)
        taken = {tokens[j] for j in range(i) if parents[j] == parent}
        tokens.append(rng.choice([t for t in range(vocab) if t not in taken]))
        parents.append(parent)
    return tokens, parents


def random_case(seed: int, model_seed: int, context_len: int, nodes: int):
    """A tiny model, a random context and a random tree over it."""
    rng = random.Random(seed)
    context = [rng.randrange(256) for _ in range(context_len)]
    return CausalLM(tiny_model(model_seed)), context, *random_tree(rng, nodes)


def path_to(parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


# ----------------------------------------------------------------------------- model wrapper
@pytest.mark.parametrize("seed", range(4))
def test_tree_pass_scores_every_node_as_its_path_alone(seed):
    lm, context, tokens, parents = random_case(seed, 3, 7, 9)
    lm.logits_for(context[:4], 1)  # a cache that holds part of the context already
    tree = lm.tree_logits(context, tokens, parents)  # [1 + N, V]
    ref = CausalLM(tiny_model(3))
    torch.testing.assert_close(tree[0], ref.logits_for(context, 1)[0], rtol=1e-4, atol=1e-5)
    for node in range(len(tokens)):
        ids = [tokens[i] for i in path_to(parents, node)]
        ref.reset()
        torch.testing.assert_close(tree[node + 1], ref.logits_for(context + ids, 1)[0], rtol=1e-4, atol=1e-5)


def test_extending_a_tree_level_by_level_equals_one_pass():
    rng = random.Random(7)
    context = [rng.randrange(256) for _ in range(5)]
    tokens, parents = [10, 11, 12, 13, 14], [-1, -1, 0, 0, 2]
    one = CausalLM(tiny_model(4)).tree_logits(context, tokens, parents)
    lm = CausalLM(tiny_model(4))
    first = lm.tree_logits(context, tokens[:2], parents[:2])
    rest = lm.extend_tree(tokens[2:4], parents[2:4])
    last = lm.extend_tree(tokens[4:], parents[4:])
    torch.testing.assert_close(torch.cat([first, rest, last]), one, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_keeping_any_path_leaves_the_cache_of_a_fresh_prefill(seed):
    lm, context, tokens, parents = random_case(seed, 5, 6, 8)
    for end in [-1, *range(len(tokens))]:
        lm.tree_logits(context, tokens, parents)
        path = path_to(parents, end) if end >= 0 else []
        lm.keep_path(path)
        assert lm.tokens == context + [tokens[i] for i in path] and lm.tree is None
        assert_cache_matches(lm)
    lm.tree_logits(context, tokens, parents)
    lm.truncate(len(context) + 3)  # dropping an open tree keeps only the context
    assert lm.tokens == context
    assert_cache_matches(lm)


def test_tree_misuse_is_refused():
    lm = CausalLM(tiny_model(5))
    with pytest.raises(RuntimeError, match="open tree"):
        lm.extend_tree([1], [-1])
    lm.tree_logits([1, 2, 3], [4, 5], [-1, 0])
    with pytest.raises(RuntimeError, match="tree is open"):
        lm.forward([6])
    with pytest.raises(ValueError, match="not a root-to-node path"):
        lm.keep_path([1])
    with pytest.raises(ValueError, match="not an earlier node"):
        lm.extend_tree([7], [5])


# ----------------------------------------------------------------------------- verification rules
def tree_round(logits, tokens, parents, params=GREEDY, seed=0):
    gen = torch.Generator().manual_seed(seed)
    probs = None if params.greedy else torch.softmax(logits / params.temperature, dim=-1)
    return TreeRound(logits, torch.tensor(tokens), parents, params, gen, target_probs=probs,
                     target_hidden=logits, lm_head=lambda h: h)


def test_greedy_walk_follows_the_matching_sibling_and_stops_at_a_mismatch():
    # root's argmax 2 (second child), node 1's argmax 3 (no child has it)
    logits = torch.log(torch.tensor([
        [.1, .2, .6, .1],  # after the context
        [.7, .1, .1, .1],  # after node 0 (token 1)
        [.1, .1, .2, .6],  # after node 1 (token 2)
        [.25, .25, .25, .25], [.25, .25, .25, .25],
    ]))
    rnd = tree_round(logits, [1, 2, 0, 1], [-1, -1, 1, 1])
    walk = walk_tree(rnd)
    assert walk.path == [1] and walk.token == 3 and walk.rejected == [2, 3]
    assert make_policy("lossless").verify_tree(rnd).path == (1,)
    assert tree_children([-1, -1, 1, 1]) == [[0, 1], [], [2, 3], [], []] and tree_depth([-1, -1, 1, 1]) == 2


def test_sampled_walk_accepts_where_the_target_puts_its_mass():
    t1 = SamplingParams(temperature=1.0)
    # the root's p is one-hot on the second child: it is always kept, then the leaf's bonus follows
    logits = torch.log(torch.tensor([[1e-9, 1e-9, 1.0, 1e-9], [.25] * 4, [.25, .25, .25, .25]]))
    for seed in range(20):
        walk = walk_tree(tree_round(logits, [1, 2], [-1, -1], t1, seed))
        assert walk.path == [1]
    # p has no mass on either child: both rejected, the residual never gives them
    logits = torch.log(torch.tensor([[.5, 1e-12, 1e-12, .5], [.25] * 4, [.25] * 4]))
    tokens = {walk_tree(tree_round(logits, [1, 2], [-1, -1], t1, s)).token for s in range(50)}
    assert tokens == {0, 3}


def test_loose_rule_keeps_a_sibling_the_lossless_walk_rejects():
    # MARS at T=0: the draft is the runner-up with a logit ratio 9.5 / 10 >= 0.9
    logits = torch.tensor([[10.0, 9.5, 0.0, 0.0], [0.0, 0.0, 5.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    rnd = tree_round(logits, [3, 1], [-1, -1])
    assert make_policy("lossless").verify_tree(rnd).accepted == 0
    v = make_policy("mars", {"theta": 0.9}).verify_tree(rnd)
    assert v.path == (1,) and v.token == 3 and v.relaxed == {"mars": 1}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["lossless", "mars", "fly", "fly+mars", "typical"])
def test_a_chain_shaped_tree_is_verified_like_the_chain(seed, policy):
    g = torch.Generator().manual_seed(seed)
    k = 9
    logits = torch.randn(k + 1, 6, generator=g) * 2
    drafts = logits[:-1].argmax(-1)
    flip = torch.rand(k, generator=g) < 0.3  # some mismatches
    drafts[flip] = (drafts[flip] + 1) % 6
    params = {"fly": {"theta": 0.0, "window": 3}, "fly+mars": {"fly_theta": 0.0, "fly_window": 3}}.get(policy, {})
    rule = make_policy(policy, params)
    chain = rule.verify(Round(logits, drafts, None, GREEDY, None, target_hidden=logits, lm_head=lambda h: h))
    tree = rule.verify_tree(tree_round(logits, drafts.tolist(), list(range(-1, k - 1))))
    assert (tree.accepted, tree.token, dict(tree.relaxed)) == (chain.accepted, chain.token, dict(chain.relaxed))
    assert tree.path == tuple(range(chain.accepted))


# ----------------------------------------------------------------------------- engine
def tiny_pair(noise=0.3, seed=2, make=CausalLM):
    target = tiny_model(seed)
    return Engine(make(target), make(perturbed_copy(target, noise, seed + 1)), eos_ids=[258])


@pytest.mark.parametrize("options", [{}, {"tree_nodes": 3, "tree_width": 3}, {"tree_nodes": 12, "tree_width": 4},
                                     {"tree_nodes": 6, "tree_width": 1}])
@pytest.mark.parametrize("k", ["auto", 1, 4])
def test_greedy_tree_decoding_is_token_identical_to_plain_decoding(options, k):
    engine = tiny_pair()
    for prompt in ([5, 17, 99, 3], [200, 1, 1, 1, 40, 41]):
        ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=24))
        out = engine.generate(prompt, DecodeConfig(drafter="tree", drafter_params=options, k=k, max_new_tokens=24))
        assert out.token_ids == ar.token_ids
        assert out.stats.tree_depths and out.stats.accepted > 0


@pytest.mark.parametrize("cache", list(CACHES))
def test_both_caches_equal_a_fresh_prefill_after_every_tree_round(cache):
    engine = tiny_pair(noise=0.5, make=CACHES[cache])
    cfg = DecodeConfig(drafter="tree", drafter_params={"tree_nodes": 6, "tree_width": 3}, k=4, max_new_tokens=30,
                       sampling=SamplingParams(temperature=1.0, seed=3))
    rounds = 0
    for _ in engine.run([9, 8, 7, 6, 5], cfg):
        rounds += 1
        assert_cache_matches(engine.target)
        assert_cache_matches(engine.draft)
    assert rounds > 3


def test_tree_stats_report_size_depth_and_per_depth_acceptance():
    engine = tiny_pair()
    out = engine.generate([5, 17, 99, 3], DecodeConfig(drafter="tree", drafter_params={"tree_nodes": 6}, max_new_tokens=20))
    s = out.stats
    assert 0 < s.mean_tree_nodes <= 6 and 0 < s.mean_tree_depth <= 6
    assert len(s.drafted_at) == max(s.tree_depths) and s.drafted_at[0] == len(s.tree_depths)
    assert all(0 <= a <= 1 for a in s.per_position_acceptance)
    assert "trees of" in s.summary()


def test_tree_depth_is_its_own_option_and_a_fixed_k_still_sets_it():
    """A tree's depth limit is the tree drafters' option ``tree_depth`` (``--tree-depth``); a fixed
    k keeps setting it for them, so both spell one request, and both given unequal are refused."""
    from specdec.cli import build_parser
    from specdec.frontends.cliargs import decode_config
    from specdec.core.request import make_config

    for drafter in ("tree", "suffix-tree", "lookahead"):
        by_depth = make_config(drafter=drafter, tree_depth=3)
        assert by_depth == make_config(drafter=drafter, k=3) == make_config(drafter=drafter, k=3, tree_depth=3)
        assert by_depth.k == 3 and "tree_depth" not in by_depth.drafter_params
    assert make_config(drafter="tree", tree_depth=None).k == "auto"
    with pytest.raises(SpecdecError, match="both set the tree's depth"):
        make_config(drafter="tree", k=2, tree_depth=3)
    with pytest.raises(SpecdecError, match=r"tree_depth must be an integer in \[1, 32\]"):
        make_config(drafter="tree", tree_depth=33)
    with pytest.raises(SpecdecError, match="drafter 'model' takes"):
        make_config(drafter="model", tree_depth=3)
    cfg = decode_config(build_parser().parse_args(["generate", "x", "--drafter", "tree", "--tree-depth", "3"]))
    assert (cfg.drafter, cfg.k) == ("tree", 3)
    engine = tiny_pair()
    by_k = engine.generate([5, 17, 99, 3], DecodeConfig(drafter="tree", k=2, max_new_tokens=12))
    by_depth = engine.generate([5, 17, 99, 3], DecodeConfig(drafter="tree", drafter_params={"tree_depth": 2},
                                                            max_new_tokens=12))
    assert by_depth.token_ids == by_k.token_ids and max(by_depth.stats.tree_depths) <= 2 and by_depth.stats.k == 2


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["lossless", "mars", "typical", "fly+mars"])
def test_sampled_tree_decoding_reproduces_the_target_distribution(policy):
    """Exactness of recursive rejection over siblings (lossless), and of the loose rules with
    their relaxation switched off, through the engine on tiny models (K = 2: depth <= 2)."""
    engine = tiny_engine(vocab=4)
    off = per_rule(policy, {"mars": {"theta": 1.0}, "typical": {"epsilon": 1.0, "delta": 1e9},
                            "fly": {"theta": 1.2, "window": 1}})
    counts, expected, accepted, relaxed = engine_sample(
        engine, 3000, SamplingParams(temperature=1.0), policy=policy, policy_params=off,
        drafter="tree", drafter_params={"tree_nodes": 4, "tree_width": 2})
    pvalue, outside = chisquare_joint(counts, expected)
    assert outside == 0 and pvalue > P_MIN, (pvalue, accepted)
    assert accepted > 0.2 and relaxed == 0


@pytest.mark.slow
def test_a_wrong_tree_rule_is_caught():
    """Accepting a child with probability p(x) without renormalizing after a rejected sibling
    (a plausible bug) is visibly off the target's law."""
    import specdec.core.verify.tree as tree_mod

    real = tree_mod.walk_tree

    def sloppy(rnd, extra=None):
        if rnd.params.greedy:
            return real(rnd, extra)
        kids = rnd.children()
        tokens = rnd.tokens.tolist()
        node, path = -1, []
        while True:
            p = rnd.target_probs[node + 1]
            chosen = next((c for c in kids[node + 1]
                           if float(torch.rand((), generator=rnd.generator)) < float(p[tokens[c]]) * 1.6), None)
            if chosen is None:
                return tree_mod.Walk(path, [False] * len(path), int(torch.multinomial(p, 1, generator=rnd.generator)), [])
            path.append(chosen)
            node = chosen

    engine = tiny_engine(vocab=4)
    import specdec.core.verify.base as base_mod
    base_mod.walk_tree, saved = sloppy, base_mod.walk_tree
    try:
        counts, expected, _, _ = engine_sample(engine, 3000, SamplingParams(temperature=1.0),
                                               drafter="tree", drafter_params={"tree_nodes": 4, "tree_width": 2})
    finally:
        base_mod.walk_tree = saved
    assert chisquare_joint(counts, expected)[0] < P_MIN


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("options, match", [
    ({"tree_nodes": 0}, "tree_nodes"),
    ({"tree_width": 0}, "tree_width"),
    ({"ngram_max": 3}, "takes tree_nodes, tree_width"),
    ({"min_confidence": 0.5}, "takes tree_nodes, tree_width"),
])
def test_bad_tree_options_are_one_line_errors(options, match):
    with pytest.raises(SpecdecError, match=match) as err:
        DecodeConfig(drafter="tree", drafter_params=options)
    assert "\n" not in str(err.value)


def test_tree_width_beyond_the_vocabulary_is_a_one_line_error():
    engine = tiny_engine(vocab=4)
    with pytest.raises(SpecdecError, match="exceeds the vocabulary") as err:
        engine.generate([1, 2], DecodeConfig(drafter="tree", drafter_params={"tree_width": 5}))
    assert "\n" not in str(err.value)


def test_fly_on_a_tree_too_small_for_its_window_is_refused():
    with pytest.raises(SpecdecError, match="tree_nodes"):
        DecodeConfig(policy="fly", drafter="tree", drafter_params={"tree_nodes": 6})
    DecodeConfig(policy="fly", drafter="tree", drafter_params={"tree_nodes": 16})


# ----------------------------------------------------------------------------- bench and server
def test_bench_runs_trees_beside_chains_and_reports_them(tiny_dirs, tmp_path, capsys):
    import json

    from specdec.cli import main

    target, draft = tiny_dirs
    out = tmp_path / "run"
    argv = ["bench", "--dataset", "fixture", "--policies", "ar,lossless:drafter=model:k=3,lossless:drafter=tree:tree_nodes=3:k=3",
            "--max-new-tokens", "6", "--no-warmup", "--out", str(out), "-q", "--no-plots",
            "--target", str(target), "--draft", str(draft), "--dtype", "float32", "--device", "cpu"]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    tree = summary["configs"]["lossless[tree_nodes=3]/tree/k3"]
    assert tree["agreement"]["exact_match"] == 1.0 and 0 < tree["tree"]["mean_nodes"] <= 3
    assert "tree" not in summary["configs"]["lossless/model/k3"]
    assert "### Token trees" in (out / "report.md").read_text()


def test_server_takes_the_tree_drafter_in_the_speculative_object(tiny_dirs):
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    import specdec
    from specdec.frontends.server import create_app, serve_in_thread

    target, draft = tiny_dirs
    pair = specdec.load(str(target), draft=str(draft), dtype="float32", device="cpu", progress=False)
    with serve_in_thread(create_app(pair, {"k": 3, "max_new_tokens": 12}, model_name="tiny")) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        kw = dict(model="tiny", prompt="Hello there", max_tokens=12, temperature=0)
        tree = client.completions.create(**kw, extra_body={"speculative": {"drafter": "tree", "tree_nodes": 4}})
        plain = client.completions.create(**kw, extra_body={"speculative": None})
        with pytest.raises(openai.BadRequestError, match="tree_nodes"):
            client.completions.create(**kw, extra_body={"speculative": {"drafter": "tree", "tree_nodes": 0}})
    s = tree.model_dump()["usage"]["speculative"]
    assert tree.choices[0].text == plain.choices[0].text
    assert s["drafter"] == "tree" and s["mean_tree_nodes"] > 0 and s["tree_depths"]
