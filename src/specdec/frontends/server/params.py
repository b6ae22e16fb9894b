"""From a request body to the arguments of ``Pair.stream``, validated before the request queues.

Decoding parameters are the request's fields layered over the server's defaults (the ``specdec
serve`` decoding flags, whose own defaults are :data:`specdec.core.request.DEFAULTS`) by the one layering
step, :func:`specdec.core.settings.layer`; :meth:`DecodeConfig.from_options` then validates them exactly as
the library does, once, here: the worker hands the :class:`~specdec.core.request.DecodeConfig` to
``Pair.stream`` as is. Structured output (``response_format``, ``structured_outputs``,
``guided_*``) becomes the config's constraint through :mod:`.structured`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from ...draftlength import K
from ...errors import SpecdecError
from ...core.request import GENERATION_FIELDS, REQUEST_KEYWORDS, DecodeConfig
from ...core.sampling import SEED_RANGE
from ...core.settings import layer
from ...core.verify.policy import AR, SCHEDULE_PARAMS
from .errors import APIError
from .schemas import MAX_STOP_CHARS, MAX_STOPS, ChatRequest, CompletionRequest, unknown_field
from .structured import Requested, requested

#: Defaults that are sampling settings; every other default key is a speculative setting.
SAMPLING = GENERATION_FIELDS
#: Request fields mapped onto ``DecodeConfig.from_options`` keyword arguments.
_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
           "repetition_penalty": "repetition_penalty", "stop_token_ids": "stop_token_ids"}
#: Keys a ``speculative`` object may not hold: top-level fields (``logprobs``, ``stop_token_ids``,
#: structured output: each is checked where the body declares it) and ``Pair.stream``'s own arguments.
_RESERVED = ("stop", "n", "stream", "echo", "prompt", "chat", "system", "on_text", *REQUEST_KEYWORDS)
#: the longest policy or drafter name (the longest registered one is far shorter)
MAX_NAME_CHARS = 64


@dataclass
class Limits:
    """Server limits: largest ``max_tokens``, largest request body, most requests queued or running;
    for a streaming request still queued: when its headers go out and how often a keep-alive
    comment follows until its first tokens; the longest a request may take, queue included, before
    it is cancelled with a 503 (0 = no limit); the longest text ``/tokenize`` takes (characters)
    and the most ids ``/detokenize`` takes."""

    max_tokens: int = 4096
    max_body_bytes: int = 2 * 1024 * 1024
    max_queue: int = 64
    stream_wait_seconds: float = 0.5  # a streaming request not started by then gets its headers now
    keepalive_seconds: float = 10.0  # ... and an SSE comment this often until its first tokens
    request_timeout_seconds: float = 1800.0
    max_tokenize_chars: int = 256 * 1024


@dataclass
class GenRequest:
    """What the worker passes to ``Pair.stream``: ``prompt`` (text or chat messages), ``chat``,
    ``stop`` and the request's :class:`~specdec.core.request.DecodeConfig` (validated once, here);
    ``constraint_param``: the field its structured-output constraint came from (None: none)."""

    prompt: Any
    chat: bool
    stop: list[str] | None
    config: DecodeConfig
    constraint_param: str | None = None
    #: /v1/completions ``echo``: the prompt's text (and, with ``logprobs``, its tokens' log-probabilities)
    #: come before the completion's
    echo: bool = False
    #: choices to generate (OpenAI's ``n``): choice i is sampled with seed + i when a seed is given
    n: int = 1


def _finite(value: Any) -> bool:
    """False for NaN or an infinity anywhere in a JSON value (Python's parser accepts them)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def speculative(given: Any) -> dict:
    """A request's ``speculative`` object, checked (the aliases renamed, no top-level field, finite
    numbers, names and ``k`` of the right type) and not yet layered over the server's defaults."""
    given = dict(given)
    for alias, key in ALIASES.items():
        if alias in given:
            if key in given:
                raise APIError(400, f"speculative.{alias} and speculative.{key} name the same setting; send one",
                               f"speculative.{alias}")
            given[key] = given.pop(alias)
    for key in given:
        if key in SAMPLING or key in _RESERVED:
            raise APIError(400, f"speculative.{key} is a top-level request field; set it there", f"speculative.{key}")
    for key, value in given.items():
        if not _finite(value):
            raise APIError(400, f"speculative.{key} must be a finite number", f"speculative.{key}")
    for key in ("policy", "drafter"):
        if key in given and not isinstance(given[key], str):
            raise APIError(400, f"speculative.{key} must be a string", f"speculative.{key}")
        if key in given and len(given[key]) > MAX_NAME_CHARS:
            raise APIError(400, f"speculative.{key} has {len(given[key])} characters; a {key} name has at most "
                                f"{MAX_NAME_CHARS}", f"speculative.{key}")
    if "k" in given and not K.is_json(given["k"]):
        raise APIError(400, "speculative.k must be an integer or \"auto\"", "speculative.k")
    return given


#: vLLM sampling fields -> the value that leaves the output unchanged (anything else is refused)
VLLM_FIELDS = {"ignore_eos": (None, False), "min_tokens": (None, 0), "min_p": (None, 0.0), "length_penalty": (None, 1.0),
               "use_beam_search": (None, False), "bad_words": (None, []), "include_stop_str_in_output": (None, False),
               "skip_special_tokens": (None, True), "guided_whitespace_pattern": (None,)}
#: other servers' names for the draft length and confidence threshold, inside ``speculative``
#: (llama.cpp: ``speculative.n_max``/``speculative.p_min``; vLLM: ``num_speculative_tokens``)
ALIASES = {"n_max": "k", "num_speculative_tokens": "k", "p_min": "min_confidence"}


#: the most choices one request may ask for (``n``): each is a whole generation, one after another
MAX_N = 16


def _unsupported(req, chat: bool) -> None:
    if req.n is not None and not 1 <= req.n <= MAX_N:
        raise APIError(400, f"n must be in 1..{MAX_N}, got {req.n}", "n")
    if req.stream and (req.n or 1) > 1:
        raise APIError(400, "n > 1 with stream is not supported by this server; ask without stream", "n")
    checks = [("logit_bias", bool(req.logit_bias))]
    if chat:
        checks += [("tools", bool(req.tools))]
    else:
        checks += [("best_of", req.best_of not in (None, 1)), ("suffix", bool(req.suffix))]
    wants_logprobs = bool(req.logprobs) if chat else req.logprobs is not None
    if req.stream and (wants_logprobs or (not chat and req.echo)):
        raise APIError(400, f"{'echo' if not chat and req.echo else 'logprobs'} with stream is not supported by this "
                            "server; ask without stream", "stream")
    if chat and req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    for name, neutral in VLLM_FIELDS.items():
        checks.append((name, getattr(req, name) not in neutral))
    for name, bad in checks:
        if bad:
            raise APIError(400, f"{name} is not supported by this server", name)


def _prompt(req: CompletionRequest) -> str | list[int]:
    """The prompt: text, or token ids (a list of ints, or a one-element list of them, as
    lm-eval's ``local-completions`` sends by default). Ids are checked against the vocabulary by
    the library, on the worker."""
    p: Any = req.prompt  # any of its declared shapes, told apart here
    if isinstance(p, list) and p and all(isinstance(t, int) for t in p):
        return list(p)
    if isinstance(p, list):
        if len(p) != 1:
            raise APIError(400, f"send one prompt per request (got a list of {len(p)})", "prompt")
        p = p[0]
        if isinstance(p, list) and not (p and all(isinstance(t, int) for t in p)):
            raise APIError(400, "a token-id prompt must be a non-empty list of integers", "prompt")
    if not p:
        raise APIError(400, "the prompt is empty", "prompt")
    return p


def _messages(req: ChatRequest) -> list[dict]:
    if not req.messages:
        raise APIError(400, "messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(req.messages):
        content = m.content
        if isinstance(content, list):  # content parts: keep the text ones
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise APIError(400, "only text content parts are supported", f"messages.{i}.content")
                extra = next((key for key, value in part.items() if key not in ("type", "text") and value is not None),
                             None)
                if extra is not None:  # refused, not dropped (schemas' rule for every field)
                    where = f"messages.{i}.content.{j}.{extra}"[:80]
                    raise APIError(400, unknown_field(where), where)
                texts.append(part["text"])
            content = "".join(texts)
        if content is None:
            raise APIError(400, "a message needs text content", f"messages.{i}.content")
        out.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    return out


def _config_param(message: str) -> str:
    """The request field a ``DecodeConfig.from_options`` error is about (best effort, for ``error.param``)."""
    for key in ("temperature", "top_p", "top_k", "seed", "repetition_penalty", "presence_penalty",
                "frequency_penalty", "stop_token_ids"):
        if message.startswith(key):
            return key
    if message.startswith("max_new_tokens"):
        return "max_tokens"
    for prefix, param in (("unknown policy", "policy"), ("unknown drafter", "drafter"), ("k (draft", "k"),
                          *((f"{key} ", key) for key in SCHEDULE_PARAMS)):
        if message.startswith(prefix):
            return f"speculative.{param}"
    option = re.match(r"(?:drafter '[^']*'|[\w+.-]+) (\w+) must be ", message)  # "<rule or drafter> <option> must be"
    return f"speculative.{option.group(1)}" if option else "speculative"


def _max_tokens(req: CompletionRequest | ChatRequest, limits: Limits) -> int | None:
    """The request's budget (``max_completion_tokens`` first, in a chat), within the server's limit."""
    max_tokens = (req.max_completion_tokens if isinstance(req, ChatRequest) and req.max_completion_tokens is not None
                  else req.max_tokens)
    if max_tokens is not None and max_tokens < 1:
        raise APIError(400, f"max_tokens must be >= 1, got {max_tokens}", "max_tokens")
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise APIError(400, f"max_tokens is {max_tokens}, over this server's limit of {limits.max_tokens}", "max_tokens")
    return max_tokens


def _stops(req: CompletionRequest | ChatRequest) -> list[str] | None:
    """The stop strings as a list (None: none), within :data:`MAX_STOPS` and :data:`MAX_STOP_CHARS`."""
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    if stop is not None:
        if len(stop) > MAX_STOPS:
            raise APIError(400, f"at most {MAX_STOPS} stop strings", "stop")
        if any(not s for s in stop):
            raise APIError(400, "stop strings must be non-empty", "stop")
        longest = max((len(s) for s in stop), default=0)
        if longest > MAX_STOP_CHARS:
            raise APIError(400, f"a stop string has {longest} characters; at most {MAX_STOP_CHARS}", "stop")
    return stop


def _config(kwargs: dict, wanted: Requested | None) -> DecodeConfig:
    """``DecodeConfig.from_options(**kwargs)`` with the request's constraint (checked already, by
    :func:`~specdec.frontends.server.structured.requested`); a bad value is a 400 naming its field."""
    try:
        config = DecodeConfig.from_options(**kwargs)
        if wanted is not None:  # validated again with it
            config = dataclasses.replace(config, constraint=wanted.constraint)
    except SpecdecError as exc:
        raise APIError(400, str(exc), _config_param(str(exc))) from None
    except (TypeError, ValueError) as exc:  # a parameter of the wrong type reaching a policy
        raise APIError(400, f"invalid speculative parameters: {exc}", "speculative") from None
    return config


def build(req: CompletionRequest | ChatRequest, defaults: dict, limits: Limits) -> GenRequest:
    """Validate a request against the server's defaults and limits (raises :class:`APIError`). A
    structured-output constraint is checked here but compiled for the tokenizer by the app
    (:func:`~specdec.frontends.server.structured.servable`), off the event loop."""
    chat = isinstance(req, ChatRequest)
    _unsupported(req, chat)
    prompt = _messages(req) if isinstance(req, ChatRequest) else _prompt(req)
    max_tokens = _max_tokens(req, limits)
    stop = _stops(req)
    _seed(req)
    given = {key: getattr(req, name) for name, key in _FIELDS.items() if getattr(req, name) is not None}
    if max_tokens is not None:
        given["max_new_tokens"] = max_tokens
    spec = req.speculative
    if req.num_speculative_tokens is not None:  # vLLM's top-level name for the draft length
        if spec is None and "speculative" in req.model_fields_set:
            raise APIError(400, "num_speculative_tokens with speculative: null (plain decoding)", "num_speculative_tokens")
        spec = {**(spec or {}), "k": req.num_speculative_tokens}
    present = "speculative" in req.model_fields_set or req.num_speculative_tokens is not None
    base = defaults
    if present and spec is None:  # plain decoding: none of the server's speculative settings
        base, given["policy"] = {k: v for k, v in defaults.items() if k in SAMPLING}, AR
    elif present:
        given.update(speculative(spec))
    logprobs = _logprobs(req, chat)
    if logprobs is not None:
        given["logprobs"] = logprobs
    wanted = requested(req)
    return GenRequest(prompt=prompt, chat=chat, stop=stop, config=_config(layer(given, base=base), wanted),
                      constraint_param=None if wanted is None else wanted.param, echo=isinstance(req, CompletionRequest) and req.echo,
                      n=req.n or 1)


def _seed(req: CompletionRequest | ChatRequest) -> None:
    """The seed and seed + i of every choice i (``n``) must be a generator's seed (64 bits)."""
    if req.seed is None:
        return
    lo, hi = SEED_RANGE[0], SEED_RANGE[1] - ((req.n or 1) - 1)
    if not lo <= req.seed <= hi:
        with_n = f" (choice i of n={req.n} uses seed + i)" if (req.n or 1) > 1 else ""
        raise APIError(400, f"seed must be an integer in [{lo}, {hi}]{with_n}, got {req.seed}", "seed")


def _logprobs(req, chat: bool) -> int | None:
    """How many alternatives per token the request asks log-probabilities for (None: none):
    chat ``logprobs: true`` with ``top_logprobs`` N (0 without), completions ``logprobs`` N."""
    from ...core.logprobs import check_logprobs

    n = (req.top_logprobs or 0 if req.logprobs else None) if chat else req.logprobs
    try:
        return check_logprobs(n)  # the library's one range check; the error names this endpoint's field
    except SpecdecError as exc:
        raise APIError(400, str(exc), "top_logprobs" if chat else "logprobs") from None
