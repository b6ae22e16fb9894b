"""A toy backend, written as a newcomer adds one: this file and one registry line
(``REGISTRY.add("toy", "toybackend:ToyBackend")``). Its models are tiny random transformers models
named ``toy-SEED`` (built from a config, nothing downloaded), run through a :class:`Model` of its
own that declares what its timings depend on."""

from __future__ import annotations

from specdec.backends import Backend, Costs, Loaded, Request
from specdec.backends.transformers.model import HFModel
from specdec.errors import SpecdecError
from tinymodels import byte_tokenizer, tiny_model


class ToyModel(HFModel):
    backend = "toy"

    def fingerprint_extra(self) -> dict:
        return {"backend": "toy", "backend_version": "1"}


class ToyBackend(Backend):
    name = "toy"
    aliases = ("toy-backend",)
    package = None
    options = {}
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
        target = ToyModel(tiny_model(int(req.target[4:])), req.target)
        draft = ToyModel(tiny_model(int(req.draft[4:])), req.draft) if req.draft is not None else None
        costs = Costs()
        if req.calibrate or req.recalibrate:
            costs.target = self.measure(target, req.recalibrate, req.log)
            costs.draft = self.measure(draft, req.recalibrate, req.log) if draft is not None else None
        costs.candidates = {"target": {target.variant: costs.target},
                            "draft": {draft.variant: costs.draft} if draft is not None else {}}
        return Loaded(target, tokenizer, draft, (req.target, req.draft), costs, why)

    def measure(self, lm, remeasure: bool = False, log=None):
        from specdec.costmodel import load_cached, model_fingerprint, table_for

        key = f"{lm.name}|toy"
        cached = None if remeasure else load_cached(model_fingerprint(lm), key, lm.variant)
        return cached or table_for(lm, key, lm.variant, log=log)
