"""``specdec replay`` on trace and cost files from anyone: a malformed one is a one-line error
naming the file (never a traceback), a special file is refused rather than read (never a hang),
sizes and lengths are bounded where they are read, and no negative or non-finite time is printed."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from specdec.cli import main
from specdec.traces.trace import header, write_traces
from specdec.traces.trace_checks import MAX_TOKENS
from test_bench_hostile_folders import with_deadline
from test_replay import bf16_like, draft_table, hand_trace


@pytest.fixture
def files(tmp_path):
    """(a trace file, a cost file with the target's and the draft's tables) that replay as they are."""
    traces = tmp_path / "traces.jsonl"
    write_traces(traces, header("t", "tok", count=2), [hand_trace("1101101"), hand_trace("0111")])
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"kind": "specdec-costs", "tables": [bf16_like().to_dict(), draft_table().to_dict()]}))
    return traces, costs


def replay(traces: Path, costs: Path, capsys) -> tuple[int, str, str]:
    rc = with_deadline(lambda: main(["replay", str(traces), "--costs", str(costs), "-k", "1,2,3"]))
    out, err = capsys.readouterr()
    return rc, out, err


def refused(rc: int, err: str, *words: str) -> None:
    assert rc == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error: "), err
    for w in words:
        assert w in lines[0], lines[0]


def sane_times(out: str) -> None:
    """No negative, NaN or infinite figure in a replay's output."""
    assert not re.search(r"nan|inf|-\d", out, re.IGNORECASE), out


def test_the_files_replay_as_they_are(files, capsys):
    rc, out, err = replay(*files, capsys)
    assert rc == 0, err
    sane_times(out)


def _edit_trace(path: Path, line: int, change) -> None:
    lines = path.read_text().splitlines()
    d = json.loads(lines[line])
    change(d)
    lines[line] = json.dumps(d)
    path.write_text("\n".join(lines) + "\n")


def _set(*keys, value):
    def change(d):
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return change


#: a trace line's field, a value it must not have, and a word the one line must hold
BAD_TRACES = {
    "drafts a list": (_set("drafts", value=[1, 2]), "'drafts'"),
    "a draft a list": (_set("drafts", "d", value=[]), "draft 'd'"),
    "answer an object": (_set("answer", value={"a": 1}), "'answer'"),
    "answer of floats": (_set("answer", value=[0.5, 1, 2, 3, 4, 5, 6]), "'answer'"),
    "a stop past the answer": (_set("drafts", "d", "stops", value=[500]), "'stops'"),
    "a negative stop": (_set("drafts", "d", "stops", value=[-1]), "'stops'"),
    "top1 of 2.0": (_set("drafts", "d", "top1", value=[2.0] * 7), "'top1'"),
    "top1 of text": (_set("drafts", "d", "top1", value=["x"] * 7), "'top1'"),
    "agree a list": (_set("drafts", "d", "agree", value=[1] * 7), "'agree'"),
    "agree of other letters": (_set("drafts", "d", "agree", value="11x1101"), "'agree'"),
    "chains a list": (_set("drafts", "d", "chains", value=[[0.5, 0]]), "'chains'"),
    "a chain past the answer": (_set("drafts", "d", "chains", value={"99": [[0.5, 0]]}), "'chains'"),
    "a chain of bad pairs": (_set("drafts", "d", "chains", value={"2": [[0.5, 0, 1]]}), "'chains'"),
    "view negative": (_set("drafts", "d", "view", value=-5), "'view'"),
    "view past the prompt": (_set("drafts", "d", "view", value=400), "'view'"),
    "window text": (_set("drafts", "d", "window", value="wide"), "'window'"),
    "max_new_tokens 1e18": (_set("max_new_tokens", value=1e18), "'max_new_tokens'"),
    "max_new_tokens 10^18": (_set("max_new_tokens", value=10**18), "'max_new_tokens'"),
    "max_new_tokens below the answer": (_set("max_new_tokens", value=3), "'max_new_tokens'"),
    "prompt_tokens 0": (_set("prompt_tokens", value=0), "'prompt_tokens'"),
    "prompt_tokens negative": (_set("prompt_tokens", value=-100), "'prompt_tokens'"),
    "finish_reason other": (_set("finish_reason", value=["stop"]), "'finish_reason'"),
    "target_agree text": (_set("target_agree", value="all"), "'target_agree'"),
    "sample_id a list": (_set("sample_id", value=["s"]), "'sample_id'"),
    "prompt ids of text": (_set("prompt", value=["a"] * 40), "'prompt'"),
    "a line that is a list": (lambda d: d.clear(), "no 'sample_id'"),
}


@pytest.mark.parametrize("case", list(BAD_TRACES))
def test_a_malformed_trace_line_is_one_line(files, capsys, case):
    traces, costs = files
    change, word = BAD_TRACES[case]
    _edit_trace(traces, 1, change)
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, str(traces), "line 2", word)


def test_an_answer_longer_than_the_bound_is_refused_before_any_replay(files, capsys):
    """A 12M-token answer replayed for hours; the bound is checked where the file is read."""
    traces, costs = files
    n = MAX_TOKENS + 1

    def long(d):
        d.update(answer=[1] * n, max_new_tokens=n)
        d["drafts"]["d"].update(agree="1" * n, top1=[0.9] * n, stops=[], chains={})
    _edit_trace(traces, 1, long)
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, "'answer'", str(MAX_TOKENS))


def test_a_line_nested_deep_is_one_line(files, capsys):
    traces, costs = files
    traces.write_text(traces.read_text() + "[" * 200_000 + "]" * 200_000 + "\n")
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, "line 4", "nested")


@pytest.mark.parametrize("change, word", [
    (_set("priors", value={"d": {"rates": [2.0] * 8}}), "prior"),
    (_set("priors", value={"d": {"rates": [0.5] * 8, "mean": 7}}), "prior"),
    (_set("priors", value=[1]), "'priors'"),
    (_set("stop_ids", value=["eos"]), "'stop_ids'"),
    (_set("count", value="two"), "'count'"),
], ids=["rates 2.0", "mean 7", "priors a list", "stop ids text", "count text"])
def test_a_malformed_header_is_one_line(files, capsys, change, word):
    traces, costs = files
    _edit_trace(traces, 0, change)
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, "line 1", word)


def _edit_table(path: Path, index: int, **fields) -> None:
    data = json.loads(path.read_text())
    data["tables"][index].update(fields)
    path.write_text(json.dumps(data))


BAD_TABLES = {
    "widths with 1e400": (0, {"widths": [1, 2, 1e400]}, "'widths'"),
    "zero context with a prefill": (0, {"context": 0}, "'context'"),
    "infinite seconds": (1, {"seconds": [float("inf")] * 6}, "'seconds'"),
    "seconds of text": (1, {"seconds": ["fast"] * 6}, "'seconds'"),
    "negative prefill": (0, {"prefill_seconds": -5.0}, "'prefill_seconds'"),
    "NaN slope": (0, {"context_slope": float("nan")}, "'context_slope'"),
    "negative slope": (0, {"context_slope": -0.5}, "'context_slope'"),
    "widths a string": (1, {"widths": "1,2,4"}, "'widths'"),
    "model a list": (1, {"model": ["d"]}, "'model'"),
}


@pytest.mark.parametrize("case", list(BAD_TABLES))
def test_a_malformed_cost_table_is_one_line(files, capsys, case):
    traces, costs = files
    index, fields, word = BAD_TABLES[case]
    _edit_table(costs, index, **fields)
    rc, out, err = replay(traces, costs, capsys)
    refused(rc, err, str(costs), word)
    sane_times(out)


def test_a_cost_file_whose_tables_are_no_list_is_one_line(files, capsys):
    traces, costs = files
    costs.write_text(json.dumps({"kind": "specdec-costs", "tables": {"t": bf16_like().to_dict()}}))
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, str(costs), "'tables'")


@pytest.mark.parametrize("special", ["fifo", "dev-zero"])
def test_a_special_file_in_a_costs_folder_is_refused_not_read(files, tmp_path, capsys, special):
    traces, costs = files
    folder = tmp_path / "costs"
    folder.mkdir()
    data = json.loads(costs.read_text())
    for t in data["tables"]:
        (folder / f"{t['model']}.json").write_text(json.dumps(t))
    if special == "fifo":
        os.mkfifo(folder / "x.json")
    else:
        (folder / "x.json").symlink_to("/dev/zero")
    rc, _, err = replay(traces, folder, capsys)
    refused(rc, err, "x.json", "not a regular file")


@pytest.mark.parametrize("special", ["fifo", "dev-zero"])
def test_a_special_trace_file_is_refused_not_read(files, tmp_path, capsys, special):
    _, costs = files
    path = tmp_path / "special.jsonl"
    if special == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    rc, _, err = replay(path, costs, capsys)
    refused(rc, err, "special.jsonl", "not a regular file")


def test_trace_of_a_folder_whose_run_json_is_a_fifo_is_one_line(tmp_path, capsys):
    os.mkfifo(tmp_path / "run.json")
    rc = with_deadline(lambda: main(["trace", str(tmp_path)]))
    refused(rc, capsys.readouterr().err, "not a 'specdec bench' folder")


# ---------------------------------------------------------------- headers and records a replay cannot use
@pytest.mark.parametrize("drafts, word", [
    ({"d": {"source": 5, "window": -3}}, "'source'"),
    ({"d|w-3": {"source": "d", "window": -3}}, "'window'"),
    ({"d|wall": {"source": "d", "window": "wide"}}, "'window'"),
    ({"d": {"window": 8}}, "'source'"),
    ({"d": [1]}, "the header's draft 'd'"),
    ({"e|w8": {"source": "d", "window": 8}}, "another source or window"),
], ids=["source a number, window negative", "window negative", "window text", "no source", "a list", "misnamed"])
def test_a_header_whose_drafts_are_unsound_is_refused(files, capsys, drafts, word):
    """``"drafts": {D: {"source": 5, "window": -3}}`` replayed as if sound."""
    traces, costs = files
    _edit_trace(traces, 0, _set("drafts", value=drafts))
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, "line 1", word)


def test_a_header_naming_other_drafts_than_its_traces_is_refused(files, capsys):
    traces, costs = files
    _edit_trace(traces, 0, _set("drafts", value={"m|w8": {"source": "m", "window": 8}}))
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, "line 1", "the header names the drafts 'm|w8', its traces hold 'd'")


def _with_prompts(traces: Path) -> None:
    for line in (1, 2):
        _edit_trace(traces, line, lambda d: d.update(prompt=list(range(3, 3 + d["prompt_tokens"]))))


def test_a_record_without_the_prompt_others_hold_is_refused(files, capsys):
    """One record without ``"prompt"`` silently dropped the portfolio, pld and suffix parts of the
    report (3 lines instead of 10); now the line is named, and what it lacks."""
    traces, costs = files
    _with_prompts(traces)
    rc, out, err = replay(traces, costs, capsys)
    assert rc == 0 and "portfolio" in out and "| pld |" in out, err
    _edit_trace(traces, 2, lambda d: d.pop("prompt"))
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, "line 3 has no 'prompt'", "line 2 has", "specdec trace")
    _with_prompts(traces)
    _edit_trace(traces, 1, lambda d: d.update(prompt=None))
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, "line 3 has a 'prompt'", "where line 2 has none")


def test_a_record_without_a_draft_the_others_hold_is_refused(files, capsys):
    traces, costs = files
    _edit_trace(traces, 2, lambda d: d["drafts"].update(e=d["drafts"]["d"]))
    rc, _, err = replay(traces, costs, capsys)
    refused(rc, err, "line 3 holds the drafts 'd', 'e' where line 2 holds 'd'")


def test_traces_without_prompts_say_what_the_report_leaves_out(files, capsys):
    rc, out, err = replay(*files, capsys)
    assert rc == 0, err
    assert "no prompt ids in these traces: pld, suffix and the portfolio (drafter auto) are not replayed" in out
