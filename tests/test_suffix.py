"""Suffix decoding (specdec.core.drafters.suffix): the suffix trie's counts and matches, the
frequency-scored drafts, the cross-request cache (bound, eviction order, per-caller isolation,
opt-out), exactness under every rule, and the drafter through the server and bench."""

from __future__ import annotations

import pytest
import torch

from specdec.core.caller import Caller
from specdec.core.drafters import DRAFTERS, SuffixCache, SuffixDrafter, SuffixTreeDrafter
from specdec.core.drafters.suffix import DEPTH, SuffixTrie, expand
from specdec.core.engine import DecodeConfig, Engine
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.core.sampling import SamplingParams
from tinymodels import chisquare_joint, engine_sample, per_rule, perturbed_copy, tiny_engine, tiny_model

GREEDY = SamplingParams()
P_MIN = 1e-3


def trie_of(*sequences, depth=DEPTH) -> SuffixTrie:
    trie = SuffixTrie(depth)
    for seq in sequences:
        trie.append([], seq)
    return trie


# ----------------------------------------------------------------------------- the suffix trie
@pytest.mark.parametrize("sequences, pattern, depth, expected", [
    ([[1, 2, 3, 1, 2, 4]], [1, 2], DEPTH, {3: 1, 4: 1}),
    ([[1, 2, 3, 1, 2, 3]], [1, 2], DEPTH, {3: 2}),
    ([[1, 2, 3, 1, 2, 3]], [2, 3], DEPTH, {1: 1}),  # the last "2 3" has no continuation yet
    ([[1, 2, 3], [1, 2, 3], [1, 2, 5]], [1, 2], DEPTH, {3: 2, 5: 1}),  # counted across sequences
    ([[7, 7, 7, 7]], [7], DEPTH, {7: 3}),
    ([[1, 2, 3]], [9], DEPTH, {}),
    ([[1, 2, 3, 4, 5]], [1, 2, 3], 3, {}),  # depth 3: "1 2 3 4" is too long to be held
    ([[1, 2, 3, 4, 5]], [2, 3], 3, {4: 1}),
])
def test_continuation_counts(sequences, pattern, depth, expected):
    assert trie_of(*sequences, depth=depth).continuations(pattern) == expected


@pytest.mark.parametrize("sequences, context, longest, expected", [
    ([[1, 2, 3, 1, 2, 4]], [5, 1, 2], 8, 2),  # "1 2" occurred followed by a token; "5 1 2" never did
    ([[1, 2, 3, 1, 2, 4]], [9, 3, 1, 2], 8, 3),  # "3 1 2" occurred, followed by 4
    ([[1, 2, 3, 1, 2, 4]], [9, 3, 1, 2], 2, 2),  # capped at ``longest``
    ([[1, 2, 3]], [8, 9], 8, 0),  # nothing matches
    ([[1, 2, 3]], [1, 2, 3], 8, 0),  # occurred, but only at the end (no continuation)
    ([[4, 4, 4, 4, 4, 4]], [4, 4, 4, 4, 4, 4], 8, 5),  # its own earlier occurrence, one token later
])
def test_longest_matching_suffix(sequences, context, longest, expected):
    node, m = trie_of(*sequences).match(context, longest)
    assert m == expected and (node is None) == (expected == 0)


def test_appending_in_pieces_equals_appending_at_once():
    text = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]
    whole, pieces = trie_of(text, depth=5), SuffixTrie(5)
    frontier = []
    for i in range(0, len(text), 4):
        frontier = pieces.append(frontier, text[i:i + 4])
    assert pieces.nodes == whole.nodes
    for start in range(len(text)):
        for end in range(start + 1, min(start + 5, len(text))):
            assert pieces.continuations(text[start:end]) == whole.continuations(text[start:end])


def test_removing_a_sequence_restores_the_counts_and_frees_its_nodes():
    a, b = [1, 2, 3, 1, 2, 4, 5], [2, 3, 9, 1, 2, 3]
    trie = trie_of(a, b, depth=4)
    trie.remove(a)
    alone = trie_of(b, depth=4)
    assert trie.nodes == alone.nodes
    for pattern in ([1, 2], [2, 3], [2], [3], [1, 2, 3], [9]):
        assert trie.continuations(pattern) == alone.continuations(pattern)
    trie.remove(b)
    assert trie.nodes == 0 and trie.root.kids is None


def test_the_tree_is_grown_best_first_by_continuation_frequency():
    # after "1 2": 3 (3 times, then 7 twice, 8 once), 4 (once, then 0)
    trie = trie_of([1, 2, 3, 7], [1, 2, 3, 7], [1, 2, 3, 8], [1, 2, 4, 0])
    node, m = trie.match([5, 1, 2], 8)
    assert m == 2
    tree = expand(node, depth=2, nodes=8, min_prob=0.0, tree=True)
    assert tree.tokens == [3, 7, 4, 8, 0] and tree.parents == [-1, 0, -1, 0, 2]  # equal scores: first found first
    assert tree.score == pytest.approx(0.75 + 0.5 + 0.25 + 0.25 + 0.25)
    chain = expand(node, depth=2, nodes=2, min_prob=0.0, tree=False)
    assert chain.tokens == [3, 7] and chain.parents == [-1, 0] and chain.score == pytest.approx(1.25)
    # the threshold prunes by path probability; the budget keeps the best nodes
    assert expand(node, 2, 8, 0.3, True).tokens == [3, 7]
    assert expand(node, 2, 2, 0.0, True).tokens == [3, 7]
    assert expand(node, 1, 8, 0.0, True).tokens == [3, 4]  # depth 1


def test_nothing_grows_under_an_end_of_sequence_token():
    trie = trie_of([1, 2, 0, 5, 6], [1, 2, 0, 5, 6])
    node, _ = trie.match([1, 2], 8)
    assert expand(node, 5, 8, 0.0, False, stop_ids=frozenset({0})).tokens == [0]
    assert expand(node, 5, 8, 0.0, False).tokens == [0, 5, 6]


def test_the_draft_length_follows_the_match_length():
    text = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    for factor, context, expected in ((1.0, [99, 11], 1), (1.0, [12, 13, 14], 3), (2.0, [99, 11], 2),
                                      (0.5, [12, 13, 14], 2)):
        drafter = SuffixDrafter(suffix_factor=factor, suffix_cache=False)
        drafter.start(text)
        draft = drafter.propose(context, 8, GREEDY, None)
        assert len(draft) == expected and draft.parents is None
        assert draft.tokens == text[text.index(context[-1]) + 1:][:expected]
    drafter = SuffixDrafter(suffix_factor=4.0, suffix_cache=False)
    drafter.start(text)
    assert len(drafter.propose([12, 13, 14], 5, GREEDY, None)) == 5  # k caps it too


def test_the_drafters_declare_their_capabilities():
    assert DRAFTERS["suffix"] is SuffixDrafter and DRAFTERS["suffix-tree"] is SuffixTreeDrafter
    for cls in (SuffixDrafter, SuffixTreeDrafter):
        assert not cls.requires_model and cls.reads_history
    assert not SuffixDrafter.grows_trees and SuffixTreeDrafter.grows_trees
    assert SuffixTreeDrafter.depth_limit(tree_nodes=4) == 4 and SuffixTreeDrafter.depth_limit(tree_nodes=200) == DEPTH - 1


# ----------------------------------------------------------------------------- the cache
def add(cache: SuffixCache, caller: str, tokens: list[int]) -> None:
    cache.scope(Caller.named(caller)).add(tokens)


def test_the_cache_holds_at_most_its_bound_and_evicts_whole_requests_oldest_first():
    cache = SuffixCache(max_tokens=10)
    add(cache, "", [1, 2, 3, 4])
    add(cache, "", [5, 6, 7])
    add(cache, "", [8, 9, 10])
    assert cache.tokens == 10 and cache.requests() == [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10]]
    add(cache, "", [11, 12])  # the oldest request goes whole
    assert cache.requests() == [[5, 6, 7], [8, 9, 10], [11, 12]] and cache.tokens == 8
    scope = cache.scope()
    scope.add([20, 21])
    add(cache, "", [30])
    scope.add([22, 23, 24])  # extending a request makes it the most recent one
    assert cache.requests() == [[11, 12], [30], [20, 21, 22, 23, 24]] and cache.tokens <= 10
    add(cache, "", list(range(40, 55)))  # longer than the bound: everything else goes; it keeps its first 10
    assert cache.requests() == [list(range(40, 50))] and cache.tokens == 10
    scope.add([25])  # an evicted request stays out
    assert cache.requests() == [list(range(40, 50))]
    trie = cache._tries[Caller.SHARED]
    assert trie.nodes == trie_of(list(range(40, 50))).nodes  # the evicted text left the trie


def test_callers_never_draft_from_each_others_text():
    engine = Engine(CausalLM(tiny_model(2)), None, eos_ids=[258])
    secret = [40, 41, 42, 43, 44, 45, 46, 47]
    alice = DecodeConfig(drafter="suffix", max_new_tokens=8).with_settings(caller="alice")
    engine.generate(secret, alice)
    held = engine.caches.suffix.requests
    assert held(Caller.named("bob")) == [] and held(Caller.named("alice"))
    for caller, expected in (("bob", []), ("alice", [44, 45, 46, 47])):
        drafter = engine.make_drafter(alice.with_settings(caller=caller))
        drafter.start([40, 41, 42, 43])
        assert drafter.propose([40, 41, 42, 43], 4, GREEDY, None).tokens == expected
        assert drafter.from_cache == (1 if expected else 0)


def test_a_request_may_opt_out_of_the_cache():
    engine = Engine(CausalLM(tiny_model(2)), None, eos_ids=[258])
    engine.generate([40, 41, 42, 43, 44], DecodeConfig(drafter="suffix", drafter_params={"suffix_cache": False},
                                                       max_new_tokens=6))
    assert engine.caches.suffix.requests() == []  # it added nothing
    engine.generate([40, 41, 42, 43, 44], DecodeConfig(drafter="suffix", max_new_tokens=6))
    cfg = DecodeConfig(drafter="suffix", drafter_params={"suffix_cache": "false"})  # as text too (flags, bench)
    drafter = engine.make_drafter(cfg)
    drafter.start([40, 41])
    assert drafter.history is None and drafter.propose([40, 41], 4, GREEDY, None).tokens == []
    assert len(engine.caches.suffix.requests()) == 1


def test_the_cache_can_be_replaced_or_shared():
    shared = SuffixCache(max_tokens=100)
    one, two = (Engine(CausalLM(tiny_model(2)), None, eos_ids=[258]) for _ in range(2))
    one.caches.suffix = two.caches.suffix = shared
    one.generate([7, 8, 9, 10], DecodeConfig(drafter="suffix-tree", max_new_tokens=5))
    drafter = two.make_drafter(DecodeConfig(drafter="suffix-tree"))
    drafter.start([7, 8])
    assert drafter.propose([7, 8], 2, GREEDY, None).tokens == [9, 10]


# ----------------------------------------------------------------------------- exactness
def tiny_pair(noise=0.3, seed=2):
    target = tiny_model(seed)
    return Engine(CausalLM(target), CausalLM(perturbed_copy(target, noise, seed + 1)), eos_ids=[258])


PROMPTS = ([5, 17, 99, 3], [200, 1, 1, 1, 40, 41], [9, 8, 7, 9, 8, 7, 9, 8])


@pytest.mark.parametrize("drafter", ["suffix", "suffix-tree"])
@pytest.mark.parametrize("k", ["auto", 1, 4])
@pytest.mark.parametrize("options", [{}, {"suffix_match": 2, "suffix_factor": 3.0, "suffix_min_prob": 0.0}])
def test_greedy_suffix_decoding_is_token_identical_to_plain_decoding(drafter, k, options):
    engine = tiny_pair()
    accepted = 0
    for _ in range(2):  # the second time, the cache holds the first answers
        for prompt in PROMPTS:
            ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=30))
            out = engine.generate(prompt, DecodeConfig(drafter=drafter, drafter_params=options, k=k,
                                                       max_new_tokens=30))
            assert out.token_ids == ar.token_ids and out.finish_reason == ar.finish_reason
            accepted += out.stats.accepted
    assert accepted > 20


@pytest.mark.parametrize("policy", ["block", "mars", "typical", "fly", "fly+mars", "dropmatch"])
@pytest.mark.parametrize("drafter", ["suffix", "suffix-tree"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_every_rule_runs_with_suffix_drafts(policy, drafter, temperature):
    if policy == "block" and drafter == "suffix-tree":
        with pytest.raises(SpecdecError, match="chains only"):
            DecodeConfig(policy=policy, drafter=drafter)
        return
    engine = tiny_pair()
    cfg = DecodeConfig(policy=policy, drafter=drafter, k=8 if "fly" in policy else 4, max_new_tokens=24,
                       sampling=SamplingParams(temperature=temperature, seed=3),
                       drafter_params={"tree_nodes": 16} if drafter == "suffix-tree" and "fly" in policy else {})
    for prompt in PROMPTS:
        out = engine.generate(prompt, cfg)
        assert 1 <= len(out.token_ids) <= 24 and out.stats.rounds >= 1
    if policy == "block" and temperature == 0:  # lossless
        assert out.token_ids == engine.generate(PROMPTS[-1], DecodeConfig(policy="ar", max_new_tokens=24)).token_ids


@pytest.mark.slow
@pytest.mark.parametrize("policy,drafter", [("lossless", "suffix"), ("block", "suffix"), ("lossless", "suffix-tree"),
                                            ("mars", "suffix-tree")])
def test_sampled_suffix_decoding_reproduces_the_target_distribution(policy, drafter):
    """Drafts that depend on earlier samples (the cache holds every earlier generation) keep every
    lossless rule exact; loose rules with their relaxation switched off too (K = 2)."""
    engine = tiny_engine(vocab=4)
    off = per_rule(policy, {"mars": {"theta": 1.0}})
    counts, expected, accepted, relaxed = engine_sample(
        engine, 3000, SamplingParams(temperature=1.0), policy=policy, policy_params=off, drafter=drafter,
        drafter_params={"suffix_min_prob": 0.0})
    pvalue, outside = chisquare_joint(counts, expected)
    assert outside == 0 and pvalue > P_MIN, (pvalue, accepted)
    assert 0.05 < accepted < 0.95 and relaxed == 0


def test_structured_output_drafts_only_what_the_grammar_allows():
    pytest.importorskip("llguidance")
    from specdec.frontends.api import Pair
    from specdec.core.constrain import constraint_from, make_guide
    from tinymodels import byte_tokenizer

    tok = byte_tokenizer()
    target = tiny_model(5, layers=1, hidden=32, initializer_range=0.2)
    pair = Pair(CausalLM(target), tok, None)
    regex = r"[a-c]{2,5}(-[0-9]{1,2}){1,3}"
    for drafter in ("suffix", "suffix-tree"):
        for prompt in ("abc-12 abc-3 abc-1", "The quick brown fox"):
            ar = pair.generate(prompt, chat=False, policy="ar", max_new_tokens=30, regex=regex)
            for policy in ("lossless", "block") if drafter == "suffix" else ("lossless",):
                out = pair.generate(prompt, chat=False, policy=policy, drafter=drafter, k=4, max_new_tokens=30,
                                    regex=regex)
                assert out.token_ids == ar.token_ids
    # the drafter itself never proposes a token the grammar refuses, nor leaves the guide moved
    guide = make_guide(tok, constraint_from(regex="ab+c"), 259, [258])
    drafter = SuffixTreeDrafter(suffix_cache=False, suffix_min_prob=0.0)
    text = list(b"abbc axbc abbbx ab")
    drafter.start(text)
    free = drafter.propose(text, 4, GREEDY, None)
    assert ord("x") in free.tokens  # "abbbx": the unconstrained tree holds a refused branch
    guide.advance(list(b"ab"))  # the answer so far
    drafter.guide = guide
    draft = drafter.propose(text, 4, GREEDY, None)
    assert draft.tokens and ord("x") not in draft.tokens and guide.consumed == 2
    for i, parent in enumerate(draft.parents):
        path = [draft.tokens[i]]
        while parent >= 0:
            path.insert(0, draft.tokens[parent])
            parent = draft.parents[parent]
        assert guide.valid_prefix(path) == len(path), bytes(path)


def test_llama_cpp_greedy_suffix_decoding_equals_plain_decoding(tmp_path):
    pytest.importorskip("llama_cpp")
    from test_llama_engine import PROMPTS as LLAMA_PROMPTS, engine_on

    from tinymodels import byte_tokenizer, save_tiny_gguf

    kw = dict(layers=1, hidden=16, initializer_range=0.2)
    paths = (save_tiny_gguf(tiny_model(21, **kw), byte_tokenizer(), tmp_path / "target.gguf"),
             save_tiny_gguf(tiny_model(22, **kw), byte_tokenizer(), tmp_path / "draft.gguf"))
    engine = engine_on(paths)
    for drafter in ("suffix", "suffix-tree"):
        for prompt in LLAMA_PROMPTS:
            ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=24)).token_ids
            out = engine.generate(prompt, DecodeConfig(drafter=drafter, k=4, max_new_tokens=24))
            assert out.token_ids == ar


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("drafter, options, match", [
    ("suffix", {"suffix_match": 0}, "suffix_match"),
    ("suffix", {"suffix_match": DEPTH}, "suffix_match"),
    ("suffix", {"suffix_factor": 0}, "suffix_factor"),
    ("suffix", {"suffix_min_prob": 1.5}, "suffix_min_prob"),
    ("suffix", {"suffix_cache": "maybe"}, "suffix_cache must be true or false"),
    ("suffix", {"suffix_cache": 1}, "suffix_cache must be true or false"),
    ("suffix", {"tree_nodes": 4}, "takes suffix_match"),
    ("suffix-tree", {"tree_nodes": 0}, "tree_nodes"),
    ("suffix-tree", {"ngram_max": 3}, "takes suffix_match"),
])
def test_bad_suffix_options_are_one_line_errors(drafter, options, match):
    with pytest.raises(SpecdecError, match=match) as err:
        DecodeConfig(drafter=drafter, drafter_params=options)
    assert "\n" not in str(err.value)


def test_the_caller_is_no_request_option():
    from specdec.core.request import make_config

    with pytest.raises(SpecdecError, match="unknown option 'caller'"):
        make_config(drafter="suffix", caller="alice")
    with pytest.raises(SpecdecError, match="caller must be a string"):
        DecodeConfig().with_settings(caller=3)


def test_cli_flags_take_the_options(capsys):
    from specdec.cli import main

    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = capsys.readouterr().out
    assert "--suffix-cache" in text and "--suffix-match" in text
    with pytest.raises(SystemExit) as err:
        main(["generate", "--target", "x", "--drafter", "suffix", "--suffix-cache", "maybe", "hi"])
    assert err.value.code != 0


# ----------------------------------------------------------------------------- bench and server
def test_bench_runs_suffix_drafters(tiny_dirs, tmp_path):
    import json

    from specdec.cli import main

    target, draft = tiny_dirs
    out = tmp_path / "run"
    argv = ["bench", "--dataset", "fixture", "--policies",
            "ar,lossless:drafter=suffix:k=3,lossless:drafter=suffix-tree:tree_nodes=4:k=3,"
            "lossless:drafter=suffix:suffix_cache=false:k=3",
            "--max-new-tokens", "6", "--no-warmup", "--out", str(out), "-q", "--no-plots",
            "--target", str(target), "--draft", str(draft), "--dtype", "float32", "--device", "cpu"]
    assert main(argv) == 0
    configs = json.loads((out / "summary.json").read_text())["configs"]
    suffix = [c for name, c in configs.items() if "/suffix" in name]
    assert len(suffix) == 3 and all(c["agreement"]["exact_match"] == 1.0 for c in suffix), list(configs)


def test_server_serves_the_suffix_drafter_and_keeps_each_keys_text_apart(tiny_dirs):
    pytest.importorskip("fastapi")
    openai = pytest.importorskip("openai")
    import specdec
    from specdec.frontends.server import create_app, serve_in_thread
    from specdec.frontends.server.gate import key_id

    target, draft = tiny_dirs
    pair = specdec.load(str(target), draft=str(draft), dtype="float32", device="cpu", progress=False)
    kw = dict(model="tiny", prompt="Hello there, hello there", max_tokens=12, temperature=0)
    texts = {}
    for key in ("key-a", "key-b"):  # two apps over one pair (one engine, one cache), one key each
        app = create_app(pair, {"k": 3, "max_new_tokens": 12}, api_key=key, model_name="tiny")
        with serve_in_thread(app) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
            spec = {"drafter": "suffix", "suffix_match": 4}
            out = client.completions.create(**kw, extra_body={"speculative": spec})
            texts[key] = out.choices[0].text
            assert out.model_dump()["usage"]["speculative"]["drafter"] == "suffix"
            client.completions.create(**kw, extra_body={"speculative": {**spec, "suffix_cache": False}})
            with pytest.raises(openai.BadRequestError, match="suffix_match"):
                client.completions.create(**kw, extra_body={"speculative": {"drafter": "suffix", "suffix_match": 0}})
    plain = pair.generate(kw["prompt"], max_new_tokens=12, policy="ar")
    assert texts["key-a"] == texts["key-b"] == plain.text
    cache = pair.engine.caches.suffix
    a, b = (cache.requests(Caller.named(key_id(key))) for key in (b"key-a", b"key-b"))
    assert len(a) == len(b) == 1  # one request each: the opted-out ones were not kept
    assert cache.requests() == a + b and cache.requests(Caller.SHARED) == []
