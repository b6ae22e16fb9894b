"""Structured output in a request body: one :class:`~specdec.core.constrain.Constraint`, and the field it
came from (``error.param`` of every 400 about it).

Three spellings, on both endpoints (``docs/server.md``):

- OpenAI's ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``,
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` (``strict`` changes
  nothing: the output always follows the schema);
- vLLM's ``structured_outputs`` object: one of ``json`` (a schema, or its JSON text), ``regex``,
  ``choice``, ``grammar`` (Lark) or ``json_object: true``; its options that would change the output
  (``disable_any_whitespace``, ``disable_additional_properties``, ``whitespace_pattern``,
  ``structural_tag``) are refused unless at their defaults, and an unknown key is refused;
- vLLM's older top-level fields ``guided_json``, ``guided_regex``, ``guided_choice`` and
  ``guided_grammar`` (vLLM 0.32 dropped them; older clients still send them).
  ``guided_decoding_backend`` is accepted and ignored: llguidance always decodes, and the
  constraint is the same whichever backend a request names.

At most one constraint per request: two are a 400 naming both fields. :func:`requested` checks
everything that needs no tokenizer (llguidance installed, JSON, schema, regex, grammar, choices,
sizes); :func:`servable` compiles the constraint for the served tokenizer (cached), which the
app runs before the request is queued, so that even a streaming request gets its 400 as a status,
never as an error event after a 200.
"""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import dataclass
from typing import Any

from ...core.constrain import KINDS, Constraint, constraint_from, require
from ...errors import SpecdecError
from .errors import APIError

#: ``structured_outputs`` keys that name a constraint -> the ``constraint_from`` keyword
SO_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
            "json_object": "response_format"}
#: ``structured_outputs`` options -> the values that leave the output unchanged (others: 400)
SO_OPTIONS = {"disable_any_whitespace": (None, False), "disable_additional_properties": (None, False),
              "whitespace_pattern": (None,), "structural_tag": (None,)}
#: vLLM's older top-level fields -> the ``constraint_from`` keyword
GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}
#: the library's keyword at the head of its messages, replaced by the request's field name
_KEYWORD_HEAD = re.compile(r"^(json_schema|regex|choice|grammar)(?=: | is | must | lists )")
_LARK_HINT = " (a Lark grammar is expected; EBNF/GBNF is not accepted)"


@dataclass(frozen=True)
class Requested:
    """A request's constraint and the field it came from (``param``: ``guided_regex``,
    ``structured_outputs.json``, ``response_format``, ...)."""

    param: str
    constraint: Constraint


def available_kinds() -> list[str]:
    """The constraint kinds this server takes: all of them with llguidance installed, none without."""
    return list(KINDS) if importlib.util.find_spec("llguidance") is not None else []


def named(message: str, param: str) -> str:
    """A library message about a constraint, worded with the request's field: ``regex: ...`` from
    ``guided_regex`` reads ``guided_regex: ...``; a message that names no field gets it in front."""
    if _KEYWORD_HEAD.match(message):
        message = _KEYWORD_HEAD.sub(param, message, count=1)
    elif not message.startswith(param):
        message = f"{param}: {message}"
    if param.endswith("grammar") and "invalid Lark grammar" in message:
        message += _LARK_HINT
    return message


def _structured_outputs(so: dict) -> list[tuple[str, str, Any]]:
    """``(field, keyword, value)`` for each constraint a ``structured_outputs`` object names."""
    unknown = sorted(set(so) - set(SO_KINDS) - set(SO_OPTIONS))
    if unknown:
        raise APIError(400, f"structured_outputs has an unknown key {unknown[0]!r}; it takes one of "
                            f"{', '.join(SO_KINDS)}", "structured_outputs")
    for key, neutral in SO_OPTIONS.items():
        if so.get(key) not in neutral:
            param = f"structured_outputs.{key}"
            raise APIError(400, f"{param} is not supported by this server", param)
    found = []
    for key, keyword in SO_KINDS.items():
        value = so.get(key)
        if value is None:
            continue
        if key == "json_object":
            if value is not True:
                raise APIError(400, "structured_outputs.json_object must be true (or left out)",
                               "structured_outputs.json_object")
            value = {"type": "json_object"}
        found.append((f"structured_outputs.{key}", keyword, value))
    if not found:
        raise APIError(400, f"structured_outputs names no constraint; give one of {', '.join(SO_KINDS)}",
                       "structured_outputs")
    return found


def _candidates(req) -> list[tuple[str, str, Any]]:
    """``(field, constraint_from keyword, value)`` for each constraint the request names."""
    found = []
    rf = req.response_format
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
        found.append(("response_format", "response_format", rf))
    if req.structured_outputs is not None:
        found += _structured_outputs(req.structured_outputs)
    for name, keyword in GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            found.append((name, keyword, value))
    return found


def _schema(param: str, value: Any) -> dict:
    """A JSON schema given as an object or as its JSON text, as an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise APIError(400, f"{param} is not valid JSON: {exc}", param) from None
    if not isinstance(value, dict):
        raise APIError(400, f"{param} must be a JSON schema (an object), got {type(value).__name__}", param)
    return value


def requested(req) -> Requested | None:
    """The request's constraint (None: unconstrained), checked without the tokenizer; any problem is
    an :class:`APIError` 400 naming the field."""
    found = _candidates(req)
    if not found:
        return None
    if len(found) > 1:
        names = " and ".join(field for field, _, _ in found)
        raise APIError(400, f"{names}: give at most one structured-output constraint per request", found[1][0])
    (param, keyword, value), = found
    try:
        require()
    except SpecdecError as exc:  # llguidance is not installed: the message names the extra
        raise APIError(400, str(exc), param) from None
    if keyword == "json_schema":
        value = _schema(param, value)
    try:
        constraint = constraint_from(**{keyword: value})
    except SpecdecError as exc:
        raise APIError(400, named(str(exc), param), param) from None
    return None if constraint is None else Requested(param, constraint)


def servable(engine, config, param: str | None) -> None:
    """Refuse, as an :class:`APIError` 400, a request ``engine`` cannot serve, before it is queued:
    a constraint that cannot serve (no token admitted, no tokenizer or end-of-sequence id; named by
    ``param``, the request's constraint field, None without one), compiled for the tokenizer here
    (cached, so the generation reuses it); then what :meth:`specdec.core.engine.Engine.check_config`
    refuses (a drafter that needs the draft model the server did not load, token trees a backend
    cannot score, a rule that needs hidden states it lacks; ``speculative``)."""
    if param is not None:
        try:
            engine.guide_for(config)
        except SpecdecError as exc:
            raise APIError(400, named(str(exc), param), param) from None
    try:
        engine.check_config(config)
    except SpecdecError as exc:
        raise APIError(400, str(exc), "speculative") from None
