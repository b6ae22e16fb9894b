"""What ``specdec tune`` settles before any model loads: the tuning and validation splits, the
budget and confidence, each policy's grid and proxy configurations, the output paths."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from ...checks import check_number
from ...errors import SpecdecError
from ..running import configs as cfgs
from ..running.options import check_optional_dependencies, parse_float, parse_selection, parse_settings, sandbox_setting
from .grid import grid_configs, grid_for_policies, parse_ks, parse_policies, proxy_config


#: the tuning split when --samples is not given (HumanEval: the second half; the first half,
#: 0..81, is the default validation split and holds bench's usual report set)
DEFAULT_SPLIT = {"humaneval": (82, 163)}


#: the budget and confidence a tune asks for when not told: what the default split can certify on
#: the bundled pair, whose plain decoding solves 47 of HumanEval's 82 tuning problems (measured,
#: 512 tokens): at 0.9 a setting that changes no outcome is certified within 0.018, and one that loses
#: one problem and gains another within 0.042; at 0.02 / 0.95 no setting could qualify there (floor
#: 0.029), so the documented workflow ended without a config file
DEFAULT_MAX_LOSS = 0.05
DEFAULT_CONFIDENCE = 0.9
QUALITY_DATASETS = "humaneval, fixture, or spec-bench:math_reasoning"


def check_quality_dataset(spec: str) -> None:
    from ..tasks.datasets import parse_dataset

    name, cats = parse_dataset(spec)
    if name in ("humaneval", "fixture") or (name == "spec-bench" and cats and set(cats) == {"math_reasoning"}):
        return
    raise SpecdecError(f"tune needs a dataset with a task-quality score ({QUALITY_DATASETS}); got {spec!r}")


@dataclass
class PolicyPlan:
    """One policy's grid: its settings and the proxy configuration each runs as."""

    policy: str
    settings: list
    skipped: list[str]
    proxy_of: dict[str, Any]  # setting id -> proxy Config


@dataclass
class TunePlan:
    """What ``specdec tune`` settles before any model loads (:func:`plan_tune`)."""

    positions: Any
    max_loss: float
    confidence: float
    min_agreement: float
    speed_tie: float
    per_batch: int
    max_confirm: int | None  # settings confirmed per policy at most (None: all the proxy kept)
    settings: Any
    proxy_settings: Any
    policies: list[PolicyPlan]
    dataset: Any
    proxy_set: Any
    validation: Any  # a Dataset, or None (skipped)
    validation_overlap: list[str]
    out: Path
    targets: dict[str, Path]
    env: dict

    @cached_property
    def by_id(self) -> dict[str, Any]:
        """Every policy's settings by id."""
        return {c.id: c for p in self.policies for c in p.settings}


def parse_validation(text: str | None) -> tuple[int, int] | str | None:
    """``--validate-samples``: positions ``(a, b)``, ``"none"``, or None (the default split)."""
    if text is None:
        return None
    if str(text).strip().lower() == "none":
        return "none"
    return cfgs.parse_positions(text, "--validate-samples")


def validation_split(a, dataset, positions) -> tuple[Any, list[str]]:
    """The validation Dataset (None with ``--validate-samples none`` or when nothing is left) and
    the ids it shares with the tuning split (empty by default). ``positions``: :func:`parse_validation`."""
    from ..tasks.datasets import load_dataset

    if positions == "none":
        return None, []
    tuning = {s.id for s in dataset.samples}
    if positions is not None:
        v = load_dataset(a.dataset, None, a.data, positions)
        return v, [s.id for s in v.samples if s.id in tuning]
    full = load_dataset(a.dataset, None, a.data)
    rest = [s for s in full.samples if s.id not in tuning][: len(dataset.samples)]
    return (replace(full, samples=rest) if rest else None), []


def plan_tune(a: argparse.Namespace) -> TunePlan:
    """Everything that needs no model, checked first: the selection, tuning and validation
    splits, the budget and confidence, the settings grids, the dataset (and its sandbox setting),
    the output paths and the environment."""
    from ..running import environment
    from ..tasks.datasets import load_dataset

    limit, positions = parse_selection(a)
    validate_positions = parse_validation(a.validate_samples)
    check_quality_dataset(a.dataset)
    if positions is None:
        positions = DEFAULT_SPLIT.get(a.dataset.split(":")[0])
    max_loss = check_number("--max-quality-loss", parse_float(a.max_quality_loss, "--max-quality-loss"), 0.0, 1.0,
                            hi_open=True)
    confidence = check_number("--confidence", parse_float(a.confidence, "--confidence"), 0.5, 1.0, hi_open=True)
    min_agreement = check_number("--min-agreement", parse_float(a.min_agreement, "--min-agreement"), 0.0, 1.0)
    speed_tie = check_number("--speed-tie", parse_float(a.speed_tie, "--speed-tie"), 0.0, 1.0, hi_open=True)
    per_batch = cfgs.parse_int(a.confirm, "--confirm")
    max_confirm = None if a.max_confirm is None else cfgs.parse_int(a.max_confirm, "--max-confirm")
    settings = parse_settings(a)
    proxy_settings = replace(settings, max_new_tokens=cfgs.parse_int(a.proxy_tokens, "--proxy-tokens"))
    proxy_k = cfgs.parse_int(a.proxy_k, "--proxy-k")
    names = parse_policies(a.policy)
    if a.write and len(names) > 1:
        raise SpecdecError("--write names one config file; with several policies each gets OUT/config-POLICY.json")
    ks = parse_ks(a.k)
    plans = []
    for name, axes in grid_for_policies(names, a.grid).items():
        grid, skipped = grid_configs(name, a.drafter, ks, axes, settings)
        plans.append(PolicyPlan(name, grid, skipped, {c.id: proxy_config(c, proxy_k, proxy_settings) for c in grid}))
    if a.draft == "none" and any(cfgs.needs_draft_model(c) for p in plans for c in p.settings):
        raise SpecdecError(f"drafter {a.drafter!r} needs a draft model, but --draft none was given")
    check_optional_dependencies(a, plots=False)
    dataset = load_dataset(a.dataset, limit, a.data, positions)
    sandbox_setting(dataset, settings.unsafe_exec)  # refuse before the models load
    validation, overlap = validation_split(a, dataset, validate_positions)
    proxy_set = replace(dataset, samples=dataset.samples[: cfgs.parse_int(a.proxy_samples, "--proxy-samples")])
    out = Path(a.out)
    targets = {p.policy: (Path(a.write) if a.write else out / "config.json") if len(plans) == 1
               else out / f"config-{p.policy}.json" for p in plans}
    env = environment.describe(getattr(a, "argv_typed", None))
    return TunePlan(positions, max_loss, confidence, min_agreement, speed_tie, per_batch, max_confirm, settings,
                    proxy_settings, plans, dataset, proxy_set, validation, overlap, out, targets, env)
