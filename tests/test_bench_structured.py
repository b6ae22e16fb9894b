"""specdec bench's structured-output task (json-extraction): the dataset and its schemas, the
validity scorer, the summary and report figures (validity, truncations, mask cost), one-line
errors, and a short run on tiny random models where every configuration decodes under the schema."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from specdec.bench.running import configs as cfgs  # noqa: E402
from specdec.bench.tasks.datasets import Sample, load_dataset  # noqa: E402
from specdec.bench.tasks.jsontask import JSON_EXTRACTION, json_verdict, require_jsonschema  # noqa: E402
from specdec.bench.scoring.quality import Scorer  # noqa: E402
from specdec.bench.outputs.report import render_report  # noqa: E402
from specdec.bench.outputs.summary import summarize  # noqa: E402
from specdec.cli import main  # noqa: E402
from specdec.core.constrain import compile_constraint, constraint_from, make_guide  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from tinymodels import byte_tokenizer  # noqa: E402

TASKS = json.loads(JSON_EXTRACTION.read_text(encoding="utf-8"))
SPEC_BENCH = JSON_EXTRACTION.parent / "spec_bench" / "question.jsonl"
TOK = byte_tokenizer()
EOS = 258  # the byte tokenizer's <|im_end|>


def extraction_questions() -> dict[int, str]:
    rows = [json.loads(line) for line in SPEC_BENCH.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {r["question_id"]: r["turns"][0] for r in rows if r["category"] == "extraction"}


def grammar_accepts(constraint, text: str) -> bool:
    """Whether ``text`` then EOS is a complete output under ``constraint`` (byte tokenizer)."""
    guide = make_guide(TOK, constraint, 259, [EOS])
    ids = TOK.encode(text)
    return guide.valid_prefix([*ids, EOS]) == len(ids) + 1


# --------------------------------------------------------------------------- the dataset


def test_the_dataset_is_the_ten_extraction_questions_times_two_schemas():
    ds = load_dataset("json-extraction")
    questions = extraction_questions()
    assert len(ds.samples) == 20 and len(questions) == 10
    assert len({s.id for s in ds.samples}) == 20
    by_question: dict[int, list[Sample]] = {}
    for s in ds.samples:
        qid = int(s.id.split("/")[1].split("-")[0])
        by_question.setdefault(qid, []).append(s)
        assert s.dataset == "json-extraction" and s.category == "extraction" and s.kind == "chat"
        assert s.question.startswith(questions[qid].rstrip())  # the first turn, then the instruction
        assert json.dumps(s.schema, ensure_ascii=False) in s.question  # the schema, as a user writes it
        assert TASKS["instruction"] in s.question and "x-guidance" not in s.question
        assert s.constraint_schema == {**s.schema, "x-guidance": TASKS["layout"]}
    assert sorted(by_question) == sorted(questions)
    assert all(len(v) == 2 and v[0].schema != v[1].schema for v in by_question.values())
    assert ds.sha256 and "json_extraction.json" in ds.source
    assert [s.id for s in load_dataset("json-extraction", limit=2).samples] == [s.id for s in ds.samples[:2]]
    assert [s.id for s in load_dataset("json-extraction", positions=(4, 5)).samples] == [s.id for s in ds.samples[4:6]]


@pytest.mark.parametrize("task", TASKS["tasks"], ids=lambda t: f"{t.get('question_id')}-{t['name']}")
def test_each_schema_compiles_and_tells_its_example_from_its_counterexample(task):
    schema = task["schema"]
    jsonschema.Draft202012Validator.check_schema(schema)
    constraint = constraint_from(json_schema={**schema, "x-guidance": TASKS["layout"]})
    assert compile_constraint(TOK, constraint).n_vocab == 259
    example, counter = json.dumps(task["example"], ensure_ascii=False), json.dumps(task["counterexample"])
    assert json_verdict(schema, example, "stop") == {"json_valid": True, "json_parsed": True, "truncated": False,
                                                     "json_error": None}
    bad = json_verdict(schema, counter, "stop")
    assert bad["json_parsed"] and not bad["json_valid"] and bad["json_error"]
    # the grammar agrees: the example in the fixed layout (json.dumps's) is a complete output, the
    # counterexample is not, nor is the example in another layout (the model cannot pad with whitespace)
    assert grammar_accepts(constraint, example)
    assert not grammar_accepts(constraint, counter)
    assert not grammar_accepts(constraint, json.dumps(task["example"], indent=2))


def test_a_task_file_given_with_data_is_checked(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"instruction": "JSON:", "layout": {}, "tasks": [
        {"name": "mine", "question": "Name a colour.", "schema": {"type": "object"}}]}))
    ds = load_dataset("json-extraction", data=path)
    assert [s.id for s in ds.samples] == ["json-extraction/mine"]
    assert ds.samples[0].question == 'Name a colour.\n\nJSON:\n{"type": "object"}'
    assert ds.samples[0].constraint_schema == {"type": "object"}
    path.write_text(json.dumps({"instruction": "JSON:", "tasks": [{"name": "x", "question_id": 1, "schema": {}}]}))
    with pytest.raises(SpecdecError, match="names Spec-Bench question 1, which is not an extraction question"):
        load_dataset("json-extraction", data=path)
    path.write_text(json.dumps({"instruction": "JSON:", "tasks": [{"name": "x", "schema": {}}]}))
    with pytest.raises(SpecdecError, match="task 0 needs a 'name', a 'schema' object and a 'question_id'"):
        load_dataset("json-extraction", data=path)
    path.write_text("{not json")
    with pytest.raises(SpecdecError, match="cannot read .* as JSON"):
        load_dataset("json-extraction", data=path)


# --------------------------------------------------------------------------- scoring

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}},
          "required": ["n"], "additionalProperties": False}


@pytest.mark.parametrize("text, finish, valid, parsed, truncated", [
    ('{"n": 3}', "stop", True, True, False),
    ('{"n": 3}', "length", True, True, False),  # closed exactly at the budget: complete, not truncated
    ('{"n": 9}', "stop", False, True, False),  # parses, violates maximum
    ('{"n": 3, "m": 1}', "stop", False, True, False),  # additionalProperties false
    ('[3]', "stop", False, True, False),
    ('{"n": 3', "length", False, False, True),  # the budget ran out before the JSON closed
    ('{"n": 3', "stop", False, False, False),  # not JSON, not for want of tokens
    ('', "length", False, False, True),
])
def test_the_verdict(text, finish, valid, parsed, truncated):
    v = json_verdict(SCHEMA, text, finish)
    assert (v["json_valid"], v["json_parsed"], v["truncated"]) == (valid, parsed, truncated)
    assert (v["json_error"] is None) == valid


def test_the_scorer_counts_valid_invalid_and_truncated():
    sample = Sample(id="s", dataset="json-extraction", category="extraction", kind="chat", question="q",
                    schema=SCHEMA)
    outputs = [('{"n": 1}', "stop"), ('{"n": 5}', "stop"), ('{"n": 0}', "stop"), ('{"n"', "length"),
               ('{"n": 2', "length"), ('{"x": 2}', "stop")]
    verdicts = [Scorer().score(sample, text, finish) for text, finish in outputs]
    assert sum(v["json_valid"] for v in verdicts) == 2
    assert sum(not v["json_valid"] for v in verdicts) == 4
    assert sum(v["truncated"] for v in verdicts) == 2
    plain = Sample(id="w", dataset="spec-bench", category="writing", kind="chat", question="q")
    assert Scorer().score(plain, '{"n": 1}') == {}  # no schema, no JSON verdict


def test_a_missing_jsonschema_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "jsonschema", None)
    with pytest.raises(SpecdecError) as exc:
        require_jsonschema()
    assert str(exc.value).count("\n") == 0 and "pip install 'specdec-rules[bench]'" in str(exc.value)
    with pytest.raises(SpecdecError, match="needs the jsonschema package"):
        json_verdict(SCHEMA, "{}", "stop")


# --------------------------------------------------------------------------- summary and report

AR = {"id": "ar", "kind": "specdec", "policy": "ar", "drafter": None, "k": None, "params": {}, "backend": None}
LL = {"id": "lossless/model/k3", "kind": "specdec", "policy": "lossless", "drafter": "model", "k": 3, "params": {},
      "backend": None}


def rec(sample, config, text, finish, tokens, seconds, stats, constraint="json_schema"):
    r = {"key": f"{sample}|{config}|0", "sample_id": sample, "config": config, "repeat": 0, "category": "extraction",
         "text": text, "token_ids": list(range(tokens)), "new_tokens": tokens, "seconds": seconds, "stats": stats,
         "finish_reason": finish, "quality": json_verdict(SCHEMA, text, finish)}
    if constraint:
        r["constraint"] = constraint
    return r


def engine_stats(rounds, verify, mask=None, draft=0.0, draft_mask=None, accepted=0):
    s = {"rounds": rounds, "accepted": accepted, "verify_seconds": verify, "draft_seconds": draft,
         "total_seconds": verify + draft}
    if mask is not None:
        s["mask_seconds"] = mask
    if draft_mask is not None:
        s["draft_mask_seconds"] = draft_mask
    return s


def test_summary_reports_validity_truncations_and_the_mask_cost():
    records = [
        rec("A", "ar", '{"n": 1}', "stop", 10, 1.0, engine_stats(10, 0.8, mask=0.02)),
        rec("B", "ar", '{"n": 1', "length", 10, 1.0, engine_stats(10, 0.8, mask=0.02)),
        rec("A", "lossless/model/k3", '{"n": 1}', "stop", 10, 0.5,
            engine_stats(4, 0.4, mask=0.01, draft=0.1, draft_mask=0.02, accepted=6)),
        rec("B", "lossless/model/k3", '{"n": 9}', "stop", 10, 0.5,
            engine_stats(4, 0.4, mask=0.01, draft=0.1, draft_mask=0.02, accepted=6)),
    ]
    s = summarize(records, [AR, LL])
    ar, ll = s["configs"]["ar"]["structured"], s["configs"]["lossless/model/k3"]["structured"]
    assert (ar["n"], ar["valid"], ar["truncated"], ar["validity"]) == (2, 1, 1, 0.5)
    assert (ll["n"], ll["valid"], ll["truncated"]) == (2, 1, 0)
    assert ar["mask_ms_per_pass"] == pytest.approx(1000 * 0.04 / 20) and ar["mask_share"] == pytest.approx(0.04 / 1.6)
    assert ll["mask_ms_per_pass"] == pytest.approx(1000 * 0.02 / 8) and ll["mask_share"] == pytest.approx(0.02 / 0.8)
    assert ll["draft_mask_ms_per_pass"] == pytest.approx(1000 * 0.04 / 8)
    assert ll["draft_mask_share"] == pytest.approx(0.04 / 0.2)
    assert ll["same_text_as_ar"] == 0.5 and ar["same_text_as_ar"] == 1.0
    assert ll["speedup_vs_ar_same_backend"] == pytest.approx(2.0) and ll["vs_ar"] == "ar"
    row = s["configs"]["lossless/model/k3"]
    assert row["quality_metric"] == "json_validity" and row["quality"] == 0.5 and row["tau"] == pytest.approx(2.5)
    assert row["paired"]["n"] == 2  # validity against ar's, sample by sample

    report = render_report(report_summary(s))
    assert "### Structured output (JSON schema)" in report
    assert "| lossless/model/k3 | 1/2 (50.0%) | 0 | 50.0% | 20.0 | 2.00x | 2.50 | 2.500 | 2.5% | 5.000 |" in report
    assert "mask ms / verify pass" in report and "Structured output: every configuration decodes" in report


def test_mask_figures_are_none_where_the_engine_does_not_record_them():
    records = [rec("A", "ar", '{"n": 1}', "stop", 10, 1.0, engine_stats(10, 0.8)),
               rec("A", "lossless/model/k3", '{"n": 1}', "stop", 10, 0.5, engine_stats(4, 0.4, accepted=6))]
    st = summarize(records, [AR, LL])["configs"]["lossless/model/k3"]["structured"]
    assert st["mask_ms_per_pass"] is None and st["mask_share"] is None and st["draft_mask_share"] is None
    assert "| lossless/model/k3 | 1/1 (100.0%) |" in render_report(report_summary(summarize(records, [AR, LL])))


def test_runs_without_a_constraint_get_no_structured_figures():
    records = [rec("A", "ar", "hi", "stop", 2, 1.0, engine_stats(2, 0.8), constraint=None)]
    for r in records:
        r["quality"] = {}
    s = summarize(records, [AR])
    assert "structured" not in s["configs"]["ar"]
    assert "Structured output" not in render_report(report_summary(s))


def report_summary(s: dict) -> dict:
    """A summary with the run header render_report needs."""
    models = {"target": "t", "draft": "d", "draft_quant": "none", "dtype": "float32", "device": "cpu"}
    run = {"dataset": "json-extraction", "data_source": "x", "samples": 2, "samples_planned": 2, "categories": None,
           "models": models, "max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0,
           "repeats": 1, "warmup": True, "constraint": "json_schema (each sample's own)"}
    env = {"argv": ["bench"], "hardware": {"cpu": "cpu", "cpu_flags": [], "gpu": None},
           "versions": {"python": "3", "torch": "2", "transformers": "4", "specdec": "0"}, "git": {}}
    return {"run": run, "environment": env, **s}


# --------------------------------------------------------------------------- bad input


def test_configurations_that_cannot_decode_under_a_schema_are_refused_before_any_model():
    constraint = constraint_from(json_schema=SCHEMA)
    # whatever the library refuses with a constraint is refused here, naming the configuration
    with pytest.raises(SpecdecError, match="configuration ar: constraint must be a specdec.core.constrain.Constraint"):
        cfgs.check_constrained(cfgs.validate(cfgs.build_configs("ar", "model", "auto")), {"type": "object"})
    with pytest.raises(SpecdecError, match="peer hf-ar cannot decode under the dataset's JSON schema"):
        cfgs.check_constrained(cfgs.build_peers("hf-ar"), constraint)
    configs = cfgs.validate(cfgs.build_configs("ar,lossless:k=3,mars:k=3,fly,typical:k=3", "model", "auto"))
    cfgs.check_constrained(configs, constraint)  # the figures' command: every policy decodes under it
    assert [c.request_for(8, constraint).constraint for c in configs] == [constraint] * 5


@pytest.mark.parametrize("extra, message", [
    (["--dataset", "json-extration"], "choose from: humaneval, spec-bench[:category,...], json-extraction, edits, fixture"),
    (["--dataset", "json-extraction:qa"], "dataset 'json-extraction' has no categories"),
    (["--dataset", "json-extraction", "--peers", "hf-ar"], "peer hf-ar cannot decode under the dataset's JSON schema"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, extra, message):
    argv = ["bench", "--out", str(tmp_path / "o"), "--target", str(tmp_path / "none"), "--no-plots", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("specdec: error: ") and message in err, err
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- a run


@pytest.fixture(scope="module")
def long_context_pair(tmp_path_factory):
    """A tiny random target and draft with the byte tokenizer and room for the long prompts."""
    from tinymodels import perturbed_copy, tiny_model

    root = tmp_path_factory.mktemp("tiny-long")
    target = tiny_model(0, layers=1, hidden=32, max_positions=4096)
    draft = perturbed_copy(target, 0.1, 1)
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        TOK.save_pretrained(root / name)
        paths.append(root / name)
    return paths


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_bench_run_decodes_every_configuration_under_the_schema(long_context_pair, tmp_path, capsys):
    target, draft = long_context_pair
    out = tmp_path / "json"
    argv = ["bench", "--dataset", "json-extraction", "--limit", "2", "--policies", "ar,lossless,mars:k=3",
            "--drafter", "model,pld", "--k", "3", "--max-new-tokens", "24", "--no-plots", "--out", str(out), "-q",
            "--target", str(target), "--draft", str(draft), "--dtype", "float32", "--device", "cpu"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    recs = lines(out / "results.jsonl")
    ids = ["ar", "lossless/model/k3", "lossless/pld/k3", "mars/model/k3", "mars/pld/k3"]
    assert list(summary["configs"]) == ids and len(recs) == 2 * len(ids)
    samples = {s.id: s for s in load_dataset("json-extraction", limit=2).samples}
    for r in recs:
        assert r["constraint"] == "json_schema"
        assert set(r["quality"]) == {"json_valid", "json_parsed", "truncated", "json_error"}
        constraint = constraint_from(json_schema=samples[r["sample_id"]].constraint_schema)
        guide = make_guide(TOK, constraint, 259, [EOS])
        assert guide.valid_prefix(r["token_ids"]) == len(r["token_ids"]), r["text"]  # never off the grammar
        assert r["quality"]["truncated"] == (r["finish_reason"] == "length" and not r["quality"]["json_parsed"])
    for cid, row in summary["configs"].items():
        st, mine = row["structured"], [r for r in recs if r["config"] == cid]
        assert st["n"] == 2 and st["valid"] == sum(r["quality"]["json_valid"] for r in mine), cid
        assert st["truncated"] == sum(r["quality"]["truncated"] for r in mine)
        assert row["quality_metric"] == "json_validity" and st["speedup_vs_ar_same_backend"] > 0
        recorded = all("mask_seconds" in r["stats"] for r in mine)
        assert (st["mask_share"] is not None) == recorded  # read defensively: None until the engine records it
    for cid in ("lossless/model/k3", "lossless/pld/k3"):  # greedy lossless under the grammar is constrained ar
        assert summary["configs"][cid]["structured"]["same_text_as_ar"] == 1.0
    assert summary["run"]["constraint"] and summary["run"]["dataset"] == "json-extraction"
    report = (out / "report.md").read_text()
    assert "### Structured output (JSON schema)" in report and "| valid | truncated |" in report
    assert main(argv) == 0  # resumes: nothing to redo
    assert len(lines(out / "results.jsonl")) == 2 * len(ids)
