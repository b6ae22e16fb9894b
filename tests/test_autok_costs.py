"""k=auto (specdec.core.autok.AutoK): when to start reading for a draft (the draft model's window of the
prompt against what drafting saves over the answer's expected length), how long each block runs
(the draft's own probabilities against the wider pass and the next draft step), only measured
widths, nothing for drafters without a model to read. Hand-made cost tables; tiny models for the
engine-level checks."""

from __future__ import annotations

import random

import pytest

from specdec.core.acceptance import AcceptancePrior, Bins
from specdec.core.autok import AutoK
from specdec.models.costmodel import CostTable
from specdec.core.rounds import RoundRecord
from specdec.core.engine import DecodeConfig, Engine
from specdec.models.backends.transformers.model import HFModel as CausalLM
from tinymodels import perturbed_copy, tiny_model

WIDTHS = list(range(1, 18)) + [24, 32]


def bandwidth_bound(widths=WIDTHS, step=0.100, per_token=0.010, prefill_per_token=0.010) -> CostTable:
    """A 16-bit-like target: a pass over w tokens costs one step plus 10 ms per extra token."""
    return CostTable("t", "bf16", list(widths), [step + per_token * (w - 1) for w in widths], context=32,
                     prefill_seconds=prefill_per_token * 32)


def draft_table(step=0.020, prefill_per_token=0.010) -> CostTable:
    return CostTable("d", "q4", [1, 2], [step, 2 * step], context=32, prefill_seconds=prefill_per_token * 32)


def controller(target=None, draft=None, prior=None) -> AutoK:
    return AutoK(target or bandwidth_bound(), draft or draft_table(), prior=prior)


@pytest.mark.parametrize("backlog,room,drafts", [
    (2, 5, True),       # a steady round's feed is never priced apart
    (300, 10, False),   # ~3 s of draft reading, little to save: plain steps, the draft never reads the prompt
    (300, 40, False),
    (300, 400, True),   # much to save: worth the reading
    (30, 40, True),     # a short window is cheap to read
])
def test_a_cold_controller_reads_a_backlog_only_when_the_room_left_repays_it(backlog, room, drafts):
    c = controller()
    c.begin(room + 1)
    assert (c.budget(0, room, backlog) > 0) == drafts
    assert c.declined == (0 if drafts else 1)
    again = controller()
    again.begin(room + 1)
    plan = again.plan(0, room, backlog)  # the round's decision, said by the plan itself
    assert (plan.k > 0) == drafts and plan.declined == (not drafts) and again.declined == c.declined


def test_a_plain_step_for_no_gain_is_not_declined():
    """``declined`` says the round is plain only because of the backlog: a plain step because no
    block pays at all is not one (the stats count only the rounds the backlog cost)."""
    c = AutoK(bandwidth_bound(), draft_table(step=0.2))  # a draft token dearer than the target's pass
    c.begin(100)
    plan = c.plan(0, 99, 300)
    assert plan.k == 0 and not plan.declined and c.declined == 0


def test_answer_lengths_seen_decide_when_to_start_reading():
    c = controller()
    c.begin(1000)
    assert c.budget(0, 999, 300) > 0  # nothing learned yet: as long as max_new_tokens allows
    for _ in range(16):
        c.end(12)  # answers have been 12 tokens long
    c.begin(1000)
    assert c.budget(0, 999, 300) == 0  # 12 tokens cannot repay 3 s of reading
    assert c.budget(12, 987, 312) > 0 or c.budget(13, 986, 313) == 0  # past every answer seen: judged again
    c.begin(1000)
    assert c.budget(0, 999, 20) > 0  # 0.2 s can be repaid
    for _ in range(16):
        c.end(800)
    c.begin(1000)
    assert c.budget(0, 999, 300) > 0


def test_mixed_lengths_wait_to_see_whether_the_answer_runs_long():
    """Half the answers end after 5 tokens, half run 400: reading 300 tokens at once loses on the
    short half; waiting a few plain steps tells them apart before paying."""
    c = controller()
    for n in [5, 400] * 8:
        c.end(n)
    c.begin(1000)
    ks = [c.budget(t, 999 - t, 300 + t) for t in range(8)]
    assert ks[0] == 0 and ks[-1] > 0


def test_a_drafter_without_a_model_reads_nothing():
    c = AutoK(bandwidth_bound(), None, drafts_with_model=False)
    c.begin(10)
    assert c.budget(0, 9, 10_000) > 0


def test_blocks_run_while_the_draft_is_sure_and_stop_when_it_is_not():
    c = controller(prior=AcceptancePrior([0.1, 0.3, 0.5, 0.7, 0.85, 0.93, 0.97, 0.99], 0.8))
    c.begin(200)
    limit = c.budget(0, 100, 1)
    assert limit == 31
    assert all(c.more(i, 0.99) for i in range(1, 10))  # near-certain drafts: go on
    assert not c.more(10, 0.05)  # a draft it barely believes: the next one is not worth its step
    # what it learns: drafts it was sure of were rejected, so the bin's rate falls
    bins = Bins(AcceptancePrior.assumed())
    before = bins.rate(0.99)
    for _ in range(50):
        bins.update([0.99, 0.99], 0)
    assert bins.rate(0.99) < before / 2


def test_a_window_rule_drafts_past_its_window():
    c = AutoK(bandwidth_bound(), draft_table(), window=6)
    c.begin(200)
    c.budget(0, 100, 1)
    assert all(c.more(i, 0.01) for i in range(1, 7))  # shorter blocks would leave the window inert
    assert not c.more(7, 0.01)


@pytest.mark.parametrize("widths", [[1, 2, 4, 8, 16, 32], [1, 3, 5, 9, 17], WIDTHS])
def test_no_model_drafters_pick_only_measured_widths(widths):
    rng = random.Random(0)
    table = CostTable("t", "x", widths, [0.05 * (1 + 0.3 * (w - 1)) for w in widths], context=32)
    c = AutoK(table, None, drafts_with_model=False)
    c.begin(100)
    seen = set()
    for _ in range(400):
        room = rng.randint(0, 40)
        k = c.budget(0, room, 0)
        seen.add(k)
        assert k == 0 or k + 1 in widths or k == room, k
        c.observe(RoundRecord(budget=k, drafted=k, accepted=rng.randint(0, k) if k else 0))
    assert seen - {0}  # it drafted


def test_never_drafts_where_even_near_perfect_drafts_cannot_pay():
    linear = CostTable("t", "gguf", [1, 2, 4, 8], [0.1, 0.2, 0.4, 0.8], 8)
    c = AutoK(linear, draft_table())
    c.begin(400)
    assert [c.budget(t, 300, 1) for t in range(300)] == [0] * 300


def tiny_pair():
    target = tiny_model(7)
    draft = perturbed_copy(target, 0.05, 17)
    return CausalLM(target), CausalLM(draft)


@pytest.mark.parametrize("new,drafts", [(6, False), (200, True)])
def test_short_answers_never_prefill_the_draft(new, drafts):
    target, draft = tiny_pair()
    engine = Engine(target, draft, eos_ids=[], target_costs=bandwidth_bound(), draft_costs=draft_table())
    prompt = list(range(3, 253))  # 250 tokens, read whole by the draft (no window)
    out = engine.generate(prompt, DecodeConfig(policy="lossless", drafter="model", k="auto", max_new_tokens=new,
                                               drafter_params={"draft_window": "all"}))
    assert len(out.token_ids) == new
    if drafts:
        assert out.stats.drafted > 0 and draft.forward_calls > 0
        assert out.stats.declined_rounds == 0
    else:
        assert out.stats.k_chosen == [0] * new and draft.forward_calls == 0
        # each plain step with room to draft (all but the last) was the backlog's doing (drafting alone
        # would pay on this target), and the answer's stats say so, with the backlog the draft would
        # have read last (the prompt and the tokens written before that round)
        assert out.stats.declined_rounds == new - 1 and out.stats.declined_backlog == 250 + new - 2


def test_the_note_names_the_draft_s_reading_when_it_was_the_reason():
    from specdec.cli import decoding_notes
    from types import SimpleNamespace

    target, draft = tiny_pair()
    engine = Engine(target, draft, eos_ids=[], target_costs=bandwidth_bound(), draft_costs=draft_table())
    out = engine.generate(list(range(3, 253)), DecodeConfig(policy="lossless", drafter="model", k="auto",
                                                            max_new_tokens=6, drafter_params={"draft_window": "all"}))
    pair = SimpleNamespace(costs=SimpleNamespace(target=bandwidth_bound(), draft=draft_table()))
    (note,) = decoding_notes(out.stats, pair)
    assert "K=0) in 6 of 6 rounds" in note
    assert "drafting would pay" in note and f"first have to read 254 tokens (~{draft_table().prefill(254):.1f} s)" in note
    assert "--draft-window" in note


def test_an_answer_cut_by_its_length_limit_counts_as_running_on():
    """A short warm-up generation (cut at 8 tokens by its limit) says nothing of how long answers run:
    the next long request drafts from its first round; 8-token answers that ended by themselves
    keep a long prompt unread."""
    cut = controller()
    cut.end(8, cut=True)
    cut.begin(257)
    assert cut.budget(0, 255, 300) > 0
    short = controller()
    for _ in range(4):
        short.end(8)
    short.begin(257)
    assert short.budget(0, 255, 300) == 0


def test_a_controller_waiting_to_read_forgets_a_bad_stretch_and_starts_again():
    """A window rule (draft at least W + 1 or nothing) after bad rounds: the pooled rate sits where a
    block barely pays, so reading a long backlog does not; while it waits, what it learned fades (as
    at K = 0) and it starts again within the answer, instead of taking plain steps to the end."""
    prior = AcceptancePrior([0.27, 0.55, 0.63, 0.97, 0.98, 0.99, 0.91, 0.99], 0.84)
    c = AutoK(bandwidth_bound(), draft_table(), window=6, prior=prior)
    c.begin(400)
    for _ in range(2):
        assert c.budget(0, 7, 1) == 7
        for i in range(1, 8):
            c.more(i, 0.97)
        c.observe(RoundRecord(budget=7, drafted=7))  # seven sure drafts, none kept
    c.end(400, cut=True)
    c.begin(400)
    ks = [c.budget(t, 399 - t, 100 + t) for t in range(399)]
    assert ks[0] == 0 and c.declined > 0
    assert any(ks[:100]), "never drafted again"


def test_a_draft_token_is_priced_at_the_context_the_draft_drafts_at():
    """A draft model whose one-token pass doubles from an empty cache to 1,024 tokens (its wide passes
    measured there): its step is priced at its window of the prompt and the answer so far, so a
    block that pays after a short window does not after a long one."""
    draft = CostTable("d", "q4", [1, 2], [0.020, 0.040], context=32, prefill_seconds=0.32,
                      wide_context=1024, wide_widths=[1, 16], wide_seconds=[0.060, 0.400])
    assert draft.step_at(32) == pytest.approx(0.020) and draft.step_at(1024) == pytest.approx(0.060)
    assert draft.step_at(528) == pytest.approx(0.040)
    assert CostTable("d", "q4", [1, 2], [0.02, 0.04], context=32, context_slope=0.001).step_at(132) == \
        pytest.approx(0.022)  # no wide passes: the measured slope
    target = bandwidth_bound(step=0.100, per_token=0.030)
    c = AutoK(target, draft)
    c.begin(1000, prompt_tokens=40, draft_context=40)
    assert c.budget(0, 999, 2) > 0 and c.step == pytest.approx(0.020)
    c.begin(1000, prompt_tokens=1200, draft_context=1000)
    assert c.budget(0, 999, 2) == 0 and c.step > 0.055  # a step of ~60 ms against a 100 ms pass: no block pays
