"""A loose policy's relaxation schedule (``exact_prefix``, ``relax_ramp``; specdec.core.verify.schedule):
the answer's first N tokens are judged by the lossless rule alone.

1. Tables: the chance eta(t) per position; chain and tree rounds that straddle the prefix's end.
2. Through the engine on tiny models: greedy, a loose rule with ``exact_prefix=N`` writes exactly
   plain decoding's first N tokens where it would otherwise relax the first, and relaxes after them;
   at T>0 the prefix follows the target's law (seeded chi-square), with the test's power shown.
3. One declaration: the CLI flag, request field, config file, tune grid and vLLM keys; bad values
   are one-line errors naming the field.
"""

import json

import pytest
import torch
from scipy.stats import binomtest

from specdec.errors import SpecdecError
from specdec.core.sampling import SamplingParams
from specdec.core.verify import Round, make_policy
from specdec.core.verify.schedule import Schedule, relax_chance
from specdec.core.verify.tree import TreeRound
from tinymodels import byte_tokenizer, chisquare_joint, engine_sample, perturbed_copy, tiny_engine, tiny_model

P_MIN = 1e-3  # a correct implementation fails a seeded test with this probability


# ============================================================================ 1. tables
@pytest.mark.parametrize("n, ramp, expected", [
    (2, 0, [0, 0, 1, 1, 1, 1]),
    (0, 0, [1, 1, 1, 1, 1, 1]),
    (2, 3, [0, 0, 0.25, 0.5, 0.75, 1]),  # the ramp's 3 tokens strictly between 0 and 1
    (0, 1, [0.5, 1, 1, 1, 1, 1]),
    (9, 0, [0, 0, 0, 0, 0, 0]),
])
def test_relax_chance_per_position(n, ramp, expected):
    assert relax_chance(torch.arange(6), n, ramp).tolist() == pytest.approx(expected)


MARGIN = [5.0, 4.9, 0.0, 0.0]  # draft 1 is MARS's runner-up within its margin: relaxed when allowed


def mars_chain(position, k=4):
    """K drafts, each token 1 where the target's argmax is 0 (every one a MARS relaxation)."""
    logits = torch.tensor([MARGIN] * k + [[1.0, 0.0, 0.0, 0.0]])
    return Round(logits, torch.ones(k, dtype=torch.long), None, SamplingParams(), None, position=position)


@pytest.mark.parametrize("position, exact_prefix, accepted", [
    (0, 2, 0),  # draft 0 is the answer's first token: lossless alone rejects it, the round stops there
    (1, 2, 0),  # draft 0 is its second: still inside the prefix
    (2, 2, 4),  # every draft past the prefix: all relaxed
    (0, 0, 4),  # no prefix
    (5, 9, 0),
    (None, 9, 4),  # a round that does not know where it sits: no schedule
])
def test_a_chain_round_relaxes_only_past_the_prefix(position, exact_prefix, accepted):
    v = make_policy("mars", {"exact_prefix": exact_prefix}).verify(mars_chain(position))
    assert (v.accepted, v.token, v.relaxed) == (accepted, 0, {"mars": accepted})


def test_a_round_straddling_the_prefix_keeps_its_exact_part_exact():
    """Drafts 0-1 inside the prefix match the target exactly, drafts 2-3 after it are relaxations."""
    logits = torch.tensor([[0.0, 9.0, 0.0, 0.0]] * 2 + [MARGIN] * 2 + [[1.0, 0.0, 0.0, 0.0]])
    rnd = Round(logits, torch.ones(4, dtype=torch.long), None, SamplingParams(), None, position=0)
    assert make_policy("mars", {"exact_prefix": 2}).verify(rnd).relaxed == {"mars": 2}
    assert make_policy("mars", {"exact_prefix": 3}).verify(rnd).accepted == 2  # draft 2 is now exact: rejected


def test_a_tree_round_judges_each_node_by_its_depth():
    """A chain of three nodes (depths 0-2) where each is MARS's runner-up; with the root at answer
    position 1 and exact_prefix 3, only the deepest node (position 3) may be relaxed: the walk stops
    at once. At position 2 the nodes sit at 2, 3, 4: the first is exact, so again nothing; at 3, all."""
    logits = torch.tensor([MARGIN] * 3 + [[1.0, 0.0, 0.0, 0.0]])

    def verdict(position):
        rnd = TreeRound(logits, torch.ones(3, dtype=torch.long), [-1, 0, 1], SamplingParams(), None,
                        position=position)
        assert rnd.node_positions().tolist() == [position, position + 1, position + 2]
        return make_policy("mars", {"exact_prefix": 3}).verify_tree(rnd)

    assert verdict(1).accepted == 0 and verdict(2).accepted == 0
    v = verdict(3)
    assert (v.accepted, v.path, v.relaxed) == (3, (0, 1, 2), {"mars": 3})


def test_the_ramp_draws_each_position_at_its_chance():
    """exact_prefix 2, relax_ramp 3: positions 0-1 never, 2-4 at 1/4, 2/4, 3/4, then always (seeded
    binomial tests over 2000 rounds of one generator)."""
    schedule, gen = Schedule(exact_prefix=2, relax_ramp=3), torch.Generator().manual_seed(7)
    hits = torch.zeros(7)
    rounds = 2000
    for _ in range(rounds):
        hits += schedule.relaxable(torch.arange(7), gen).float()
    assert hits[:2].tolist() == [0, 0] and hits[5:].tolist() == [rounds, rounds]
    for t, chance in zip((2, 3, 4), (0.25, 0.5, 0.75)):
        assert binomtest(int(hits[t]), rounds, chance).pvalue > P_MIN, (t, hits[t])
    assert Schedule().relaxable(None, gen) is None  # positions unknown: no schedule


# ============================================================================ 2. the engine
@pytest.fixture(scope="module")
def pair():
    from specdec.frontends.api import Pair
    from specdec.models.backends.transformers.model import HFModel as CausalLM

    target = tiny_model(11)
    return Pair(CausalLM(target), byte_tokenizer(), CausalLM(perturbed_copy(target, 0.2, 12)))


PROMPT = "xyz"  # on this pair every policy below relaxes the answer's first token when let
LOOSE = [
    pytest.param("typical", {}, id="typical"),
    pytest.param("fuzzy", {"divergence": "tv", "threshold": 1.0}, id="fuzzy"),
    pytest.param("fly", {"theta": 0.0, "window": 1}, id="fly"),
    pytest.param("fly+fuzzy", {"fly_theta": 0.0, "window": 1, "threshold": 0.3}, id="fly+fuzzy"),
]


@pytest.mark.parametrize("policy, params", LOOSE)
@pytest.mark.parametrize("drafter", ["model", "tree", "lookahead"])
def test_greedy_exact_prefix_writes_plain_decodings_first_tokens(pair, policy, params, drafter):
    """Greedy, K = 4: with no prefix the rule changes the answer's first token; with exact_prefix N
    the first N tokens are plain decoding's, and the rule still relaxes after them."""
    kw = dict(chat=False, drafter=drafter, k=4, max_new_tokens=24)
    plain = pair.generate(PROMPT, policy="ar", max_new_tokens=24, chat=False).token_ids
    free = pair.generate(PROMPT, policy=policy, exact_prefix=0, **kw, **params)
    assert free.token_ids[0] != plain[0] and sum(free.stats.relaxed.values()) > 0
    for n in (2, 3):
        out = pair.generate(PROMPT, policy=policy, exact_prefix=n, **kw, **params)
        assert out.token_ids[:n] == plain[:n], n
        assert out.token_ids != plain and sum(out.stats.relaxed.values()) > 0, n
        assert out.stats.params["exact_prefix"] == n


def test_greedy_ramp_keeps_the_prefix_and_repeats_with_a_seed(pair):
    kw = dict(chat=False, drafter="model", k=4, max_new_tokens=24, policy="typical", exact_prefix=2, relax_ramp=4)
    plain = pair.generate(PROMPT, policy="ar", max_new_tokens=24, chat=False).token_ids
    a, b = pair.generate(PROMPT, seed=1, **kw), pair.generate(PROMPT, seed=1, **kw)
    assert a.token_ids[:2] == plain[:2] and a.token_ids == b.token_ids


@pytest.mark.slow
def test_exact_prefix_at_t_above_zero_follows_the_target_law():
    """Tiny models (V = 4, K = 2, temperature 0.9, top-p 0.95) and a rule wide open (fuzzy, total
    variation, threshold 1: every draft in the support is kept): with exact_prefix 3 the first three
    tokens follow the target's joint law exactly; with exact_prefix 1 the first does while later ones
    are relaxed. Without the prefix the same test catches the relaxation of the first (its power)."""
    engine, sampling = tiny_engine(), SamplingParams(temperature=0.9, top_p=0.95)

    def sample(n, exact_prefix):
        params = {"fuzzy_divergence": "tv", "fuzzy_threshold": 1.0, "exact_prefix": exact_prefix}
        return engine_sample(engine, n, sampling, policy="fuzzy", policy_params=params)

    counts, expected, accept_rate, relaxed = sample(3000, 3)
    assert relaxed == 0 and 0.2 < accept_rate < 0.95
    pvalue, outside = chisquare_joint(counts, expected)
    assert pvalue > P_MIN and outside == 0

    one, expected, _, relaxed = sample(3000, 1)
    assert relaxed > 0  # the second and third tokens may be relaxed
    pvalue, outside = chisquare_joint(one.sum(dim=(1, 2)), expected.sum(dim=(1, 2)))  # the first token's law
    assert pvalue > P_MIN and outside == 0

    free, expected, _, relaxed = sample(1000, 0)
    assert relaxed > 0 and chisquare_joint(free.sum(dim=(1, 2)), expected.sum(dim=(1, 2)))[0] < P_MIN


# ============================================================================ 3. one declaration
@pytest.mark.parametrize("options, message", [
    ({"exact_prefix": -1}, "exact_prefix must be an integer >= 0, got -1"),
    ({"exact_prefix": 1.5}, "exact_prefix must be an integer >= 0, got 1.5"),
    ({"exact_prefix": "two"}, "exact_prefix must be an integer >= 0, got 'two'"),
    ({"relax_ramp": -3}, "relax_ramp must be an integer >= 0, got -3"),
    ({"exact_prefx": 2}, "unknown option 'exact_prefx'; did you mean 'exact_prefix'?"),
])
def test_bad_values_are_one_line_errors_naming_the_field(options, message):
    from specdec.frontends.api import make_config

    with pytest.raises(SpecdecError) as err:
        make_config(policy="mars", **options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_exact_policies_take_no_schedule():
    from specdec.frontends.api import make_config

    with pytest.raises(SpecdecError, match=r"policy 'lossless' takes no parameters, got \['exact_prefix'\]"):
        make_config(policy="lossless", exact_prefix=2)


def test_flag_request_field_config_file_tune_grid_and_vllm_keys(tmp_path):
    from specdec.frontends.api import make_config
    from specdec.bench.tune import grid
    from specdec.cli import build_parser
    from specdec.frontends.cliargs import decode_config
    from specdec.core.configfile import read_config
    from specdec.frontends.vllm import _split_policy_params, engine_config, request_args
    from specdec.frontends.vllm.config import request_selection, selection

    parser = build_parser()
    for command in ("generate", "serve"):
        assert any(a.dest == "exact_prefix" for a in parser._subparsers._group_actions[0].choices[command]._actions), command
    flags = decode_config(parser.parse_args(["generate", "x", "--draft", "none", "--policy", "fly+mars",
                                             "--exact-prefix", "5", "--relax-ramp", "2"]))
    assert (flags.parsed.schedule.exact_prefix, flags.parsed.schedule.relax_ramp) == (5, 2)
    assert make_config(policy="typical").parsed.schedule == Schedule(exact_prefix=2, relax_ramp=0)  # the default

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"format": "specdec-config/1", "decode": {"policy": "mars", "exact_prefix": 0}}))
    assert read_config(path) == {"policy": "mars", "exact_prefix": 0}
    path.write_text(json.dumps({"format": "specdec-config/1", "decode": {"policy": "mars", "exact_prefix": -2}}))
    with pytest.raises(SpecdecError, match="config.json: exact_prefix must be an integer >= 0"):
        read_config(path)

    assert grid.grid_axes("mars", ["exact_prefix=0,2,8"]) == {"mars_theta": [0.8, 0.9, 0.95], "exact_prefix": [0, 2, 8]}
    assert grid.grid_axes("fuzzy", None) == {"fuzzy_threshold": [0.05, 0.1, 0.2]}
    with pytest.raises(SpecdecError, match="is not a parameter of policy 'lossless'"):
        grid.grid_axes("lossless", ["exact_prefix=0"])

    assert engine_config("mars", {"exact_prefix": 4}) == {"specdec": {"policy": "mars", "exact_prefix": 4}}
    args = request_args("fly+mars", exact_prefix=0)
    assert request_selection(args, None).parsed().schedule.exact_prefix == 0
    assert request_selection({"specdec_theta": 0.8}, selection("mars", {"exact_prefix": 6})).parsed().schedule \
        == Schedule(exact_prefix=6)
    with pytest.raises(SpecdecError, match="exact_prefix must be an integer >= 0"):
        request_args("mars", exact_prefix=-1)
    kwargs = {"exact_prefix": 1, "max_model_len": 64}
    assert _split_policy_params("mars", kwargs) == {"exact_prefix": 1} and kwargs == {"max_model_len": 64}


def test_vllm_rounds_know_where_each_request_stands():
    """The adapter hands each request's output length so far to its round (vLLM's own sampler state,
    :func:`specdec.frontends.vllm.patch._positions`)."""
    from types import SimpleNamespace

    from specdec.frontends.vllm.patch import _positions
    from specdec.frontends.vllm.ragged import RaggedBatch

    runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=["a", "b", "c"]),
                             requests={"a": SimpleNamespace(output_token_ids=[5, 6, 7]),
                                       "b": SimpleNamespace(output_token_ids=[]), "c": SimpleNamespace()})
    assert _positions(runner) == [3, 0, 0]  # a state that does not say counts as the answer's start
    batch = RaggedBatch(draft_token_ids=torch.tensor([1, 1, 1]), num_draft_tokens=[2, 1],
                        target_logits=torch.tensor([MARGIN] * 3), bonus_token_ids=torch.tensor([0, 0]),
                        params=[SamplingParams()] * 2, positions=[3, 0])
    assert (batch.round(0).position, batch.round(1).position) == (3, 0)
    policy = make_policy("mars")  # exact_prefix 2: request 0 is past it, request 1 at the answer's start
    assert batch.round(0).positions().tolist() == [3, 4]
    assert policy.verify(batch.round(0)).accepted == 2 and policy.verify(batch.round(1)).accepted == 0
