"""Policies from names: ``lossless``, the loose rules, and compositions written with ``+``.

How rules compose (one definition for every combination):

1. The lossless rule decides first (exact match at T=0, ``min(1, p/q)`` at T>0).
2. Each *token rule* (``mars``, ``dropmatch``, ``typical``, ``fuzzy``) may accept a draft the
   lossless rule rejected; a position passes if any of them accepts it. Rules only add acceptances.
3. A *window rule* (``fly``; :class:`~specdec.core.verify.base.WindowRule`) may flip remaining
   mismatches using the decisions of steps 1-2 (so ``fly+mars`` lets MARS acceptances count as
   agreement inside FLy's window). A policy holds at most one window rule.
4. The round keeps the leading accepted drafts; the next token is the target's (argmax at T=0,
   residual ``max(p - q, 0)`` draw at T>0) at the first rejection, or the bonus.

Steps 2-3 act only where the policy's relaxation schedule allows (:mod:`specdec.core.verify.schedule`):
the answer's first ``exact_prefix`` tokens are judged by step 1 alone, then the rules apply (with a
chance rising over ``relax_ramp`` tokens, when set).

At T>0 no rule may keep a draft that has zero probability under the request's sampling settings
(temperature, top-k, top-p): every committed token is one plain sampling could have produced. At
any temperature no rule may keep a draft whose target logit is -inf (a token structured output
forbids there: :mod:`specdec.core.constrain` masks the target's rows before the round is built).

A composition names each rule at most once, in any order (``fly+mars`` == ``mars+fly``).
Parameters may be given plainly (``theta=0.8``) when only one rule of the policy has that name,
or prefixed by the rule (``mars_theta=0.8``, ``fly_theta=0.3``) always. The schedule's parameters
(``exact_prefix``, ``relax_ramp``) belong to the policy, not to a rule, and are never prefixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ...checks import options_of
from ...errors import SpecdecError
from ..sampling import draw
from .base import AR, Lossless, Round, Verdict, WindowRule, finish, lossless_mask
from .block import Block
from .dropmatch import DropMatch
from .fly import Fly
from .fuzzy import Fuzzy
from .lossless import leading_true, residual
from .mars import Mars
from .schedule import Schedule
from .tree import TreeRound, Walk, first_child_chain, walk_tree
from .typical import Typical


#: The loose rules by name: token rules (``kind = "token"``, ``accepts``) and window rules
#: (``kind = "window"``, ``flips``, ``lookahead``); see :mod:`specdec.core.verify.base`. Each class sits
#: next to its pure function and declares its parameters, ranges and help once. A new rule is one
#: file in verify/ and one entry here.
RULES: dict[str, Any] = {"mars": Mars, "dropmatch": DropMatch, "typical": Typical, "fuzzy": Fuzzy, "fly": Fly}  # rule classes
#: the parameters every loose policy takes besides its rules' (its relaxation schedule), never prefixed
SCHEDULE_PARAMS = tuple(options_of(Schedule))

#: The exact policies by name: each one class, taking no parameters, that verifies on its own (it
#: does not combine with loose rules, which compose with the token-wise lossless rule already).
EXACT: dict[str, type] = {"lossless": Lossless, "block": Block}
#: every single policy name, in the order the CLI's help lists them
POLICIES = (AR, *EXACT, *RULES)


def rule_params(rule: str) -> list[str]:
    return list(options_of(RULES[rule]))


def policy_param_names(rules) -> list[str]:
    """Every name a loose policy of ``rules`` takes: each rule's parameters prefixed by the rule
    (``mars_theta``) and plain (``theta``), and the schedule's (``exact_prefix``)."""
    out = [*SCHEDULE_PARAMS]
    for rule in rules:
        out += [f"{rule}_{p}" for p in rule_params(rule)] + rule_params(rule)
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class LoosePolicy:
    """The lossless rule plus token rules, optionally wrapped by one window rule, relaxing where its
    schedule allows (module docstring)."""

    name: str
    rules: tuple = ()
    window: WindowRule | None = None
    schedule: Schedule = field(default_factory=Schedule)
    lossy = True
    verifies_trees = True
    drafts = True

    @property
    def needs_hidden(self) -> bool:
        return any(r.needs_hidden for r in (*self.rules, *([self.window] if self.window else [])))

    @property
    def lookahead(self) -> int:
        return self.window.lookahead if self.window is not None else 0

    @property
    def lookahead_label(self) -> str:
        return self.window.lookahead_label if self.window is not None else ""

    @property
    def lookahead_remedy(self) -> str:
        return self.window.lookahead_remedy if self.window is not None else ""

    @property
    def params(self) -> dict[str, Any]:
        out = {}
        for rule in (*self.rules, *([self.window] if self.window else [])):
            out.update({f"{rule.name}_{f.name}": getattr(rule, f.name) for f in fields(rule)})
        out.update({f.name: getattr(self.schedule, f.name) for f in fields(self.schedule)})
        return out

    def relaxable(self, rnd: Round | TreeRound, allowed: torch.Tensor) -> torch.Tensor:
        """``allowed`` where the schedule lets the rules relax each draft (a tree: each node)."""
        positions = rnd.node_positions() if isinstance(rnd, TreeRound) else rnd.positions()
        mask = self.schedule.relaxable(positions, rnd.generator)
        return allowed if mask is None else allowed & mask.to(allowed.device)

    def verify(self, rnd: Round) -> Verdict:
        base = lossless_mask(rnd)  # [K]
        allowed = self.relaxable(rnd, ~base & in_support(rnd))
        accept = base.clone()
        added = {}
        for rule in self.rules:
            added[rule.name] = rule.accepts(rnd, allowed) & allowed  # [K], only where lossless rejected
            accept |= added[rule.name]
        if self.window is not None:
            added[self.window.name] = self.window.flips(rnd, accept) & allowed
            accept |= added[self.window.name]
        n = leading_true(accept)
        relaxed = {name: int(mask[:n].sum()) for name, mask in added.items()}
        return Verdict(n, finish(rnd, n), relaxed)

    def verify_tree(self, rnd: TreeRound) -> Verdict:
        """The same composition on a token tree: token rules judge each node against its parent's
        row and may keep a node the lossless walk rejects; FLy's window runs along the path and its
        first-child continuation (:func:`window_extend`)."""
        flat = node_round(rnd)
        alone = lossless_mask(flat)  # [N] each node judged alone (exact match / u < p at a point mass)
        # T>0: the walk's rejections are sequential over siblings, so every node may be relaxed
        allowed = self.relaxable(rnd, (~alone if rnd.params.greedy else torch.ones_like(alone)) & in_support(flat))
        added = {rule.name: rule.accepts(flat, allowed) & allowed for rule in self.rules}
        extra = torch.zeros_like(alone)
        for mask in added.values():
            extra |= mask
        walk = walk_tree(rnd, extra)
        flipped: set[int] = set()
        if self.window is not None:
            walk, flipped = window_extend(rnd, flat, walk, alone | extra, allowed, self.window)
        relaxed = {name: sum(1 for node, loose in zip(walk.path, walk.loose) if loose and node not in flipped
                             and bool(mask[node])) for name, mask in added.items()}
        if self.window is not None:
            relaxed[self.window.name] = len(flipped)
        return Verdict(len(walk.path), walk.token, relaxed, path=tuple(walk.path))


def in_support(rnd: Round) -> torch.Tensor:
    """``[K]`` bool: at T>0 a relaxation may only keep a draft the request's sampling could
    produce, with nonzero probability after temperature/top-k/top-p (the rules read raw logits or
    unfiltered paths); at T=0 any draft whose target logit is finite may be relaxed: a logit at
    -inf is a token structured output forbids there (:mod:`specdec.core.constrain`), which no rule may
    keep (at T>0 its probability is 0 already)."""
    if rnd.params.greedy or rnd.target_probs is None:
        return rnd.target_logits[:-1].gather(-1, rnd.draft_tokens[:, None]).squeeze(-1) > float("-inf")
    return rnd.target_probs[:-1].gather(-1, rnd.draft_tokens[:, None]).squeeze(-1) > 0


def node_round(rnd: TreeRound) -> Round:
    """The per-node view of a tree that loose rules read: a "chain" whose ``i``-th draft is node
    ``i`` judged against its parent's row (plus one last row, the root's, that no rule reads), with
    point-mass proposals (``draft_probs=None``)."""
    rows = torch.cat([rnd.node_rows(), rnd.node_rows().new_zeros(1)])
    return Round(
        target_logits=rnd.target_logits[rows], draft_tokens=rnd.tokens, draft_probs=None, params=rnd.params,
        generator=rnd.generator, target_probs=None if rnd.target_probs is None else rnd.target_probs[rows],
        target_hidden=None if rnd.target_hidden is None else rnd.target_hidden[rows], lm_head=rnd.lm_head,
        draft_logits=rnd.draft_logits, penalize_rows=_rows_of(rnd.penalize_rows, rows),
    )


def _rows_of(penalize_rows, rows: torch.Tensor):
    """``penalize_rows`` of a round whose row ``i`` is row ``rows[i]`` of the one it came from."""
    if penalize_rows is None:
        return None
    return lambda t, idx: penalize_rows(t, rows[idx])


def chain_round(flat: Round, index: torch.Tensor) -> Round:
    """The nodes ``index`` of a tree's per-node view (:func:`node_round`) as a chain: draft ``j`` is
    node ``index[j]`` with its parent's row (plus one last row that no rule reads)."""
    rows = torch.cat([index, index.new_zeros(1)])
    pick = (lambda t: None if t is None else t[rows])
    return Round(
        target_logits=flat.target_logits[rows], draft_tokens=flat.draft_tokens[index], draft_probs=None,
        params=flat.params, generator=flat.generator, target_probs=pick(flat.target_probs),
        target_hidden=pick(flat.target_hidden), lm_head=flat.lm_head,
        penalize_rows=_rows_of(flat.penalize_rows, rows),
        draft_logits=None if flat.draft_logits is None or len(flat.draft_logits) != flat.k else flat.draft_logits[index],
    )


def window_extend(rnd: TreeRound, flat: Round, walk: Walk, accepts: torch.Tensor, allowed: torch.Tensor,
                  window: WindowRule) -> tuple[Walk, set[int]]:
    """A window rule on a tree: the chain is the walk's path, then the first child of the node
    where it stopped and first children below it. The mismatch at that first child may flip when
    the window rule says so (its ``flips`` over the chain, reading the chain's per-node decisions
    ``accepts``); returns the walk, extended if it did, and the flipped nodes."""
    if not walk.rejected:  # the path ended at a leaf: no mismatch to flip
        return walk, set()
    kept = len(walk.path)
    chain = walk.path + first_child_chain(rnd.parents, walk.path[-1] if walk.path else -1)
    index = torch.tensor(chain, dtype=torch.long, device=accepts.device)
    accept = accepts[index].clone()
    accept[:kept] = True
    accept[kept] = False
    flips = window.flips(chain_round(flat, index), accept) & allowed[index]
    n = leading_true(accept | flips)
    if n <= kept:
        return walk, set()
    path = chain[:n]
    loose = walk.loose + [not bool(accepts[i]) or bool(flips[j]) for j, i in enumerate(chain[kept:n], start=kept)]
    row = path[-1] + 1
    if rnd.params.greedy:
        token = int(rnd.target_logits[row].argmax())
    else:
        assert rnd.target_probs is not None
        p = rnd.target_probs[row]
        if n < len(chain):
            p = residual(p, None, int(rnd.tokens[chain[n]]))
        token = int(draw(p[None], rnd.generator)[0])
    rejected = chain[n:n + 1]
    flipped = {chain[j] for j in range(kept, n) if bool(flips[j])}
    return Walk(path, loose, token, rejected), flipped


def parse_policy(name: str, params: dict[str, Any]):
    """``name`` (``lossless``, ``mars``, ``fly+mars``, ...) and its parameters -> a policy object."""
    if not isinstance(name, str) or not name:
        raise SpecdecError(f"policy must be a non-empty string, got {name!r}")
    if name in EXACT:
        if params:
            raise SpecdecError(f"policy {name!r} takes no parameters, got {sorted(params)}")
        return EXACT[name]()
    parts = [p.strip() for p in name.split("+")]
    for part in parts:
        if part in EXACT and part != "lossless":
            raise SpecdecError(
                f"policy {name!r}: {part} verification is exact and verifies on its own, so it does not combine "
                "with loose rules; loose rules compose with the token-wise lossless rule (write just the rules, e.g. "
                "fly+mars)")
        if part not in RULES:
            raise SpecdecError(
                f"unknown policy {name!r}: {part!r} is not a rule; choose from {', '.join(POLICIES)}, "
                "or combine loose rules with '+' (e.g. fly+mars)"
            )
    if len(set(parts)) != len(parts):
        raise SpecdecError(f"policy {name!r} names a rule twice")
    chosen: dict[str, dict[str, Any]] = {part: {} for part in parts}
    schedule: dict[str, Any] = {}
    for key, value in params.items():
        if key in SCHEDULE_PARAMS:
            spec, _ = options_of(Schedule)[key]
            schedule[key] = spec.check(key, value)
            continue
        rule, _, plain = key.partition("_")
        if rule in chosen and plain in rule_params(rule):
            target = rule
        else:
            owners = [p for p in parts if key in rule_params(p)]
            if not owners:
                accepted = sorted(policy_param_names(parts))
                raise SpecdecError(f"policy {name!r} has no parameter {key!r}; it takes: {', '.join(accepted)}")
            if len(owners) > 1:
                raise SpecdecError(
                    f"parameter {key!r} is ambiguous in policy {name!r}; write "
                    + " or ".join(f"{o}_{key}" for o in owners)
                )
            target, plain = owners[0], key
        if plain in chosen[target]:
            raise SpecdecError(f"parameter {target}_{plain} given twice")
        spec, _ = options_of(RULES[target])[plain]
        chosen[target][plain] = spec.check(f"{target} {plain}", value)
    windows = [p for p in parts if RULES[p].kind == "window"]
    if len(windows) > 1:
        raise SpecdecError(f"policy {name!r} combines window rules ({', '.join(windows)}); at most one per policy")
    token_rules = tuple(RULES[p](**chosen[p]) for p in parts if RULES[p].kind == "token")
    window = RULES[windows[0]](**chosen[windows[0]]) if windows else None
    return LoosePolicy(name=name, rules=token_rules, window=window, schedule=Schedule(**schedule))
