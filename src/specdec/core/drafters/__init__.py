"""Drafters behind one small interface (:class:`specdec.core.drafters.base.Drafter`, which lists all
that the engine, bench and the server read of a drafter), in one registry.

Each drafter class declares its options once (``Options``: a dataclass whose fields carry default,
range and help); validation, the CLI flags and the server's option names all come from there. A
new drafter is one file with a :class:`Drafter` subclass and one entry in :data:`DRAFTERS`.
"""

from __future__ import annotations

from ...checks import check_options, options_of
from ...errors import SpecdecError
from .auto import AutoDrafter
from .base import Draft, Drafter, Offer, TreeDraft
from .lookahead import LookaheadDrafter
from .lookup import LookupDrafter, lookup
from .mla import LookupModelDrafter
from .model import ModelDrafter
from .suffix import CacheScope, SuffixCache, SuffixDrafter, SuffixTreeDrafter
from .tree import TreeDrafter

#: ``model``: the draft model; ``pld``: prompt lookup; ``model+pld``: the draft model accelerated by
#: prompt lookup (FLy's multi-level acceleration; same tokens as ``model``, cheaper when text repeats);
#: ``tree``: a token tree from the draft model (EAGLE-2 style), verified in one target pass;
#: ``suffix``/``suffix-tree``: suffix decoding's chain/tree from a suffix trie over this and earlier requests' text;
#: ``lookahead``: lookahead decoding (a Jacobi window and an n-gram pool, no draft model), one tree pass;
#: ``auto``: the portfolio: each round the draft model, prompt lookup or suffix decoding, or a plain step,
#: whichever the cost tables price fastest (the default).
DRAFTERS: dict[str, type[Drafter]] = {"auto": AutoDrafter, "model": ModelDrafter, "pld": LookupDrafter, "model+pld": LookupModelDrafter,
                             "tree": TreeDrafter, "suffix": SuffixDrafter, "suffix-tree": SuffixTreeDrafter,
                             "lookahead": LookaheadDrafter}

#: drafter -> the option names it takes (passed through ``generate(..., ngram_max=4)`` etc.)
DRAFTER_OPTIONS: dict[str, tuple[str, ...]] = {name: tuple(options_of(cls.Options)) for name, cls in DRAFTERS.items()}

#: every drafter option name (a request's options that are not these go to the policy)
ALL_DRAFTER_OPTIONS: tuple[str, ...] = tuple(sorted({o for opts in DRAFTER_OPTIONS.values() for o in opts}))


def drafter_class(name: str) -> type[Drafter]:
    """The registered class called ``name`` (its declared capabilities: :class:`Drafter`)."""
    if name not in DRAFTERS:
        raise SpecdecError(f"unknown drafter {name!r}; choose one of: {', '.join(DRAFTERS)}")
    return DRAFTERS[name]


def check_drafter_options(drafter: str, options: dict) -> dict:
    """Raise a user error for an unknown drafter, an option it does not take, or a bad value;
    returns the options normalized."""
    cls = drafter_class(drafter)
    out = check_options(f"drafter {drafter!r}", cls.Options, dict(options))
    cls.check(**out)
    return out


def make_drafter(drafter: str | type[Drafter], draft_lm, stop_ids: frozenset[int], options: dict,
                 history: CacheScope | None = None) -> Drafter:
    """The drafter called ``drafter`` (or the registered class itself, as a request resolved it:
    ``DecodeConfig.drafter_type``) over the draft model ``draft_lm`` (None when none is loaded); a
    drafter that ``reads_history`` also gets ``history``, the request's view of earlier requests' text."""
    cls = drafter_class(drafter) if isinstance(drafter, str) else drafter
    if cls.requires_model and draft_lm is None:
        raise SpecdecError(f"drafter {cls.name!r} needs a draft model; load one (draft=...) or use drafter='pld'")
    if cls.reads_history:
        return cls.build(draft_lm, stop_ids, history=history, **options)
    return cls.build(draft_lm, stop_ids, **options)


__all__ = ["ALL_DRAFTER_OPTIONS", "DRAFTERS", "DRAFTER_OPTIONS", "check_drafter_options", "drafter_class", "make_drafter",
           "AutoDrafter", "Draft", "Drafter", "Offer", "TreeDraft", "LookaheadDrafter", "LookupDrafter", "LookupModelDrafter", "ModelDrafter", "SuffixCache",
           "SuffixDrafter", "SuffixTreeDrafter", "TreeDrafter", "lookup"]
