"""Request bodies of the OpenAI endpoints (pydantic, strict types; unknown fields are ignored).

Strict: ``"max_tokens": "5"`` or ``1.5`` is a type error (400), not silently coerced; integers
are accepted where a number is expected. NaN and infinities are rejected. So is a lone surrogate
(``"\\ud800"``, valid JSON but not Unicode text) in any string or key of the body, unknown fields
included: no tokenizer takes one and no UTF-8 response can echo it (error type ``surrogate``).
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from .. import genconfig
from ..request import DEFAULTS, NO_DRAFT_MODEL_DRAFTER
from ..text import surrogate_at


def _default(field: str, what: str) -> str:
    """A field's description: what it is, and the default a request that leaves it out gets."""
    if field == "max_new_tokens":
        return (f"{what}; left out: the server's default ('specdec serve --max-new-tokens'; else the answer may "
                "run to the context's end, at most --max-tokens-limit)")
    value = "random" if DEFAULTS[field] is None else DEFAULTS[field]
    model = " the model's generation_config where it sets one, else" if field in genconfig.KEYS else ""
    return f"{what}; left out: the server's default ('specdec serve' flags;{model} built in: {value})"


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


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_surrogates(cls, data: Any) -> Any:
        found = find_surrogate(data)
        if found is not None:
            path, text, at = found
            field = ".".join(ascii(p)[1:-1] if isinstance(p, str) else str(p) for p in path)
            raise PydanticCustomError(
                "surrogate", "{field}: a lone surrogate ({char}) at character {at} is not Unicode text; send UTF-8",
                {"field": field, "char": ascii(text[at]), "at": at})
        return data


class StreamOptions(_Body):
    include_usage: bool = False


class _Common(_Body):
    """Fields both endpoints share. A field left out gets the server's default: the ``specdec serve``
    decoding flags, whose own defaults are :data:`specdec.request.DEFAULTS`. ``speculative``: absent
    = server defaults, null = plain decoding, an object = ``{policy, drafter, k, <rule or drafter
    parameters>}`` over the defaults."""

    model: str | None = None
    max_tokens: int | None = Field(None, description=_default("max_new_tokens", "generation budget in tokens"))
    temperature: float | None = Field(None, description=_default("temperature", "0 = greedy"))
    top_p: float | None = Field(None, description=_default("top_p", "nucleus sampling mass in (0, 1]"))
    top_k: int | None = Field(None, description=_default("top_k", "keep the k most likely tokens; 0 = off"))  # as in vLLM
    seed: int | None = Field(None, description=_default("seed", "sampling seed"))
    stop: Union[str, list[str], None] = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, description=_default("presence_penalty", "in [-2, 2]"))
    frequency_penalty: float | None = Field(None, description=_default("frequency_penalty", "in [-2, 2]"))
    repetition_penalty: float | None = Field(None, description=_default("repetition_penalty", "> 0; 1 = off"))
    stop_token_ids: list[int] | None = Field(None, description="token ids that end the answer, as an end-of-sequence id does")
    logit_bias: dict[str, Any] | None = None
    user: str | None = None
    speculative: dict[str, Any] | None = Field(
        None, description=f"absent: the server's defaults (built in: policy {DEFAULTS['policy']}, drafter "
                          f"{DEFAULTS['drafter']} or {NO_DRAFT_MODEL_DRAFTER} without a draft model, k "
                          f"{DEFAULTS['k']}); null: plain decoding; an object: {{policy, drafter, k, <rule or "
                          "drafter parameters>} over the defaults")
    # vLLM's extra sampling fields: each changes the output, so a non-default value is refused
    # (400) rather than silently ignored (see params.VLLM_FIELDS)
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    min_p: float | None = None
    length_penalty: float | None = None
    use_beam_search: bool | None = None
    bad_words: list[str] | None = None
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
    guided_choice: list[str] | None = None
    guided_grammar: str | None = Field(None, description="a Lark grammar (EBNF/GBNF is not accepted)")
    guided_decoding_backend: str | None = Field(None, description="accepted and ignored: llguidance always decodes")
    num_speculative_tokens: int | None = None  # vLLM's name for the draft length: an alias of speculative.k


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None


class ChatMessage(_Body):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: str
    content: Union[str, list[dict[str, Any]], None] = None


class ChatRequest(_Common):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Any] | None = None


class TokenizeRequest(_Body):
    """vLLM's ``/tokenize``: a ``prompt`` (raw text) or chat ``messages`` (through the template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]
