"""Fuzzy Speculative Decoding (``policy="fuzzy"``): table tests with hand-made logits for each
divergence, accepting just inside the threshold and rejecting just outside it, at T=0 and T>0, with
model drafts and point-mass drafts; its parameters' errors; its composition with FLy's window."""

import math

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.core.sampling import SamplingParams, probabilities
from specdec.core.verify import Lossless, Round, make_policy
from specdec.core.verify.divergence import js_divergence, kl_divergence, tv_distance
from specdec.core.verify.fuzzy import fuzzy_accept

EPS = 1e-6  # well above float32 rounding (~1e-7 here)
LN = math.log

# The target p = (0.6, 0.4, 0) and a draft model's q = (0.4, 0.6, 0) at the draft's position; the draft
# is token 1 (the target's runner-up: the lossless rule rejects it at T=0). By hand, in nats:
P, Q = (0.6, 0.4, 0.0), (0.4, 0.6, 0.0)
BY_HAND = {
    "js": 0.6 * LN(0.6 / 0.5) + 0.4 * LN(0.4 / 0.5),  # m = (0.5, 0.5): KL(p||m) = KL(q||m), by symmetry
    "kl": 0.6 * LN(0.6 / 0.4) + 0.4 * LN(0.4 / 0.6),  # = 0.2 ln 1.5
    "tv": 0.5 * (0.2 + 0.2),
}
# The same target against a point mass at token 1 (prompt lookup: no distribution), p = (0.6, 0.3, 0.1):
P3 = (0.6, 0.3, 0.1)
M3 = (0.3, 0.65, 0.05)  # (p + point mass) / 2
POINT_BY_HAND = {
    "js": 0.5 * (0.6 * LN(0.6 / 0.3) + 0.3 * LN(0.3 / 0.65) + 0.1 * LN(0.1 / 0.05)) + 0.5 * LN(1 / 0.65),
    "kl": math.inf,  # the point mass is 0 where p is not
    "tv": 1 - 0.3,  # 1 - p(d)
}


def log(probs):
    return [LN(x) if x > 0 else float("-inf") for x in probs]


def greedy_round(target, draft_dist=None, draft=1):
    """K = 1 at T=0: the target's logits ``log p``, then a bonus row certain of token 0; the draft's
    logits ``log q`` (None: a drafter without a model, a point mass)."""
    logits = torch.tensor([log(target), [1e3] + [0.0] * (len(target) - 1)])
    q = None if draft_dist is None else torch.tensor([log(draft_dist)])
    return Round(logits, torch.tensor([draft]), None, SamplingParams(), None, draft_logits=q)


def test_the_divergences_by_hand():
    p, q = torch.tensor(P), torch.tensor(Q)
    assert float(js_divergence(p, q)) == pytest.approx(BY_HAND["js"], abs=1e-7)
    assert float(kl_divergence(p, q)) == pytest.approx(BY_HAND["kl"], abs=1e-7)
    assert float(tv_distance(p, q)) == pytest.approx(BY_HAND["tv"], abs=1e-7)
    assert float(js_divergence(p, p)) == 0 == float(kl_divergence(p, p)) == float(tv_distance(p, p))
    one = torch.tensor([1.0, 0.0, 0.0])
    assert float(js_divergence(one, torch.tensor([0.0, 1.0, 0.0]))) == pytest.approx(math.log(2))  # its largest


@pytest.mark.parametrize("divergence", ["js", "kl", "tv"])
@pytest.mark.parametrize("draft_dist, by_hand", [(Q, BY_HAND), (None, POINT_BY_HAND)], ids=["model", "point-mass"])
def test_accepts_inside_the_threshold_and_rejects_outside_at_t0(divergence, draft_dist, by_hand):
    """A mismatch (the lossless rule rejects it) is kept exactly when the divergence is at most the
    threshold: just above it, kept and counted; just below it, the lossless verdict (the argmax, 0)."""
    target = P if draft_dist is not None else P3
    value = by_hand[divergence]
    rnd = greedy_round(target, draft_dist)
    assert Lossless().verify(rnd).accepted == 0
    if math.isinf(value):  # KL against a point mass: never, even at a huge threshold
        assert make_policy("fuzzy", {"divergence": divergence, "threshold": 1e6}).verify(rnd).accepted == 0
        return
    inside = make_policy("fuzzy", {"divergence": divergence, "threshold": value + EPS}).verify(rnd)
    outside = make_policy("fuzzy", {"divergence": divergence, "threshold": value - EPS}).verify(rnd)
    assert (inside.accepted, inside.token, inside.relaxed) == (1, 0, {"fuzzy": 1})
    assert (outside.accepted, outside.token, outside.relaxed) == (0, 0, {"fuzzy": 0})


def test_the_pure_function_on_rows():
    p = torch.tensor([P, P, [1.0, 0.0, 0.0]])
    q = torch.tensor([Q, P, [0.0, 1.0, 0.0]])
    assert fuzzy_accept(p, q, "tv", 0.2 + EPS).tolist() == [True, True, False]
    assert fuzzy_accept(p, q, "tv", 1.0).tolist() == [True, True, True]
    assert fuzzy_accept(p, q, "js", 0.0).tolist() == [False, True, False]  # 0: only identical distributions


SEEDS = 200


@pytest.mark.parametrize("divergence", ["js", "kl", "tv"])
@pytest.mark.parametrize("sampling, kept", [
    (dict(temperature=1.0), True),
    (dict(temperature=1.0, top_k=1), False),  # token 1 is outside the target's top-1: never kept
], ids=["T1", "T1-top-k-1"])
def test_at_t_above_zero_seed_for_seed(divergence, sampling, kept):
    """T=1, the draft drawn from q: where the divergence is within the threshold the draft is always
    kept (counted only where the lossless rule, on the same seed, rejected it); just outside the
    threshold, or outside the sampling support, the verdict is the lossless one."""
    params = SamplingParams(**sampling)
    logits = torch.tensor([log(P), [1e3, 0.0, 0.0]])
    probs = probabilities(logits, params)
    value = BY_HAND[divergence]

    def verify(policy, seed):
        rnd = Round(logits, torch.tensor([1]), torch.tensor([Q]), params, torch.Generator().manual_seed(seed),
                    target_probs=probs)
        return policy.verify(rnd)

    inside = make_policy("fuzzy", {"divergence": divergence, "threshold": value + EPS})
    outside = make_policy("fuzzy", {"divergence": divergence, "threshold": value - EPS})
    rejected = 0
    for seed in range(SEEDS):
        plain = verify(Lossless(), seed)
        rejected += plain.accepted == 0
        v = verify(inside, seed)
        if kept:
            assert (v.accepted, v.token, v.relaxed) == (1, 0, {"fuzzy": 1 - plain.accepted})
        else:
            assert (v.accepted, v.token, v.relaxed) == (plain.accepted, plain.token, {"fuzzy": 0})
        assert (verify(outside, seed).accepted, verify(outside, seed).token) == (plain.accepted, plain.token)
    assert rejected > 0  # the rule was consulted


@pytest.mark.parametrize("params, message", [
    ({"divergence": "hellinger"}, "fuzzy divergence must be one of js, kl, tv, got 'hellinger'"),
    ({"threshold": -0.1}, "fuzzy threshold must be a number >= 0.0, got -0.1"),
    ({"threshold": 0.7}, r"fuzzy threshold must be a number in \[0, 0.6931\] for divergence js"),
    ({"divergence": "tv", "threshold": 1.5}, r"fuzzy threshold must be a number in \[0, 1.0000\] for divergence tv"),
    ({"threshold": "low"}, "fuzzy threshold must be a number, got 'low'"),
])
def test_bad_values_are_one_line_errors_naming_the_field(params, message):
    with pytest.raises(SpecdecError, match=message) as err:
        make_policy("fuzzy", params)
    assert "\n" not in str(err.value)


def test_kl_takes_any_threshold_and_tune_sweeps_the_threshold():
    assert make_policy("fuzzy", {"divergence": "kl", "threshold": 12.0}).params["fuzzy_threshold"] == 12.0
    assert make_policy("fuzzy", {"divergence": "tv", "threshold": 1.0}).params["fuzzy_divergence"] == "tv"


def test_composes_with_fly_window():
    """fly+fuzzy: a fuzzy acceptance counts as agreement inside FLy's window. A block of 8 where
    draft 0 is an uncertain mismatch (FLy's gate open) and draft 2 a mismatch fuzzy accepts (TV
    against a point mass 0.45 <= 0.5); the rest exact matches."""
    k, rows = 8, []
    for i in range(k + 1):
        row = [0.0] * 4
        if i == 0:
            row = [2.0, 1.9, 0.0, 0.0]  # top-3 entropy high: the gate opens; draft 1 is the runner-up
        elif i == 2:
            row = log([0.55, 0.45, 0.0, 0.0])  # draft 1 has p 0.45: TV to its point mass 0.55
        else:
            row[0] = 20.0
        rows.append(row)
    drafts = torch.tensor([1, 0, 1, 0, 0, 0, 0, 0])
    rnd = Round(torch.tensor(rows), drafts, None, SamplingParams(), None)
    assert make_policy("fly", {"window": 3}).verify(rnd).accepted == 0  # draft 2's mismatch blocks the window
    v = make_policy("fly+fuzzy", {"window": 3, "divergence": "tv", "threshold": 0.55 + EPS}).verify(rnd)
    assert v.accepted == 8 and v.relaxed == {"fuzzy": 1, "fly": 1}
