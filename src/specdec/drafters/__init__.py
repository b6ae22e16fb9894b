"""Drafters behind one small interface (see :mod:`specdec.drafters.base`)."""

from .base import Draft, Drafter
from .lookup import LookupDrafter, lookup
from .mla import LookupModelDrafter
from .model import ModelDrafter

#: ``model``: the draft model; ``pld``: prompt lookup; ``model+pld``: the draft model accelerated by
#: prompt lookup (FLy's multi-level acceleration; same tokens as ``model``, cheaper when text repeats).
DRAFTERS = ("model", "pld", "model+pld")

#: The options each drafter takes (passed through ``generate(..., ngram_max=4)`` etc.).
DRAFTER_OPTIONS = {
    "model": ("min_confidence",),
    "pld": ("ngram_max", "ngram_min"),
    "model+pld": ("ngram_max", "ngram_min", "lookup_tokens", "min_confidence"),
}


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
    else:
        ModelDrafter.check_confidence(options.get("min_confidence", 0.0))
        if drafter == "model+pld":
            LookupModelDrafter.check(**{k: v for k, v in options.items() if k != "min_confidence"})


__all__ = ["DRAFTERS", "DRAFTER_OPTIONS", "check_drafter_options", "Draft", "Drafter", "LookupDrafter", "LookupModelDrafter", "ModelDrafter", "lookup"]
