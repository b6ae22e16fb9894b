"""``specdec tune``'s grid: the policies asked for, each rule's parameter values (its declared
``tune_grid`` or ``--grid``) times ``--k``, as validated bench configurations, and the
configuration the proxy stage runs for each."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from ...draftlength import K
from ...errors import SpecdecError
from ...core.names import AR
from ..running import configs as cfgs


def parse_policies(text: str) -> list[str]:
    """``--policy`` as a list of loose (or exact) policy names, validated, without duplicates."""
    names = list(dict.fromkeys(cfgs.split_list(text, "--policy")))
    for name in names:
        check_policy(name)
    return names


def check_policy(name: str):
    """The policy object of ``name``, refusing ``ar`` (the baseline) and unknown names."""
    from ...core.verify import make_policy

    if name == AR:
        raise SpecdecError("policy 'ar' (plain decoding) has nothing to tune; it is the baseline")
    return make_policy(name)


def grid_axes(policy: str, overrides: list[str] | None) -> dict[str, list[Any]]:
    """``{prefixed parameter: values}``: each rule's ``tune_grid``, replaced by ``--grid`` items
    (with several policies, an item applies to each policy that has the parameter)."""
    from ...core.verify import RULES

    pol = check_policy(policy)
    rules = [] if pol is None else sorted(set(policy.split("+")) & set(RULES))
    axes: dict[str, list[Any]] = {}
    for rule in rules:
        for param, values in getattr(RULES[rule], "tune_grid", {}).items():
            axes[f"{rule}_{param}"] = list(values)
    for item in overrides or []:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not values.strip():
            raise SpecdecError(f"bad --grid {item!r}: use PARAM=V1,V2,... (e.g. mars_theta=0.7,0.9)")
        full = _prefixed(key, rules, policy)
        axes[full] = [cfgs.parse_value(v) for v in cfgs.split_list(values, "--grid value")]
    return axes


def grid_for_policies(policies: list[str], overrides: list[str] | None) -> dict[str, dict[str, list[Any]]]:
    """:func:`grid_axes` per policy; with several policies a ``--grid`` item goes to each policy
    that takes it (an item none takes is an error naming them all)."""
    if len(policies) == 1:
        return {policies[0]: grid_axes(policies[0], overrides)}
    items: dict[str, list[str]] = {p: [] for p in policies}
    for item in overrides or []:
        took = []
        for p in policies:
            try:
                grid_axes(p, [item])
            except SpecdecError as exc:
                if "is not a parameter" in str(exc):
                    continue
                raise
            items[p].append(item)
            took.append(p)
        if not took:
            raise SpecdecError(f"--grid {item.partition('=')[0].strip()!r} is not a parameter of any policy in "
                               f"{', '.join(policies)}")
    return {p: grid_axes(p, items[p]) for p in policies}


def _prefixed(key: str, rules: list[str], policy: str) -> str:
    from ...core.verify import rule_params
    from ...core.verify.policy import SCHEDULE_PARAMS

    if any(key == f"{r}_{p}" for r in rules for p in rule_params(r)) or (rules and key in SCHEDULE_PARAMS):
        return key  # prefixed already, or the policy's own (its relaxation schedule: never prefixed)
    owners = [r for r in rules if key in rule_params(r)]
    if len(owners) != 1:
        taken = ", ".join([*(f"{r}_{p}" for r in rules for p in rule_params(r)),
                           *(SCHEDULE_PARAMS if rules else ())]) or "no parameters"
        raise SpecdecError(f"--grid {key!r} is not a parameter of policy {policy!r} (it takes {taken})"
                           if not owners else f"--grid {key!r} is ambiguous in {policy!r}; prefix it: "
                           + ", ".join(f"{r}_{key}" for r in owners))
    return f"{owners[0]}_{key}"


def grid_configs(policy: str, drafter: str, ks: list, axes: dict[str, list[Any]], settings) -> tuple[list, list[str]]:
    """Every setting as a bench Config, validated (:func:`specdec.bench.running.configs.validate`: its
    DecodeConfig is built once and kept); settings the policy refuses (FLy with K <= window) are
    skipped and returned as notes."""
    out, skipped = [], []
    names = list(axes)
    for values in itertools.product(*(axes[n] for n in names)):
        params = dict(zip(names, values))
        for k in ks:
            c = cfgs.Config(policy, drafter, k, params)
            try:
                [c] = cfgs.validate([c], max_new_tokens=settings.max_new_tokens, **settings.sampling())
            except SpecdecError as exc:
                if "window" not in str(exc):
                    raise
                skipped.append(c.id)
                continue
            out.append(c)
    if not out:
        raise SpecdecError(f"no setting of {policy!r} in the grid can run (skipped: {', '.join(skipped)})")
    return cfgs.dedupe(out), skipped


def proxy_config(c, proxy_k: int, settings):
    """The configuration the proxy stage runs for grid setting ``c``: ``c`` itself at a fixed K,
    or, for ``k=auto``, at ``proxy_k`` (at least one more than a FLy window, so the window can act)."""
    from ...core.verify import make_policy

    if not K.parse(c.k).auto:
        return c
    pol = make_policy(c.policy, c.params)
    k = max(proxy_k, (pol.lookahead + 1) if pol is not None and pol.lookahead else 0)
    [out] = cfgs.validate([replace(c, k=k, request=None)], max_new_tokens=settings.max_new_tokens,
                          **settings.sampling())
    return out


def parse_ks(text: str) -> list:
    return list(dict.fromkeys(cfgs.parse_k(x, "--k") for x in cfgs.split_list(text, "--k")))
