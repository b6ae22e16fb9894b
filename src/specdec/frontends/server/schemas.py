"""Request bodies of the OpenAI endpoints (pydantic, strict types; unknown fields are refused).

Every field a body may hold is declared here, and each is either honoured or refused (400): a
field the server does not know (a speculative setting such as ``drafter`` sent at the top level,
another server's extension) is a 400 naming it, never accepted and dropped; ``null`` is the same
as leaving a field out, so an unknown field sent as ``null`` passes (clients that send back a
whole assistant message, ``"tool_calls": null`` included). :func:`unknown_field` words the error.

Strict: ``"max_tokens": "5"`` or ``1.5`` is a type error (400), not silently coerced; integers
are accepted where a number is expected. NaN and infinities are rejected. So is a lone surrogate
(``"\\ud800"``, valid JSON but not Unicode text) in any string or key of the body, unknown fields
included: no tokenizer takes one and no UTF-8 response can echo it (error type ``surrogate``).

Every list is declared with its most items where a request needs few (``stop``, ``messages``,
...) and stops at its first bad item (``fail_fast``), so however a body is shaped its validation
does bounded work and reports one error, not one per item (300 000 bad items took 15-20 s and
gigabytes). :func:`parse` reads a body; the app runs it off the event loop.
"""

from __future__ import annotations

import functools
import json
import re
from contextvars import ContextVar
from typing import Annotated, Any, Union

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from ...models import genconfig
from ...core.request import DEFAULTS
from ...core.text import surrogate_at


def _default(field: str, what: str) -> str:
    """A field's description: what it is, and the default a request that leaves it out gets."""
    if field == "max_new_tokens":
        return (f"{what}; left out: the server's default ('specdec serve --max-new-tokens'; else the answer may "
                "run to the context's end, at most --max-tokens-limit)")
    value = "random" if DEFAULTS[field] is None else DEFAULTS[field]
    model = " the model's generation_config where it sets one, else" if field in genconfig.KEYS else ""
    return f"{what}; left out: the server's default ('specdec serve' flags;{model} built in: {value})"


#: stop strings per request, and characters per stop string (each round holds back up to that
#: many characters per stop, so both bound a round's text work)
MAX_STOPS = 16
MAX_STOP_CHARS = 256
#: messages per chat request, text parts per message, stop token ids per request
MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 256
MAX_STOP_TOKEN_IDS = 256
#: the longest ``cache_salt``
MAX_SALT_CHARS = 256


def items(most: int | None = None) -> Any:
    """A list field's declaration: at most ``most`` items (None: the body size bounds it), and
    validation stops at the first bad one."""
    return Field(max_length=most, fail_fast=True)


#: token ids (a prompt, /detokenize): as many as the body holds, each checked until the first bad one
Ids = Annotated[list[int], items()]


def find_surrogate(value: Any, path: tuple = ()) -> tuple[tuple, str, int] | None:
    """``(path, text, index)`` of the first string or key in a JSON value that holds a lone
    surrogate, else None."""
    if isinstance(value, str):
        at = surrogate_at(value)
        return None if at is None else (path, value, at)
    if isinstance(value, dict):
        for key, item in value.items():
            found = find_surrogate(key, path + (key,)) if isinstance(key, str) else None
            found = found or find_surrogate(item, path + (key,))
            if found:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = find_surrogate(item, path + (i,))
            if found:
                return found
    return None


#: whether :class:`_Body` walks the data for lone surrogates: :func:`parse` turns it off for a body
#: whose text holds no surrogate escape (the walk is what a large body of small items costs most)
_SCAN: ContextVar[bool] = ContextVar("specdec_scan_surrogates", default=True)
#: a JSON escape of a UTF-16 surrogate (``\\ud800``-``\\udfff``), the only way UTF-8 JSON text can carry one
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_surrogates(cls, data: Any) -> Any:
        found = find_surrogate(data) if _SCAN.get() else None
        if found is not None:
            path, text, at = found
            field = ".".join(ascii(p)[1:-1] if isinstance(p, str) else str(p) for p in path)
            raise PydanticCustomError(
                "surrogate", "{field}: a lone surrogate ({char}) at character {at} is not Unicode text; send UTF-8",
                {"field": field, "char": ascii(text[at]), "at": at})
        if isinstance(data, dict):  # an unknown field sent as null is a field left out; any other is refused
            data = {key: value for key, value in data.items() if value is not None or key in cls.model_fields}
        return data


class StreamOptions(_Body):
    include_usage: bool = False


class _Common(_Body):
    """Fields both endpoints share. A field left out gets the server's default: the ``specdec serve``
    decoding flags, whose own defaults are :data:`specdec.core.request.DEFAULTS`. ``speculative``: absent
    = server defaults, null = plain decoding, an object = ``{policy, drafter, k, <rule or drafter
    parameters>}`` over the defaults."""

    model: str | None = None
    max_tokens: int | None = Field(None, description=_default("max_new_tokens", "generation budget in tokens"))
    temperature: float | None = Field(None, description=_default("temperature", "0 = greedy"))
    top_p: float | None = Field(None, description=_default("top_p", "nucleus sampling mass in (0, 1]"))
    top_k: int | None = Field(None, description=_default("top_k", "keep the k most likely tokens; 0 = off"))  # as in vLLM
    seed: int | None = Field(None, description=_default("seed", "sampling seed"))
    stop: Union[str, Annotated[list[str], items(MAX_STOPS)], None] = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, description=_default("presence_penalty", "in [-2, 2]"))
    frequency_penalty: float | None = Field(None, description=_default("frequency_penalty", "in [-2, 2]"))
    repetition_penalty: float | None = Field(None, description=_default("repetition_penalty", "in [0.01, 100]; 1 = off"))
    stop_token_ids: Annotated[list[int], items(MAX_STOP_TOKEN_IDS)] | None = Field(
        None, description="token ids that end the answer, as an end-of-sequence id does")
    logit_bias: dict[str, Any] | None = None
    user: str | None = None
    speculative: dict[str, Any] | None = Field(
        None, description=f"absent: the server's defaults (built in: policy {DEFAULTS['policy']}, drafter "
                          f"{DEFAULTS['drafter']}, k "
                          f"{DEFAULTS['k']}); null: plain decoding; an object: {{policy, drafter, k, <rule or "
                          "drafter parameters>} over the defaults")
    # vLLM's extra sampling fields: each changes the output, so a non-default value is refused
    # (400) rather than silently ignored (see params.VLLM_FIELDS)
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    min_p: float | None = None
    length_penalty: float | None = None
    use_beam_search: bool | None = None
    bad_words: Annotated[list[str], items()] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    guided_whitespace_pattern: str | None = None
    # structured output (server/structured.py): OpenAI's response_format, vLLM's structured_outputs
    # object and its older guided_* fields; at most one constraint per request
    response_format: dict[str, Any] | None = Field(
        None, description='{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}')
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM's: one of json (a schema), regex, choice (a list), grammar (Lark), json_object: true")
    guided_json: Any = Field(None, description="a JSON schema (an object, or its JSON text)")
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], items()] | None = None
    guided_grammar: str | None = Field(None, description="a Lark grammar (EBNF/GBNF is not accepted)")
    guided_decoding_backend: str | None = Field(None, description="accepted and ignored: llguidance always decodes")
    num_speculative_tokens: int | None = None  # vLLM's name for the draft length: an alias of speculative.k
    cache_salt: str | None = Field(
        None, min_length=1, max_length=MAX_SALT_CHARS,
        description="vLLM's: requests share the prefix cache and the suffix drafters' cache only with requests of "
                    "the same API key and the same salt (docs/server.md)")


class CompletionRequest(_Common):
    prompt: Union[str, Annotated[list[str], items()], Ids, Annotated[list[Ids], items()]]
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None


class ChatMessage(_Body):
    role: str
    content: Union[str, Annotated[list[dict[str, Any]], items(MAX_CONTENT_PARTS)], None] = None


class ChatRequest(_Common):
    messages: Annotated[list[ChatMessage], items(MAX_MESSAGES)]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None


class TokenizeRequest(_Body):
    """vLLM's ``/tokenize``: a ``prompt`` (raw text) or chat ``messages`` (through the template)."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], items(MAX_MESSAGES)] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: Ids


@functools.cache
def _speculative_names() -> frozenset[str]:
    """Every name that belongs inside ``speculative``: the policy, drafter and draft length, each
    rule's and drafter's parameters, the schedule's, and other servers' names for them."""
    from ...core.drafters import ALL_DRAFTER_OPTIONS
    from ...core.request import GENERATION_FIELDS
    from ...core.verify.policy import RULES, SCHEDULE_PARAMS, rule_params

    names = {key for key in DEFAULTS if key not in GENERATION_FIELDS}
    names |= {*ALL_DRAFTER_OPTIONS, *SCHEDULE_PARAMS, *(p for rule in RULES for p in rule_params(rule))}
    return frozenset(names | {"n_max", "p_min"})


def unknown_field(path: str) -> str:
    """The 400's message for a field no body declares: where it belongs when it is a speculative
    setting sent at the top level, else that the server refuses what it would not use."""
    path = path if len(path) <= 80 else path[:77] + "..."
    name = path.rsplit(".", 1)[-1]
    if "." not in path and name in _speculative_names():
        return (f"{name} is a speculative setting, not a top-level field; send it inside speculative "
                f'({{"speculative": {{"{name}": ...}}}})')
    return f"{path} is not a field this server takes; it is refused rather than ignored (docs/server.md lists them)"


#: the most arrays and objects a body may hold (a chat of 4096 messages with a text part each holds
#: about 12 000): parsing one allocates an object the garbage collector walks, with the interpreter
#: held throughout, so 300 000 empty ones in 1.2 MB held every thread for a quarter second, seconds
#: on a busy machine
MAX_CONTAINERS = 65536
#: a JSON string (its brackets are text, not structure)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def containers(raw: bytes) -> int:
    """How many arrays and objects the JSON text ``raw`` holds (at least; exactly when it is valid)."""
    n = raw.count(b"[") + raw.count(b"{")
    if n <= MAX_CONTAINERS:
        return n
    bare = _STRING.sub(b"", raw)
    return bare.count(b"[") + bare.count(b"{")


def _invalid(kind: str, loc: tuple, msg: str, **ctx) -> RequestValidationError:
    return RequestValidationError([{"type": kind, "loc": ("body", *loc), "msg": msg, "input": None, "ctx": ctx}])


def parse(model: type[BaseModel], raw: bytes) -> BaseModel:
    """``model`` from a request body (``RequestValidationError`` as FastAPI raises it: malformed
    JSON, nesting too deep for the parser, more than :data:`MAX_CONTAINERS` arrays and objects,
    the fields' errors). Bounded work whatever the body's
    shape (module docstring); the app runs it in a thread of its own."""
    if not raw.strip():
        raise _invalid("missing", (), "Field required")
    if containers(raw) > MAX_CONTAINERS:
        raise _invalid("too_complex", (), f"the body holds {containers(raw)} arrays and objects; at most "
                                          f"{MAX_CONTAINERS}")
    try:
        text = raw.decode("utf-8")  # strict: UTF-8 cannot encode a lone surrogate, only a \\u escape can
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid("json_invalid", (exc.pos,), "JSON decode error", error=exc.msg) from None
    except UnicodeDecodeError:
        raise _invalid("json_invalid", (), "JSON decode error", error="the body is not UTF-8") from None
    except RecursionError:
        raise _invalid("json_invalid", (), "JSON decode error", error="nested too deeply") from None
    scan = _SCAN.set(_SURROGATE_ESCAPE.search(text) is not None)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False, include_input=False)) from None
    except RecursionError:
        raise _invalid("json_invalid", (), "JSON decode error", error="nested too deeply") from None
    finally:
        _SCAN.reset(scan)
