"""The structured-output task ``json-extraction``: JSON extraction under a JSON schema.

Prompts: the 10 Spec-Bench questions of category ``extraction`` (first user turn, from the packaged
``spec_bench/question.jsonl``) x 2 hand-written JSON schemas each = 20 samples, listed in
``data/json_extraction.json`` (see its ``about``). Each sample's prompt is the question, an optional
note (a field the schema adds, e.g. what the question's second turn asks for), the instruction and
the schema as JSON text, as a user would write it; each sample carries its schema, and every
configuration of the run (``ar`` included) decodes under it (the request's ``json_schema``) with
the file's ``layout`` added as llguidance's ``x-guidance`` options: one fixed layout (``", "`` and
``": "``, no other whitespace), so a model cannot spend its budget on whitespace.

Scoring (:func:`json_verdict`): ``json_valid`` when the output parses with ``json.loads`` and
validates against the schema (the ``jsonschema`` package, in the ``bench`` extra); an output cut by
``max_new_tokens`` before the JSON closed is invalid and counted as ``truncated``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ...errors import SpecdecError

NAME = "json-extraction"
#: the schemas, notes and instruction (hand-written for specdec; prompts from Spec-Bench)
JSON_EXTRACTION = Path(__file__).parent / "data" / "json_extraction.json"
#: the Spec-Bench category the questions come from
CATEGORY = "extraction"
INSTALL = "pip install 'specdec-rules[bench]'"


def read_task_file(path: Path) -> dict:
    """The task file (``data/json_extraction.json`` or one in its format), checked: an
    ``instruction``, a ``layout`` object and a list of ``tasks``, each with a ``name``, a
    ``schema`` object and a ``question_id`` (a Spec-Bench question) or its own ``question`` text."""
    if not path.is_file():
        raise SpecdecError(f"data file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecdecError(f"cannot read {path} as JSON: {getattr(exc, 'msg', exc)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise SpecdecError(f"{path}: expected an object with a non-empty 'tasks' list")
    if not isinstance(data.get("instruction"), str) or not isinstance(data.get("layout", {}), dict):
        raise SpecdecError(f"{path}: expected an 'instruction' string and a 'layout' object")
    for i, t in enumerate(data["tasks"]):
        ok = (isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("schema"), dict)
              and (isinstance(t.get("question_id"), int) or isinstance(t.get("question"), str)))
        if not ok:
            raise SpecdecError(f"{path}: task {i} needs a 'name', a 'schema' object and a 'question_id' or 'question'")
    return data


def first_turns(rows: list[dict]) -> dict[int, str]:
    """Spec-Bench question id -> its first user turn, for the ``extraction`` questions."""
    return {r["question_id"]: r["turns"][0] for r in rows
            if r.get("category") == CATEGORY and isinstance(r.get("turns"), list) and r["turns"]}


def prompt_text(question: str, schema: dict, instruction: str, note: str | None = None) -> str:
    """The user message: the question, the note, the instruction and the schema (``json.dumps``)."""
    parts = [question.rstrip()]
    if note:
        parts.append(note)
    parts.append(f"{instruction}\n{json.dumps(schema, ensure_ascii=False)}")
    return "\n\n".join(parts)


def task_samples(data: dict, questions: dict[int, str], source: Path, sample_type) -> list:
    """The file's tasks as chat samples (``sample_type``: :class:`~.datasets.Sample`, passed in so
    this module never imports the dataset loader that imports it) that carry their schema."""
    Sample = sample_type
    layout = dict(data.get("layout") or {})
    out = []
    for t in data["tasks"]:
        qid = t.get("question_id")
        question = t.get("question")
        if question is None:
            if qid not in questions:
                raise SpecdecError(f"{source}: task {t['name']!r} names Spec-Bench question {qid}, which is not an "
                                   f"{CATEGORY} question of the packaged question.jsonl")
            question = questions[qid]
        schema = t["schema"]
        sample_id = f"{NAME}/{qid}-{t['name']}" if qid is not None else f"{NAME}/{t['name']}"
        out.append(Sample(id=sample_id, dataset=NAME, category=CATEGORY, kind="chat",
                          question=prompt_text(question, schema, data["instruction"], t.get("note")),
                          schema=schema, constraint_schema={**schema, "x-guidance": layout} if layout else schema))
    if len({s.id for s in out}) != len(out):
        raise SpecdecError(f"{source}: two tasks share a question and a name")
    return out


def load_json_extraction(data: str | os.PathLike | None, spec_bench: Path, rows: list[dict], sample_type) -> tuple[list, str, str]:
    """(samples, source, sha256) of the task file ``data`` (default: the packaged one), with the
    questions from ``rows`` (read from ``spec_bench``); the hash covers both files."""
    from ...models.cache import sha256_file

    path = Path(data) if data else JSON_EXTRACTION
    tasks = read_task_file(path)
    samples = task_samples(tasks, first_turns(rows), path, sample_type)
    digest = hashlib.sha256(f"{sha256_file(path)}\0{sha256_file(spec_bench)}".encode()).hexdigest()
    return samples, f"{path} (questions: {spec_bench})", digest


# --------------------------------------------------------------------------- scoring


def require_jsonschema():
    """The ``jsonschema`` module, or a one-line error naming the extra that installs it."""
    try:
        import jsonschema
    except ImportError:
        raise SpecdecError(f"the json-extraction scorer needs the jsonschema package: {INSTALL}") from None
    return jsonschema


def _first_error(validator, value: Any) -> str | None:
    """The first (shallowest) schema violation of ``value``, in one short line; None when valid."""
    errors = sorted(validator.iter_errors(value), key=lambda e: (len(e.path), str(list(e.path))))
    if not errors:
        return None
    e = errors[0]
    where = "/".join(str(p) for p in e.path) or "(root)"
    return f"{where}: {e.message}"[:200]


def json_verdict(schema: dict, text: str, finish_reason: str | None) -> dict:
    """``json_valid`` (parses and validates against ``schema``), ``json_parsed``, ``truncated``
    (the budget ran out before the JSON closed) and ``json_error`` (why not valid, or None)."""
    jsonschema = require_jsonschema()
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        truncated = finish_reason == "length"
        why = "cut by max_new_tokens before the JSON closed" if truncated else f"not JSON: {getattr(exc, 'msg', exc)}"
        return {"json_valid": False, "json_parsed": False, "truncated": truncated, "json_error": why}
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)
    error = _first_error(validator, value)
    return {"json_valid": error is None, "json_parsed": True, "truncated": False, "json_error": error}
