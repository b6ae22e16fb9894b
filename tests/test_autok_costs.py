"""k=auto prices the draft model's reading (its prefill of the window, a catch-up) against what
drafting saves over the tokens still to come, and picks K only where the target's pass over K + 1
tokens was measured. Hand-made cost tables; tiny models for the engine-level checks."""

from __future__ import annotations

import random

import pytest

from specdec.autok import KController
from specdec.costmodel import CostTable
from specdec.engine import DecodeConfig, Engine
from specdec.backends.hf import HFModel as CausalLM
from tinymodels import perturbed_copy, tiny_model

WIDTHS = list(range(1, 18)) + [24, 32]


def bandwidth_bound(widths=WIDTHS, step=0.100, per_token=0.010, prefill_per_token=0.010) -> CostTable:
    """A 16-bit-like target: a pass over w tokens costs one step plus 10 ms per extra token."""
    return CostTable("t", "bf16", list(widths), [step + per_token * (w - 1) for w in widths], context=32,
                     prefill_seconds=prefill_per_token * 32)


def draft_table(step=0.020, prefill_per_token=0.010) -> CostTable:
    return CostTable("d", "q4", [1, 2], [step, 2 * step], context=32, prefill_seconds=prefill_per_token * 32)


def controller(target=None, draft=None) -> KController:
    target = target or bandwidth_bound()
    draft = draft or draft_table()
    return KController(target, draft.forward(1), k_max=31, draft_prefill=draft.prefill)


@pytest.mark.parametrize("backlog,remaining,drafts", [
    (2, 5, True),       # a steady round's feed is never priced apart
    (300, 10, False),   # 3 s of draft prefill, ~0.6 s to save: plain steps, the draft never reads the prompt
    (300, 40, False),
    (300, 400, True),   # ~24 s to save: worth the prefill
    (30, 40, True),     # a short window is cheap to read
])
def test_drafting_waits_for_a_backlog_worth_reading(backlog, remaining, drafts):
    c = controller()
    k = c.choose(remaining - 1, backlog=backlog)
    assert (k > 0) == drafts, k
    assert c.backlog_declined == (0 if drafts else 1)


def test_the_expected_answer_length_is_learned_from_finished_answers():
    c = controller()
    assert c.choose(999, backlog=300) > 0  # nothing learned yet: what max_new_tokens allows (1000)
    for _ in range(20):
        c.finished(12)  # answers have been ~12 tokens long
    assert abs(c.expected_length - 12) < 1e-6
    assert c.choose(999, backlog=300) == 0  # 12 tokens cannot repay 3 s of draft prefill
    assert c.choose(999, backlog=20) > 0  # 0.2 s can be
    for _ in range(20):
        c.finished(800)
    assert c.choose(999, backlog=300) > 0


def test_a_drafter_without_a_model_reads_nothing():
    c = KController(bandwidth_bound(), 0.0, k_max=31, draft_prefill=None)
    assert c.choose(9, backlog=10_000) > 0


@pytest.mark.parametrize("widths", [[1, 2, 4, 8, 16, 32], [1, 3, 5, 9, 17], WIDTHS])
def test_k_auto_picks_only_measured_widths(widths):
    rng = random.Random(0)
    table = CostTable("t", "x", widths, [0.05 * (1 + 0.3 * (w - 1)) for w in widths], context=32)
    c = KController(table, 0.005, k_max=31)
    seen = set()
    for _ in range(400):
        k = c.choose(rng.randint(0, 40))
        seen.add(k)
        assert k == 0 or k + 1 in widths, k
        drafted = k
        c.observe(drafted, rng.randint(0, drafted) if drafted else 0, 0.005 * drafted, table.forward(drafted + 1))
    assert seen - {0}  # it drafted


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
        assert out.stats.backlog_declined == 0
    else:
        assert out.stats.k_chosen == [0] * new and draft.forward_calls == 0
        # each plain step with room to draft (all but the last) was the backlog's doing (drafting alone
        # would pay on this target), and the answer's stats say so, with the backlog the draft would
        # have read last (the prompt and the tokens written before that round)
        assert out.stats.backlog_declined == new - 1 and out.stats.declined_backlog == 250 + new - 2


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


# ------------------------------------------------------------------ what the rounds really cost
def test_wide_passes_learn_their_own_correction():
    """Beside a draft model a verify pass was seen at 1.5x its table while plain steps kept theirs:
    drafting rounds correct the wide passes' price, plain rounds the one-token step's."""
    t = bandwidth_bound()
    c = controller(t)
    for _ in range(40):
        c.observe(0, 0, None, t.forward(1))
        c.observe(2, 1, 0.04, 1.5 * t.forward(3))
    assert c.wide_scale == pytest.approx(1.5, rel=1e-3)
    assert c.verify_cost(3) == pytest.approx(1.5 * t.forward(3), rel=1e-3)
    assert c.verify_cost(1) < 1.3 * t.forward(1)  # the every-round correction, plain steps dominating
    assert controller(t).verify_cost(3) == pytest.approx(t.forward(3))  # nothing drafted yet: the table


def test_catch_ups_correct_their_price_and_drafting_waits_for_it():
    d = draft_table()
    c = controller(draft=d)
    assert c.catchup_cost(100) == pytest.approx(d.prefill(100)) and c.catchup_cost(2) == 0.0
    for _ in range(60):  # catch-ups of 100 tokens took 3x the table's prefill (+ the 2 drafts' steps)
        c.observe(2, 2, 3 * (d.prefill(100) + 2 * d.forward(1)), 0.12, fed=100)
    assert c.catchup_scale == pytest.approx(3.0, rel=0.02)
    assert c.catchup_cost(100) == pytest.approx(3 * d.prefill(100), rel=0.02)
    assert c.draft_seconds_per_token is None  # a catch-up round is no per-token observation
    # 1 s of drafting's saving repays the table's 1 s of reading 100 tokens, not the real 3 s
    for remaining, drafts in ((40, False), (400, True)):
        fresh = controller(draft=d)
        fresh.catchup_scale = c.catchup_scale
        assert (fresh.choose(remaining - 1, backlog=100) > 0) == drafts


def probing(c: KController, rounds: int, backlog: int) -> list[int]:
    """The rounds at which a controller that has learned drafting does not pay probes anyway, each
    probe finding nothing again (so the estimate stays below break-even)."""
    out = []
    for i in range(rounds):
        k = c.choose(200, backlog=backlog)
        if k:
            out.append(i)
            c.observe(k, 0, None, c.verify_cost(k + 1), fed=backlog)
    return out


def test_probes_spend_at_most_a_small_share_of_plain_decoding_on_catch_ups():
    t, d = bandwidth_bound(), draft_table()

    def learned_not_to_pay() -> KController:
        c = controller(t, d)
        for _ in range(30):
            c.observe(3, 0, 3 * d.forward(1), t.forward(4))
        assert c.choose(200) == 0
        return c

    # prompt lookup reads nothing: probes after 16, then 32, 64 ... plain rounds, as before (the
    # check in learned_not_to_pay was the first of them)
    c = learned_not_to_pay()
    c.draft_prefill = None
    assert probing(c, 120, backlog=50)[:2] == [14, 14 + 32]
    # a draft model that must first read 50 tokens (0.5 s): a probe waits until 2% of the plain
    # steps taken (0.1 s each) pays for it, about 250 rounds, however short the probe interval
    c = learned_not_to_pay()
    first = probing(c, 600, backlog=50)
    assert first and 240 <= first[0] <= 260
    spent = len(first) * c.catchup_cost(50)
    assert spent <= 0.02 * 600 * t.forward(1) + c.catchup_cost(50)
