"""Drafters behind one small interface (see :mod:`specdec.drafters.base`)."""

from .base import Draft, Drafter
from .lookup import LookupDrafter, lookup
from .mla import LookupModelDrafter
from .model import ModelDrafter

#: ``model``: the draft model; ``pld``: prompt lookup; ``model+pld``: the draft model accelerated by
#: prompt lookup (FLy's multi-level acceleration; same tokens as ``model``, cheaper when text repeats).
DRAFTERS = ("model", "pld", "model+pld")

#: The options each drafter takes (passed through ``generate(..., ngram_max=4)`` etc.).
DRAFTER_OPTIONS = {"model": (), "pld": ("ngram_max", "ngram_min"), "model+pld": ("ngram_max", "ngram_min", "lookup_tokens")}


def check_drafter_options(drafter: str, options: dict) -> None:
    """Raise a user error for an unknown drafter, an option it does not take, or a bad value."""
    from ..errors import SpecdecError

    if drafter not in DRAFTERS:
        raise SpecdecError(f"unknown drafter {drafter!r}; choose one of: {', '.join(DRAFTERS)}")
    takes = DRAFTER_OPTIONS[drafter]
    extra = sorted(set(options) - set(takes))
    if extra:
        raise SpecdecError(f"drafter {drafter!r} takes {', '.join(takes) or 'no options'}, got {extra}")
    if drafter == "pld":
        LookupDrafter(**options)
    elif drafter == "model+pld":
        LookupModelDrafter.check(**options)


__all__ = ["DRAFTERS", "DRAFTER_OPTIONS", "check_drafter_options", "Draft", "Drafter", "LookupDrafter", "LookupModelDrafter", "ModelDrafter", "lookup"]
