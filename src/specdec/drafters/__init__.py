"""Drafters behind one small interface (see :mod:`specdec.drafters.base`)."""

from .base import Draft, Drafter
from .lookup import LookupDrafter, lookup
from .model import ModelDrafter

DRAFTERS = ("model", "pld")

__all__ = ["DRAFTERS", "Draft", "Drafter", "LookupDrafter", "ModelDrafter", "lookup"]
