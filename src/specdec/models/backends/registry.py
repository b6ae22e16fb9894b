"""What a backend is, and the one table of them.

A backend is one :class:`Backend` subclass in a file of its own and one line in :data:`REGISTRY`
(``specdec.models.backends``). It declares the Python package it needs and how to install it, the load
options it takes, when ``backend="auto"`` may choose it and why not otherwise, and it loads a
model pair, measures a model's forward cost for the cost model and says what that measurement
depends on (its fingerprint). :func:`specdec.load`, ``specdec calibrate``, the CLI's flags, the
server and the benchmark name no backend: they ask this table.

Entries are imported when first asked for (``"module:Class"``), so importing specdec imports no
backend's library.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ...checks import Spec, options_of
from ...errors import SpecdecError
from .base import Model

Log = Callable[[str], None]
AUTO = "auto"


def stderr_log(line: str) -> None:
    """The :data:`Log` of progress lines when none is given: each line to stderr."""
    print(line, file=sys.stderr, flush=True)


@dataclass
class Costs:
    """The measured cost model of a loaded pair: the tables of the variants in use, why the
    dtypes were chosen (``dtype="auto"``), and every candidate's table (for ``specdec calibrate``)."""

    target: Any = None
    draft: Any = None
    why: str | None = None
    candidates: dict = field(default_factory=dict)
    #: ``draft="auto"``: which weight format of the draft was chosen, and why (llama.cpp)
    draft_why: str | None = None
    #: how often the draft's tokens are kept by its own probability of them, measured with the tables on
    #: a reference text (:class:`specdec.core.autok.AcceptancePrior`; None: not measured)
    prior: Any = None


@dataclass
class Loaded:
    """What :meth:`Backend.load` returns, and :func:`specdec.load` wraps in a :class:`specdec.Pair`."""

    target: Model
    tokenizer: Any
    draft: Model | None
    names: tuple[str, str | None]
    costs: Costs
    why: str

    def close(self) -> None:
        for m in (self.target, self.draft):
            if m is not None:
                m.close()


@dataclass
class Request:
    """What :func:`specdec.load` asks of a backend: the model sources, the device, the options the
    caller set (only those: a backend refuses the ones it does not declare) and how to calibrate."""

    target: str
    draft: str | None
    device: torch.device
    options: dict
    calibrate: bool = True
    recalibrate: bool = False
    progress: bool = True
    log: Log = print
    #: the draft was chosen by ``draft="auto"`` (:func:`specdec.load` may then load another of its
    #: weight formats: :meth:`Backend.draft_variants`)
    draft_auto: bool = False


@dataclass(frozen=True)
class NoOptions:
    """The load options of a backend that takes none."""


class Backend:
    """The contract of a backend. Subclasses set the class attributes and implement :meth:`load` and
    :meth:`measure`; the rest has defaults. Its models declare what they can do
    (:class:`~specdec.models.backends.base.Capabilities`, opt-in) and what their timings depend on
    (:meth:`~specdec.models.backends.base.Model.fingerprint_extra`)."""

    #: the name ``backend=`` takes, and other spellings accepted for it
    name: str = ""
    aliases: tuple[str, ...] = ()
    #: the module it imports beyond specdec's own dependencies (None: none), and how to install it
    package: str | None = None
    install: str = ""
    #: the load options it takes: a frozen dataclass whose fields are declared with
    #: :func:`specdec.checks.option`. The one declaration gives ``specdec.load``'s keyword of that name,
    #: the check of its value, the commands' flag (``context_length``: ``--context-length``) and the
    #: error naming this backend when another one is asked for with it
    Options: type = NoOptions
    #: said when options it does not take are given (after "applies to the X backend; ")
    foreign_options: str = "it does not take them"
    #: the weight formats a model source may name after ``@`` on this backend (``name@bf16``: a copy of
    #: the model's weights in that format, which the backend makes): declared here, once, and checked by
    #: :meth:`check_format` for every backend
    formats: tuple[str, ...] = ()
    #: said when a source names a format another backend makes (after "made by the X backend; ")
    foreign_formats: str = "it runs a model's weights as given"

    # ------------------------------------------------------------------ choosing
    def available(self) -> bool:
        """Whether its package can be imported here (without importing it)."""
        return self.package is None or importlib.util.find_spec(self.package) is not None

    def require(self) -> None:
        """A one-line error naming how to install the missing package."""
        if not self.available():
            raise SpecdecError(f"backend {self.name!r} needs the Python package {self.package!r}, which is not "
                               f"installed: {self.install}")

    def auto_refusal(self, req: Request) -> str | None:
        """Why ``backend="auto"`` may not choose this backend for ``req`` (None: it may)."""
        return self.options_refusal(req) or (None if self.available() else f"{self.package} is not installed "
                                                                              f"({self.install})")

    def auto_reason(self, req: Request) -> str:
        """Why ``auto`` chose it (when no backend before it refused)."""
        return "auto"

    def check(self, req: Request) -> None:
        """A one-line error when this backend cannot load ``req`` (asked for by name, or chosen): a weight
        format it does not make, its package missing, options it does not take."""
        for source in (req.target, req.draft):
            self.check_format(source)
        self.require()
        self.check_options(req)

    def check_format(self, source: str | None) -> None:
        """A one-line error when ``source`` names a weight format after ``@`` (``name@bf16``) that this
        backend does not make (:attr:`formats`): naming the backend that makes it, or the formats that exist."""
        from ..sources import split_format

        fmt = split_format(source)[1]
        if fmt is None or fmt in self.formats:
            return
        makers = [b for b in REGISTRY if fmt in b.formats]
        if makers:
            maker = makers[0]
            missing = "" if maker.available() else f", which is not installed here: {maker.install}"
            raise SpecdecError(f"{source!r}: a copy in weight format {fmt!r} is made by the {maker.name} backend"
                               f"{missing}; {self.foreign_formats}")
        known = "; ".join(f"{', '.join(b.formats)} (the {b.name} backend)" for b in REGISTRY if b.formats)
        raise SpecdecError(f"{source!r}: unknown weight format {fmt!r} after '@'; "
                           + (f"choose one of {known}" if known else "no backend makes weight formats"))

    @property
    def options(self) -> dict[str, str]:
        """Its load options' names and help (:attr:`Options`)."""
        return {name: spec.help for name, (spec, _) in options_of(self.Options).items()}

    def foreign(self, options: dict) -> list[str]:
        """The given options this backend does not take."""
        return [k for k in options if k not in self.options]

    def options_refusal(self, req: Request) -> str | None:
        foreign = self.foreign(req.options)
        return f"{', '.join(foreign)} given ({REGISTRY.owner(foreign[0])} options)" if foreign else None

    def check_options(self, req: Request) -> None:
        foreign = self.foreign(req.options)
        if foreign:
            names = ", ".join(f"{k}={req.options[k]}" for k in foreign)
            raise SpecdecError(f"{names}: {'applies' if len(foreign) == 1 else 'apply'} to the "
                               f"{REGISTRY.owner(foreign[0])} backend; {self.foreign_options}")
        declared = options_of(self.Options)
        for name, value in req.options.items():
            declared[name][0].check(name, value)

    # ------------------------------------------------------------------ the work
    def load(self, req: Request, why: str) -> Loaded:
        raise NotImplementedError

    def measure(self, lm: Model, remeasure: bool = False, log: Log | None = None):
        """``lm``'s :class:`~specdec.models.costmodel.CostTable`: cached for this machine, else measured now."""
        raise NotImplementedError

    def identity(self, lm: Model) -> str:
        """A loaded model's weights, as a string, for caches of measurements made with it (its
        acceptance against a target: :mod:`specdec.frontends.draft_formats`). By default its backend, name and
        variant; a backend whose names do not say which weights they hold says more."""
        return f"{self.name}|{lm.name}|{lm.variant}"

    def draft_variants(self, draft: str) -> tuple[str, ...]:
        """Sources of other weight formats of the draft ``draft`` that ``draft="auto"`` may choose
        instead of it (:mod:`specdec.frontends.draft_formats` measures each); none by default."""
        return ()

    def load_draft(self, source: str, req: Request, loaded: Loaded) -> tuple[Model, Any]:
        """One more draft model beside the loaded pair (one of :meth:`draft_variants`), and its cost table
        (None when it could not be measured)."""
        raise SpecdecError(f"backend {self.name!r} loads no draft variants")

    def fingerprint(self, device: torch.device | str = "cpu") -> dict:
        """What a measurement on this backend depends on besides the model, for a model loaded with
        this backend's defaults (a loaded model's own: :func:`specdec.models.costmodel.model_fingerprint`);
        ``specdec models`` lists the tables cached under it."""
        from ..costmodel import fingerprint

        return fingerprint(device)

    # ------------------------------------------------------ for callers that run the library itself
    def prepare(self, source: str, progress: bool = True, verify: bool = False) -> str:
        """What this backend's library itself reads for a model source, made once and cached first
        (``verify``: every cached file hashed again): ``specdec models prepare``, the vLLM plug-in and
        the benchmark's peers ask it."""
        raise SpecdecError(f"backend {self.name!r} prepares no model files for other programs")

    def peer_model(self, source: str, dtype, device, quant: str = "none"):
        """The library's own model object for a source (not a :class:`Model`), its weights quantized
        as ``quant`` says: what a benchmark peer running the library's own generation takes."""
        raise SpecdecError(f"backend {self.name!r} lends no model object to peers")

    def threads(self) -> int | None:
        """The CPU threads its library runs with here by default (a peer of the same library runs with
        as many); None where it does not choose them."""
        return None

    def cached_estimate(self, req: Request):
        """This backend's expected reference-request time for ``req``'s models
        (:class:`~specdec.models.costmodel.DtypeChoice`) from tables already cached on this machine, without
        loading or converting anything; None when not measured here (``auto`` compares it with the
        chosen backend's measurement)."""
        return None


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu. ``cuda`` without a GPU is a user error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecdecError("device 'cuda' was asked for, but torch sees no CUDA GPU; use --device cpu")
    if device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise SpecdecError(f"unknown device {device!r}; choose cpu, cuda, cuda:N or auto")
    return torch.device(device)


def check_same_vocabulary(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose token table differs from the target's: its ids would mean other text."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv == dv:
        return
    differing = sorted(set(tv.items()) ^ set(dv.items()), key=lambda kv: kv[1])
    examples = ", ".join(f"{tok!r}->{idx}" for tok, idx in differing[:3])
    raise SpecdecError(
        f"draft {draft_name!r} and target {target_name!r} do not share a tokenizer: vocabularies of "
        f"{len(dv)} and {len(tv)} tokens differ in {len(differing)} entries (e.g. {examples}). "
        "Speculative decoding needs the same token table; pick a draft from the target's family, "
        "or use --drafter pld, which needs no draft model."
    )


class Registry:
    """The backends, in the order ``auto`` prefers them (the last one must accept anything)."""

    def __init__(self):
        self._paths: dict[str, str] = {}
        self._loaded: dict[str, Backend] = {}

    def add(self, name: str, path: str) -> None:
        """Register ``name`` as ``"module:Class"`` (imported when first asked for)."""
        self._paths[name] = path
        self._loaded.pop(name, None)

    def remove(self, name: str) -> None:
        self._paths.pop(name, None)
        self._loaded.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._paths)

    def get(self, name: str) -> Backend:
        name = self.canonical(name)
        if name not in self._loaded:
            module, _, cls = self._paths[name].partition(":")
            self._loaded[name] = getattr(importlib.import_module(module), cls)()
        return self._loaded[name]

    def __iter__(self):
        return (self.get(n) for n in self._paths)

    def canonical(self, name) -> str:
        """The registered name for ``name`` or one of its aliases (case and spaces ignored), ``auto``
        as is; else a one-line error listing the choices."""
        if isinstance(name, str):
            text = name.strip().lower()
            if text == AUTO or text in self._paths:
                return text
            for n in self._paths:
                if text in self.get(n).aliases:
                    return n
        raise SpecdecError(f"unknown backend {name!r}; choose one of: {AUTO}, {', '.join(self._paths)}")

    def owner(self, option: str) -> str:
        """The backend(s) that take a load option (for error messages)."""
        return " or ".join(b.name for b in self if option in b.options) or "no"

    def option_names(self) -> list[str]:
        return list(self.options())

    def options(self) -> dict[str, tuple[Spec, Any]]:
        """Every backend's load options, in the registry's order: ``{name: (spec, default)}``."""
        out: dict[str, tuple[Spec, Any]] = {}
        for b in self:
            for name, declared in options_of(b.Options).items():
                out.setdefault(name, declared)
        return out

    def given(self, options: dict) -> dict:
        """The load options a caller set: those not ``None`` or ``"auto"`` (their defaults); a name no
        backend declares is a one-line error."""
        self.check_known(options)
        return {k: v for k, v in options.items() if v is not None and v != AUTO}

    def check_known(self, options: dict) -> None:
        unknown = [k for k in options if k not in self.option_names()]
        if unknown:
            raise SpecdecError(f"unknown load option(s) {', '.join(unknown)}; known: {', '.join(self.option_names())}")

    def choose(self, name: str, req: Request) -> tuple[Backend, str]:
        """The backend for ``req`` and why: the one named, checked; or with ``auto`` the first in
        order that does not refuse, the why naming what ruled out those before it."""
        self.check_known(req.options)
        name = self.canonical(name)
        if name != AUTO:
            backend = self.get(name)
            backend.check(req)
            return backend, "asked for"
        refusals: list[str] = []
        for backend in self:
            refusal = backend.auto_refusal(req)
            if refusal is None:
                backend.check(req)
                return backend, (f"auto: {refusals[0]}" if refusals else backend.auto_reason(req))
            refusals.append(refusal)
        raise SpecdecError(f"no backend can load these models: {'; '.join(refusals)}")

    def load(self, name: str, req: Request) -> Loaded:
        """Choose (as :meth:`choose`) and load. When ``auto`` chose, the other backends ``auto`` could
        have chosen are asked for an estimate from tables cached on this machine; one measured
        faster than the chosen backend's own tables loads instead, and the why says so."""
        backend, why = self.choose(name, req)
        loaded = backend.load(req, why)
        if name == AUTO and req.options == {}:
            loaded = self._follow_measurement(backend, req, loaded)
        return loaded

    def _follow_measurement(self, chosen: Backend, req: Request, loaded: Loaded) -> Loaded:
        from ..costmodel import choose_dtypes

        t, d = loaded.costs.target, loaded.costs.draft
        if t is None or (loaded.draft is not None and d is None):
            return loaded
        mine = choose_dtypes({loaded.target.variant: t}, {loaded.draft.variant: d} if loaded.draft else None)
        for other in self:
            if other is chosen or other.auto_refusal(req) is not None:
                continue
            try:
                theirs = other.cached_estimate(req)
            except Exception:  # noqa: BLE001 - a comparison must never break a load
                theirs = None
            if theirs is None:
                continue
            if theirs.seconds < mine.seconds:  # measured faster on this machine: use it
                loaded.close()
                why = (f"auto: measured on this machine, {other.name} {theirs.seconds:.1f}s against {chosen.name} "
                       f"{mine.seconds:.1f}s for a reference request")
                other.check(req)
                return other.load(dataclasses.replace(req, options={}, calibrate=True, recalibrate=False), why)
            loaded.why = (f"{loaded.why}; measured on this machine, {chosen.name} {mine.seconds:.1f}s against "
                          f"{other.name} {theirs.seconds:.1f}s for a reference request")
        return loaded


#: every backend, in the order ``backend="auto"`` prefers them: one line each
REGISTRY = Registry()
REGISTRY.add("llama.cpp", "specdec.models.backends.llamacpp.backend:LlamaCppBackend")
REGISTRY.add("transformers", "specdec.models.backends.transformers.backend:TransformersBackend")
