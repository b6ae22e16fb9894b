"""Request bodies of the OpenAI endpoints (pydantic, strict types; unknown fields are ignored).

Strict: ``"max_tokens": "5"`` or ``1.5`` is a type error (400), not silently coerced; integers
are accepted where a number is expected. NaN and infinities are rejected.
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False


class _Common(_Body):
    """Fields both endpoints share. ``speculative``: absent = server defaults, null = plain
    decoding, an object = ``{policy, drafter, k, <rule or drafter parameters>}`` over the defaults."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # an extension, as in vLLM
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    user: str | None = None
    speculative: dict[str, Any] | None = None


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
    response_format: dict[str, Any] | None = None
