"""Policies from names: ``lossless``, the loose rules, and compositions written with ``+``.

How rules compose (one definition for every combination):

1. The lossless rule decides first (exact match at T=0, ``min(1, p/q)`` at T>0).
2. Each *token rule* (``mars``, ``dropmatch``, ``typical``) may accept a draft the lossless rule
   rejected; a position passes if any of them accepts it. Rules only add acceptances.
3. ``fly`` is a *window*: it may flip remaining mismatches using the decisions of steps 1-2 (so
   ``fly+mars`` lets MARS acceptances count as agreement inside FLy's window).
4. The round keeps the leading accepted drafts; the next token is the target's (argmax at T=0,
   residual ``max(p - q, 0)`` draw at T>0) at the first rejection, or the bonus.

A composition names each rule at most once, in any order (``fly+mars`` == ``mars+fly``).
Parameters may be given plainly (``theta=0.8``) when only one rule of the policy has that name,
or prefixed by the rule (``mars_theta=0.8``, ``fly_theta=0.3``) always.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from ..errors import SpecdecError
from .base import Lossless, Round, Verdict, finish, lossless_mask
from .dropmatch import CRITERIA, dropout_logits, js_accept, majority_accept, naive_accept, path_tokens
from .fly import fly_flips, topk_entropy
from .lossless import leading_true
from .mars import mars_accept
from .typical import typical_accept


def rule_target_probs(rnd: Round) -> torch.Tensor:
    """``[K+1, V]`` the target distributions loose criteria read: the sampling distribution at T>0,
    the model's own softmax (temperature 1) at T=0, where the sampling distribution is one-hot."""
    if rnd.params.greedy or rnd.target_probs is None:
        return torch.softmax(rnd.target_logits, dim=-1)
    return rnd.target_probs


def rule_draft_probs(rnd: Round) -> torch.Tensor:
    """``[K, V]`` the draft's distributions: what drafts were drawn from at T>0, the draft model's
    softmax at T=0, and one-hot at the drafts for drafters without a model (prompt lookup)."""
    if not rnd.params.greedy and rnd.draft_probs is not None:
        return rnd.draft_probs
    if rnd.draft_logits is not None:
        t = rnd.params.temperature if rnd.params.temperature > 0 else 1.0
        return torch.softmax(rnd.draft_logits / t, dim=-1)
    one_hot = torch.zeros(rnd.k, rnd.target_logits.shape[-1], device=rnd.target_logits.device)
    return one_hot.scatter_(-1, rnd.draft_tokens[:, None], 1.0)


# ------------------------------------------------------------------------------ token rules
@dataclass(frozen=True)
class Mars:
    """MARS: accept a top-2 draft when ``z_(2) / z_(1) > theta`` (see :mod:`.mars`)."""

    theta: float = 0.9
    name = "mars"
    needs_hidden = False
    needs_draft_logits = False

    def accepts(self, rnd: Round, where: torch.Tensor) -> torch.Tensor:
        return mars_accept(rnd.target_logits[:-1], rnd.draft_tokens, self.theta) & where


@dataclass(frozen=True)
class Typical:
    """Typical acceptance: ``p(d) > min(epsilon, delta * exp(-H(p)))`` (see :mod:`.typical`)."""

    epsilon: float = 0.09
    delta: float = 0.3
    name = "typical"
    needs_hidden = False
    needs_draft_logits = False

    def accepts(self, rnd: Round, where: torch.Tensor) -> torch.Tensor:
        probs = rule_target_probs(rnd)[:-1]
        return typical_accept(probs, rnd.draft_tokens, self.epsilon, self.delta) & where


@dataclass(frozen=True)
class DropMatch:
    """DropMatch: ``paths`` MC-dropout LM-head paths with dropout ``p``; criterion ``naive`` (any
    path's token), ``js`` (JS divergence to the paths' centroid), ``majority`` (more than half of
    the paths) or ``paper`` (js or majority, the paper's Algorithm 1). ``p = 0`` means no dropout,
    so no path differs from the target and the rule adds nothing (at any temperature).

    Only positions the lossless rule rejected are evaluated, so a round the lossless rule accepts
    whole costs nothing extra; otherwise one LM-head matmul over paths x those positions."""

    paths: int = 5
    p: float = 0.1
    criterion: str = "paper"
    name = "dropmatch"
    needs_hidden = True

    @property
    def needs_draft_logits(self) -> bool:
        return self.criterion in ("js", "paper")

    def accepts(self, rnd: Round, where: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(where)
        if self.p == 0 or not bool(where.any()):
            return out
        if rnd.target_hidden is None or rnd.lm_head is None:
            raise RuntimeError("dropmatch needs the target's hidden states and LM head")
        idx = where.nonzero().squeeze(-1)  # [M]
        logits = dropout_logits(rnd.target_hidden[idx], rnd.lm_head, self.paths, self.p, rnd.generator)  # [N, M, V]
        drafts = rnd.draft_tokens[idx]
        temperature = rnd.params.temperature
        ok = torch.zeros_like(drafts, dtype=torch.bool)
        if self.criterion in ("naive", "majority", "paper"):
            tokens = path_tokens(logits, temperature, rnd.generator)  # [N, M]
            ok |= naive_accept(tokens, drafts) if self.criterion == "naive" else majority_accept(tokens, drafts)
        if self.criterion in ("js", "paper"):
            ok |= js_accept(logits, rule_draft_probs(rnd)[idx], temperature)
        out[idx] = ok
        return out


@dataclass(frozen=True)
class Fly:
    """FLy's entropy gate + deferred window over the block (see :mod:`.fly`)."""

    theta: float = 0.3
    window: int = 6
    name = "fly"
    needs_hidden = False
    needs_draft_logits = False

    def flips(self, rnd: Round, accept: torch.Tensor) -> torch.Tensor:
        return fly_flips(accept, topk_entropy(rnd.target_logits[:-1]), self.theta, self.window)


RULES: dict[str, type] = {"mars": Mars, "dropmatch": DropMatch, "typical": Typical, "fly": Fly}


def _check(rule: str, key: str, value: Any) -> Any:
    """Validate one rule parameter; returns it normalized."""
    where = f"{rule} {key}"

    def number(lo: float, hi: float | None = None, lo_open: bool = False, hi_open: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise SpecdecError(f"{where} must be a number, got {value!r}")
        if (value < lo or (lo_open and value == lo)) or (hi is not None and (value > hi or (hi_open and value == hi))):
            lo_b, hi_b = ("(" if lo_open else "["), (")" if hi_open else "]")
            raise SpecdecError(f"{where} must be in {lo_b}{lo}, {hi if hi is not None else 'inf'}{hi_b}, got {value}")
        return float(value)

    def integer(lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise SpecdecError(f"{where} must be an integer in [{lo}, {hi}], got {value!r}")
        return value

    spec = {
        ("mars", "theta"): lambda: number(0.0, 1.0),
        ("typical", "epsilon"): lambda: number(0.0, 1.0),
        ("typical", "delta"): lambda: number(0.0),
        ("dropmatch", "paths"): lambda: integer(1, 64),
        ("dropmatch", "p"): lambda: number(0.0, 1.0, hi_open=True),
        ("fly", "theta"): lambda: number(0.0),
        ("fly", "window"): lambda: integer(1, 1024),
    }
    if (rule, key) == ("dropmatch", "criterion"):
        if value not in CRITERIA:
            raise SpecdecError(f"{where} must be one of {', '.join(CRITERIA)}, got {value!r}")
        return value
    return spec[(rule, key)]()


def rule_params(rule: str) -> list[str]:
    return [f.name for f in fields(RULES[rule])]


@dataclass(frozen=True)
class LoosePolicy:
    """The lossless rule plus token rules, optionally wrapped by FLy's window (module docstring)."""

    name: str
    rules: tuple = ()
    window: Fly | None = None
    lossy = True

    @property
    def needs_hidden(self) -> bool:
        return any(r.needs_hidden for r in self.rules)

    @property
    def needs_draft_logits(self) -> bool:
        return any(r.needs_draft_logits for r in self.rules)

    @property
    def params(self) -> dict[str, Any]:
        out = {}
        for rule in (*self.rules, *([self.window] if self.window else [])):
            out.update({f"{rule.name}_{f.name}": getattr(rule, f.name) for f in fields(rule)})
        return out

    def verify(self, rnd: Round) -> Verdict:
        base = lossless_mask(rnd)  # [K]
        accept = base.clone()
        added = {}
        for rule in self.rules:
            added[rule.name] = rule.accepts(rnd, ~base)  # [K], only where lossless rejected
            accept |= added[rule.name]
        if self.window is not None:
            added[self.window.name] = self.window.flips(rnd, accept)
            accept |= added[self.window.name]
        n = leading_true(accept)
        relaxed = {name: int(mask[:n].sum()) for name, mask in added.items()}
        return Verdict(n, finish(rnd, n), relaxed)


def parse_policy(name: str, params: dict[str, Any]):
    """``name`` (``lossless``, ``mars``, ``fly+mars``, ...) and its parameters -> a policy object."""
    if not isinstance(name, str) or not name:
        raise SpecdecError(f"policy must be a non-empty string, got {name!r}")
    if name == "lossless":
        if params:
            raise SpecdecError(f"policy 'lossless' takes no parameters, got {sorted(params)}")
        return Lossless()
    parts = [p.strip() for p in name.split("+")]
    known = ", ".join(["ar", "lossless", *RULES])
    for part in parts:
        if part not in RULES:
            raise SpecdecError(
                f"unknown policy {name!r}: {part!r} is not a rule; choose from {known}, "
                "or combine loose rules with '+' (e.g. fly+mars)"
            )
    if len(set(parts)) != len(parts):
        raise SpecdecError(f"policy {name!r} names a rule twice")
    chosen: dict[str, dict[str, Any]] = {part: {} for part in parts}
    for key, value in params.items():
        rule, _, plain = key.partition("_")
        if rule in chosen and plain in rule_params(rule):
            target = rule
        else:
            owners = [p for p in parts if key in rule_params(p)]
            if not owners:
                accepted = sorted({f"{p}_{k}" for p in parts for k in rule_params(p)} | {k for p in parts for k in rule_params(p)})
                raise SpecdecError(f"policy {name!r} has no parameter {key!r}; it takes: {', '.join(accepted)}")
            if len(owners) > 1:
                raise SpecdecError(
                    f"parameter {key!r} is ambiguous in policy {name!r}; write "
                    + " or ".join(f"{o}_{key}" for o in owners)
                )
            target, plain = owners[0], key
        if plain in chosen[target]:
            raise SpecdecError(f"parameter {target}_{plain} given twice")
        chosen[target][plain] = _check(target, plain, value)
    token_rules = tuple(RULES[p](**chosen[p]) for p in parts if p != "fly")
    window = Fly(**chosen["fly"]) if "fly" in chosen else None
    return LoosePolicy(name=name, rules=token_rules, window=window)
