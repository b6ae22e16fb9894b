"""The llama.cpp backend's entry in the registry (:mod:`specdec.models.backends.registry`): GGUF models on
the CPU, run as stored (their own quantization, llama.cpp's kernels) by
:class:`specdec.models.backends.llamacpp.model.LlamaCppModel`. Importing this module imports no llama.cpp."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....checks import option
from ....errors import SpecdecError
from ..registry import Backend, Costs, Loaded, Log, Request, check_same_vocabulary
from .formats import DRAFT_FORMATS, FTYPES


@dataclass(frozen=True)
class LlamaCppOptions:
    context_length: int | None = option(None, kind=int, lo=16, help="KV cache size in tokens (default: the model's "
                                                                    "trained context, at most 8192)")
    exact: bool | None = option(None, kind=bool, help="the target's passes width-invariant, bit for bit, so greedy "
                                                      "speculation writes plain decoding's answer token for token "
                                                      "(no repacked weights, passes of 2-63 tokens; default: off)")


class LlamaCppBackend(Backend):
    name = "llama.cpp"
    aliases = ("llama-cpp", "llamacpp")
    package = "llama_cpp"
    install = "pip install 'specdec-rules[llama]' (it builds llama.cpp from source, ~8 minutes on 2 cores)"
    Options = LlamaCppOptions
    foreign_options = "llama.cpp runs a GGUF file's weights as stored"
    formats = tuple(FTYPES)

    def auto_refusal(self, req: Request) -> str | None:
        from .formats import is_gguf

        if req.device.type != "cpu":
            return f"a {req.device.type} device"
        if not (is_gguf(req.target) and is_gguf(req.draft)):
            return "not a GGUF model"
        refusal = self.options_refusal(req)
        if refusal:
            return refusal
        if not self.available():
            return ("llama-cpp-python is not installed (pip install 'specdec-rules[llama]' runs GGUF models on llama.cpp's "
                    "kernels, measured 1.8-2.8x faster end to end on a CPU)")
        return None

    def auto_reason(self, req: Request) -> str:
        return "auto: GGUF models on a CPU, llama-cpp-python installed"

    def check(self, req: Request) -> None:
        from .formats import is_gguf

        super().check(req)
        if req.device.type != "cpu":
            raise SpecdecError("backend 'llama.cpp' runs on the CPU in specdec (llama-cpp-python's CPU build); "
                               "use --device cpu, or backend 'transformers' on a GPU")
        for source in (req.target, req.draft):
            if not is_gguf(source):
                raise SpecdecError(f"backend 'llama.cpp' needs GGUF models, and {source!r} is not one; "
                                   "use backend 'transformers'")

    def load(self, req: Request, why: str) -> Loaded:
        """The GGUF models, and their cost tables when calibrating."""
        from ...costmodel import FALLBACK_K
        from .formats import model_file
        from .model import LlamaCppModel, busy_cores, busy_note, gguf_tokenizer

        target, draft, log, n_ctx = req.target, req.draft, req.log, req.options.get("context_length")
        exact = bool(req.options.get("exact"))
        t_path = model_file(target, progress=req.progress)
        d_path = model_file(draft, progress=req.progress) if draft is not None else None
        tokenizer = gguf_tokenizer(t_path, progress=req.progress)
        vocab = len(tokenizer)
        if d_path is not None and draft is not None:  # a draft's path is there when a draft is asked
            check_same_vocabulary(tokenizer, gguf_tokenizer(d_path, progress=req.progress), target, draft)
        t = LlamaCppModel(t_path, target, vocab_limit=vocab, n_ctx=n_ctx, exact=exact)  # the draft only proposes
        note = busy_note(t.threads, busy_cores()) if req.progress else None   # a person is watching
        if note:
            log(note)
        d = LlamaCppModel(d_path, draft, vocab_limit=vocab, n_ctx=n_ctx) if d_path is not None else None
        for m in (t, d):
            if m is not None and m.vocab_size < vocab:
                raise SpecdecError(f"{m.name}: the model scores {m.vocab_size} tokens, fewer than the tokenizer's {vocab}")
        t_table = d_table = None
        if req.calibrate or req.recalibrate:
            t_table = self.measure(t, remeasure=req.recalibrate, log=log)
            d_table = self.measure(d, remeasure=req.recalibrate, log=log) if d is not None else None
            if t_table is None:
                log(f"specdec: warning: no cost model, so k=auto is k={FALLBACK_K}")
        costs = Costs(t_table, d_table, None, {"target": {t.variant: t_table}, "draft": {d.variant: d_table} if d else {}})
        return Loaded(t, tokenizer, d, (target, draft), costs, why)

    def identity(self, lm) -> str:
        """A llama.cpp model's weights: its file's key and its weight format."""
        from .model import file_key

        return f"{file_key(lm.path)}|{lm.variant}"

    def draft_variants(self, draft: str) -> tuple[str, ...]:
        """A draft as stored (no ``@format``) may also run as a pure 4-bit copy (:data:`DRAFT_FORMATS`)."""
        from ...sources import split_format

        return () if split_format(draft)[1] is not None else tuple(f"{draft}@{fmt}" for fmt in DRAFT_FORMATS)

    def load_draft(self, source: str, req: Request, loaded: Loaded):
        from .formats import model_file
        from .model import LlamaCppModel

        lm = LlamaCppModel(model_file(source, progress=req.progress), source, vocab_limit=len(loaded.tokenizer),
                           n_ctx=req.options.get("context_length"))
        return lm, self.measure(lm, remeasure=req.recalibrate, log=req.log)

    def measure(self, lm, remeasure: bool = False, log: Log | None = None):
        """The cost table of a llama.cpp model: cached for this machine, llama.cpp version, threads,
        file and weight format, else measured now (widths 1..32 as for transformers, each timed
        ``REPEATS`` times; the bundled pair took 10-30 s on 2 cores when each width was timed twice,
        and takes longer now)."""
        from ...costmodel import load_cached, model_fingerprint, table_for
        from .model import file_key

        key = f"{lm.name}|{file_key(lm.path)}"
        if not remeasure:
            cached = load_cached(model_fingerprint(lm), key, lm.variant)
            if cached is not None:
                return cached
        return table_for(lm, key, lm.variant, log=log)

    def prepare(self, source: str, progress: bool = True, verify: bool = False) -> str:
        """The GGUF file llama.cpp reads for ``source`` (a bundled model's assembled, a ``@format`` copy
        made, once)."""
        from .formats import model_file

        self.check_format(source)
        return str(model_file(source, progress=progress, verify=verify))

    def threads(self) -> int:
        from .model import default_threads

        return default_threads()

    def fingerprint(self, device: torch.device | str = "cpu") -> dict:
        from ...costmodel import fingerprint
        from .model import BACKEND, default_threads, version

        return fingerprint(device, {"backend": BACKEND, "backend_version": version(), "threads": default_threads()})

