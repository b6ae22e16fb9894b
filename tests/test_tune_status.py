"""specdec tune --status: a stage's table from hand-made records (states, counts, speed and time
against ar), read without writing anything."""

import json

from specdec.bench.tune import status as tune_status


def rec(config, sample, passed, tokens=10, seconds=1.0, policy=None, token_ids=None):
    return {"key": f"{sample}|{config}|0", "sample_id": sample, "config": config, "repeat": 0, "kind": "specdec",
            "policy": policy or config.split("[")[0], "drafter": None if config == "ar" else "model",
            "k": None if config == "ar" else 4, "params": {}, "new_tokens": tokens, "seconds": seconds,
            "quality": {"passed": passed}, "token_ids": token_ids or [1] * tokens, "text": "", "time": "2026-11-25T04:00:00",
            "stats": {}}


IDS = [f"s{i}" for i in range(10)]


def rows_of(lines):
    return {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines[2:]}


def test_confirm_states_counts_and_time():
    records = [rec("ar", s, i != 9) for i, s in enumerate(IDS)]  # ar solves 9 of 10
    records += [rec("same", s, i != 9, tokens=20, seconds=1.0) for i, s in enumerate(IDS)]  # all run, 2x longer
    records += [rec("lossy", s, i not in (0, 1)) for i, s in enumerate(IDS[:3])]  # lost 2 of 3
    records += [rec("fine", s, True) for s in IDS[:3]]  # none lost yet
    lines = tune_status.stage_table(records, IDS, "confirm", 0.1, 0.5)
    rows = rows_of(lines)
    assert rows["ar"][1:3] == ["10/10", "9"]
    same = rows["same"]
    assert same[1:4] == ["10/10", "9", "0 / 0"] and same[-1].startswith("qualifies")
    assert same[6] == "2.00x" and same[7] == "1.00x (2.00x)"  # twice the tokens/s, same time: longer answers
    assert rows["lossy"][1:4] == ["3/10", "1", "2 / 0"] and rows["lossy"][-1].startswith("cannot qualify")
    assert rows["fine"][-1].startswith("can still qualify")
    # before ar has run the whole split nothing is judged
    partial = rows_of(tune_status.stage_table([r for r in records if r["sample_id"] != "s9" or r["config"] != "ar"],
                                              IDS, "confirm", 0.1, 0.5))
    assert partial["fine"][-1].startswith("running (ar not complete)")


def test_validation_says_whether_the_budget_holds_so_far():
    records = [rec("ar", s, True) for s in IDS[:4]]
    records += [rec("pick", s, s != "s0") for s in IDS[:4]]
    rows = rows_of(tune_status.stage_table(records, IDS[:4], "validate", 0.02, 0.8))
    assert rows["pick"][3] == "1 / 0" and rows["pick"][-1].startswith("below budget so far")


def test_proxy_table_and_the_whole_status(tmp_path):
    proxy = tmp_path / "proxy"
    proxy.mkdir()
    records = [rec("ar", s, True, token_ids=[1, 2, 3]) for s in IDS[:2]]
    records += [rec("m", "s0", True, token_ids=[1, 2, 3]), rec("m", "s1", True, token_ids=[1, 9, 9])]
    text = "".join(json.dumps(r) + "\n" for r in records)
    (proxy / "results.jsonl").write_text(text + '{"torn": ')  # a run mid-write: the torn tail is left alone
    out = tune_status.status_markdown(tmp_path, {"proxy": IDS[:2], "confirm": IDS}, 0.02, 0.8)
    assert "## proxy (4 generations" in out and "## confirm" not in out
    assert "| m | 2/2 | 50% |" in out
    assert (proxy / "results.jsonl").read_text() == text + '{"torn": '  # nothing written
    assert "No records yet" in tune_status.status_markdown(tmp_path / "none", {"confirm": IDS}, 0.02, 0.8)
