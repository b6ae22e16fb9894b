"""The portfolio drafter (``drafter="auto"``, the default): greedy output is plain decoding's for
every mix of sources, sampled output keeps the target's distribution, the chooser prices copies by
their run at the measured pass costs (a copy where a wide pass is cheap, a plain step where it is
not), the replay redoes the engine's rounds and sources, and the portfolio's oracle bounds them."""

from __future__ import annotations

import pytest

from specdec.core.acceptance import RunRates, copy_situation
from specdec.core.autok import PortfolioK
from specdec.core.caller import Caller
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.models.costmodel import CostTable
from specdec.core.drafters import AutoDrafter, Offer, SuffixCache
from specdec.core.engine import DecodeConfig, Engine
from specdec.errors import SpecdecError
from specdec.traces.replay import Clock, copy_offers, oracle, replay
from specdec.core.rounds import RoundRecord
from specdec.traces.trace import trace_answer
from tinymodels import perturbed_copy, tiny_model

WIDTHS = list(range(1, 18)) + [24, 32]


def cheap_wide(step=0.100, per_token=0.004) -> CostTable:
    """A target whose wide passes cost little more than one token (16-bit weights, native bf16)."""
    return CostTable("t", "bf16", WIDTHS, [step + per_token * (w - 1) for w in WIDTHS], context=32,
                     prefill_seconds=0.3)


def dear_wide(step=0.040) -> CostTable:
    """A target whose every extra token costs most of a step (4-bit weights on a small CPU)."""
    return CostTable("t", "q4", WIDTHS, [step * (1 + 0.6 * (w - 1)) for w in WIDTHS], context=32,
                     prefill_seconds=0.45)


def draft_table(step=0.015) -> CostTable:
    return CostTable("d", "q4", [1, 2, 4, 8, 16, 32], [step, 1.6 * step, 2.5 * step, 4 * step, 6 * step, 11 * step],
                     context=32, prefill_seconds=0.12)


@pytest.fixture(scope="module")
def models():
    target = tiny_model(7)
    return CausalLM(target), CausalLM(perturbed_copy(target, 0.05, 17))


REPEATS = [3 + i % 9 for i in range(60)]  # text that repeats: the copy sources hit
NOVEL = [3 + (i * 37) % 90 for i in range(40)]


@pytest.mark.parametrize("with_model", [True, False])
@pytest.mark.parametrize("table", ["cheap", "dear", None])
@pytest.mark.parametrize("k", ["auto", 3])
def test_greedy_output_is_plain_decoding_s_for_every_mix_of_sources(models, with_model, table, k):
    target, draft = models
    costs = {"cheap": cheap_wide(), "dear": dear_wide(), None: None}[table]
    engine = Engine(target, draft if with_model else None, eos_ids=[], target_costs=costs,
                    draft_costs=draft_table() if with_model and costs is not None else None)
    for prompt in (REPEATS, NOVEL):
        plain = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=40)).token_ids
        out = engine.generate(prompt, DecodeConfig(drafter="auto", k=k, max_new_tokens=40))
        assert out.token_ids == plain
        assert set(out.stats.sources) <= {"model", "pld", "suffix"}
        assert sum(n for n, _, _ in out.stats.sources.values()) == sum(1 for d in out.stats.k_chosen if d) \
            if k == "auto" else True


def test_the_default_drafter_is_the_portfolio():
    assert DecodeConfig().drafter == "auto"
    assert DecodeConfig().drafter_type is AutoDrafter


def test_a_bad_drafter_is_a_one_line_error():
    with pytest.raises(SpecdecError, match="unknown drafter 'autoo'"):
        DecodeConfig(drafter="autoo")


def test_copies_are_drafted_where_a_wide_pass_is_cheap_and_less_where_it_is_dear(models):
    target, _ = models
    cheap, dear = (Engine(target, None, eos_ids=[], target_costs=table).generate(REPEATS, DecodeConfig(max_new_tokens=40))
                   for table in (cheap_wide(), dear_wide()))
    assert cheap.stats.sources.get("pld", [0])[0] + cheap.stats.sources.get("suffix", [0])[0] > 0
    assert dear.stats.drafted < cheap.stats.drafted


# ------------------------------------------------------------------------ the chooser, on tables
def offer(run: int, n: int = 16, source: str = "pld") -> Offer:
    return Offer(source, tuple(range(100, 100 + n)), run)


def test_a_long_copy_is_proposed_where_a_wide_pass_is_cheap():
    policy = PortfolioK(cheap_wide(), has_model=False)
    policy.begin(256)
    k = policy.plan(0, 200, 0, [offer(run=40)]).k
    assert policy.chosen.source == "pld" and k >= 8


def test_where_a_wide_pass_is_dear_only_a_long_run_is_drafted():
    policy = PortfolioK(dear_wide(), has_model=False)
    policy.begin(256)
    assert policy.plan(0, 200, 0, [offer(run=1)]).k == 0 and policy.chosen.source is None
    assert policy.plan(0, 200, 0, []).k == 0  # nothing offered: a plain step
    rates = policy.rates[("pld", "first", False)]  # before the answer's first token, no other offer
    for _ in range(60):  # a copy that keeps going: its long-run bins learn it
        rates.update(40, 16, 16)
    assert policy.plan(0, 200, 0, [offer(run=40)]).k > 0 and policy.chosen.source == "pld"


def test_the_portfolio_s_suffix_offer_is_not_cut_at_its_match_length():
    """Suffix decoding alone drafts at most its match length (``suffix_factor`` 1); the portfolio
    prices K itself, so its suffix source offers up to 4x the match (``suffix_factor`` 4)."""
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    cache, caller = SuffixCache(), Caller.named("a")
    first = AutoDrafter(None, frozenset(), cache.scope(caller))
    first.start([1, 2])
    first.commit([1, 2] + text, 0, 0)  # an earlier answer, in the same caller's cache
    lengths = {}
    for factor in (None, 1.0):
        auto = AutoDrafter(None, frozenset(), cache.scope(caller), **({} if factor is None else {"suffix_factor": factor}))
        auto.start([1, 2, 3])
        context = [1, 2, 3, 4, 5, 6]  # the answer so far matches the earlier one's "5 6"
        offer = next(o for o in auto.offers(context, 16) if o.source == "suffix")
        assert list(offer.tokens) == text[2:2 + len(offer.tokens)]
        lengths[factor] = len(offer.tokens)
    assert lengths[1.0] == 2 and lengths[None] == 8


def test_the_draft_model_is_chosen_when_it_beats_the_copies():
    policy = PortfolioK(cheap_wide(), draft_table(), has_model=True)
    policy.begin(256)
    assert policy.plan(0, 200, 1, [offer(run=1)]).k > 0 and policy.chosen.source == "model"
    assert policy.more(1, 0.99)  # the model's own stop rule decides how long it drafts


def test_run_rates_count_a_copy_kept_in_full_as_censored_not_missed():
    rates = RunRates()
    before = rates.rate(40)
    rates.update(30, 16, 16)  # all judged tokens kept: nothing known past them
    assert rates.rate(40) > before and rates.kept == rates.reached
    rates.update(1, 3, 2)  # the third missed
    assert rates.reached[1] > rates.kept[1] or rates.reached[2] > rates.kept[2]


def test_an_offer_is_scored_against_what_the_round_committed():
    o = Offer("pld", (5, 6, 7, 8), 3)
    assert o.outcome([5, 6, 9]) == (3, 2)
    assert o.outcome([5, 6]) == (2, 2)  # censored: the round committed only two tokens
    assert o.outcome([5, 6, 7, 8, 9]) == (4, 4)


def test_every_offer_teaches_its_source_even_when_another_drafted():
    policy = PortfolioK(cheap_wide(), has_model=False)
    policy.plan(9, 100, 0, [offer(run=5, source="suffix")]).k
    assert policy.situations["suffix"] == ("suffix", "part", False)
    rates = policy.rates_of("suffix")
    before = rates.rate(5)
    policy.observe(RoundRecord(drafted=0, offers=(("suffix", 5, 1, 1),)))
    assert rates.rate(5) > before


@pytest.mark.parametrize("run, t, first, others, situation", [
    (3, 0, 7, [], ("pld", "first", False)),  # before the answer's first token
    (3, 3, 7, [], ("pld", "whole", False)),  # the match reaches back to the answer's first token
    (5, 3, 7, [], ("pld", "whole", False)),  # ... and into the prompt
    (2, 3, 7, [], ("pld", "part", False)),
    (2, 3, 7, [8, 7], ("pld", "part", True)),  # another offer starts with the same token
    (2, 3, 7, [8], ("pld", "part", False)),
])
def test_a_copy_s_situation(run, t, first, others, situation):
    assert copy_situation("pld", run, t, first, others) == situation


def test_copies_in_different_situations_are_priced_apart():
    """A short suffix copy that an answer's start always kept (an agent whose answers begin alike)
    is drafted there, and the same copy mid-answer, where it always missed, is not."""
    policy = PortfolioK(dear_wide(), has_model=False)
    policy.begin(256)
    start, middle = offer(run=1, n=8, source="suffix"), offer(run=1, n=8, source="suffix")
    for _ in range(40):
        policy.plan(1, 200, 0, [start]).k
        policy.observe(RoundRecord(drafted=0, offers=(("suffix", 1, 8, 8),)))
        policy.plan(30, 200, 0, [middle]).k
        policy.observe(RoundRecord(drafted=0, offers=(("suffix", 1, 1, 0),)))
    assert policy.plan(1, 200, 0, [start]).k > 0 and policy.chosen.source == "suffix"
    assert policy.plan(30, 200, 0, [middle]).k == 0


def test_copies_that_agree_are_priced_apart_from_copies_that_differ():
    policy = PortfolioK(dear_wide(), has_model=False)
    policy.begin(256)
    pld, same, other = offer(run=2, n=8), offer(run=2, n=8, source="suffix"), Offer("suffix", (7, 8, 9), 2)
    for _ in range(40):  # where both start alike, prompt lookup was right; where they differ, wrong
        policy.plan(30, 200, 0, [pld, same]).k
        policy.observe(RoundRecord(drafted=0, offers=(("pld", 2, 8, 8), ("suffix", 2, 8, 8))))
        policy.plan(30, 200, 0, [pld, other]).k
        policy.observe(RoundRecord(drafted=0, offers=(("pld", 2, 1, 0), ("suffix", 2, 1, 0))))
    assert policy.plan(30, 200, 0, [pld, same]).k > 0
    assert policy.plan(30, 200, 0, [pld, other]).k == 0


# ------------------------------------------------------------------------ replay and oracle
@pytest.mark.parametrize("with_model", [True, False])
def test_replay_redoes_the_portfolio_s_rounds_and_sources(models, with_model):
    from specdec.traces.runs import replay_portfolio

    target, draft = models
    tt, dt = cheap_wide(step=0.05, per_token=0.004), draft_table()
    engine = Engine(target, draft if with_model else None, eos_ids=[], target_costs=tt,
                    draft_costs=dt if with_model else None)
    prompts = [REPEATS, NOVEL, [5 + i % 7 for i in range(40)]]
    traces, outs = [], []
    for prompt, new in zip(prompts, (40, 30, 35)):  # in a row: k=auto's state and the suffix cache carry over
        out = engine.generate(prompt, DecodeConfig(drafter="auto", max_new_tokens=new))
        outs.append(out)
        drafts = {"d": (draft, "auto", 64)} if with_model else {}
        traces.append(trace_answer(target, drafts, prompt, out.token_ids, out.finish_reason, new, frozenset()))
    rows = replay_portfolio(traces, "d" if with_model else None, tt, dt if with_model else None)["prompts"]
    for row, out in zip(rows, outs):
        assert row["auto_k_chosen"] == out.stats.k_chosen
        assert row["auto_sources"] == {s: n for s, (n, _, _) in out.stats.sources.items()}
        assert row["auto_accepted"] == out.stats.accepted
        assert row["oracle"] <= row["auto"] + 1e-9 and row["oracle"] <= row["plain"] + 1e-9
        assert row["oracle"] <= row["fitted"] + 1e-9  # the realistic bound is a schedule, so never below the oracle
    assert any(out.stats.sources for out in outs)


def test_the_fitted_bound_s_rates_are_the_answers_shares_censored_as_the_portfolio_learns():
    """Per copy source, situation and run bin: offered tokens judged up to the first miss (a copy
    matched to its end says nothing past it), over every position of every trace; unseen bins keep
    the prior."""
    import numpy as np

    from specdec.core.acceptance import COPY_PRIOR, run_bin
    from specdec.traces.runs import FittedRates, fitted_copy_rates

    arr = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    # t=0: 3 offered from run 2, 1 kept (judged: run 2 kept, run 3 missed); t=2: 2 offered from run 5,
    # both kept (a match back to the answer's start); t=3: run 2, the first missed; suffix agrees there
    offered = [{"pld": (arr(3, 0, 2, 4), arr(1, 0, 2, 0), arr(2, 0, 5, 2), arr(9, -1, 9, 9)),
                "suffix": (arr(0, 0, 0, 1), arr(0, 0, 0, 0), arr(0, 0, 0, 1), arr(-1, -1, -1, 9))}]
    fitted = fitted_copy_rates(offered)
    first, whole = fitted[("pld", "first", False)], fitted[("pld", "whole", False)]
    agreed = fitted[("pld", "part", True)]
    assert run_bin(2) != run_bin(3) and run_bin(5) == run_bin(6)
    assert first[run_bin(2)] == 1.0 and first[run_bin(3)] == 0.0 and whole[run_bin(5)] == 1.0
    assert agreed[run_bin(2)] == 0.0 and fitted[("suffix", "part", True)][run_bin(1)] == 0.0
    assert first[run_bin(100)] == COPY_PRIOR[run_bin(100)]
    rates = first
    frozen = FittedRates(prior=rates)
    before = frozen.rates()
    frozen.update(0, 3, 0)
    assert frozen.rates() == before


def test_the_portfolio_oracle_is_at_most_each_source_alone(models):
    target, draft = models
    tt, dt = cheap_wide(step=0.05), draft_table()
    out = Engine(target, None, eos_ids=[]).generate(REPEATS, DecodeConfig(policy="ar", max_new_tokens=40))
    trace = trace_answer(target, {"d": (draft, "auto", 64)}, REPEATS, out.token_ids, out.finish_reason, 40,
                         frozenset())
    clock = Clock(tt, dt)
    copies = copy_offers(trace, list(AutoDrafter(None, frozenset(), SuffixCache().scope()).copies.values()))
    both = oracle(trace, "d", clock, copies=copies)
    assert both <= oracle(trace, "d", clock) + 1e-12
    assert both <= oracle(trace, None, clock, copies={"pld": copies["pld"]}) + 1e-12
    assert both <= replay(trace, None, None, clock).seconds
    assert oracle(trace, None, clock, copies={}) == pytest.approx(replay(trace, None, None, clock).seconds)


# ------------------------------------------------------------------------ k=auto per caller
def test_what_one_caller_taught_k_auto_never_steers_another(models):
    target, draft = models
    engine = Engine(target, draft, eos_ids=[], target_costs=cheap_wide(), draft_costs=draft_table())
    cfg = DecodeConfig(max_new_tokens=20)
    engine.generate(REPEATS, cfg.with_settings(caller="a"))
    assert engine.k_policy(cfg.with_settings(caller="a")) is engine.k_policy(cfg.with_settings(caller="a"))
    assert engine.k_policy(cfg.with_settings(caller="b")) is not engine.k_policy(cfg.with_settings(caller="a"))
    assert engine.k_policy(cfg.with_settings(caller=None)) is not engine.k_policy(cfg.with_settings(caller=None))


@pytest.mark.slow
@pytest.mark.parametrize("with_model", [True, False])
def test_sampled_output_keeps_the_target_s_distribution(with_model):
    """As for every drafter (tests/test_distribution.py): the joint of the first three tokens at T > 0,
    with a prompt whose text repeats; without a draft model every round that drafts copies."""
    from specdec.core.engine import Engine
    from specdec.core.sampling import SamplingParams
    from tinymodels import chisquare_joint, engine_sample, tiny_engine

    engine = tiny_engine()
    if not with_model:
        engine = Engine(engine.target, None, eos_ids=[])
    prompt = (1, 3, 0, 2, 1, 3, 0, 2, 1, 3, 0)
    counts, expected, accept_rate, _ = engine_sample(engine, 3000, SamplingParams(temperature=0.9), prompt=prompt,
                                                     drafter="auto")
    assert accept_rate > 0.05
    pvalue, outside = chisquare_joint(counts, expected)
    assert pvalue > 1e-3 and outside == 0


def test_the_sources_take_turns_in_one_sampled_answer():
    from specdec.core.sampling import SamplingParams
    from tinymodels import tiny_engine

    engine = tiny_engine()
    seen = set()
    for seed in range(20):
        out = engine.generate([1, 3, 0, 2, 1, 3, 0, 2, 1, 3, 0],
                              DecodeConfig(k=2, max_new_tokens=40, sampling=SamplingParams(temperature=0.9, seed=seed)))
        seen |= set(out.stats.sources)
    assert "model" in seen and seen & {"pld", "suffix"}


def test_bench_configurations_are_callers_of_their_own():
    """A suffix cache shared by a bench run's configurations would let one draft from another's
    answer to the same prompt; each configuration is a caller of its own."""
    from specdec.bench.running import configs as cfgs

    built = cfgs.build_configs("ar,lossless", "suffix,auto", "auto")
    callers = [c.request_for(16).caller.name for c in built]
    assert callers == [c.id for c in built] and len(set(callers)) == len(built)


def test_a_bad_suffix_factor_under_auto_is_a_one_line_error():
    with pytest.raises(SpecdecError, match="suffix_factor must be a number in"):
        DecodeConfig.from_options(drafter="auto", suffix_factor=0)


def wide_table(short_per_token: float, long_per_token: float, step=0.040, long_step=0.048) -> CostTable:
    """A target with wide passes measured after 1024 tokens of context: ``*_per_token`` of a step
    per token beyond the first, at the short and at the long context."""
    wide = [1, 16, 32, 64, 128]
    return CostTable("t", "q4", WIDTHS, [step * (1 + short_per_token * (w - 1)) for w in WIDTHS], context=32,
                     prefill_seconds=0.45, wide_context=1024, wide_widths=wide,
                     wide_seconds=[long_step * (1 + long_per_token * (w - 1)) for w in wide])


def long_copy_k(table: CostTable, prompt: int = 600, t: int = 200, run: int = 200) -> int:
    """The K the portfolio drafts for a 127-token prompt-lookup copy that has matched ``run`` tokens."""
    policy = PortfolioK(table, has_model=False)
    policy.begin(512, prompt_tokens=prompt)
    offer = Offer("pld", tuple(range(3, 130)), run)
    return policy.plan(t, 300, 0, [offer]).k


def test_a_copy_kept_whole_is_drafted_long_where_a_wide_pass_is_cheap_per_token_and_not_where_it_is_dear():
    cheap = long_copy_k(wide_table(0.08, 0.1))  # a 128-token pass: ~15 steps
    assert cheap > 32  # past the request's k limit: the copy limit follows the measured widths
    assert source_of(wide_table(0.08, 0.1)) == "pld"
    assert long_copy_k(wide_table(0.08, 0.1), run=3) < 8  # a short match is not trusted that far
    dear = long_copy_k(wide_table(0.9, 1.1))  # every extra token costs about a step: nothing pays
    assert dear == 0


def source_of(table: CostTable) -> str | None:
    policy = PortfolioK(table, has_model=False)
    policy.begin(512, prompt_tokens=600)
    policy.plan(200, 300, 0, [Offer("pld", tuple(range(3, 130)), 200)]).k
    return policy.chosen.source


def test_a_round_is_priced_at_its_context():
    table = wide_table(0.08, 0.3)
    short, long = table.at_context(32), table.at_context(1024)
    assert short.forward(16) == pytest.approx(table.forward(16))
    assert long.forward(16) == pytest.approx(0.048 * (1 + 0.3 * 15))
    assert long.forward(128) == pytest.approx(0.048 * (1 + 0.3 * 127))
    middle = table.at_context(528)
    assert short.forward(64) < middle.forward(64) < long.forward(64)
    assert table.at_context(2016).forward(64) > long.forward(64)  # beyond, along the same line
    # the same copy is drafted shorter deep into a long context, where wide passes cost more
    assert long_copy_k(table, prompt=3000) <= long_copy_k(table, prompt=100)


def test_a_new_caller_s_first_answer_drafts_a_long_copy_once_the_copy_has_run_long():
    """No cold-start deadlock: with nothing learned, a copy whose match runs back 100 tokens is
    drafted long on a table where that pays (the prior of long runs: what edit answers kept)."""
    assert long_copy_k(wide_table(0.08, 0.1), t=100, run=100) > 32
    assert long_copy_k(wide_table(0.45, 0.5), t=100, run=100) >= 16  # on a 4-bit CPU's prices: still long


def test_a_table_without_wide_passes_prices_copies_as_before():
    from specdec.core.autok import premium, priced_at

    table = dear_wide()
    assert priced_at(table, 5000).seconds == premium(table).seconds
    assert long_copy_k(cheap_wide()) <= 31  # its widest pass is 32: no copy past it
