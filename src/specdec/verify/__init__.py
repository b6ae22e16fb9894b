"""Verification rules: pure functions over tensors, and the policies built from them.

``make_policy(name, **params)`` is the one way the engine gets a policy from its name.
"""

from __future__ import annotations

from typing import Any

from ..errors import SpecdecError
from .base import Lossless, Policy, Round, Verdict, finish, lossless_mask

__all__ = ["Lossless", "Policy", "Round", "Verdict", "finish", "lossless_mask", "make_policy", "POLICIES"]

#: Policy names the engine accepts. ``ar`` is plain decoding: no drafting, no verification.
POLICIES = ("ar", "lossless")


def make_policy(name: str, params: dict[str, Any] | None = None) -> Policy | None:
    """The policy called ``name`` (None for ``ar``); unknown names and parameters are user errors."""
    params = dict(params or {})
    if name == "ar" or name == "lossless":
        if params:
            raise SpecdecError(f"policy {name!r} takes no parameters, got {sorted(params)}")
        return None if name == "ar" else Lossless()
    raise SpecdecError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
