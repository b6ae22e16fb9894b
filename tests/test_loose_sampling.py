"""The loose rules at T>0.

1. Relaxation switched off by a rule's own parameters = exact: seeded chi-square tests that the
   first three output tokens follow the target's joint law, on hand-made tables and through the
   engine, with the same test's power shown by switching the relaxation back on.
2. Table tests at T>0 through the policy: where MARS, typical acceptance and DropMatch relax, and
   where they must not (the draft has zero probability under temperature/top-k/top-p, or the
   rule's own criterion fails).
"""

import itertools
import math

import pytest
import torch
from scipy.stats import binomtest

from specdec.core.sampling import SamplingParams, probabilities
from tinymodels import ToyChain, chisquare_joint, engine_sample, per_rule, tiny_engine
from specdec.core.verify import Lossless, Round, Verdict, make_policy
from specdec.core.verify.dropmatch import js_accept

P_MIN = 1e-3  # a correct implementation fails a seeded test with this probability

#: Per rule, parameters under which it can never relax. The rule's other settings stay where it
#: would relax, so the named parameters alone switch it off:
OFF = {
    # z2 > theta * z1 (z1 > 0) with theta = 1: the runner-up's logit never exceeds the top one's
    "mars": {"theta": 1.0},
    # threshold min(epsilon, delta * exp(-H)) = 1, as exp(-H) >= 1/V > 1e-9: p(d) > 1 never holds
    "typical": {"epsilon": 1.0, "delta": 1e9},
    # no dropout: no path differs from the target (naive at T>0 would otherwise match sampled tokens)
    "dropmatch": {"p": 0.0, "paths": 16, "criterion": "naive"},
    # divergence 0 only between equal distributions, where the lossless rule keeps the draft anyway
    "fuzzy": {"threshold": 0.0},
    # the top-3 entropy is at most ln 3 = 1.0986 < 1.2, so the gate never opens; window 1 < K = 2
    # would otherwise let position 1's agreement flip position 0
    "fly": {"theta": 1.2, "window": 1},
}


def switched_off(policy: str) -> dict:
    """``OFF``'s parameters for every rule of ``policy``, prefixed by the rule (``mars_theta``)."""
    return per_rule(policy, OFF)


# ============================================================== 1. relaxation off = exact
ALL = "fly+dropmatch+fuzzy+mars+typical"  # every rule at once
CHAIN = ToyChain(99, offset=4.0)  # positive top logits: MARS's ratio is live
SAMPLING = SamplingParams(temperature=0.8, top_k=3)  # top-k leaves zero cells: drafts outside the support
OFF_CASES = [
    pytest.param("mars", switched_off("mars"), None, id="mars"),
    pytest.param("typical", switched_off("typical"), None, id="typical"),
    pytest.param("dropmatch", switched_off("dropmatch"), None, id="dropmatch"),
    pytest.param("fuzzy", switched_off("fuzzy"), None, id="fuzzy"),
    pytest.param("fuzzy", switched_off("fuzzy"), (2, 1), id="fuzzy-one-hot"),
    pytest.param("fly", switched_off("fly"), None, id="fly-gate"),
    # the other way to switch FLy off: a window as long as the block, gate wide open
    pytest.param("fly", {"theta": 0.0, "window": 2}, None, id="fly-window"),
    pytest.param("fly+mars", switched_off("fly+mars"), None, id="fly+mars"),
    pytest.param(ALL, switched_off(ALL), None, id="all"),
    pytest.param(ALL, switched_off(ALL), (2, 1), id="all-one-hot"),
]


@pytest.mark.slow
@pytest.mark.parametrize("policy, params, fixed", OFF_CASES)
def test_relaxation_off_reproduces_target_joint(policy, params, fixed):
    """K = 2 rounds on random tables (V = 4, temperature 0.8, top-k 3): with every rule of the policy
    switched off by its own parameters, no draft is relaxed and the first three output tokens follow
    the target's joint law exactly (as for the lossless rule, tests/test_distribution.py).
    ``fixed``: the drafts of a drafter without probabilities (one-hot q)."""
    n = 10_000
    counts, rejected, relaxed = CHAIN.sample(make_policy(policy, params), SAMPLING, n, seed=5, fixed=fixed)
    assert relaxed == 0
    assert rejected > n // 5  # the rules were consulted, often
    pvalue, outside = chisquare_joint(counts, CHAIN.joint(SAMPLING))
    assert pvalue > P_MIN and outside == 0


@pytest.mark.slow
@pytest.mark.parametrize("policy, params", [
    ("mars", {"theta": 0.0}), ("typical", {"delta": 0.0}), ("dropmatch", {"p": 0.5, "criterion": "naive"}),
    ("fly", {"theta": 0.0, "window": 1}), ("fuzzy", {"divergence": "tv", "threshold": 1.0}),
])
def test_relaxation_on_is_caught(policy, params):
    """The test above has power: the same tables fail it with the rule's relaxation on (here wide
    open: MARS takes any positive runner-up, typical any draft in the support)."""
    counts, _, relaxed = CHAIN.sample(make_policy(policy, params), SAMPLING, 5_000, seed=5)
    assert relaxed > 0
    assert chisquare_joint(counts, CHAIN.joint(SAMPLING))[0] < P_MIN


@pytest.mark.slow
def test_engine_with_every_rule_switched_off_matches_target_distribution():
    """Through the engine with tiny models (V = 4, K = 2, temperature 0.9, top-p 0.95; the dropout
    paths and the hidden-state plumbing included): all five rules, switched off, leave the target's
    joint law of the first three tokens intact; switched on, the same setup relaxes drafts. No exact
    prefix: the rules are consulted from the answer's first token."""
    engine, sampling, policy = tiny_engine(), SamplingParams(temperature=0.9, top_p=0.95), ALL
    counts, expected, accept_rate, relaxed = engine_sample(engine, 4000, sampling, policy=policy,
                                                           policy_params={**switched_off(policy), "exact_prefix": 0})
    assert relaxed == 0 and 0.2 < accept_rate < 0.95
    pvalue, outside = chisquare_joint(counts, expected)
    assert pvalue > P_MIN and outside == 0
    on = {"dropmatch_p": 0.5, "dropmatch_criterion": "naive", "fly_window": 1, "exact_prefix": 0}
    assert engine_sample(engine, 100, sampling, policy=policy, policy_params=on)[3] > 0


# ============================================================== 2. T>0 tables through the policy
SEEDS = 300


def one_draft(row, draft, params, q=None):
    """``(policy, seed) -> Verdict`` on a K = 1 round: the target's logits ``row`` at the draft, then a
    bonus row certain of token 0 at any temperature; ``q`` the draft's distribution (None: one-hot).
    The hidden state is the logits row and the LM head the identity (for DropMatch)."""
    logits = torch.tensor([row, [1e3] + [0.0] * (len(row) - 1)])
    probs = probabilities(logits, params)
    q_rows = None if q is None else torch.tensor([q])

    def verify(policy, seed):
        rnd = Round(logits, torch.tensor([draft]), q_rows, params, torch.Generator().manual_seed(seed),
                    target_probs=probs, target_hidden=logits, lm_head=lambda h: h)
        return policy.verify(rnd)

    verify.p_d = float(probs[0, draft])  # the draft's probability under the sampling settings
    return verify


def assert_rate(hits, trials, prob):
    """``hits`` of ``trials`` is consistent with probability ``prob`` (two-sided binomial test)."""
    assert binomtest(int(hits), int(trials), prob).pvalue > P_MIN, (hits, trials, prob)


MARS_CASES = [  # logits at the draft, draft, sampling, relaxes (default theta 0.9)
    pytest.param([10.0, 9.5, 0.0, 0.0], 1, dict(temperature=0.8), True, id="runner-up-in-margin"),
    pytest.param([10.0, 9.5, 0.0, 0.0], 1, dict(temperature=0.1), True, id="low-T-same-ratio"),
    pytest.param([10.0, 9.5, 0.0, 0.0], 1, dict(temperature=0.8, top_k=2), True, id="top-k-2-keeps-it"),
    pytest.param([10.0, 9.5, 0.0, 0.0], 1, dict(temperature=0.8, top_p=0.7), True, id="top-p-0.7-keeps-it"),
    pytest.param([10.0, 9.5, 0.0, 0.0], 1, dict(temperature=0.8, top_k=1), False, id="top-k-1-filters-it"),
    pytest.param([10.0, 9.5, 0.0, 0.0], 1, dict(temperature=0.8, top_p=0.5), False, id="top-p-0.5-filters-it"),
    pytest.param([10.0, 8.0, 0.0, 0.0], 1, dict(temperature=0.8), False, id="ratio-0.8-outside"),
    pytest.param([10.0, 9.5, 9.4, 0.0], 2, dict(temperature=0.8), False, id="top-3-draft"),
    pytest.param([-1.0, -1.05, -5.0, -5.0], 1, dict(temperature=0.8), False, id="negative-logits-guarded"),
]
TYPICAL_CASES = [  # threshold min(0.09, 0.3 exp(-H(p))) on the sampling distribution p
    pytest.param([2.0, 1.5, 0.0, 0.0], 2, dict(temperature=1.0), False, id="p-0.072-below"),
    pytest.param([2.0, 1.5, 0.0, 0.0], 2, dict(temperature=3.0), True, id="T-3-flattens-to-0.179"),
    pytest.param([2.0, 1.5, 0.0, 0.0], 2, dict(temperature=3.0, top_k=2), False, id="top-k-2-filters-it"),
    pytest.param([2.0, 1.5, 0.0, 0.0], 1, dict(temperature=0.5), True, id="runner-up-0.26"),
    pytest.param([3.0, 1.1, 0.85, 0.5], 2, dict(temperature=1.0), False, id="p-0.086-below"),
    pytest.param([3.0, 1.1, 0.85, 0.5], 2, dict(temperature=1.0, top_p=0.9), True, id="top-p-renormalizes-to-0.092"),
    pytest.param([2.0, 1.5, 1.2, 0.9], 2, dict(temperature=0.5), True, id="p-0.12-passes"),
    pytest.param([2.0, 1.5, 1.2, 0.9], 2, dict(temperature=0.5, top_p=0.8), False, id="top-p-0.8-filters-it"),
]


@pytest.mark.parametrize("rule, row, draft, sampling, relaxes", [
    *(pytest.param("mars", *c.values, id=f"mars-{c.id}") for c in MARS_CASES),
    *(pytest.param("typical", *c.values, id=f"typical-{c.id}") for c in TYPICAL_CASES),
])
def test_token_rule_table_at_t_above_zero(rule, row, draft, sampling, relaxes):
    """Seed for seed against the lossless rule on the same round (MARS and typical draw nothing):
    where the rule relaxes, the draft is always kept and the bonus (token 0) follows, and the
    relaxed counter is 1 exactly where the lossless rule rejected; where it must not, the verdict
    is the lossless verdict and the counter stays 0. A draft with zero probability under the
    sampling settings is never kept, and nothing emitted lies outside the sampling support."""
    verify, policy = one_draft(row, draft, SamplingParams(**sampling)), make_policy(rule)
    rejected = 0
    for seed in range(SEEDS):
        v, plain = verify(policy, seed), verify(Lossless(), seed)
        rejected += plain.accepted == 0
        if relaxes:
            assert (v.accepted, v.token, v.relaxed) == (1, 0, {rule: 1 - plain.accepted})
        else:
            assert (v.accepted, v.token, v.relaxed) == (plain.accepted, plain.token, {rule: 0})
    assert rejected > 0  # the rule was consulted
    assert_rate(SEEDS - rejected, SEEDS, verify.p_d)  # the lossless chance p(d) / q(d), q one-hot; 0 if filtered


MARGIN, FILTERED = [10.0, 9.5, 0.0, 0.0], [0.0, 9.6, 9.8, 10.0]  # draft 1: within MARS's margin; outside top-k 2


@pytest.mark.parametrize("first, second, accepted, relaxed", [
    (MARGIN, FILTERED, 1, (0, 1)),  # kept (by either rule), then stopped at the filtered draft
    (FILTERED, MARGIN, 0, (0,)),  # stopped at once; the relaxation behind it is neither kept nor counted
])
def test_mars_block_stops_at_a_filtered_draft(first, second, accepted, relaxed):
    """K = 2, both drafts token 1, temperature 0.8, top-k 2. At the filtered position token 1 is the
    target's third (zero probability under top-k 2, though z2 / z1 > 0.9 there too): it is never
    kept, and the next token is one top-k 2 allows there. Exact accepted counts over 50 seeds."""
    logits = torch.tensor([first, second, [1e3, 0.0, 0.0, 0.0]])
    params = SamplingParams(temperature=0.8, top_k=2)
    probs = probabilities(logits, params)
    for seed in range(50):
        rnd = Round(logits, torch.tensor([1, 1]), None, params, torch.Generator().manual_seed(seed),
                    target_probs=probs)
        v = make_policy("mars").verify(rnd)
        assert v.accepted == accepted and probs[accepted, v.token] > 0 and v.relaxed["mars"] in relaxed


# ------------------------------------------------------------------------ DropMatch
# K = 1, identity LM head (the hidden state is the logits row), draft 1 (the runner-up) drawn
# from q, p = 0.3, 4 paths (an even count: a 2-2 tie is no majority).
DM_DRAFT, DM_Q, DM_PARAMS = 1, [0.2, 0.7, 0.1], {"p": 0.3, "paths": 4}
DM_CASES = [  # criterion, hidden state, temperature; chosen so that the temperature matters
    pytest.param("naive", [4.0, 3.0, 0.0], 0.4, id="naive"),  # chance 0.689 (0.798 if the paths ignored T)
    pytest.param("majority", [4.0, 3.0, 0.0], 0.4, id="majority"),  # 0.053 (0.108)
    pytest.param("js", [3.0, 2.5, 2.0], 2.5, id="js"),  # 0.182 (0.665)
]


def dropout_masks(units: int, p: float):
    """Every keep-mask over ``units`` hidden units ``[2^units, units]`` and its probability."""
    masks = torch.tensor(list(itertools.product([0.0, 1.0], repeat=units)))
    kept = masks.sum(-1)
    return masks, (1 - p) ** kept * p ** (units - kept)


def dropmatch_chance(criterion: str, h, draft, q, p: float, paths: int, temperature: float) -> float:
    """P(the criterion accepts ``draft``), exactly, by enumerating the dropout masks (identity head).

    naive / majority: each path independently samples ``draft`` with chance ``a`` (over its mask and
    its draw from ``softmax(z / T)``), so naive = 1 - (1 - a)^N and majority = P(Binomial(N, a) > N/2).
    js: enumerates the masks of all N paths jointly."""
    h = torch.tensor(h)
    masks, weights = dropout_masks(len(h), p)
    logits = h * masks / (1 - p)  # [2^H, V]: one path's logits per mask
    if criterion == "js":
        combos = torch.tensor(list(itertools.product(range(len(masks)), repeat=paths)))  # [C, N]
        ok = js_accept(logits[combos].transpose(0, 1), torch.tensor(q).expand(len(combos), -1), temperature)
        return float((weights[combos].prod(-1) * ok).sum())
    a = float((weights * torch.softmax(logits / temperature, -1)[:, draft]).sum())
    if criterion == "naive":
        return 1 - (1 - a) ** paths
    return sum(math.comb(paths, v) * a**v * (1 - a) ** (paths - v) for v in range(paths + 1) if 2 * v > paths)


@pytest.mark.parametrize("criterion, row, temperature", DM_CASES)
def test_dropmatch_relaxes_at_t_above_zero_with_the_computed_chance(criterion, row, temperature):
    """Its decision is random (dropout masks, and the paths' sampled tokens for naive/majority):
    over seeds, the lossless rule's acceptances are kept, and among its rejections DropMatch accepts
    at the chance computed by enumerating the masks, at the request's temperature."""
    verify = one_draft(row, DM_DRAFT, SamplingParams(temperature=temperature), DM_Q)
    policy = make_policy("dropmatch", {**DM_PARAMS, "criterion": criterion})
    rejected = relaxed = 0
    for seed in range(1500):
        v, plain = verify(policy, seed), verify(Lossless(), seed)
        assert v.accepted >= plain.accepted and v.relaxed == {"dropmatch": v.accepted - plain.accepted}
        assert v.token == 0 if v.accepted else v.token != DM_DRAFT  # bonus, or a residual draw
        rejected += plain.accepted == 0
        relaxed += v.accepted - plain.accepted
    assert_rate(relaxed, rejected, dropmatch_chance(criterion, row, DM_DRAFT, DM_Q, temperature=temperature,
                                                    **DM_PARAMS))


@pytest.mark.parametrize("criterion", ["naive", "js", "majority", "paper"])
@pytest.mark.parametrize("sampling", [dict(top_k=1), dict(top_p=0.6)], ids=["top-k-1", "top-p-0.6"])
def test_dropmatch_never_keeps_a_draft_the_sampling_settings_exclude(criterion, sampling):
    """Heavy dropout (p 0.5, 16 paths) on a near tie, but top-k 1 or top-p 0.6 (the top token has
    0.617 at temperature 0.7) leave only token 0: the runner-up draft is never kept, nothing is
    counted, token 0 follows."""
    verify = one_draft([2.0, 1.6, 0.0], DM_DRAFT, SamplingParams(temperature=0.7, **sampling), DM_Q)
    policy = make_policy("dropmatch", {"p": 0.5, "paths": 16, "criterion": criterion})
    for seed in range(100):
        assert verify(policy, seed) == Verdict(0, 0, {"dropmatch": 0})
