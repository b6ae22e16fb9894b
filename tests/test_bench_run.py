"""specdec bench end to end with tiny models: resumption after a crash or a kill, the output
files (results, summary, report, plots), and one-line CLI errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec.bench.running import configs as cfgs
from specdec.bench.tasks.datasets import load_dataset
from specdec.bench.tasks.prompts import build_prompt
from specdec.bench.outputs.results import ResultsFile
from specdec.bench.running.runner import Settings, run
from specdec.bench.outputs.summary import summarize
from specdec.cli import main
from specdec.errors import SpecdecError

DATA = Path(__file__).parent / "data"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models: threads only add contention on a shared CPU


class Crash(Exception):
    pass


def tiny_args(tiny_dirs):
    target, draft = tiny_dirs
    return ["--target", str(target), "--draft", str(draft), "--dtype", "float32", "--device", "cpu"]


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def test_resume_after_crash_and_torn_line(tiny_pair, tmp_path, monkeypatch):
    dataset = load_dataset("fixture")
    configs = cfgs.build_configs("ar,lossless", "model,pld", 2)
    settings = Settings(max_new_tokens=6, warmup=False, sandbox_timeout=5)
    total = len(dataset.samples) * len(configs)  # 3 x 3

    def crash_after(n):
        seen = []

        def hook(rec):
            seen.append(rec["key"])
            if len(seen) == n:
                raise Crash

        return hook

    with pytest.raises(Crash):
        run(tiny_pair, dataset, configs, [], settings, tmp_path, progress=False, on_record=crash_after(4))
    path = tmp_path / "results.jsonl"
    before = path.read_bytes()
    assert len(before.splitlines()) == 4
    first = [r["key"] for r in lines(path)]
    # samples outer, configurations inner, their order turned by one from each sample to the next
    assert first == ["Fixture/0|ar|0", "Fixture/0|lossless/model/k2|0", "Fixture/0|lossless/pld/k2|0",
                     "Fixture/1|lossless/model/k2|0"]
    # a kill in the middle of the next write leaves a torn line
    with open(path, "ab") as f:
        f.write(b'{"key": "Fixture/1|lossless/pld/k2|0", "text": "de')

    calls = []
    real = tiny_pair.generate

    def counting(*a, **kw):
        calls.append(kw.get("policy"))
        return real(*a, **kw)

    monkeypatch.setattr(tiny_pair, "generate", counting)
    records = run(tiny_pair, dataset, configs, [], settings, tmp_path, progress=False)
    assert len(calls) == total - 4  # finished samples are not redone
    assert path.read_bytes().startswith(before)  # and not rewritten
    keys = [r["key"] for r in lines(path)]
    assert len(keys) == len(set(keys)) == total == len(records)
    # a third run has nothing to do
    calls.clear()
    run(tiny_pair, dataset, configs, [], settings, tmp_path, progress=False)
    assert calls == [] and len(lines(path)) == total
    assert [r["key"] for r in lines(path)][6:] == ["Fixture/2|lossless/pld/k2|0", "Fixture/2|ar|0",
                                                   "Fixture/2|lossless/model/k2|0"]  # ar is not always first
    # lossless at T=0 agrees exactly with ar on every sample (a record made before ar's: in the summary)
    for r in lines(path):
        assert r.get("agreement", {"exact": True})["exact"] is True, r["key"]
        assert set(r) >= {"text", "token_ids", "stats", "quality", "seconds", "new_tokens"}
        assert "passed" in r["quality"]
    assert any("agreement" not in r for r in lines(path))
    rows = summarize(lines(path), [c.to_dict() for c in configs])["configs"]
    assert all(row["agreement"] == {"exact_match": 1.0, "token_agreement": 1.0, "n": 3} for row in rows.values())


def record(sample="a", config="ar", repeat=0, **extra):
    return {"key": f"{sample}|{config}|{repeat}", "sample_id": sample, "config": config, "repeat": repeat,
            "text": "x", "token_ids": [1], "new_tokens": 1, "seconds": 0.5, "stats": {}, "quality": {}, **extra}


def test_torn_and_corrupt_lines_are_discarded(tmp_path):
    path = tmp_path / "results.jsonl"
    good = record("a")
    path.write_text(json.dumps(good) + "\n" + "not json\n" + json.dumps(record("b")))  # last: no newline
    rf = ResultsFile(tmp_path)
    assert rf.load() == [good] and rf.discarded == 2
    assert rf.problems == ["line 2: not JSON", "line 3: torn (no end of line: the write never finished)"]
    assert path.read_text() == json.dumps(good) + "\n"
    rf.append(record("c"))
    rf.close()
    assert [r["key"] for r in lines(path)] == ["a|ar|0", "c|ar|0"]


@pytest.mark.parametrize("bad, why", [
    ({"key": "a|ar|0"}, "no 'sample_id'"),
    ([1, 2], "a JSON list, not an object"),
    ("just a string", "a JSON str, not an object"),
    ({**record(), "new_tokens": "7"}, "'new_tokens' is str, not int"),
    ({**record(), "repeat": True}, "'repeat' is bool"),
    ({**record(), "seconds": -1}, "'seconds' is -1"),
    ({**record(), "token_ids": [1, "2"]}, "'token_ids' holds a non-integer"),
    ({**record(), "key": "b|ar|0"}, "does not match its sample_id"),
    ({k: v for k, v in record().items() if k != "stats"}, "no 'stats'"),
    ({**record(), "step_ms": "60"}, "'step_ms' is '60'"),
    ({**record(), "step_ms": 0}, "'step_ms' is 0"),
])
def test_each_line_is_validated(tmp_path, bad, why):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(record("z")) + "\n" + json.dumps(bad) + "\n")
    rf = ResultsFile(tmp_path)
    assert [r["key"] for r in rf.load(repair=False)] == ["z|ar|0"]
    assert len(rf.problems) == 1 and rf.problems[0].startswith("line 2: ") and why in rf.problems[0], rf.problems
    assert path.read_text().count("\n") == 2  # repair=False writes nothing
    line = rf.report()
    assert line.count("\n") == 0 and "discarded 1 unusable line(s)" in line and why in line


def test_resume_with_a_key_only_line_and_a_truncated_line(tiny_pair, tmp_path, monkeypatch, capsys):
    """A line that is valid JSON holding only a key (and one cut short) made resume fail with a
    KeyError; now each is reported in one line and run again, and the rest resumes."""
    from specdec.bench.running import runner as runner_module

    # one machine speed for both runs: a tiny model's step timed on a busy CPU (two test workers on two
    # cores) can differ by more than the noise allowance, and the resume would add its speed line
    monkeypatch.setattr(runner_module, "machine_step_ms", lambda pair: 1.0)
    dataset = load_dataset("fixture")
    configs = cfgs.build_configs("ar,lossless", "pld", 2)
    settings = Settings(max_new_tokens=4, warmup=False, sandbox_timeout=5)
    total = len(dataset.samples) * len(configs)
    run(tiny_pair, dataset, configs, [], settings, tmp_path, progress=False)
    path = tmp_path / "results.jsonl"
    recs = lines(path)
    assert len(recs) == total
    victim, cut = recs[1]["key"], recs[4]
    text = "".join(json.dumps({"key": r["key"]}) + "\n" if r["key"] == victim else json.dumps(r) + "\n"
                   for r in recs if r is not cut)
    path.write_text(text + json.dumps(cut)[:40] + "\n")  # a truncated line, then the end of line
    capsys.readouterr()
    calls = []
    real = tiny_pair.generate
    monkeypatch.setattr(tiny_pair, "generate", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    records = run(tiny_pair, dataset, configs, [], settings, tmp_path, progress=False)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "discarded 2 unusable line(s)" in err, err
    assert "no 'sample_id'" in err and "not JSON" in err
    assert len(calls) == 2  # only the two bad lines are made again
    keys = [r["key"] for r in lines(path)]
    assert len(keys) == len(set(keys)) == total == len(records)
    assert victim in keys and cut["key"] in keys


def test_records_carry_the_machine_speed_and_a_resume_elsewhere_says_so(tiny_pair, tmp_path, monkeypatch, capsys):
    """Each record made by a run holds that run's one-token step time; resuming on a machine of
    another speed (or a folder made before speeds were recorded) prints one line, and the summary
    then times only the samples made at one speed."""
    from specdec.bench.running import runner as runner_module
    from specdec.bench.outputs.summary import summarize

    dataset = load_dataset("fixture")
    configs = cfgs.build_configs("ar,lossless", "pld", 2)
    settings = Settings(max_new_tokens=4, warmup=False, sandbox_timeout=5)
    run(tiny_pair, dataset, configs[:1], [], settings, tmp_path, progress=False)  # ar only, at the real speed
    recs = lines(tmp_path / "results.jsonl")
    assert all(isinstance(r["step_ms"], float) and r["step_ms"] > 0 for r in recs)
    capsys.readouterr()
    monkeypatch.setattr(runner_module, "machine_step_ms", lambda pair: 1000.0)  # "a machine much slower"
    records = run(tiny_pair, dataset, configs, [], settings, tmp_path, progress=False)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "takes 1000 ms" in err and f"folder's {len(recs)} results were made at" in err, err
    made = [r for r in lines(tmp_path / "results.jsonl") if r["config"] != "ar"]
    assert made and all(r["step_ms"] == 1000.0 for r in made)
    row = summarize(records, [c.to_dict() for c in configs])["configs"][configs[1].id]
    assert row["samples"] == len(dataset.samples) and row["speed_samples"] == 0
    assert row["time_speedup_vs_ar"] is None and row["paired"] is not None
    # records from before the probe existed are named as such
    assert runner_module.speed_warning([{"config": "ar"}], 60.0).endswith("quality uses them all")
    assert "the folder's 1 results were made before machine speeds" in runner_module.speed_warning([{}], 60.0)
    assert "of the folder's 3 results, 1 were made at 93 ms and 1 were made before" in runner_module.speed_warning(
        [{}, {"step_ms": 93.0}, {"step_ms": 61.0}], 60.0)
    assert runner_module.speed_warning([{"step_ms": 61.0}], 60.0) is None
    assert runner_module.speed_warning([{"step_ms": 61.0}], None) is None


def test_skip_leaves_generations_out_and_warm_up_covers_only_work_left(tiny_pair, tmp_path, monkeypatch):
    """``skip`` (tune's stop rule) is asked before each generation and records nothing when it says
    so; a resumed run warms up only the configurations that still have work."""
    from specdec.bench.running import runner

    dataset = load_dataset("fixture")
    configs = cfgs.build_configs("ar,lossless", "pld", 2)
    settings = Settings(max_new_tokens=4, sandbox_timeout=5)
    warmed = []
    prompts = []
    monkeypatch.setattr(runner, "warm_up", lambda pair, prompt, cs, *a, **kw: (warmed.append([c.id for c in cs]),
                                                                                prompts.append(prompt.text)))
    asked = []

    def skip(cfg, records):
        asked.append(cfg.id)
        return cfg.id != "ar"  # every setting stopped at once

    records = run(tiny_pair, dataset, configs, [], settings, tmp_path, progress=False, skip=skip)
    assert {r["config"] for r in records} == {"ar"} and len(records) == len(dataset.samples)
    assert asked.count("lossless/pld/k2") == len(dataset.samples)  # asked again at each sample
    assert warmed == [["ar", "lossless/pld/k2"]]
    texts = [build_prompt(tiny_pair.tokenizer, smp).text for smp in dataset.samples]
    assert prompts[0] == min(texts, key=len)  # the shortest prompt
    run(tiny_pair, dataset, configs, [], settings, tmp_path, progress=False)  # resume without the rule
    assert warmed[-1] == ["lossless/pld/k2"]  # ar is complete: not warmed again
    assert len(lines(tmp_path / "results.jsonl")) == 2 * len(dataset.samples)


def test_a_second_run_on_the_same_out_is_refused_while_the_first_holds_it(tiny_dirs, tmp_path, capsys):
    """``--out`` is locked (flock) while a run writes it: a second run gets one line naming the
    holder; the lock goes with its holder's process, ended normally or killed."""
    from specdec.bench.outputs.results import lock_out

    out = tmp_path / "shared"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from specdec.bench.outputs.results import lock_out\n"
         f"with lock_out({str(out)!r}):\n    print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = ["bench", "--dataset", "fixture", "--policies", "ar", "--max-new-tokens", "2", "--no-warmup",
                "--no-plots", "--out", str(out), "-q", *tiny_args(tiny_dirs)]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("specdec: error: ") and "in use by another run" in err, err
        assert f"pid {holder.pid} " in err
        assert not (out / "run.json").exists() and not (out / "results.jsonl").exists()
    finally:
        holder.kill()  # SIGKILL: no clean-up code runs
        holder.wait(timeout=30)
    with lock_out(out):  # the kernel dropped the killed holder's lock
        with pytest.raises(SpecdecError, match="in use by another run"):
            with lock_out(out):  # another open file of the same lock: refused, even in one process
                pass
    assert main(argv) == 0  # a finished run releases it too
    assert main(argv) == 0
    with lock_out(out):
        pass


def test_cli_writes_results_summary_report_and_plots(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["bench", "--dataset", "fixture", "--policies", "ar,lossless,mars", "--drafter", "model,pld",
            "--k-sweep", "2..3", "--max-new-tokens", "6", "--peers", "hf-assisted,hf-pld", "--repeats", "2",
            "--out", str(out), "-q", *tiny_args(tiny_dirs)]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    summary = json.loads(stdout.strip().splitlines()[-1])  # the last stdout line is the summary
    assert summary == json.loads((out / "summary.json").read_text())
    ids = ["ar", "lossless/model/k2", "lossless/model/k3", "lossless/pld/k2", "lossless/pld/k3", "mars/model/k2",
           "mars/model/k3", "mars/pld/k2", "mars/pld/k3", "hf-assisted", "hf-pld"]
    assert list(summary["configs"]) == ids
    assert len(lines(out / "results.jsonl")) == 3 * 2 * len(ids)
    for cid, row in summary["configs"].items():
        assert row["samples"] == 3 and row["tokens_per_second"] > 0 and row["speedup_vs_ar"] > 0, cid
        assert row["quality_metric"] == "pass@1"
        assert row["speedup_min"] <= row["speedup_vs_ar"] <= row["speedup_max"] or cid == "ar"
    assert summary["configs"]["ar"]["speedup_vs_ar"] == 1.0
    assert summary["configs"]["lossless/model/k2"]["tau"] > 1.0
    assert summary["configs"]["lossless/model/k2"]["agreement"]["exact_match"] == 1.0
    assert summary["configs"]["hf-assisted"]["agreement"]["exact_match"] == 1.0  # greedy peers match ar too
    assert summary["configs"]["hf-assisted"]["tau"] is not None
    assert set(summary["best_k"]) == {"lossless/model", "lossless/pld", "mars/model", "mars/pld"}
    assert summary["vs_lossless"]["mars/pld/k3"]["lossless"] == "lossless/pld/k3"
    env = summary["environment"]
    assert env["versions"]["torch"] and env["hardware"]["cpu_cores"] and "commit" in env["git"]
    report = (out / "report.md").read_text()
    for cid in ids:
        assert f"| {cid}" in report or f"| **{cid}**" in report
    assert "speedup vs ar" in report and "Hardware" in report and "transformers" in report
    assert "| mars/model/k2 | lossless/model/k2 |" in report  # loose rules vs lossless at the same K
    for png in ("speedup_vs_quality.png", "tau.png", "acceptance.png", "k_sweep.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["settings"]["max_new_tokens"] == 6 and len(run_json["invocations"]) == 1
    # the stored settings name the draft the run really loaded (float32: auto keeps it unquantized)
    # run.json keeps what was asked (auto is decided at load); the summary what was loaded
    assert run_json["settings"]["draft_quant"] == "auto" and summary["run"]["models"]["draft_quant"] == "none"
    assert "cpu_flags" in run_json["settings"] and summary["run"]["models"]["cost_model"]["target"]["widths"][0] == 1

    # the same command resumes (nothing to redo); different settings in the same DIR are refused
    assert main(argv) == 0
    assert len(lines(out / "results.jsonl")) == 3 * 2 * len(ids)
    capsys.readouterr()
    changed = ["7" if a == "6" else a for a in argv]  # --max-new-tokens 6 -> 7
    assert main(changed) == 2
    err = capsys.readouterr().err
    assert "different settings" in err and "max_new_tokens: 6 -> 7" in err


def test_report_only_reports_the_finished_samples_and_generates_nothing(tiny_dirs, tmp_path, capsys, monkeypatch):
    out = tmp_path / "partial"
    argv = ["bench", "--dataset", "fixture", "--policies", "ar,lossless", "--drafter", "pld", "--k", "2",
            "--max-new-tokens", "4", "--no-warmup", "--no-plots", "--out", str(out), "-q", *tiny_args(tiny_dirs)]
    monkeypatch.setattr(sys, "argv", ["pytest", "-q"])  # the process's argv is not the command main ran
    assert main(argv) == 0
    capsys.readouterr()
    # run.json records the command main was given, which --report-only then reads back
    assert json.loads((out / "run.json").read_text())["invocations"][-1]["argv"] == argv
    recs = lines(out / "results.jsonl")
    last = recs[-1]["sample_id"]
    kept = [r for r in recs if not (r["sample_id"] == last and r["config"] != "ar")]  # as if killed mid-sample
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    assert main([*argv, "--report-only"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["run"]["samples"] == 2 and summary["run"]["samples_planned"] == 3
    assert all(row["samples"] == 2 for row in summary["configs"].values())
    assert len(lines(out / "results.jsonl")) == len(kept)  # nothing generated
    assert "(partial: the 2 of 3 planned" in (out / "report.md").read_text()
    assert all(r["dtypes"] == {"target": "float32", "draft": "float32", "kernels": [], "backend": "transformers"} for r in kept if r["config"] != "ar")
    # made on another machine: reported from the folder alone (no model loaded), naming that machine
    original = (out / "run.json").read_text()
    run = json.loads(original)
    run["settings"].update(cpu="Another CPU", cpu_flags=["avx2", "avx512_bf16"], torch="9.9")
    (out / "run.json").write_text(json.dumps(run))
    import specdec.frontends.cliargs

    monkeypatch.setattr(specdec.frontends.cliargs, "load_pair",
                        lambda *a, **k: pytest.fail("--report-only loaded a model"))
    assert main([*argv, "--report-only"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert "another machine (Another CPU" in captured.err and summary["run"]["models"]["dtype"] == "float32"
    report = (out / "report.md").read_text()
    assert "Another CPU; CPU flags: avx2, avx512_bf16" in report and "torch 9.9" in report
    assert json.loads((out / "run.json").read_text()) == run  # nothing appended
    # other run settings: refused, one line
    assert main([("5" if x == "4" else x) for x in argv] + ["--report-only"]) == 2
    assert "max_new_tokens: 4 -> 5" in capsys.readouterr().err
    monkeypatch.undo()
    (out / "run.json").write_text(original)
    # with nothing finished there is nothing to report: one line, exit 2
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept if r["config"] == "ar"))
    assert main([*argv, "--report-only"]) == 2
    assert "nothing to report yet" in capsys.readouterr().err
    assert main([str(tmp_path / "none") if x == str(out) else x for x in argv] + ["--report-only"]) == 2
    assert "holds no results.jsonl" in capsys.readouterr().err and not (tmp_path / "none").exists()
    # rerun without it: resumes and completes
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run"]["samples"] == 3


def test_spec_bench_run_reports_categories_and_math(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "sb"
    argv = ["bench", "--dataset", "spec-bench:math_reasoning,qa", "--data", str(DATA / "spec_bench_mini.jsonl"),
            "--limit", "2", "--policies", "lossless", "--drafter", "pld", "--max-new-tokens", "4", "--no-warmup",
            "--no-plots", "--out", str(out), "-q", *tiny_args(tiny_dirs)]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["run"]["categories"] == {"qa": 2, "math_reasoning": 2}
    row = summary["configs"]["lossless/pld/kauto"]
    assert row["quality_metric"] == "math_accuracy" and set(row["by_category"]) == {"math_reasoning", "qa"}
    recs = lines(out / "results.jsonl")
    assert {r["category"] for r in recs} == {"qa", "math_reasoning"} and len(recs) == 8
    math = [r for r in recs if r["category"] == "math_reasoning"]
    assert all("correct" in r["quality"] for r in math)


def test_kill_at_any_moment_then_rerun_completes(tiny_dirs, tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "specdec", "bench", "--dataset", "fixture", "--policies", "ar,lossless",
           "--drafter", "model,pld", "--k-sweep", "1..2", "--max-new-tokens", "16", "--repeats", "2",
           "--no-plots", "--out", str(out), "-q", *tiny_args(tiny_dirs)]
    total = 3 * 2 * (1 + 2 * 2)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    results = out / "results.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and results.read_bytes().count(b"\n") >= 3:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    done_before = results.read_bytes().count(b"\n")
    assert 3 <= done_before < total
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert res.returncode == 0, res.stderr
    keys = [r["key"] for r in lines(results)]
    assert len(keys) == len(set(keys)) == total
    assert json.loads(res.stdout.strip().splitlines()[-1])["configs"]["lossless/model/k1"]["samples"] == 3


@pytest.mark.parametrize("extra, message", [
    (["--dataset", "mmlu"], "unknown dataset 'mmlu'"),
    (["--dataset", "spec-bench:poetry"], "unknown Spec-Bench category 'poetry'"),
    (["--policies", "ar,nosuchrule"], "configuration nosuchrule/auto/kauto"),
    (["--limit", "0"], "--limit must be an integer >= 1"),
    (["--limit=-3"], "--limit must be an integer >= 1"),
    (["--limit", "ten"], "--limit must be an integer >= 1, got 'ten'"),
    (["--k", "fast"], "--k: k (draft length) must be 'auto' or an integer in [1, 32], got 'fast'"),
    (["--policies", "ar,lossless:k=0"], "k in 'lossless:k=0': k (draft length) must be 'auto' or an integer in [1, 32]"),
    (["--k-sweep", "2-10"], "bad --k-sweep '2-10'"),
    (["--k-sweep", "10..2"], "bad --k-sweep"),
    (["--policies", "mars:theta"], "bad policy item"),
    (["--data", "/nonexistent/problems.jsonl"], "data file not found"),
    (["--peers", "vllm"], "unknown peer 'vllm'"),
    (["--repeats", "0"], "--repeats must be an integer >= 1"),
    (["--samples", "5"], "bad --samples '5'"),
    (["--config", "/nonexistent/tuned.json"], "config file '/nonexistent/tuned.json' does not exist"),
])
def test_cli_errors_are_one_line(tiny_dirs, tmp_path, capsys, extra, message):
    argv = ["bench", "--dataset", "fixture", "--out", str(tmp_path / "o"), *tiny_args(tiny_dirs), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specdec: error: ") and message in err, err
    assert not (tmp_path / "o" / "results.jsonl").exists()


def test_unwritable_out_dir_is_one_line(tiny_dirs, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["bench", "--dataset", "fixture", "--out", str(blocker / "sub"), *tiny_args(tiny_dirs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not writable" in err


def test_cli_error_from_a_real_process_has_no_traceback(tiny_dirs, tmp_path):
    res = subprocess.run([sys.executable, "-m", "specdec", "bench", "--dataset", "fixture", "--limit", "x",
                          "--out", str(tmp_path / "o"), *tiny_args(tiny_dirs)], capture_output=True, text=True,
                         timeout=120, env=ENV)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["specdec: error: --limit must be an integer >= 1, got 'x'"]
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_help_lists_the_flags():
    res = subprocess.run([sys.executable, "-m", "specdec", "bench", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0
    for flag in ("--dataset", "--limit", "--policies", "--drafter", "--k", "--k-sweep", "--max-new-tokens",
                 "--temperature", "--repeats", "--peers", "--out", "--data", "--target", "--draft-quant"):
        assert flag in res.stdout, flag
    assert os.environ.get("SPECDEC_HOME") is not None  # tests never touch the real model cache


def test_the_warm_up_is_a_caller_of_its_own(tiny_pair, tmp_path, monkeypatch):
    """What a warm-up would teach its configuration's caller (its answer, cut at a few tokens, as a
    length to expect and a text to copy) never reaches the measured samples: it runs as another caller."""
    from specdec.bench.running.runner import WARM_UP

    callers = []
    generate = tiny_pair.generate

    def spy(*args, config=None, **kwargs):
        callers.append(config.caller.name)
        return generate(*args, config=config, **kwargs)

    monkeypatch.setattr(tiny_pair, "generate", spy)
    dataset = load_dataset("fixture")
    configs = cfgs.build_configs("ar,lossless", "auto", "auto")
    run(tiny_pair, dataset, configs, [], Settings(max_new_tokens=4, sandbox_timeout=5), tmp_path, progress=False)
    ids = {c.id for c in configs}
    assert sorted(callers[:2]) == sorted(i + WARM_UP for i in ids)
    assert set(callers[2:]) == ids and len(callers[2:]) == 2 * len(dataset.samples)


def test_report_only_keeps_every_field_the_run_wrote(tiny_dirs, tmp_path, capsys, monkeypatch):
    """Re-reporting a finished folder leaves summary.json as the run wrote it (the backend, why it
    was chosen, the cost table, the resolved draft and quantization, the machine's cores and
    versions), adding only who re-reported it: what run.json does not hold is kept from the
    folder's summary.json."""
    out = tmp_path / "done"
    argv = ["bench", "--dataset", "fixture", "--limit", "2", "--policies", "ar,lossless", "--drafter", "pld",
            "--k", "2", "--max-new-tokens", "4", "--no-warmup", "--no-plots", "--out", str(out), "-q",
            *tiny_args(tiny_dirs)]
    monkeypatch.setattr(sys, "argv", ["pytest", "-q"])
    assert main(argv) == 0
    capsys.readouterr()
    before = json.loads((out / "summary.json").read_text())
    assert before["run"]["models"]["cost_model"] and before["run"]["models"]["backend"] == "transformers"
    report_only = ["bench", "--report-only", "--out", str(out), "--no-plots", "-q"]
    assert main(report_only) == 0
    after = json.loads((out / "summary.json").read_text())
    assert after["environment"].pop("reported_by") == report_only
    assert after == before
    assert main(report_only) == 0  # and again: the re-reported summary keeps them too
    again = json.loads((out / "summary.json").read_text())
    again["environment"].pop("reported_by")
    assert again == before
    # a summary.json that is not the run's (another machine's, or unreadable) lends it nothing
    before["environment"]["hardware"]["cpu"] = "Another CPU"
    (out / "summary.json").write_text(json.dumps(before))
    assert main(report_only) == 0
    assert json.loads((out / "summary.json").read_text())["run"]["models"]["cost_model"] is None
    (out / "summary.json").write_text("{not json")
    assert main(report_only) == 0
    assert json.loads((out / "summary.json").read_text())["run"]["models"]["cost_model"] is None
