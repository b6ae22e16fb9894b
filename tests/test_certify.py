"""What ``specdec tune`` may promise (specdec.bench.tune.certify): the one-sided recovery bound, the
budget a split can certify, the split size a budget needs, and the proxy's divergence figures."""

import math

import pytest

from specdec.bench.tune import certify
from specdec.bench.outputs.summary import bonett_price_ratio, paired_quality


def test_the_bound_is_bonett_price_one_sided():
    # one-sided 0.95 is the lower end of the two-sided 90% interval
    z90 = 1.6448536269514722
    assert certify.recovery_bound(50, 1, 3, 0.95) == pytest.approx(bonett_price_ratio(50, 1, 3, z90)[0])
    assert certify.recovery_bound(0, 2, 0) is None  # ar solved none: no ratio
    # more confidence, lower bound; at 0.5 the bound is the point estimate when nothing is discordant
    assert certify.recovery_bound(50, 1, 3, 0.99) < certify.recovery_bound(50, 1, 3, 0.95) < \
        certify.recovery_bound(50, 1, 3, 0.8)
    assert certify.recovery_bound(40, 0, 0, 0.5) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        certify.z_of(1.0)


@pytest.mark.parametrize("both, gained, lost, loss, ok", [
    (57, 0, 0, 0.02, False),   # HumanEval's half: 57 of 82 solved and no discordance certifies only ~0.024
    (57, 0, 0, 0.03, True),
    (114, 0, 0, 0.02, True),   # twice the problems, the same outcome: certified
    (114, 10, 8, 0.02, False),  # a gain on the point estimate, but 18 discordant problems
    (300, 0, 2, 0.02, True),
    (300, 0, 9, 0.02, False),  # recovery 0.971: the point estimate is already outside
])
def test_qualifies(both, gained, lost, loss, ok):
    paired = {"both": both, "gained": gained, "lost": lost, "n": both + gained + lost}
    assert certify.qualifies(paired, loss) is ok
    assert certify.qualifies(None, 0.5) is False and certify.qualifies({"n": 3}, 0.5) is False


def test_paired_figures_carry_both():
    p = paired_quality({"a": True, "b": True, "c": False, "d": True}, {"a": True, "b": False, "c": True, "d": True})
    assert (p["both"], p["gained"], p["lost"], p["n"]) == (2, 1, 1, 4)
    assert certify.counts(p) == (2, 1, 1)


def test_best_case_budget_shrinks_with_the_split():
    budgets = [certify.best_case_budget(s) for s in (10, 57, 114, 500)]
    assert budgets == sorted(budgets, reverse=True) and 0.02 < budgets[1] < 0.03 and budgets[-1] < 0.01
    assert certify.best_case_budget(0) is None


def test_problems_needed_is_the_smallest_split_that_certifies():
    need = certify.problems_needed(57, 0, 0, 82, 0.02)
    assert 82 < need < 164

    def ok(m):
        f = m / 82
        return certify.recovery_bound(57 * f, 0, 0) >= 0.98

    assert ok(need) and not ok(need - 1)
    assert certify.problems_needed(57, 0, 0, 82, 0.03) == 82  # already certified here
    more = certify.problems_needed(57, 1, 1, 82, 0.02)
    assert more > need  # discordance costs problems
    assert certify.problems_needed(50, 0, 5, 82, 0.02) is None  # recovery 0.91: no split size helps
    assert certify.problems_needed(0, 0, 0, 82, 0.02) is None


def test_a_setting_can_still_qualify_until_no_outcome_left_helps():
    # nothing left: the bound is the observed one
    assert certify.best_completion_bound(40, 1, 2, 0, 0) == pytest.approx(certify.recovery_bound(40, 1, 2))
    # problems left that ar solves count as solved in the best case
    assert certify.best_completion_bound(10, 0, 0, 30, 0) == pytest.approx(certify.recovery_bound(40, 0, 0))
    # problems left that ar fails: the best number of gains, every count tried
    best = max(certify.recovery_bound(40, g, 3) for g in range(6))
    assert certify.best_completion_bound(40, 0, 3, 0, 5) == pytest.approx(best)
    assert certify.best_completion_bound(0, 0, 0, 0, 4) is None  # ar solves none
    assert certify.can_still_qualify(0, 0, 0, 0, 4, 0.02)  # nothing to judge: keep going
    # 9 solved by ar, no problem left that ar fails: two losses cannot be recovered
    assert not certify.can_still_qualify(1, 0, 2, 6, 0, 0.1, 0.5)
    assert certify.can_still_qualify(1, 0, 1, 7, 0, 0.2, 0.5)
    # the same losses with ar-failed problems left: gains could still lift the bound
    assert certify.can_still_qualify(1, 0, 2, 6, 20, 0.1, 0.5)


@pytest.mark.parametrize("ids, ref, first", [
    ([1, 2, 3], [1, 2, 3], None),
    ([1, 2, 4], [1, 2, 3], 2),
    ([9, 2, 3], [1, 2, 3], 0),
    ([1, 2], [1, 2, 3], 2),  # stopped early: diverges where it ended
    ([], [], None),
])
def test_first_divergence(ids, ref, first):
    assert certify.first_divergence(ids, ref) == first


def test_divergence_over_records():
    def rec(config, sample, ids, repeat=0):
        return {"config": config, "sample_id": sample, "token_ids": ids, "repeat": repeat}

    records = [rec("ar", "a", [1, 2, 3, 4]), rec("x", "a", [1, 2, 3, 4]),
               rec("ar", "b", [1, 2, 3]), rec("x", "b", [1, 5, 3]),
               rec("ar", "c", [7, 7]), rec("x", "c", [8, 7]), rec("x", "c", [7, 7], repeat=1),
               rec("x", "d", [1])]  # no ar record: not counted
    d = certify.divergence(records, "x")
    assert d == {"n": 3, "diverged": 2 / 3, "first_divergence": 0.5, "tokens_before_divergence": (4 + 1 + 0) / 3}
    assert certify.divergence(records, "nobody") == {"n": 0, "diverged": None, "first_divergence": None,
                                                     "tokens_before_divergence": None}


def test_decode_speedup_is_the_steady_state():
    def rec(config, sample, tokens, seconds, prefill, ends=None, acc=None, repeat=0):
        stats = {"prefill_seconds": prefill}
        if ends is not None:
            stats.update(round_ends=ends, accepted_per_round=acc)
        return {"config": config, "sample_id": sample, "repeat": repeat, "new_tokens": tokens, "seconds": seconds,
                "stats": stats}

    # round_ends: the first round (the prefills, a lazy draft prefill included) is left out
    records = [rec("ar", "a", 4, 29.0, 25.0, [25.5, 26.0, 26.5, 27.0], [0, 0, 0, 0]),  # 3 tokens in 1.5 s
               rec("x", "a", 9, 30.0, 25.0, [28.0, 28.5, 29.0], [2, 2, 2]),  # 6 tokens in 1.0 s
               rec("x", "c", 9, 1.0, 0.0, [0.5, 0.7, 0.9], [2, 2, 2]),  # ar did not run c: not counted
               rec("x", "a", 9, 99.0, 0.0, [1.0, 90.0, 99.0], [2, 2, 2], repeat=1)]  # only the first repeat
    assert certify.decode_speedup(records, "x") == pytest.approx((6 / 1.0) / (3 / 1.5))
    # without round_ends (a peer): the time after the prefill
    records = [rec("ar", "a", 32, 29.0, 25.0), rec("x", "a", 32, 27.0, 25.0)]
    assert certify.decode_speedup(records, "x") == pytest.approx((32 / 2) / (32 / 4))
    assert certify.decode_speedup(records, "y") is None
    assert certify.proxy_speed({"speedup_vs_ar": 0.9, "decode_speedup_vs_ar": 1.4}) == 1.4
    assert certify.proxy_speed({"speedup_vs_ar": 0.9}) == 0.9 and certify.proxy_speed({}) == 0.0


def test_dominated_settings():
    def row(speed, agree, diverged):
        return {"speedup_vs_ar": speed, "agreement": {"token_agreement": agree}, "divergence": {"diverged": diverged}}

    rows = {"fast-loose": row(1.5, 0.8, 0.5), "slow-loose": row(1.2, 0.7, 0.6), "slow-strict": row(1.1, 1.0, 0.0),
            "twin": row(1.1, 1.0, 0.0)}
    assert certify.dominated(rows) == {"slow-loose"}  # equal rows do not beat each other


def test_hours():
    assert certify.hours(30) == "30 s" and certify.hours(600) == "10 min" and certify.hours(7200) == "2.0 h"
    assert certify.hours(None) == "unknown time" and certify.hours(math.inf) == "unknown time"
