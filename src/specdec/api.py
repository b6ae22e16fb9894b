"""The Python API: ``specdec.load(...)`` -> :class:`Pair`; ``pair.generate(...)`` -> :class:`Output`."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from . import genconfig
from .bundled import DEFAULT_DRAFT, DEFAULT_TARGET
from .configfile import read_config
from .costmodel import CostTable
from .engine import Engine, Generation
from .logprobs import TokenLogprob, check_logprobs, token_logprobs
from .errors import SpecdecError
from .backends import AUTO as AUTO_BACKEND, Model, check_backend
from .models import check_same_vocabulary, resolve_device, resolve_dtype
from .costmodel import FALLBACK_K, choose_dtypes
from .quant import resolve_quant
from .request import DecodeConfig, default_drafter, make_config, overlay
from .stats import Stats
from .text import StopStrings, TextStream, encode_prompt, eos_ids

_AUTO = "auto"


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
    #: likely alternatives (:class:`specdec.logprobs.TokenLogprob`), else None
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


@dataclass
class Costs:
    """The measured cost model of a loaded pair: the tables of the variants in use, why the
    dtypes were chosen (``dtype="auto"``), and every candidate's table (for ``specdec calibrate``)."""

    target: CostTable | None = None
    draft: CostTable | None = None
    why: str | None = None
    candidates: dict = field(default_factory=dict)
    #: llama.cpp, ``draft="auto"``: which weight format of the draft was chosen, and why
    draft_why: str | None = None


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


def resolve_draft(target: str, draft: str | None) -> str | None:
    """The draft model :func:`load` loads: ``"auto"`` is the bundled draft for the bundled target
    and none otherwise; anything else as given (None: no draft model)."""
    if draft == _AUTO:
        from .backends.gguf_formats import split_format

        return DEFAULT_DRAFT if split_format(target)[0] == DEFAULT_TARGET else None
    return draft


class Pair:
    """A target model, an optional draft model that shares its tokenizer, and the engine over them."""

    def __init__(self, target: Model, tokenizer, draft: Model | None = None,
                 names: tuple[str, str | None] = ("target", None), costs: Costs | None = None,
                 backend_why: str | None = None):
        self.target, self.draft, self.tokenizer = target, draft, tokenizer
        self.target_name, self.draft_name = names
        self.draft_quant = "none"
        self.costs = costs or Costs()
        #: which backend runs the models, and why (``backend="auto"``)
        self.backend = target.backend
        self.backend_why = backend_why
        #: the drafter a request gets when it names none: the draft model, or prompt lookup without one
        self.default_drafter = default_drafter(draft is not None)
        #: the model's sampling settings a request that names none gets (:mod:`specdec.genconfig`;
        #: :func:`load` fills them, ``generation_config="auto"``), and where they came from
        self.sampling_defaults: dict = {}
        self.sampling_why = "none"
        self.eos_ids = eos_ids(tokenizer, target.eos_ids())
        self.engine = Engine(target, draft, self.eos_ids, target_costs=self.costs.target,
                             draft_costs=self.costs.draft, tokenizer=tokenizer)

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
        used as is, not validated again), or the path of a config file (:mod:`specdec.configfile`,
        as ``specdec tune`` writes; keywords given next to it override its values, as
        :func:`specdec.request.overlay` layers them)."""
        if isinstance(config, (str, os.PathLike)):
            kwargs = overlay(read_config(config), kwargs)
            config = None
        if config is None:
            kwargs.setdefault("drafter", self.default_drafter)
            cfg = make_config(**genconfig.fill(kwargs, self.sampling_defaults))
        elif kwargs:
            raise SpecdecError(f"pass either config= or decoding keywords, not both (got {sorted(kwargs)})")
        elif not isinstance(config, DecodeConfig):
            raise SpecdecError(f"config must be a DecodeConfig (specdec.make_config(...)) or a config file's path, "
                               f"got {type(config).__name__}")
        else:
            cfg = config
        self.engine.check_config(cfg)
        prompt_ids = self.encode(prompt, chat=chat, system=system)
        self.engine.check_prompt(prompt_ids)
        stops = StopStrings(self.tokenizer, stop)
        gen = Generation(prompt_ids)
        stream = Stream(iter(()))

        def finish() -> None:
            stream.output = Output(
                stops.final_text(gen.token_ids), list(gen.token_ids), gen.finish_reason or "cancelled",
                len(prompt_ids), gen.stats, None if gen.logprobs is None else list(gen.logprobs),
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
        messages (the chat template applied), or token ids. Keyword arguments: ``policy`` ("ar" |
        "lossless"), ``drafter`` ("model" | "pld"), ``k``, ``max_new_tokens``, ``temperature``,
        ``top_p``, ``top_k``, ``seed``, ``stop``, ``system``, ``on_text`` (called with each text
        delta), drafter options ``ngram_max``/``ngram_min``, the policy's own parameters, and
        structured output: one of ``response_format``, ``json_schema``, ``regex``, ``choice``,
        ``grammar`` (:meth:`specdec.request.DecodeConfig.from_options`). Defaults:
        :data:`specdec.request.DEFAULTS` (the drafter: :attr:`default_drafter`), under the model's
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
    target: str = DEFAULT_TARGET, draft: str | None = _AUTO, *, backend: str = AUTO_BACKEND,
    dtype: str | torch.dtype = "auto", draft_dtype: str | torch.dtype = "auto", device: str = "auto",
    draft_quant: str = "auto", calibrate: bool = True, recalibrate: bool = False, progress: bool = True,
    log: Callable[[str], None] | None = None, context_length: int | None = None,
    generation_config: str | os.PathLike = "auto",
) -> Pair:
    """Load a target and (optionally) a draft model.

    target/draft: a bundled name (``qwen2.5-coder-1.5b``, ``qwen2.5-coder-0.5b``), a Hugging Face
    model folder, a ``.gguf`` file or a hub id. On llama.cpp a GGUF source may end in ``@bf16``,
    ``@f16``, ``@q8_0``, ``@q4_0`` or ``@iq4_nl``: a copy of its weights in that format, made once
    and cached (:mod:`specdec.backends.gguf_formats`; a copy of 4-bit weights is not the original
    checkpoint). On a CPU a 16-bit target verifies drafts far more cheaply than a 4-bit one.
    ``draft="auto"`` picks the bundled draft for the bundled target and no draft otherwise;
    ``draft=None`` loads none (only ``drafter="pld"`` and ``policy="ar"`` work then).

    backend: ``auto`` (llama.cpp for a GGUF model on a CPU when llama-cpp-python is installed:
    measured 1.8-2.8x faster end to end on the CPUs measured; transformers otherwise), ``llama.cpp`` (GGUF files, as stored:
    their own quantization, llama.cpp's kernels, the machine's cores) or ``transformers`` (GGUF
    files are dequantized once into a cached bf16 folder). ``Pair.backend_why`` and the CLI's
    startup line say which was chosen and why.

    The rest applies to the transformers backend (the llama.cpp backend refuses non-default values):
    dtype: ``auto`` (measured: on a CPU the faster of float32 and bfloat16 for this machine,
    prefill and decoding both counted; bfloat16 on a GPU, float16 without bf16 support),
    ``bfloat16``, ``float16`` or ``float32``. draft_dtype: ``auto`` (measured with ``dtype="auto"``,
    else the same as ``dtype``) or a dtype: the draft only proposes, so it may differ from the
    target's without changing what the lossless rules output. device: ``auto``, ``cpu``, ``cuda``.
    draft_quant: ``auto`` (int8 weight-only for a bfloat16 draft on a CPU, none elsewhere),
    ``int8`` or ``none``. context_length (llama.cpp only): the KV cache's size in tokens (default:
    the model's trained context, at most 8192).

    generation_config: where a request's sampling defaults come from (:mod:`specdec.genconfig`):
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
        log = _stderr if progress else (lambda line: None)
    sampling = genconfig.resolve(generation_config, target)  # a bad path fails before any model loads
    pair = _load(target, draft, backend=backend, dtype=dtype, draft_dtype=draft_dtype, device=device,
                 draft_quant=draft_quant, calibrate=calibrate, recalibrate=recalibrate, progress=progress, log=log,
                 context_length=context_length)
    pair.sampling_defaults, pair.sampling_why = sampling
    return pair


def _load(target: str, draft: str | None, *, backend: str, dtype, draft_dtype, device: str, draft_quant: str,
          calibrate: bool, recalibrate: bool, progress: bool, log: Callable[[str], None],
          context_length: int | None) -> Pair:
    """:func:`load`'s models, on the backend it chooses."""
    dev = resolve_device(device)
    draft_auto = draft == _AUTO
    draft = resolve_draft(target, draft)
    explicit = {k: v for k, v in (("dtype", dtype), ("draft_dtype", draft_dtype), ("draft_quant", draft_quant))
                if v != "auto"}
    chosen, why = choose_backend(check_backend(backend), target, draft, dev, explicit)
    if chosen == "llama.cpp":
        if context_length is not None:
            from .checks import check_int

            check_int("context_length", context_length, lo=16)
        return _load_llama(target, draft, why, calibrate=calibrate, recalibrate=recalibrate, progress=progress,
                           draft_auto=draft_auto and draft == DEFAULT_DRAFT,
                           log=log, context_length=context_length)
    if context_length is not None:
        raise SpecdecError("context_length applies to the llama.cpp backend; transformers models use their own")
    return _load_transformers(target, draft, why, dev, dtype=dtype, draft_dtype=draft_dtype, draft_quant=draft_quant,
                              calibrate=calibrate, recalibrate=recalibrate, progress=progress, log=log)


def _is_gguf(source: str | None) -> bool:
    """Whether a model source is a GGUF file (bundled models are), without loading anything."""
    from pathlib import Path

    from .backends.gguf_formats import split_format
    from .bundled import BUNDLED

    if source is None:
        return True
    source, fmt = split_format(source)
    if fmt is not None:
        return True
    if source in BUNDLED or str(source).endswith(".gguf"):
        return True
    path = Path(str(source)).expanduser()
    return path.is_dir() and not (path / "config.json").exists() and len(list(path.glob("*.gguf"))) == 1


def choose_backend(backend: str, target: str, draft: str | None, device: torch.device,
                   explicit: dict) -> tuple[str, str]:
    """``(backend, why)``. ``auto``: llama.cpp when the models are GGUF files, the device is a CPU,
    no transformers-only option was given and llama-cpp-python is installed; else transformers."""
    from .backends import available, require

    if backend == "llama.cpp":
        require("llama.cpp")
        if device.type != "cpu":
            raise SpecdecError("backend 'llama.cpp' runs on the CPU in specdec (llama-cpp-python's CPU build); "
                               "use --device cpu, or backend 'transformers' on a GPU")
        if explicit:
            names = ", ".join(f"{k}={v}" for k, v in explicit.items())
            raise SpecdecError(f"{names}: dtype and quantization options apply to the transformers backend; "
                               "llama.cpp runs a GGUF file's weights as stored")
        for source in (target, draft):
            if not _is_gguf(source):
                raise SpecdecError(f"backend 'llama.cpp' needs GGUF models, and {source!r} is not one; "
                                   "use backend 'transformers'")
        return "llama.cpp", "asked for"
    if backend == "transformers":
        _no_format_copies(target, draft)
        return "transformers", "asked for"
    if device.type != "cpu":
        _no_format_copies(target, draft)
        return "transformers", f"auto: a {device.type} device"
    if not (_is_gguf(target) and _is_gguf(draft)):
        return "transformers", "auto: not a GGUF model"
    if explicit:
        _no_format_copies(target, draft)
        return "transformers", f"auto: {', '.join(explicit)} given (transformers options)"
    if not available("llama.cpp"):
        _no_format_copies(target, draft)
        return "transformers", ("auto: llama-cpp-python is not installed (pip install 'specdec[llama]' runs GGUF "
                                "models on llama.cpp's kernels, measured 1.8-2.8x faster end to end on a CPU)")
    return "llama.cpp", "auto: GGUF models on a CPU, llama-cpp-python installed"


def _no_format_copies(*sources: str | None) -> None:
    """``model@format`` names a llama.cpp copy of a GGUF file; the transformers backend has dtypes instead."""
    from .backends.gguf_formats import split_format

    for source in sources:
        if split_format(source)[1] is not None:
            raise SpecdecError(f"{source!r}: a GGUF weight-format copy ('@...') runs on the llama.cpp backend "
                               "(pip install 'specdec[llama]', backend 'llama.cpp'); on transformers use dtype=")


def _load_llama(target: str, draft: str | None, why: str, *, calibrate: bool, recalibrate: bool, progress: bool,
                log: Callable[[str], None], context_length: int | None, draft_auto: bool = False) -> Pair:
    """llama.cpp models. ``draft_auto``: the bundled draft was chosen by ``draft="auto"``, so its weight
    format is chosen too, by measurement (:mod:`specdec.draft_formats`), when calibrating."""
    from .backends.gguf_formats import model_file as gguf_path
    from .backends.llamacpp import LlamaCppModel, gguf_tokenizer
    from .calibrate import llama_table

    t_path = gguf_path(target, progress=progress)
    d_path = gguf_path(draft, progress=progress) if draft is not None else None
    tokenizer = gguf_tokenizer(t_path, progress=progress)
    vocab = len(tokenizer)
    if d_path is not None:
        check_same_vocabulary(tokenizer, gguf_tokenizer(d_path, progress=progress), target, draft)
    t = LlamaCppModel(t_path, target, vocab_limit=vocab, n_ctx=context_length)
    draft_auto = draft_auto and (calibrate or recalibrate)
    d = None
    if d_path is not None and not draft_auto:
        d = LlamaCppModel(d_path, draft, vocab_limit=vocab, n_ctx=context_length)
    for m in (t, d):
        if m is not None and m.vocab_size < vocab:
            raise SpecdecError(f"{m.name}: the model scores {m.vocab_size} tokens, fewer than the tokenizer's {vocab}")
    t_table = d_table = None
    draft_name, draft_why = draft, None  # the chosen copy's name (``draft`` stays the source for transformers)
    if calibrate or recalibrate:
        t_table = llama_table(t, remeasure=recalibrate, log=log)
        if draft_auto:
            from .draft_formats import choose

            def load_draft(source: str):
                return LlamaCppModel(gguf_path(source, progress=progress), source, vocab_limit=vocab,
                                     n_ctx=context_length)

            choice, d, d_table = choose(t, tokenizer, draft, load_draft,
                                        lambda lm: llama_table(lm, remeasure=recalibrate, log=log), log)
            draft_name, draft_why = choice.source, choice.why
        elif d is not None:
            d_table = llama_table(d, remeasure=recalibrate, log=log)
        if t_table is None:
            log(f"specdec: warning: no cost model, so k=auto is k={FALLBACK_K}")
    costs = Costs(t_table, d_table, None, {"target": {t.variant: t_table}, "draft": {d.variant: d_table} if d else {}},
                  draft_why=draft_why)
    if why.startswith("auto") and t_table is not None and (d is None or d_table is not None):
        other = _transformers_measured(target, draft)
        if other is not None:
            mine = choose_dtypes({t.variant: t_table}, {d.variant: d_table} if d is not None else None)
            if other.seconds < mine.seconds:  # measured faster on this machine: use it
                for m in (t, d):
                    if m is not None:
                        m.close()
                why = (f"auto: measured on this machine, transformers {other.seconds:.1f}s against llama.cpp "
                       f"{mine.seconds:.1f}s for a reference request")
                return _load_transformers(target, draft, why, torch.device("cpu"), dtype="auto", draft_dtype="auto",
                                          draft_quant="auto", calibrate=True, recalibrate=False, progress=progress,
                                          log=log)
            why = (f"auto: GGUF models on a CPU; measured on this machine, llama.cpp {mine.seconds:.1f}s against "
                   f"transformers {other.seconds:.1f}s for a reference request")
    return Pair(t, tokenizer, d, names=(target, draft_name), costs=costs, backend_why=why)


def _transformers_measured(target: str, draft: str | None):
    """The transformers backend's expected reference-request time from tables cached on this
    machine (None when not measured here yet: nothing is converted or measured for this)."""
    from .calibrate import cached_choice

    try:
        return cached_choice(target, draft, torch.device("cpu"))
    except Exception:  # noqa: BLE001 - a comparison must never break a load
        return None


def _load_transformers(target: str, draft: str | None, why: str, dev: torch.device, *, dtype, draft_dtype,
                       draft_quant, calibrate: bool, recalibrate: bool, progress: bool,
                       log: Callable[[str], None]) -> Pair:
    from .backends.hf import HFModel
    from .calibrate import candidate_tables, draft_candidates, materialize, pick, split_variant, target_candidates
    from .models import output_rows

    if draft_dtype != "auto":  # (dtype is checked by target_candidates)
        resolve_dtype(draft_dtype, dev)
    resolve_quant(draft_quant, dev, torch.float32)  # validates the name
    t_cands = target_candidates(dtype, dev)
    d_cands = draft_candidates(dtype, draft_dtype, draft_quant, dev) if draft is not None else []
    calibrate = calibrate or recalibrate
    t_tables: dict = {}
    d_tables: dict = {}
    t_measured = d_measured = None
    if calibrate:
        t_tables, t_measured = candidate_tables(target, "target", t_cands, dev, remeasure=recalibrate,
                                              progress=progress, log=log)
        if draft is not None:
            d_tables, d_measured = candidate_tables(draft, "draft", d_cands, dev, remeasure=recalibrate,
                                                  progress=progress, log=log)
    choice = pick(t_tables, d_tables if draft is not None else None) if calibrate else None
    t_variant = choice.target if choice is not None else (t_cands[-1] if dtype == "auto" else t_cands[0])
    d_variant = None
    if draft is not None:
        d_variant = choice.draft if choice is not None else d_cands[-1]
    dtype_why = choice.reason() if choice is not None and (len(t_cands) > 1 or len(d_cands) > 1) else None
    if choice is None and len(t_cands) > 1:
        dtype_why = f"not measured (calibration {'off' if not calibrate else 'failed'}); bfloat16 as before"
        if calibrate:
            log(f"specdec: warning: no cost model, so dtype=auto is bfloat16 and k=auto is k={FALLBACK_K}")
    t = materialize(target, t_variant, dev, t_measured, progress=progress, table=t_tables.get(t_variant))
    d = None
    if draft is not None:
        d = materialize(draft, d_variant, dev, d_measured, progress=progress, table=d_tables.get(d_variant))
        check_same_vocabulary(t.tokenizer, d.tokenizer, target, draft)
    vocab = len(t.tokenizer)
    widths = [output_rows(m.model.get_output_embeddings()) for m in (t, d) if m is not None]
    if min(widths) < vocab:
        raise SpecdecError(f"a model's output layer has {min(widths)} rows, fewer than the tokenizer's {vocab} tokens")
    # Rows past the tokenizer's table (padding) are never real tokens; cut them so both models agree.
    target_lm = HFModel(t.model, target, vocab_limit=vocab)
    draft_lm = HFModel(d.model, draft, vocab_limit=vocab) if d is not None else None
    costs = Costs(t_tables.get(t_variant), d_tables.get(d_variant) if d_variant else None, dtype_why,
                  {"target": t_tables, "draft": d_tables})
    pair = Pair(target_lm, t.tokenizer, draft_lm, names=(target, draft), costs=costs, backend_why=why)
    pair.draft_quant = split_variant(d_variant)[1] if d_variant else "none"
    return pair


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
