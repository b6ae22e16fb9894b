"""Verification rules: pure functions over tensors, and the policies built from them.

``make_policy(name, params)`` is the one way the engine gets a policy from its name; see
:mod:`specdec.core.verify.policy` for how loose rules compose.
"""

from __future__ import annotations

from typing import Any

from ...errors import SpecdecError
from .base import Lossless, Plain, Policy, Round, Verdict, finish, lossless_mask
from .block import Block
from .policy import AR, EXACT, POLICIES, RULES, LoosePolicy, parse_policy, rule_params

__all__ = [
    "AR", "EXACT", "POLICIES", "RULES", "Block", "Lossless", "LoosePolicy", "Plain", "Policy", "Round", "Verdict", "finish", "lossless_mask",
    "make_policy", "rule_params",
]

def make_policy(name: str, params: dict[str, Any] | None = None) -> Policy:
    """The policy called ``name`` (``ar``: :class:`Plain`, which drafts nothing); unknown names and
    bad parameters are user errors."""
    params = dict(params or {})
    if name == AR:
        if params:
            raise SpecdecError(f"policy 'ar' takes no parameters, got {sorted(params)}")
        return Plain()
    return parse_policy(name, params)
