"""k=auto prices the draft model's reading (its prefill of the window, a catch-up) against what
drafting saves over the tokens still to come, and picks K only where the target's pass over K + 1
tokens was measured. Hand-made cost tables; tiny models for the engine-level checks."""

from __future__ import annotations

import random

import pytest

from specdec.autok import KController
from specdec.costmodel import CostTable
from specdec.engine import DecodeConfig, Engine
from specdec.models import CausalLM
from specdec.testing import perturbed_copy, tiny_model

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
