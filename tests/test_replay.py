"""Traces and replay: a replay of a trace redoes the engine's rounds exactly (fixed K and k=auto,
the same controller code), the oracle is the best schedule (against brute force on hand-made
traces), and bad trace files are one-line errors."""

from __future__ import annotations

import functools
import json

import pytest

from specdec.core.autok import AutoK, Fixed
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.models.costmodel import CostTable
from specdec.core.engine import DecodeConfig, Engine
from specdec.errors import SpecdecError
from specdec.traces.replay import Clock, oracle, replay
from specdec.traces.trace import DraftTrace, Trace, header, read_traces, trace_answer, write_traces
from tinymodels import perturbed_copy, tiny_model

WIDTHS = list(range(1, 18)) + [24, 32]


def bf16_like(step=0.100, per_token=0.008) -> CostTable:
    """A 16-bit target on a CPU with native bf16: wide passes cost little more than one token."""
    return CostTable("t", "bf16", WIDTHS, [step + per_token * (w - 1) for w in WIDTHS], context=32,
                     prefill_seconds=0.3)


def q4_like(step=0.040) -> CostTable:
    """A 4-bit target on a small CPU: each extra token costs most of a step."""
    return CostTable("t", "q4", WIDTHS, [step * (1 + 0.8 * (w - 1)) for w in WIDTHS], context=32,
                     prefill_seconds=0.45)


def draft_table(step=0.015) -> CostTable:
    return CostTable("d", "q4", [1, 2, 4, 8, 16, 32], [step, 1.6 * step, 2.5 * step, 4 * step, 6 * step, 11 * step],
                     context=32, prefill_seconds=0.12)


def tiny_pair(noise=0.05):
    target = tiny_model(7)
    return CausalLM(target), CausalLM(perturbed_copy(target, noise, 17))


@pytest.mark.parametrize("k", [1, 3, "auto"])
@pytest.mark.parametrize("window", ["all", 16])
def test_replay_redoes_the_engine_s_rounds_exactly(k, window):
    target, draft = tiny_pair()
    tt, dt = bf16_like(), draft_table()
    prompt = list(range(3, 60))
    engine = Engine(target, draft, eos_ids=[], target_costs=tt, draft_costs=dt)
    results = []
    for new in (40, 25):  # two requests in a row: k=auto's state carries over, in both
        cfg = DecodeConfig(policy="lossless", drafter="model", k=k, max_new_tokens=new,
                           drafter_params={"draft_window": window})
        out = engine.generate(prompt, cfg)
        results.append((new, out))
    policy = AutoK(tt, dt) if k == "auto" else Fixed(k)
    for new, out in results:
        trace = trace_answer(target, {"d": (draft, window, 64)}, prompt, out.token_ids, out.finish_reason, new,
                             frozenset())
        assert trace.target_agree == 1.0
        rep = replay(trace, "d", policy, Clock(tt, dt))
        assert rep.accepted_per_round == out.stats.accepted_per_round
        assert rep.rounds == out.stats.rounds and rep.drafted == out.stats.drafted
        if k == "auto":
            assert rep.k_chosen == out.stats.k_chosen
            assert sum(rep.k_chosen) > 0  # it drafted


@pytest.mark.parametrize("k", [2, "auto"])
@pytest.mark.parametrize("drafter", ["pld", "suffix"])
def test_replay_runs_drafters_without_a_model_as_the_engine_does(drafter, k):
    from specdec.traces.runs import replay_all

    target = CausalLM(tiny_model(7))
    tt = bf16_like(step=0.05, per_token=0.002)
    prompts = [[3 + i % 9 for i in range(50)], [5 + i % 7 for i in range(40)]]  # text that repeats: lookups hit
    engine = Engine(target, None, eos_ids=[], target_costs=tt)
    traces, outs = [], []
    for prompt, new in zip(prompts, (40, 30)):  # two requests in a row: k=auto's and the suffix cache's state carry over
        cfg = DecodeConfig(policy="lossless", drafter=drafter, k=k, max_new_tokens=new)
        out = engine.generate(prompt, cfg)
        outs.append(out)
        traces.append(trace_answer(target, {}, prompt, out.token_ids, out.finish_reason, new, frozenset()))
    ks = [] if k == "auto" else [k]
    rows = replay_all(traces, drafter, tt, None, ks)["prompts"]
    for row, out in zip(rows, outs):
        if k == "auto":
            assert (row["auto_rounds"], row["auto_drafted"], row["auto_accepted"]) == (
                out.stats.rounds, out.stats.drafted, out.stats.accepted)
    auto = AutoK(tt, None, drafts_with_model=False)
    from specdec.core.drafters import SuffixCache, make_drafter

    cache = SuffixCache()
    for tr, out in zip(traces, outs):
        policy = auto if k == "auto" else Fixed(k)
        rep = replay(tr, None, policy, Clock(tt), make_drafter(drafter, None, frozenset(), {}, history=cache.scope()))
        assert rep.accepted_per_round == out.stats.accepted_per_round and rep.rounds == out.stats.rounds
        assert rep.drafted == out.stats.drafted > 0


def test_a_drafter_without_a_model_needs_the_prompt_in_the_trace():
    from specdec.core.drafters import make_drafter

    trace = hand_trace("1101")
    with pytest.raises(SpecdecError, match="no prompt ids"):
        replay(trace, None, Fixed(2), Clock(bf16_like()), make_drafter("pld", None, frozenset(), {}))


def test_the_engine_s_own_seconds_are_priced_per_round_and_per_draft_token():
    trace = hand_trace("1101100111")
    t, d = bf16_like(), draft_table()
    base = replay(trace, "d", Fixed(3), Clock(t, d))
    plain = replay(trace, None, None, Clock(t, d))
    extra = Clock(t, d, step_overhead=0.001, round_overhead=0.002, token_overhead=0.0005)
    rep = replay(trace, "d", Fixed(3), extra)
    assert rep.seconds == pytest.approx(base.seconds + 0.002 * rep.rounds + 0.0005 * rep.drafted)
    assert replay(trace, None, None, extra).seconds == pytest.approx(plain.seconds + 0.001 * plain.rounds)
    assert oracle(trace, "d", extra) > oracle(trace, "d", Clock(t, d))


def test_a_long_read_measured_on_an_accelerator_prices_long_prompts():
    flat = CostTable("g", "bf16", WIDTHS, [0.016] * len(WIDTHS), context=32, prefill_seconds=0.08,
                     long_read=[512, 0.020])
    assert flat.read(1) == pytest.approx(0.016)
    assert flat.read(288) == pytest.approx(0.016 + 287 / 511 * 0.004)  # not 288 x the 32-token prefill's share
    assert CostTable.from_dict(flat.to_dict()).long_read == [512, 0.020]
    for bad in ([512], [512, -1.0], "512", [1, 0.02]):
        with pytest.raises(ValueError, match="long_read"):
            CostTable.from_dict({**flat.to_dict(), "long_read": bad})
    assert bf16_like().long_read is None and bf16_like().read(64) == pytest.approx(64 * 0.3 / 32)


def test_a_cold_engine_drafts_in_its_first_round_where_drafting_pays_and_never_where_it_cannot():
    target, draft = tiny_pair()
    prompt = list(range(3, 200))
    cfg = DecodeConfig(policy="lossless", drafter="model", k="auto", max_new_tokens=30)
    pays = Engine(target, draft, eos_ids=[], target_costs=bf16_like(), draft_costs=draft_table())
    out = pays.generate(prompt, cfg)
    assert out.stats.k_chosen[0] > 0
    flat = CostTable("t", "q4", WIDTHS, [0.04 * w for w in WIDTHS], context=32, prefill_seconds=0.45)
    never = Engine(target, draft, eos_ids=[], target_costs=flat, draft_costs=draft_table())
    out = never.generate(prompt, cfg)
    assert set(out.stats.k_chosen) == {0} and out.stats.drafted == 0


def test_short_answers_after_long_prompts_do_not_read_the_prompt_once_answers_are_known_to_be_short():
    target, draft = tiny_pair()
    engine = Engine(target, draft, eos_ids=[], target_costs=bf16_like(step=0.05), draft_costs=draft_table())
    prompt = [3 + i % 250 for i in range(400)]
    cfg = DecodeConfig(policy="lossless", drafter="model", k="auto", max_new_tokens=6,
                       drafter_params={"draft_window": "all"})
    for _ in range(3):
        out = engine.generate(prompt, cfg)
    assert out.stats.drafted == 0 and out.stats.declined_rounds > 0


# ------------------------------------------------------------------------------- the oracle
def hand_trace(agree: str, prompt=40, view=8, max_new=None) -> Trace:
    n = len(agree)
    dt = DraftTrace(view, view, [c == "1" for c in agree], [0.9 if c == "1" else 0.4 for c in agree], [False] * n, {})
    return Trace("s", prompt, list(range(n)), "stop", max_new or n + 5, {"d": dt})


def brute_force(trace: Trace, clock: Clock, k_max: int) -> float:
    """Every schedule, by recursion over (position, backlog) choices without the DP's shortcuts."""
    dt, n, prompt = trace.drafts["d"], len(trace.answer), trace.prompt_tokens

    @functools.lru_cache(maxsize=None)
    def best(t: int, b: int) -> float:
        if t >= n:
            return 0.0
        options = [clock.verify(1, prompt + t) + best(t + 1, b + 1)]
        for k in range(1, min(k_max, trace.max_new_tokens - t - 1) + 1):
            a = 0
            while a < k and t + a < n and dt.agree[t + a]:
                a += 1
            cost = clock.draft_read(b, dt.view + t) + (k - 1) * clock.draft_step(dt.view + t) + clock.verify(k + 1, prompt + t)
            options.append(cost + best(min(t + a + 1, n), 2 if a == k else 1))
        return min(options)

    return clock.prefill(prompt - 1) + best(0, dt.view)


@pytest.mark.parametrize("agree", ["1111011110", "0000000000", "1111111111111", "10", "110111011111110110"])
@pytest.mark.parametrize("target", [bf16_like(), q4_like()])
def test_the_oracle_is_the_best_schedule(agree, target):
    trace = hand_trace(agree)
    clock = Clock(target, draft_table())
    assert oracle(trace, "d", clock, k_max=6) == pytest.approx(brute_force(trace, clock, 6))
    plain = replay(trace, None, None, clock).seconds
    assert oracle(trace, "d", clock, k_max=6) <= plain + 1e-12
    for k in (1, 2, 4):
        assert oracle(trace, "d", clock, k_max=6) <= replay(trace, "d", Fixed(k), clock).seconds + 1e-12


def test_replay_of_plain_decoding_adds_one_step_per_token():
    trace = hand_trace("1111")
    t = bf16_like()
    rep = replay(trace, None, None, Clock(t))
    assert rep.rounds == 4 and rep.seconds == pytest.approx(t.read(39) + 4 * t.forward(1))


# ------------------------------------------------------------------------------- files
def test_trace_files_round_trip_and_bad_ones_are_one_line_errors(tmp_path):
    trace = hand_trace("1101")
    path = tmp_path / "t.jsonl"
    write_traces(path, header("qwen@bf16", "tok1", count=1), [trace])
    head, traces = read_traces(path, target="qwen@bf16|abc", tokenizer_fp="tok1")
    assert traces[0].drafts["d"].agree == trace.drafts["d"].agree and head["count"] == 1
    with pytest.raises(SpecdecError, match="not 'qwen-other'"):
        read_traces(path, target="qwen-other")
    with pytest.raises(SpecdecError, match="another tokenizer"):
        read_traces(path, tokenizer_fp="tok2")
    cut = tmp_path / "cut.jsonl"
    cut.write_text(path.read_text()[:-20])
    with pytest.raises(SpecdecError, match="cut short or broken"):
        read_traces(cut)
    short = tmp_path / "short.jsonl"
    short.write_text(path.read_text().splitlines()[0] + "\n")
    with pytest.raises(SpecdecError, match="cut short"):
        read_traces(short)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"hello": 1}) + "\n")
    with pytest.raises(SpecdecError, match="not a specdec trace file"):
        read_traces(other)


# ------------------------------------------------------------------------------- the commands
def bench(argv: list[str], monkeypatch) -> int:
    """``specdec bench`` as typed (its run.json records the command line)."""
    import sys

    from specdec.cli import main

    monkeypatch.setattr(sys, "argv", ["specdec", *argv])
    return main(argv)


def test_bench_then_trace_then_replay_on_tiny_models(tiny_dirs, tmp_path, capsys, monkeypatch):
    """A greedy bench folder is traced, and the traces replayed on hand-made tables: plain, fixed K,
    k=auto and the oracle, compared with the folder's own seconds; bad inputs are one-line errors."""
    from specdec.cli import main

    target, draft = tiny_dirs
    models = ["--target", str(target), "--draft", str(draft), "--dtype", "float32", "--device", "cpu"]
    out = tmp_path / "run"
    assert bench(["bench", "--dataset", "fixture", "--policies", "ar,lossless", "--drafter", "model", "--k-sweep", "2,3",
                  "--max-new-tokens", "12", "--out", str(out), "-q", "--no-plots", *models], monkeypatch) == 0
    assert main(["trace", str(out), "--windows", "auto,4"]) == 0
    head, traces = read_traces(out / "traces.jsonl")
    assert len(traces) == 3 and set(traces[0].drafts) == {f"{draft}|wauto", f"{draft}|w4"}
    assert all(t.target_agree == 1.0 for t in traces) and head["priors"][str(draft)]["rates"]
    costs = tmp_path / "costs.json"
    tables = [{**bf16_like().to_dict(), "model": f"{target}|x"}, {**draft_table().to_dict(), "model": f"{draft}|y"}]
    costs.write_text(json.dumps({"kind": "specdec-costs", "format": 1, "tables": tables}))
    capsys.readouterr()
    assert main(["replay", str(out / "traces.jsonl"), "--costs", str(costs), "-k", "2,3", "--by-category",
                 "--compare", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"| {draft}|wauto |" in text and "| lossless/model/k2 |" in text and "| ar |" in text
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**bf16_like().to_dict(), "model": "another-model|z"}))
    for argv, message in ((["--costs", str(other)], "no table for the traces' target"),
                          (["--costs", str(tmp_path / "missing.json")], "no such file or folder"),
                          (["--costs", str(costs), "-k", "0,40"], "each K must be in 1..31"),
                          (["--costs", str(costs), "--draft", "nope"], "not in the traces")):
        assert main(["replay", str(out / "traces.jsonl"), *argv]) == 2
        assert message in capsys.readouterr().err
    assert main(["trace", str(out), "--windows", "auto,-3"]) == 2
    assert "--windows: '-3' is not a positive number, auto or all" in capsys.readouterr().err
    assert main(["trace", str(tmp_path / "not-a-run")]) == 2
    assert "not a 'specdec bench' folder" in capsys.readouterr().err
    sampled = tmp_path / "sampled"
    assert bench(["bench", "--dataset", "fixture", "--policies", "ar", "--max-new-tokens", "4", "--temperature", "1",
                  "--limit", "1", "--out", str(sampled), "-q", "--no-plots", *models], monkeypatch) == 0
    assert main(["trace", str(sampled)]) == 2
    assert "greedy runs only" in capsys.readouterr().err


def test_calibrate_exports_what_replay_reads_and_an_unwritable_path_is_one_line(tiny_dirs, tmp_path, capsys):
    from specdec.cli import main

    target, draft = tiny_dirs
    models = ["--target", str(target), "--draft", str(draft), "--dtype", "float32", "--device", "cpu", "-q"]
    out = tmp_path / "costs.json"
    assert main(["calibrate", *models, "--export", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["kind"] == "specdec-costs" and {t["role"] for t in data["tables"]} == {"target", "draft"}
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["calibrate", *models, "--export", str(blocker / "costs.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--export" in err and "cannot write it" in err


def test_the_stop_threshold_policy_stops_after_a_draft_below_its_threshold():
    from specdec.traces.runs import StopBelow

    trace = hand_trace("1101111011")  # top1 0.9 where the draft agrees, 0.4 where it does not
    clock = Clock(bf16_like(), draft_table())
    one = replay(trace, "d", StopBelow(0.95), clock)
    assert set(one.k_chosen) == {1}  # every draft is below 0.95: one a round
    cut = replay(trace, "d", StopBelow(0.5), clock)
    assert all(a == k or a == k - 1 for k, a in zip(cut.k_chosen, cut.accepted_per_round))
    assert cut.drafted - cut.accepted <= one.drafted - one.accepted + cut.rounds


def test_a_bad_long_read_or_prompt_in_a_file_is_a_one_line_error(tmp_path):
    from specdec.traces.runs import read_tables

    table = {**bf16_like().to_dict(), "long_read": [512]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    with pytest.raises(SpecdecError, match="long_read"):
        read_tables([str(path)])
    trace = hand_trace("1101")
    trace.prompt = [1, 2, 3]  # 3 ids for a 40-token prompt
    bad = tmp_path / "bad.jsonl"
    write_traces(bad, header("qwen@bf16", "tok1", count=1), [trace])
    with pytest.raises(SpecdecError):
        read_traces(bad)
