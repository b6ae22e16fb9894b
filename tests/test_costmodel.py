"""The measured cost model: K choice (table tests with hand-made costs and acceptance), the
per-machine cache, the dtype choice, and k=auto / mixed dtypes through the engine."""

import json

import pytest
import torch

import specdec
from specdec.models import costmodel
from specdec.core.acceptance import AcceptanceEstimate
from specdec.models.costmodel import CostTable, best_k, choose_dtypes, expected_tokens

W = [1, 2, 4, 8, 16, 32]


def table(seconds, dtype="float32", prefill=None, context=32):
    return CostTable("m|x", dtype, list(W), list(seconds), context, prefill_seconds=prefill)


def linear(c1):  # a pass costs (width) x one token: verify grows like K
    return table([c1 * w for w in W])


def flat(c1):  # a pass costs the same at any width (a GPU, a CPU with native bf16)
    return table([c1] * len(W))


# ------------------------------------------------------------------------------- formulas
@pytest.mark.parametrize("a, k", [(0.5, 1), (0.75, 5), (0.9, 12), (0.0, 4), (1.0, 7)])
def test_expected_tokens_is_the_closed_form_for_a_constant_rate(a, k):
    closed = k + 1.0 if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)
    assert expected_tokens([a] * k, k) == pytest.approx(closed)


def test_expected_tokens_uses_per_position_rates():
    assert expected_tokens([0.9, 0.5, 0.0, 1.0], 4) == pytest.approx(1 + 0.9 + 0.45)


@pytest.mark.parametrize(
    "verify, draft, rate, k_max, expected",
    [
        (linear(0.18), 0.05, 0.9, 16, 0),  # verify costs like K tokens: drafting can never pay
        (linear(0.18), 0.0, 0.99, 16, 0),  # ... even with a free draft and near-certain acceptance
        (flat(0.2), 0.0, 0.9, 16, 16),  # flat verify and a free draft: as long as allowed
        (flat(0.2), 0.0, 0.9, 5, 5),  # bounded by k_max (max_new_tokens / context room)
        (flat(0.2), 0.05, 0.0, 16, 0),  # nothing is ever accepted: plain decoding
        (flat(0.2), 0.3, 0.9, 16, 0),  # a draft step dearer than a target step
    ],
)
def test_best_k_table(verify, draft, rate, k_max, expected):
    assert best_k(verify.forward, draft, [rate] * k_max, k_max) == expected


def test_best_k_in_between_grows_with_acceptance():
    fp32 = table([0.353, 0.5, 0.544, 0.581, 0.781, 1.019])  # measured here (AVX2, float32, packed)
    ks = [best_k(fp32.forward, 0.058, [a] * 31, 31) for a in (0.3, 0.6, 0.8, 0.9, 0.97)]
    assert ks == sorted(ks) and ks[0] < ks[-1] and 0 < ks[-1] <= 31


def test_table_interpolates_and_extrapolates():
    t = table([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], prefill=3.2)
    assert t.forward(1) == 1.0 and t.forward(3) == pytest.approx(2.5) and t.forward(12) == pytest.approx(4.5)
    assert t.forward(48) == pytest.approx(6.0 + 16 / 16)  # the last slope, beyond the widest width
    assert t.prefill(64) == pytest.approx(64 * 3.2 / 32) and t.prefill(0) == 0.0
    with pytest.raises(ValueError):
        table([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])


# ---------------------------------------------------------------------------- dtype choice
def test_dtype_choice_counts_prefill_and_decoding():
    # the AVX2 machine: bf16 is fastest for one token, but its wide passes (prefill, verify) cost
    # ~K x one token; float32 is slower per token but nearly flat
    bf16 = table([0.187, 0.329, 0.644, 1.285, 2.477, 4.953], "bfloat16", prefill=4.9)
    fp32 = table([0.353, 0.5, 0.544, 0.581, 0.781, 1.019], "float32", prefill=1.0)
    draft = {"bfloat16+int8": table([0.058, 0.064, 0.083, 0.149, 0.258, 0.472], "bfloat16+int8", prefill=0.47)}
    choice = choose_dtypes({"bfloat16": bf16, "float32": fp32}, draft)
    assert (choice.target, choice.draft) == ("float32", "bfloat16+int8") and choice.k > 0
    assert "next best" in choice.reason()
    # a machine with native bf16: one bf16 pass over 8 tokens ~1.07x one token
    native = table([0.15, 0.15, 0.155, 0.16, 0.2, 0.3], "bfloat16", prefill=0.3)
    assert choose_dtypes({"bfloat16": native, "float32": fp32}, draft).target == "bfloat16"
    # without a draft model: plain decoding per token + prefill
    assert choose_dtypes({"bfloat16": bf16, "float32": fp32}, None, prompt=8, new=256).target == "bfloat16"


# -------------------------------------------------------------------------- online estimate
def test_acceptance_estimate_is_conditional_per_position():
    est = AcceptanceEstimate(prior=0.5, prior_weight=1e-9, decay=1.0)
    est.update(4, 4)  # all kept: positions 0..3 reached and kept
    est.update(4, 1)  # position 0 kept, 1 rejected, 2..3 never reached
    assert est.reached == [2, 2, 1, 1] and est.kept == [2, 1, 1, 1]
    r = est.rates(4)
    assert r[0] == pytest.approx(1.0) and r[1] == pytest.approx(0.5) and r[2] == pytest.approx(1.0)
    assert len(est.rates(6)) == 6  # positions never drafted borrow the pooled rate


# ------------------------------------------------------------------------ the cache on disk
@pytest.fixture
def counting(monkeypatch):
    calls = []
    real = costmodel.measure

    def measure(lm, *a, **kw):
        calls.append(lm.name)
        return real(lm, widths=(1, 2, 4), repeats=1)

    monkeypatch.setattr(costmodel.timing, "measure", measure)  # (patched where the cache reads it)
    monkeypatch.setattr(costmodel.timing, "machine_load", lambda threads: None)  # the counts must not follow the load
    return calls


def test_cache_reused_remeasured_on_new_fingerprint_or_corruption(tiny_dirs, counting, monkeypatch):
    target, _ = tiny_dirs
    p = specdec.load(str(target), draft=None, dtype="float32", progress=False)
    assert len(counting) == 1 and p.costs.target.widths == [1, 2, 4]
    specdec.load(str(target), draft=None, dtype="float32", progress=False)
    assert len(counting) == 1  # same machine, model, dtype: cached
    files = list(costmodel.costs_dir().glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["fingerprint"]["threads"] == torch.get_num_threads()
    files[0].write_text("{not json")
    specdec.load(str(target), draft=None, dtype="float32", progress=False)
    assert len(counting) == 2  # corrupt: measured again, and the file is whole again
    assert costmodel.CostTable.from_dict(json.loads(files[0].read_text())).dtype == "float32"
    real_fp = costmodel.fingerprint
    elsewhere = lambda d="cpu", backend=None: {**real_fp(d, backend), "cpu": "another CPU"}  # noqa: E731
    monkeypatch.setattr(costmodel, "fingerprint", elsewhere)  # what calibrate looks the cache up with
    monkeypatch.setattr(costmodel.fingerprints, "fingerprint", elsewhere)  # what a measured table is saved under
    specdec.load(str(target), draft=None, dtype="float32", progress=False)
    assert len(counting) == 3  # another machine: measured again


def test_failed_measurement_warns_and_falls_back(tiny_dirs, monkeypatch):
    def broken(lm, *a, **kw):
        raise RuntimeError("timer exploded")

    monkeypatch.setattr(costmodel.timing, "measure", broken)
    lines = []
    target, draft = tiny_dirs
    p = specdec.load(str(target), draft=str(draft), progress=False, log=lines.append)
    assert any("could not measure" in line and "timer exploded" in line for line in lines)
    assert p.costs.target is None and p.target.dtype == torch.bfloat16  # auto without a cost model
    out = p.generate("hello", chat=False, max_new_tokens=12)
    assert out.stats.k == "auto" and max(out.stats.k_chosen) == costmodel.FALLBACK_K  # fixed, within the room left


# -------------------------------------------------------------------------- through the engine
PROMPTS = ["hello world, hello", "abcabcabcabc", "The quick brown fox", "def f(x):\n    return"]


def test_k_auto_and_mixed_dtypes_stay_identical_to_plain_decoding(tiny_dirs):
    target, draft = tiny_dirs
    # float32 target (the guarantee's dtype) with a bf16 int8 draft, and with a float32 draft
    for draft_dtype, quant in (("bfloat16", "int8"), ("float32", "none")):
        pair = specdec.load(str(target), draft=str(draft), dtype="float32", draft_dtype=draft_dtype,
                            draft_quant=quant, progress=False)
        assert pair.target.dtype == torch.float32 and pair.draft.dtype == getattr(torch, draft_dtype)
        for prompt in PROMPTS:
            ar = pair.generate(prompt, chat=False, policy="ar", max_new_tokens=40)
            for drafter in ("model", "pld", "model+pld"):
                out = pair.generate(prompt, chat=False, policy="lossless", drafter=drafter, k="auto", max_new_tokens=40)
                assert out.token_ids == ar.token_ids, (draft_dtype, drafter, prompt)
                assert len(out.stats.k_chosen) == out.stats.rounds and out.stats.k == "auto"
                assert "auto (mean" in out.stats.summary()


def test_k_auto_chooses_plain_steps_when_the_draft_costs_as_much_as_the_target(tiny_dirs):
    target, _ = tiny_dirs
    # the draft *is* the target: a draft step costs a target step, so K=0 wins (bar probes)
    pair = specdec.load(str(target), draft=str(target), dtype="float32", progress=False)
    pair.engine.target_costs = linear(0.01)
    pair.engine.draft_costs = linear(0.01)
    out = pair.generate("hello world", chat=False, max_new_tokens=60)
    assert out.stats.k_chosen.count(0) > len(out.stats.k_chosen) / 2
    assert out.token_ids == pair.generate("hello world", chat=False, policy="ar", max_new_tokens=60).token_ids
    pair.engine.caches.controllers.clear()
    short = pair.generate("hello again", chat=False, max_new_tokens=10)
    assert set(short.stats.k_chosen) == {0} and pair.draft.tokens == []  # never drafted: the draft's prefill never ran


def test_dtype_auto_loads_the_measured_choice(tiny_dirs):
    target, draft = tiny_dirs
    pair = specdec.load(str(target), draft=str(draft), progress=False)
    assert pair.costs.why and "expected" in pair.costs.why
    assert set(pair.costs.candidates["target"]) == {"float32", "bfloat16"}
    assert set(pair.costs.candidates["draft"]) == {"float32", "bfloat16+int8"}
    chosen = str(pair.target.dtype).replace("torch.", "")
    assert pair.costs.target is pair.costs.candidates["target"][chosen]
    assert pair.generate("hi there", chat=False, max_new_tokens=8).token_ids


def test_kernel_choice_is_recorded_in_the_table_and_rebuilt_from_it(tiny_dirs, counting, monkeypatch):
    from specdec.models.backends.transformers import dtypes as calibrate
    from specdec.models.backends.transformers.kernels import RowPaddedLinear

    target, _ = tiny_dirs
    monkeypatch.setattr(calibrate, "choose_kernels", lambda model, lm: calibrate.set_row_padding(model, True) and ["pad1"])
    p = specdec.load(str(target), draft=None, dtype="bfloat16", progress=False)
    assert len(counting) == 1 and p.costs.target.kernels == ["pad1"]
    assert any(type(m) is RowPaddedLinear for m in p.target.model.modules())  # the model measured in place
    saved = costmodel.CostTable.from_dict(json.loads(next(costmodel.costs_dir().glob("*.json")).read_text()))
    assert saved.kernels == ["pad1"]
    monkeypatch.setattr(calibrate, "choose_kernels", lambda model, lm: pytest.fail("cached: nothing to measure"))
    again = specdec.load(str(target), draft=None, dtype="bfloat16", progress=False)
    assert len(counting) == 1 and any(type(m) is RowPaddedLinear for m in again.target.model.modules())
    ar = again.generate("hello world", chat=False, policy="ar", max_new_tokens=12)
    assert ar.token_ids and ar.stats.rounds == 12


def test_a_cached_table_of_an_older_format_is_measured_again(tiny_dirs, counting):
    target, _ = tiny_dirs
    specdec.load(str(target), draft=None, dtype="float32", progress=False)
    path = next(costmodel.costs_dir().glob("*.json"))
    old = json.loads(path.read_text())
    old["format"] = 2
    old.pop("kernels")
    path.write_text(json.dumps(old))
    specdec.load(str(target), draft=None, dtype="float32", progress=False)
    assert len(counting) == 2 and json.loads(path.read_text())["format"] == costmodel.FORMAT


# ------------------------------------------------------------------------ wide passes at a long context
def test_wide_passes_are_measured_after_a_long_context_and_kept_in_the_stored_table():
    from specdec.models.backends.transformers.model import HFModel
    from specdec.models.costmodel.timing import _wide
    from tinymodels import tiny_model

    lm = HFModel(tiny_model(3))
    wide = _wide(lm, 8, context=40, widths=(1, 4, 16))
    assert wide["wide_context"] == 40 and wide["wide_widths"] == [1, 4, 16]
    assert all(b >= a > 0 for a, b in zip(wide["wide_seconds"], wide["wide_seconds"][1:]))
    assert lm.tokens == []  # the cache is left empty
    assert _wide(lm, 8, context=10 ** 6) is None  # longer than the model's context: not measured
    table = costmodel.CostTable("m", "float32", [1, 2, 4], [0.01, 0.015, 0.02], 8, **wide)
    again = costmodel.CostTable.from_dict(json.loads(json.dumps(table.to_dict())))
    assert again.wide_widths == [1, 4, 16] and again.widest == 16


def test_a_stored_table_of_the_older_format_reads_without_wide_passes_and_bad_wide_fields_are_refused():
    d = costmodel.CostTable("m", "float32", [1, 2], [0.01, 0.02], 32).to_dict()
    old = {k: v for k, v in d.items() if not k.startswith("wide_")} | {"format": 4}
    table = costmodel.CostTable.from_dict(old)
    assert table.wide_widths == [] and table.at_context(5000) is table and table.format == 4
    for bad in ({"wide_widths": [1, 64], "wide_seconds": [0.1], "wide_context": 1024},
                {"wide_widths": [1, 64], "wide_seconds": [0.1, 0.5], "wide_context": 16},
                {"wide_widths": [1, 64], "wide_seconds": [0.1, float("nan")], "wide_context": 1024}):
        with pytest.raises(ValueError, match="wide_"):
            costmodel.CostTable.from_dict(d | bad)
