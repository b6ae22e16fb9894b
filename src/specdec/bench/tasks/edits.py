"""``edits``: answers that copy most of their input, as edit requests do ("apply this change and
return the whole code"). Each HumanEval problem gives one task: its code (the prompt with the
canonical solution) and one of five instructions, taken in turn by the problem's position:

- ``comments``: add a short comment above each ``return`` statement;
- ``docstrings``: give every function without a docstring a one-line docstring;
- ``type-hints``: add the type hints a signature lacks;
- ``rename``: rename the entry point's first parameter (``x`` -> ``x_value``);
- ``spacing``: put one space around each binary operator and after each comma.

The answer is pre-filled with an opening ```` ```python```` fence and stops at the closing one, so
the generated text is the edited code. It is scored by the problem's own tests run on it (in the
sandbox, as HumanEval is: ``passed``) and by how much of what was meant to stay was kept
(``kept``: the share of the input's lines, compared as the instruction allows, found in order in
the answer; ``kept_all``: every one of them).
"""

from __future__ import annotations

import ast
import difflib
import re

KINDS = ("comments", "docstrings", "type-hints", "rename", "spacing")
INSTRUCTIONS = {
    "comments": "Add a short comment on its own line above each `return` statement.",
    "docstrings": "Give every function that has no docstring a one-line docstring; leave existing docstrings as "
                  "they are.",
    "type-hints": "Add type hints to every function parameter and return value that lacks one.",
    "rename": "Rename the parameter `{old}` of `{entry}` to `{new}` everywhere it is used.",
    "spacing": "Put exactly one space around each binary operator and after each comma, as PEP 8 asks.",
}
TAIL = " Do not change anything else. Answer with the whole code in one ```python block."


def code_of(row: dict) -> str:
    """A HumanEval problem's whole code: its prompt (imports, helpers, signature, docstring) and the
    canonical body."""
    return row["prompt"] + row["canonical_solution"]


def first_parameter(code: str, entry: str) -> str | None:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == entry and node.args.args:
            return node.args.args[0].arg
    return None


def edit_task(row: dict, position: int) -> tuple[str, str, dict]:
    """``(kind, instruction, details)`` of the problem at ``position`` (the kinds in turn; a
    problem whose entry point has no parameter to rename gets the next kind)."""
    kind = KINDS[position % len(KINDS)]
    code = code_of(row)
    details: dict = {}
    if kind == "rename":
        old = first_parameter(code, row["entry_point"])
        if old is None:
            kind = KINDS[(position + 1) % len(KINDS)]
        else:
            details = {"old": old, "new": f"{old}_value", "entry": row["entry_point"]}
    return kind, INSTRUCTIONS[kind].format(**details) + TAIL, details


def question(instruction: str, code: str) -> str:
    return f"{instruction}\n\n```python\n{code}```"


def _norm(kind: str, line: str) -> str:
    """A line as the instruction allows it to change: ``spacing`` compares without spaces."""
    return re.sub(r"\s+", "", line) if kind == "spacing" else line.rstrip()


def meant_to_stay(kind: str, code: str, details: dict) -> list[str]:
    """The input's lines the edit must keep (normalised by :func:`_norm`): every non-blank line,
    except the signatures for ``type-hints`` and the lines naming the renamed parameter for
    ``rename``."""
    out = []
    for line in code.splitlines():
        if not line.strip():
            continue
        if kind == "type-hints" and line.lstrip().startswith("def "):
            continue
        if kind == "rename" and re.search(rf"\b{re.escape(details['old'])}\b", line):
            continue
        out.append(_norm(kind, line))
    return out


def kept_share(kind: str, code: str, answer: str, details: dict) -> float:
    """The share of :func:`meant_to_stay`'s lines found, in order, among the answer's lines."""
    want = meant_to_stay(kind, code, details)
    if not want:
        return 1.0
    got = [_norm(kind, line) for line in answer.splitlines() if line.strip()]
    matcher = difflib.SequenceMatcher(None, want, got, autojunk=False)
    return sum(b.size for b in matcher.get_matching_blocks()) / len(want)


def edit_verdict(sample, text: str, run) -> dict:
    """Quality fields of one edit answer: ``passed``/``exec_status`` (the problem's tests on the
    edited code, through ``run(problem, program)``: the sandbox), ``kept`` and ``kept_all``."""
    problem = sample.problem
    kind, details = problem["edit_kind"], problem["edit_details"]
    res = run({**problem, "prompt": ""}, text)
    kept = kept_share(kind, sample.reference or "", text, details)
    return {"passed": res.passed, "exec_status": res.status, "sandbox": res.isolation, "kept": round(kept, 4),
            "kept_all": kept >= 1.0}
