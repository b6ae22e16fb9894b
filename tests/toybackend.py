"""A toy backend, written as a newcomer adds one: this file and one registry line
(``REGISTRY.add("toy", "toybackend:ToyBackend")``), against the contract alone (``Model`` and
``Backend``, nothing of the real backends). Its models are ``toy-SEED``: a seeded table of logits
by the last two tokens, so what it says next depends on its context like a language model's, and
its "cache" is the token list :class:`Model` keeps."""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.models.backends import Backend, Costs, Loaded, Model, Request
from specdec.errors import SpecdecError
from tinymodels import byte_tokenizer


class ToyModel(Model):
    """Logits after position i: ``table[token i] + table[token i-1].roll(1)``, float32, on the CPU."""

    backend = "toy"

    def __init__(self, seed: int, name: str, vocab: int):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, generator=g) * 3  # [V, V]
        super().__init__(name, vocab, vocab, 512, torch.device("cpu"), "float32")

    def _append(self, ids: Sequence[int], num_logits: int, hidden: bool):
        seq = torch.tensor([*self.tokens, *ids])  # the whole context: the cache's tokens, then ids
        start = len(seq) - num_logits
        logits = self.table[seq[start:]]  # [num_logits, V] (a copy)
        before = seq[max(0, start - 1):-1]  # the token before each of those that has one
        logits[num_logits - len(before):] += self.table[before].roll(1, dims=-1)
        return logits, None

    def _crop(self, length: int) -> None:
        pass  # the context is self.tokens, which Model crops

    def _clear(self) -> None:
        pass

    def parameter_bytes(self) -> int:
        return self.table.numel() * self.table.element_size()

    def cache_bytes(self) -> int:
        return 0

    def fingerprint_extra(self) -> dict:
        return {"backend": "toy", "backend_version": "1"}


class ToyBackend(Backend):
    name = "toy"
    aliases = ("toy-backend",)
    package = None
    foreign_options = "toy models take no options"

    def auto_refusal(self, req: Request) -> str | None:
        return "toy models load only by name"

    def check(self, req: Request) -> None:
        super().check(req)
        for source in (req.target, req.draft):
            if source is not None and not str(source).startswith("toy-"):
                raise SpecdecError(f"backend 'toy' loads toy-SEED models, not {source!r}")

    def load(self, req: Request, why: str) -> Loaded:
        tokenizer = byte_tokenizer()
        target = ToyModel(int(req.target[4:]), req.target, len(tokenizer))
        draft = ToyModel(int(req.draft[4:]), req.draft, len(tokenizer)) if req.draft is not None else None
        costs = Costs()
        if req.calibrate or req.recalibrate:
            costs.target = self.measure(target, req.recalibrate, req.log)
            costs.draft = self.measure(draft, req.recalibrate, req.log) if draft is not None else None
        costs.candidates = {"target": {target.variant: costs.target},
                            "draft": {draft.variant: costs.draft} if draft is not None else {}}
        return Loaded(target, tokenizer, draft, (req.target, req.draft), costs, why)

    def measure(self, lm, remeasure: bool = False, log=None):
        from specdec.models.costmodel import load_cached, model_fingerprint, table_for

        key = f"{lm.name}|toy"
        cached = None if remeasure else load_cached(model_fingerprint(lm), key, lm.variant)
        return cached or table_for(lm, key, lm.variant, log=log)
