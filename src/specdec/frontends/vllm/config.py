"""Which rule a vLLM engine and each of its requests use: the exact keys, parsed and validated.

Engine default, in vLLM's ``additional_config`` (``LLM(additional_config=...)``,
``vllm serve --additional-config '...'``)::

    {"specdec": {"policy": "fly+mars", "mars_theta": 0.9, "fly_window": 6}}

Per request, in ``SamplingParams.extra_args`` (the OpenAI server's ``vllm_xargs``, whose values
must be scalars, hence flat keys)::

    {"specdec_policy": "mars", "specdec_theta": 0.8}

``policy`` is ``lossless`` (specdec's exact rule, run through the plugin), a loose rule (``mars``,
``dropmatch``, ``typical``, ``fly``) or a ``+`` composition, or ``vllm`` (vLLM's own rejection
sampler for this request). Parameters are the policy's own, named as in specdec
(``theta`` when one rule of the policy has it, ``mars_theta`` always). A request that names the
engine's policy (or none) keeps the engine's parameters and overrides the ones it gives; a request
that names another policy gets that policy's defaults plus its own parameters (the one layering
rule of every entry point: :func:`specdec.core.request.overlay`).

Pure Python: no vLLM import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...errors import SpecdecError
from ...core.request import overlay
from ...core.verify import Policy, make_policy

#: the key of specdec's settings in vLLM's ``additional_config``
ENGINE_KEY = "specdec"
#: the prefix of specdec's keys in ``SamplingParams.extra_args``
REQUEST_PREFIX = "specdec_"
#: policy name for vLLM's own rejection sampler
VLLM_RULE = "vllm"


@dataclass(frozen=True)
class Selection:
    """A policy name and its parameters (sorted ``(name, value)`` pairs): hashable, for caching."""

    policy: str
    params: tuple = ()

    def parsed(self) -> Policy | None:
        """The specdec policy object (None for ``vllm``: vLLM's own sampler decides)."""
        return _parse(self)


_CACHE: dict[Selection, Policy | None] = {}


def _parse(sel: Selection) -> Policy | None:
    if sel not in _CACHE:
        if sel.policy == VLLM_RULE:
            if sel.params:
                raise SpecdecError(f"policy {VLLM_RULE!r} (vLLM's own rejection sampler) takes no parameters, "
                                   f"got {sorted(k for k, _ in sel.params)}")
            _CACHE[sel] = None
        else:
            policy = make_policy(sel.policy, dict(sel.params))
            if not policy.drafts:
                raise SpecdecError(f"policy {sel.policy!r} (plain decoding) is chosen by running vLLM without a "
                                   "speculative_config, not per request or in additional_config")
            _CACHE[sel] = policy
    return _CACHE[sel]


def selection(policy: Any, params: Mapping[str, Any] | None = None) -> Selection:
    """A validated :class:`Selection` (unknown policies and bad parameters raise SpecdecError)."""
    if not isinstance(policy, str) or not policy.strip():
        raise SpecdecError(f"specdec policy must be a non-empty string, got {policy!r}")
    sel = Selection(policy.strip(), tuple(sorted((params or {}).items())))
    sel.parsed()
    return sel


def engine_selection(additional_config: Any) -> Selection | None:
    """The engine's default from vLLM's ``additional_config`` (None when it has no ``specdec`` key)."""
    if not isinstance(additional_config, Mapping) or ENGINE_KEY not in additional_config:
        return None
    spec = additional_config[ENGINE_KEY]
    if not isinstance(spec, Mapping) or "policy" not in spec:
        raise SpecdecError(f"additional_config[{ENGINE_KEY!r}] must be an object with a 'policy' key, e.g. "
                           '{"policy": "fly+mars", "mars_theta": 0.9}; got ' + repr(spec))
    params = {k: v for k, v in spec.items() if k != "policy"}
    return selection(spec["policy"], params)


def request_selection(extra_args: Any, default: Selection | None) -> Selection | None:
    """The request's selection from ``SamplingParams.extra_args`` (module docstring): its own
    ``specdec_*`` keys over the engine default. None: no specdec rule for this request."""
    mine = {}
    if isinstance(extra_args, Mapping):
        mine = {k[len(REQUEST_PREFIX):]: v for k, v in extra_args.items()
                if isinstance(k, str) and k.startswith(REQUEST_PREFIX)}
    if not mine:
        return default
    name = mine.pop("policy", None)
    if name is None:
        if default is None:
            raise SpecdecError(f"request sets {sorted(REQUEST_PREFIX + k for k in mine)} but names no "
                               f"{REQUEST_PREFIX}policy and the engine has no specdec default")
        name = default.policy
    base = {"policy": default.policy, **dict(default.params)} if default is not None else {}
    params = overlay(base, {"policy": name, **mine})
    return selection(params.pop("policy"), params)


def request_args(policy: str, **params: Any) -> dict[str, Any]:
    """``SamplingParams.extra_args`` selecting ``policy`` with ``params`` for one request; validated
    here, in the caller's process (a bad value inside vLLM's engine is only logged, and the
    request falls back to vLLM's own rule)."""
    selection(policy, params)
    return {f"{REQUEST_PREFIX}policy": policy, **{f"{REQUEST_PREFIX}{k}": v for k, v in params.items()}}
