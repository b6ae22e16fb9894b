"""The transformers backend's entry in the registry (:mod:`specdec.models.backends.registry`): Hugging Face
models (and GGUF files, dequantized once into a cached bf16 folder) in torch, on any device, in
the dtype the cost model measures fastest (:mod:`specdec.models.backends.transformers.dtypes`). The fallback of
``backend="auto"``: it loads anything the others refuse."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....checks import option
from ....errors import SpecdecError
from ..registry import Backend, Costs, Loaded, Log, Request, check_same_vocabulary
from .dtypes import DTYPES, resolve_dtype
from .execution import SWITCHES, choose_execution, describe, switch
from .quant import QUANT_MODES, resolve_quant


def _dtype(where: str, value):
    """``auto``, a dtype's name or a ``torch.dtype``; else "unknown dtype ..." naming the choices."""
    resolve_dtype(value, torch.device("cpu"))
    return value


def _quant(where: str, value):
    resolve_quant(value, torch.device("cpu"), torch.float32)
    return value


def _switch(where: str, value):
    return switch(where, value)


@dataclass(frozen=True)
class TransformersOptions:
    dtype: str = option("auto", choices=("auto", *DTYPES), check=_dtype,
                        help="target dtype (default: auto = measured on this machine: on a CPU the faster of float32 "
                             "and bfloat16, prefill and decoding counted; bfloat16 on a GPU)")
    draft_dtype: str = option("auto", choices=("auto", *DTYPES), check=_dtype,
                              help="draft dtype; the draft only proposes, so lossless output is unchanged (default: "
                                   "auto = measured with --dtype auto, else the same as --dtype)")
    draft_quant: str = option("auto", choices=QUANT_MODES, check=_quant,
                              help="quantize the draft's weights; the draft only proposes, so lossless output is "
                                   "unchanged (default: auto = int8 for bfloat16 on CPU, none otherwise)")
    static_cache: str = option("auto", choices=SWITCHES, check=_switch,
                               help="a KV cache preallocated to the context, rolled back by moving an index "
                                    "(default: auto = on for CUDA, off elsewhere; on = also on a CPU)")
    cuda_graphs: str = option("auto", choices=SWITCHES, check=_switch,
                              help="replay short passes (verify, draft steps) as captured CUDA graphs, on the static "
                                   "cache (default: auto = on for CUDA; on needs a CUDA device)")
    compile_step: str = option("auto", choices=SWITCHES, check=_switch,
                               help="compile the static cache's fused step with torch.compile inside its graphs "
                                    "(about 2x faster passes on a GPU, 15-25 s of compiling per pass width at its "
                                    "first use; default: auto = off; on needs the static cache)")


class TransformersBackend(Backend):
    name = "transformers"
    aliases = ("hf",)
    package = None  # a dependency of specdec itself
    Options = TransformersOptions
    foreign_options = "transformers models use their own context length"
    foreign_formats = "on transformers choose the weights' type with dtype="

    def auto_refusal(self, req: Request) -> str | None:
        return None  # the fallback: what it cannot load, check() says

    def load(self, req: Request, why: str) -> Loaded:
        from .dtypes import choose_variants, materialize
        from .model import output_rows

        target, draft, dev = req.target, req.draft, req.device
        plan = choose_execution(req.options.get("static_cache", "auto"), req.options.get("cuda_graphs", "auto"), dev,
                                req.options.get("compile_step", "auto"))
        chosen = choose_variants(req, plan)
        t = materialize(target, chosen.target, dev, chosen.measured["target"], progress=req.progress,
                        table=chosen.tables["target"].get(chosen.target))
        d = None
        if draft is not None:
            assert chosen.draft is not None  # chosen for the draft asked
            d = materialize(draft, chosen.draft, dev, chosen.measured["draft"], progress=req.progress,
                            table=chosen.tables["draft"].get(chosen.draft))
            check_same_vocabulary(t.tokenizer, d.tokenizer, target, draft)
        vocab = len(t.tokenizer)
        widths = [output_rows(m.model.get_output_embeddings()) for m in (t, d) if m is not None]
        if min(widths) < vocab:
            raise SpecdecError(f"a model's output layer has {min(widths)} rows, fewer than the tokenizer's {vocab} tokens")
        # Rows past the tokenizer's table (padding) are never real tokens; cut them so both models agree.
        target_run, draft_run = plan.for_config(t.model.config), plan.for_config(d.model.config) if d else None
        runs = {"target": target_run, "draft": draft_run}
        target_lm = target_run.wrap(t.model, target, vocab_limit=vocab)
        draft_lm = None
        if d is not None and draft is not None and draft_run is not None:  # all three or none
            draft_lm = draft_run.wrap(d.model, draft, vocab_limit=vocab)
        costs = Costs(chosen.tables["target"].get(chosen.target),
                      chosen.tables["draft"].get(chosen.draft) if chosen.draft else None, chosen.why,
                      dict(chosen.tables))
        return Loaded(target_lm, t.tokenizer, draft_lm, (target, draft), costs, f"{why}; {describe(runs)}")

    def measure(self, lm, remeasure: bool = False, log: Log | None = None):
        """The cost table of a loaded model in its variant (``specdec.load`` measures candidates
        before loading instead: :func:`specdec.models.backends.transformers.dtypes.candidate_tables`)."""
        from ...costmodel import load_cached, model_fingerprint, model_key, table_for
        from .dtypes import choose_kernels

        key = model_key(lm.name, lm.model.config)
        if not remeasure:
            cached = load_cached(model_fingerprint(lm), key, lm.variant)  # what table_for saves under
            if cached is not None:
                return cached
        return table_for(lm, key, lm.variant, log=log, kernels=choose_kernels(lm.model, lm))

    def identity(self, lm) -> str:
        """A loaded model's weights: where they came from, a hash of its config, and its variant."""
        from ...costmodel import model_key

        return f"{model_key(lm.name, lm.model.config)}|{lm.variant}"

    def fingerprint(self, device: torch.device | str = "cpu") -> dict:
        """A model loaded with the defaults: on CUDA its tables are the static cache's with graphs."""
        from ...costmodel import fingerprint

        return fingerprint(device, choose_execution("auto", "auto", device).fingerprint())

    def prepare(self, source: str, progress: bool = True, verify: bool = False) -> str:
        """What ``from_pretrained`` reads for ``source``: a folder or a hub id (a bundled model or a GGUF
        file converted once into its cached bf16 folder)."""
        from .load import resolve

        return resolve(source, progress=progress, verify=verify)[1]

    def peer_model(self, source: str, dtype, device, quant: str = "none"):
        """The torch module of ``source`` (weight-only int8 when ``quant`` is ``int8``)."""
        from .load import load
        from .quant import quantize_int8

        model = load(source, dtype, device, progress=False).model
        if quant == "int8":
            quantize_int8(model)
        return model

    def cached_estimate(self, req: Request):
        from .dtypes import cached_choice

        return cached_choice(req.target, req.draft, torch.device("cpu"))
