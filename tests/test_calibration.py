"""Calibration a busy machine cannot fool: repeated timings with medians, widths checked against
each other (an outlier is timed again), a warning when the machine looks loaded, the drift of
observed passes from the table reported; and the notes that tell a k=auto run that chose plain
steps from one whose drafts were rejected. Timings are injected (a fake clock), never slept."""

import json
import time
import types

import pytest
import torch

import specdec
from specdec.core import autok
from specdec.models import costmodel
from specdec.cli import decoding_notes
from specdec.models.costmodel import CostTable
from specdec.core.rounds import RoundRecord
from specdec.core.stats import Stats


def true_cost(w):
    return 0.010 + 0.002 * w  # seconds: above NOISE_FLOOR, so noise and outliers count


class FakeLM:
    """A model whose passes advance a fake clock by a set cost; ``slow`` maps a width to how many of
    its verify passes (from the first) take ``factor`` times longer."""

    backend = "transformers"
    device = torch.device("cpu")
    vocab_limit = 100
    name = "fake"

    def __init__(self, clock, slow=None, factor=6.0):
        self.clock, self.slow, self.factor = clock, dict(slow or {}), factor
        self.passes = {}

    def reset(self):
        pass

    def truncate(self, n):
        pass

    def forward(self, ids, num_logits=None):
        w = len(ids)
        cost = true_cost(w)
        if num_logits is not None:  # a verify pass (the prefill and warm-up passes ask for the last only)
            self.passes[w] = self.passes.get(w, 0) + 1
            n = self.slow.get(w, 0)
            if n == "always" or n >= self.passes[w]:
                cost *= self.factor
        self.clock.now += cost


@pytest.fixture
def clock(monkeypatch):
    c = types.SimpleNamespace(now=0.0)
    fake = types.SimpleNamespace(perf_counter=lambda: c.now, strftime=time.strftime)
    monkeypatch.setattr(costmodel.timing, "time", fake)
    return c


def sane(widths, seconds):
    return (all(b >= a for a, b in zip(seconds, seconds[1:]))
            and all(sb <= sa * (wb / wa) * costmodel.PROPORTIONAL_TOLERANCE
                    for (wa, sa), (wb, sb) in zip(zip(widths, seconds), zip(widths[1:], seconds[1:]))))


def test_one_slow_pass_does_not_move_the_median(clock):
    lm = FakeLM(clock, slow={16: 1})  # width 16's first pass only: 6x
    widths, seconds, _, _ = res = costmodel.measure(lm)
    assert seconds[widths.index(16)] == pytest.approx(true_cost(16))
    assert res.report["remeasured"] == [] and res.report["noisy"] == ""


def test_an_outlier_width_is_measured_again(clock):
    """Width 16 is 6x slow through its whole first batch (a slow spell hit it): the median is 6x
    its neighbours' trend, so it (and its neighbours in the broken pairs) are timed afresh."""
    lm = FakeLM(clock, slow={16: costmodel.REPEATS})
    widths, seconds, _, _ = res = costmodel.measure(lm)
    assert 16 in res.report["remeasured"] and res.report["noisy"] == ""
    assert seconds == pytest.approx([true_cost(w) for w in widths])
    assert sane(widths, seconds)


def test_a_width_that_stays_slow_is_repaired_and_recorded_noisy(clock):
    lm = FakeLM(clock, slow={16: "always"})
    widths, seconds, _, _ = res = costmodel.measure(lm)
    assert sane(widths, seconds) and seconds[widths.index(16)] < 3 * true_cost(16)
    assert "16" in res.report["noisy"] and "stayed noisy or inconsistent" in res.report["noisy"]
    assert res.report["remeasured"].count(16) == costmodel.MAX_REMEASURE


def test_widths_checked_against_each_other():
    w = [1, 2, 4, 8, 16, 32]
    good = [true_cost(x) for x in w]
    assert costmodel.suspect_widths(w, good) == set()
    cheap = list(good)
    cheap[4] = good[3] * 0.5  # a wider pass much cheaper than a narrower one
    assert costmodel.suspect_widths(w, cheap) == {8, 16, 32}  # (and 32 is over twice 16's: ambiguous)
    slow = list(good)
    slow[4] = 6 * good[4]
    assert costmodel.suspect_widths(w, slow) == {8, 16, 32}
    tiny = [1e-4, 5e-5, 1e-4, 1e-4, 1e-4, 1e-4]  # under the noise floor: call overhead, not evidence
    assert costmodel.suspect_widths(w, tiny) == set()
    assert sane(w, costmodel.repair(w, slow)) and sane(w, costmodel.repair(w, cheap))


def count_measurements(monkeypatch) -> list:
    """Make every cost measurement short and count it (the list returned grows by one per call).
    A tiny model's timings on a shared CI core can spread or contradict each other, and such a
    table is marked noisy and measured again at a later quiet load; that rule has tests of its
    own, so here the timings' own noise is cleared and only the machine's load (patched) counts."""
    calls = []
    real = costmodel.measure

    def measure(lm, *a, **kw):
        calls.append(1)
        result = real(lm, widths=(1, 2, 4), repeats=1)
        result.report["noisy"] = ""
        return result

    monkeypatch.setattr(costmodel.timing, "measure", measure)
    return calls


def test_a_loaded_machine_gets_a_warning_and_a_quiet_one_measures_again(tiny_dirs, monkeypatch):
    import os

    target, _ = tiny_dirs
    calls = count_measurements(monkeypatch)
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (cores + 8.0, 1.0, 1.0))
    lines = []
    p = specdec.load(str(target), draft=None, dtype="float32", progress=False, log=lines.append)
    warned = [x for x in lines if "warning" in x and "looks busy" in x]
    assert len(warned) == 1 and f"load average is {cores + 8.0:.1f}" in warned[0]
    assert p.costs.target.noisy and len(calls) == 1
    specdec.load(str(target), draft=None, dtype="float32", progress=False)
    assert len(calls) == 1  # still busy: the table is kept (no endless re-measuring)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    p = specdec.load(str(target), draft=None, dtype="float32", progress=False)
    assert len(calls) == 2 and p.costs.target.noisy == ""  # quiet now: measured again, and trusted
    specdec.load(str(target), draft=None, dtype="float32", progress=False)
    assert len(calls) == 2


def test_machine_load_rule(monkeypatch):
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 0.0, 0.0))
    assert costmodel.machine_load(2) is None  # its own two threads
    monkeypatch.setattr(os, "getloadavg", lambda: (3.1, 0.0, 0.0))
    assert "3.1 on 2 cores" in costmodel.machine_load(2)  # a hog on top of them
    assert costmodel.machine_load(1) is not None  # 2.1 others on the one core left
    monkeypatch.setattr(os, "getloadavg", lambda: (1.9, 0.0, 0.0))
    assert costmodel.machine_load(1) is None


# ------------------------------------------------------------------------- drift while decoding
def test_a_table_measured_slow_is_named_in_the_stats_and_the_notes(tiny_dirs, monkeypatch):
    """A cached table 20x too slow (as a busy first load measured it): the generation's verify passes
    take a twentieth of what it predicts, the stats say so and the note points to 'specdec calibrate';
    decoding writes nothing to the cache (measuring again is calibrate's job)."""
    from specdec.core import engine

    target, _ = tiny_dirs
    calls = count_measurements(monkeypatch)
    monkeypatch.setattr(costmodel.timing, "machine_load", lambda threads: None)
    monkeypatch.setattr(engine, "DRIFT_ROUNDS", 8)
    specdec.load(str(target), draft=None, dtype="float32", progress=False)
    path = next(costmodel.costs_dir().glob("*.json"))
    d = json.loads(path.read_text())
    d["seconds"] = [s * 20 for s in d["seconds"]]
    path.write_text(json.dumps(d))
    before = path.read_text()
    p = specdec.load(str(target), draft=None, dtype="float32", progress=False)
    assert len(calls) == 1 and p.costs.target.seconds == d["seconds"]
    out = p.generate("abc abc abc", chat=False, drafter="pld", k="auto", max_new_tokens=64)
    assert out.stats.rounds >= 8
    assert out.stats.cost_drift is not None and out.stats.cost_drift < engine.DRIFT_LOW
    assert any("specdec calibrate" in n for n in decoding_notes(out.stats, p))
    assert path.read_text() == before


# ----------------------------------------------------------------------------- the notes
def pair_with(target, draft=None):
    # a draft model is loaded where it has a table
    return types.SimpleNamespace(costs=types.SimpleNamespace(target=target, draft=draft), draft=draft)


def stats(k, k_chosen, drafted_per_round, accepted_per_round, policy="lossless", drafter="model"):
    s = Stats(policy=policy, drafter=drafter, k=k)
    for d, a in zip(drafted_per_round, accepted_per_round):
        s.add(RoundRecord(budget=d, drafted=d, accepted=a))
    s.k_chosen = list(k_chosen)
    return s


def test_plain_steps_chosen_are_not_called_low_acceptance():
    """The report: K=0 in 98% of rounds, 3/3 drafts accepted, and the stats line warned of 'low
    acceptance (tau=1.02)'. Now the note says the controller chose not to draft, and why."""
    compute_bound = CostTable("t", "float32", [1, 2, 4, 8, 16, 32], [0.74, 1.4, 2.8, 5.6, 11.2, 22.4], 32)
    draft = CostTable("d", "float32", [1, 2, 4, 8, 16, 32], [0.2, 0.4, 0.8, 1.6, 3.2, 6.4], 32)
    ks = [0] * 147 + [3]
    s = stats("auto", ks, [0] * 147 + [3], [0] * 147 + [3])
    assert s.mean_acceptance_length < 1.3  # what the old warning looked at
    notes = decoding_notes(s, pair_with(compute_bound, draft))
    assert len(notes) == 1 and notes[0].startswith("specdec: note: k=auto chose plain decoding steps (K=0) in 147")
    assert "no draft was rejected" in notes[0] and "low acceptance" not in notes[0]
    assert "not even near-perfect drafts would pay" in notes[0] and "a plain step 740 ms" in notes[0]
    cheap_wide = CostTable("t", "float32", [1, 2, 4, 8, 16, 32], [0.74, 0.76, 0.8, 0.9, 1.2, 2.0], 32)
    notes = decoding_notes(s, pair_with(cheap_wide, draft))
    assert "drafting pays only when drafts are kept at" in notes[0] and "the 3 drafts tried were kept at 100%" in notes[0]


def test_low_acceptance_speaks_of_rejected_drafts_only():
    table = CostTable("t", "float32", [1, 2, 4, 8], [0.1, 0.11, 0.12, 0.15], 8)
    # k=auto at K=0 in 49 of 100 rounds, the drafting rounds keeping half their drafts: the old tau
    # over every round (1.25) warned; over the rounds that drafted (1.49) there is nothing to say
    s = stats("auto", [0] * 49 + [1] * 51, [0] * 49 + [1] * 51, [0] * 49 + [1] * 25 + [0] * 26)
    assert s.mean_acceptance_length < 1.3 and decoding_notes(s, pair_with(table)) == []
    # a fixed K whose drafts are rejected: the warning, in terms of rejected drafts
    s = stats(3, [], [3] * 10, [0] * 9 + [1])
    notes = decoding_notes(s, pair_with(table))
    assert len(notes) == 1 and notes[0].startswith("specdec: warning: low acceptance")
    assert "rejected 29 of 30 drafted tokens" in notes[0] and "over the 10 rounds that drafted" in notes[0]
