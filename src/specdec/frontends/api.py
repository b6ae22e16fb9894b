"""The Python API: ``specdec.load(...)`` -> :class:`Pair`; ``pair.generate(...)`` -> :class:`Output`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from ..models import genconfig
from ..models.bundled import DEFAULT_TARGET
from ..core.constrain import Constraints
from ..core.engine import Engine, Generation
from ..core.logprobs import TokenLogprob, check_logprobs, token_logprobs
from ..errors import SpecdecError
from ..models.backends import AUTO as AUTO_BACKEND, REGISTRY, Costs, Model, Request, resolve_device, stderr_log
from ..models.sources import AUTO as _AUTO, resolve_draft
from ..core.request import DecodeConfig, make_config
from ..core.scopes import Parked
from ..core.settings import layer
from ..core.stats import Stats
from ..core.text import StopStrings, TextStream, encode_prompt, eos_ids



@dataclass
class Output:
    """A finished generation: text (cut before any stop string), the generated token ids (through
    the EOS or stop-completing token), why it ended, and its statistics."""

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    stats: Stats
    #: with ``logprobs=N``: the target's log-probability of each of ``token_ids`` and its N most
    #: likely alternatives (:class:`specdec.core.logprobs.TokenLogprob`), else None
    logprobs: list[TokenLogprob] | None = None

    def to_dict(self) -> dict:
        out = {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "stats": self.stats.to_dict(),
        }
        if self.logprobs is not None:
            out["logprobs"] = [lp.to_dict() for lp in self.logprobs]
        return out


class Stream:
    """Iterate for text deltas as tokens are committed; ``output`` is set once iteration ends."""

    def __init__(self, chunks: Iterator[str]):
        self._chunks = chunks
        self.output: Output | None = None

    def __iter__(self) -> Iterator[str]:
        return self._chunks

    def close(self) -> None:
        """Stop generating now; the engine stops before its next round and ``output`` holds what
        was generated so far, with finish reason ``cancelled``. To stop from another thread while
        the engine is busy, pass ``should_stop`` to :meth:`Pair.stream` instead."""
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


class Pair:
    """A target model, an optional draft model that shares its tokenizer, and the engine over them."""

    def __init__(self, target: Model, tokenizer, draft: Model | None = None,
                 names: tuple[str, str | None] = ("target", None), costs: Costs | None = None,
                 backend_why: str | None = None):
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.target_name, self.draft_name = names
        self.costs = costs or Costs()
        #: which backend runs the models, and why (``backend="auto"``)
        self.backend = target.backend
        self.backend_why = backend_why
        #: the model's sampling settings a request that names none gets (:mod:`specdec.models.genconfig`;
        #: :func:`load` fills them, ``generation_config="auto"``), and where they came from
        self.sampling_defaults: dict = {}
        self.sampling_why = "none"
        self.eos_ids = eos_ids(tokenizer, target.eos_ids())
        self.engine = Engine(target, draft, self.eos_ids, target_costs=self.costs.target,
                             draft_costs=self.costs.draft, prior=self.costs.prior,
                             constraints=Constraints(tokenizer, target.vocab_limit, self.eos_ids))

    @property
    def prefix_caching(self) -> bool:
        """Whether a generation reads only the part of its prompt that the target's cache holds from
        the same caller's request before (:attr:`specdec.core.scopes.Caches.prefix_caching`). Off by
        default here, so that every generation reads its prompt whole and timings compare; ``specdec
        serve`` turns it on. Set it to True to keep what a caller's earlier request left."""
        return self.engine.caches.prefix_caching

    @prefix_caching.setter
    def prefix_caching(self, on: bool) -> None:
        if not isinstance(on, bool):
            raise SpecdecError(f"prefix_caching must be True or False, got {on!r}")
        self.engine.caches.prefix_caching = on

    @property
    def caller_cache_bytes(self) -> int:
        """Host memory for the target's cache parked per caller between its requests, all callers
        together (:class:`specdec.core.scopes.Parked`; 512 MiB by default; 0: none parked, and
        another caller's generation empties the cache). Setting it forgets the copies held."""
        return self.engine.caches.parked.budget

    @caller_cache_bytes.setter
    def caller_cache_bytes(self, budget: int) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise SpecdecError(f"caller_cache_bytes must be an integer >= 0, got {budget!r}")
        self.engine.caches.parked = Parked(budget)

    @property
    def draft_quant(self) -> str:
        """The draft's weight quantization, as its backend applied it (``"none"`` without a draft)."""
        return self.draft.quant if self.draft is not None else "none"

    # ----------------------------------------------------------------- requests
    def encode(self, prompt, chat: bool | None = None, system: str | None = None) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat=chat, system=system)

    def stream(
        self, prompt, *, stop: Sequence[str] | str | None = None, chat: bool | None = None,
        system: str | None = None, should_stop: Callable[[], bool] | None = None,
        config: DecodeConfig | str | os.PathLike | None = None, **kwargs: Any,
    ) -> Stream:
        """Like :meth:`generate`, but returns a :class:`Stream` of text deltas. All validation
        happens here, before the first delta. ``should_stop()`` is asked before every round; when
        it returns True the generation ends (finish reason ``cancelled``). ``config``: a
        :class:`DecodeConfig` already made by :func:`make_config` (instead of the keywords: it is
        used as is, not validated again), or the path of a config file (:mod:`specdec.core.configfile`,
        as ``specdec tune`` writes; keywords given next to it override its values, as
        :func:`specdec.core.settings.layer` layers them, over the model's sampling settings)."""
        if config is None or isinstance(config, (str, os.PathLike)):
            cfg = make_config(**layer(kwargs, model=self.sampling_defaults, config_file=config))
        elif kwargs:
            raise SpecdecError(f"pass either config= or decoding keywords, not both (got {sorted(kwargs)})")
        elif not isinstance(config, DecodeConfig):
            raise SpecdecError(f"config must be a DecodeConfig (specdec.make_config(...)) or a config file's path, "
                               f"got {type(config).__name__}")
        else:
            cfg = config
        # Engine.admit in its two halves: the settings before encoding (a bad request fails without
        # touching the prompt), then the prompt
        self.engine.check_config(cfg)
        prompt_ids = self.encode(prompt, chat=chat, system=system)
        self.engine.admit_prompt(cfg, prompt_ids)
        stops = StopStrings(self.tokenizer, stop)
        gen = Generation(prompt_ids)
        stream = Stream(iter(()))

        def finish() -> None:
            stream.output = Output(
                stops.final_text(gen.token_ids), list(gen.token_ids), gen.finish_reason or "cancelled",
                # stats are None only where the run failed before its first round (its error goes on up)
                len(prompt_ids), gen.stats, None if gen.logprobs is None else list(gen.logprobs),  # type: ignore[arg-type]
            )

        def chunks() -> Iterator[str]:
            text = TextStream(stops)
            rounds = self.engine.run(prompt_ids, cfg, gen, stop_check=stops if stops.stops else None,
                                     should_stop=should_stop, check=False)
            try:
                for progress in rounds:
                    delta = text.push(progress.token_ids)
                    if delta:
                        yield delta
                tail = text.flush(gen.token_ids)
                if tail:
                    yield tail
            finally:  # also when the consumer closes the stream early
                rounds.close()
                finish()

        stream._chunks = chunks()
        return stream

    def generate(
        self, prompt, *, stop: Sequence[str] | str | None = None, chat: bool | None = None,
        system: str | None = None, on_text: Callable[[str], None] | None = None,
        config: DecodeConfig | str | os.PathLike | None = None, **kwargs: Any,
    ) -> Output:
        """Generate a completion.

        prompt: a string, continued as text (as vLLM's ``LLM.generate`` and OpenAI's completions
        do; ``chat=True`` applies the chat template to it, as :meth:`chat` does), a list of chat
        messages (the chat template applied), or token ids. Keyword arguments: ``policy`` (``ar``,
        ``lossless`` or a loose rule: :mod:`specdec.core.verify`), ``drafter`` (a name in
        :data:`specdec.core.drafters.DRAFTERS`; default ``auto``, the portfolio), ``k``, ``max_new_tokens``, ``temperature``,
        ``top_p``, ``top_k``, ``seed``, ``stop``, ``system``, ``on_text`` (called with each text
        delta), drafter options ``ngram_max``/``ngram_min``, the policy's own parameters, and
        structured output: one of ``response_format``, ``json_schema``, ``regex``, ``choice``,
        ``grammar`` (:meth:`specdec.core.request.DecodeConfig.from_options`). Defaults:
        :data:`specdec.core.request.DEFAULTS` (the drafter: the portfolio, ``auto``), under the model's
        own sampling settings where :func:`load` found them (:attr:`sampling_defaults`: the bundled
        pair samples at temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05 unless told;
        ``temperature=0`` is greedy).
        """
        stream = self.stream(prompt, stop=stop, chat=chat, system=system, config=config, **kwargs)
        for delta in stream:
            if on_text is not None:
                on_text(delta)
        assert stream.output is not None
        return stream.output

    def prompt_logprobs(self, prompt, *, top: int = 0, chat: bool | None = None, system: str | None = None,
                        chunk: int = 64) -> list[TokenLogprob | None]:
        """The target's log-probability of each prompt token given the ones before it (None for the
        first, which nothing precedes) and its ``top`` most likely alternatives: what OpenAI's and
        vLLM's ``echo`` with ``logprobs`` return, and what lm-eval's loglikelihood tasks read. The
        prompt is read ``chunk`` positions at a time (a row of logits is the vocabulary's size)."""
        top = check_logprobs(top) or 0
        ids = self.encode(prompt, chat=chat, system=system)
        self.engine.check_prompt(ids)
        out: list[TokenLogprob | None] = [None]
        with torch.inference_mode():
            for start in range(1, len(ids), chunk):
                end = min(len(ids), start + chunk)
                rows = self.target.logits_for(ids[: end - 1], end - start)  # positions start-1 .. end-2
                out += token_logprobs(rows, ids[start:end], top)
        return out

    def chat(self, messages, **kwargs: Any) -> Output:
        """Answer a conversation, as vLLM's ``LLM.chat``: ``messages`` is a list of ``{"role",
        "content"}`` dicts, or a string taken as one user message; the chat template is applied.
        Every keyword of :meth:`generate` is taken."""
        if kwargs.get("chat") is False:
            raise SpecdecError("chat() applies the chat template; use generate() to continue plain text")
        kwargs["chat"] = True
        return self.generate(messages, **kwargs)

    def memory(self) -> dict:
        """Bytes held by the weights and current KV caches of both models."""
        out = {"target_weights": self.target.parameter_bytes(), "target_cache": self.target.cache_bytes()}
        if self.draft is not None:
            out.update(draft_weights=self.draft.parameter_bytes(), draft_cache=self.draft.cache_bytes())
        return out


def load(
    target: str = DEFAULT_TARGET, draft: str | None = _AUTO, *, backend: str = AUTO_BACKEND, device: str = "auto",
    calibrate: bool = True, recalibrate: bool = False, progress: bool = True, log: Callable[[str], None] | None = None,
    generation_config: str | os.PathLike = "auto", **options: Any,
) -> Pair:
    """Load a target and (optionally) a draft model.

    target/draft: a bundled name (``qwen2.5-coder-1.5b``, ``qwen2.5-coder-0.5b``), a Hugging Face
    model folder, a ``.gguf`` file or a hub id. On llama.cpp a GGUF source may end in ``@bf16``,
    ``@f16``, ``@q8_0``, ``@q4_0`` or ``@iq4_nl``: a copy of its weights in that format, made once
    and cached (:mod:`specdec.models.backends.llamacpp.formats`; a copy of 4-bit weights is not the original
    checkpoint). On a CPU a 16-bit target verifies drafts far more cheaply than a 4-bit one.
    ``draft="auto"`` picks the bundled draft for the bundled target and no draft otherwise;
    ``draft=None`` loads none (only ``drafter="pld"`` and ``policy="ar"`` work then).

    backend: ``auto`` (llama.cpp for a GGUF model on a CPU when llama-cpp-python is installed:
    measured 1.8-2.8x faster end to end on the CPUs measured; transformers otherwise), ``llama.cpp`` (GGUF files, as stored:
    their own quantization, llama.cpp's kernels, the machine's cores) or ``transformers`` (GGUF
    files are dequantized once into a cached bf16 folder). ``Pair.backend_why`` and the CLI's
    startup line say which was chosen and why.

    device: ``auto``, ``cpu``, ``cuda``.

    options: the backends' load options, each declared once by the backend that takes it
    (``Backend.Options``, :mod:`specdec.models.backends.registry`); ``None`` or ``"auto"`` is the default, and
    an option of another backend than the one loading is a one-line error naming its owner.
    transformers: dtype: ``auto`` (measured: on a CPU the faster of float32 and bfloat16 for this
    machine, prefill and decoding both counted; bfloat16 on a GPU, float16 without bf16 support),
    ``bfloat16``, ``float16`` or ``float32`` (or a ``torch.dtype``). draft_dtype: ``auto`` (measured
    with ``dtype="auto"``, else the same as ``dtype``) or a dtype: the draft only proposes, so it may
    differ from the target's without changing what the lossless rules output. draft_quant: ``auto``
    (int8 weight-only for a bfloat16 draft on a CPU, none elsewhere), ``int8`` or ``none``.
    llama.cpp: context_length: the KV cache's size in tokens (default: the model's trained context,
    at most 8192). exact: ``True`` makes the target's passes width-invariant, bit for bit, so greedy
    speculation writes plain decoding's answer token for token (weights in their plain layout, an
    8-bit KV cache; more CPU time per step: :mod:`specdec.models.backends.llamacpp.exact`).

    generation_config: where a request's sampling defaults come from (:mod:`specdec.models.genconfig`):
    ``auto`` (the model's own: a bundled model's published settings, or a Hugging Face folder's
    ``generation_config.json``; none for a bare GGUF file), ``specdec`` (greedy, specdec's built-in
    defaults) or a ``generation_config.json`` path. A call's own values always win.
    ``Pair.sampling_defaults`` holds the result.

    calibrate: measure each model's forward cost at verify widths 1..32 (once per machine, backend,
    model and variant; cached under ``$SPECDEC_HOME/costs``), which ``dtype="auto"`` and
    ``k="auto"`` use. ``recalibrate`` measures again even when cached. ``log`` receives progress
    lines (default: stderr when ``progress``).
    """
    if log is None:
        log = stderr_log if progress else (lambda line: None)
    sampling = genconfig.resolve(generation_config, target)  # a bad path fails before any model loads
    pair = _load(target, draft, backend=backend, device=device, calibrate=calibrate, recalibrate=recalibrate,
                 progress=progress, log=log, options=options)
    pair.sampling_defaults, pair.sampling_why = sampling
    return pair


def _load(target: str, draft: str | None, *, backend: str, device: str, calibrate: bool, recalibrate: bool,
          progress: bool, log: Callable[[str], None], options: dict) -> Pair:
    """:func:`load`'s models, on the backend the registry chooses (:mod:`specdec.models.backends.registry`); the
    draft's acceptance prior (and with ``draft="auto"`` its weight format) measured above the backends, by
    :mod:`specdec.frontends.draft_formats`."""
    from . import draft_formats

    dev = resolve_device(device)
    draft_auto = draft == _AUTO
    draft = resolve_draft(target, draft)
    req = Request(target, draft, dev, REGISTRY.given(options), calibrate=calibrate, recalibrate=recalibrate, progress=progress,
                  log=log, draft_auto=draft_auto)
    loaded = REGISTRY.load(backend, req)
    draft_formats.settle(loaded, REGISTRY.get(loaded.target.backend), req)
    return Pair(loaded.target, loaded.tokenizer, loaded.draft, names=loaded.names, costs=loaded.costs,
                backend_why=loaded.why)

