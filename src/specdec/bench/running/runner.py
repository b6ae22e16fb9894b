"""The benchmark loop: every configuration on the same prompts, interleaved.

Order: samples outer, repeats, configurations inner, so drift of the machine (thermal, other
load) hits every configuration alike; the configurations' order turns by one from each (sample,
repeat) to the next (:func:`turn`), so none always runs first (on a cold cache) or last. A
configuration run before ``ar`` on a sample gets its agreement with ``ar`` in the summary. Our configurations run through
``Pair.generate`` (the one engine, never a loop of our own); peers through transformers'
``generate``. Each configuration is warmed up once on a short generation (not recorded) before
anything is timed. Every finished (sample, configuration, repeat) is scored and appended to
``results.jsonl`` at once; finished keys are skipped on a rerun. A sample that carries a JSON
schema (``json-extraction``) is decoded under it by every configuration; its constraint is
compiled for the pair's tokenizer before the clock starts, so no configuration pays for it.
Every record made by one invocation carries that invocation's machine speed (``step_ms``,
:func:`machine_step_ms`); resuming a folder made at another speed says so in one line, and the
summary times a sample's records against each other only when they share a speed.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ...errors import SpecdecError
from ...core.caller import Caller
from ...core.request import BENCH_SEED, DEFAULTS
from ...core.names import AR
from ...core.stats import tau_of
from .configs import Config
from ..tasks.datasets import Dataset, Sample
from .loaded import BenchModels
from .peers import run_peer
from ..tasks.prompts import Prompt, build_prompt
from ..scoring.quality import Scorer, agreement
from ..outputs.results import ResultsFile, record_key
from ..outputs.summary import same_speed


@dataclass
class Settings:
    """What shapes every generation of a run (besides the configuration)."""

    max_new_tokens: int = DEFAULTS["max_new_tokens"]
    temperature: float = DEFAULTS["temperature"]
    top_p: float = DEFAULTS["top_p"]
    top_k: int = DEFAULTS["top_k"]
    seed: int | None = BENCH_SEED  # seeded, unlike the library's default: repeat r uses seed + r
    repeats: int = 1
    warmup: bool = True
    warmup_tokens: int = 8
    sandbox_timeout: float = 10.0
    sandbox_memory_mb: int = 1024
    unsafe_exec: bool = False  # run code without isolation where the machine has none (sandbox.py)

    def sampling(self, repeat: int = 0) -> dict[str, Any]:
        seed = None if self.seed is None else self.seed + repeat
        return dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=seed)


class Running:
    """Running totals for the progress line (tau and speedup of each configuration so far)."""

    def __init__(self):
        self.tokens: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        self.accepted: dict[str, int] = {}
        self.rounds: dict[str, int] = {}

    def add(self, rec: dict) -> None:
        cid = rec["config"]
        self.tokens[cid] = self.tokens.get(cid, 0) + rec["new_tokens"]
        self.seconds[cid] = self.seconds.get(cid, 0.0) + rec["seconds"]
        s = rec.get("stats") or {}
        if s.get("target_forwards"):  # a peer: tau = produced tokens / target forward passes
            accepted, rounds = s["produced_tokens"] - s["target_forwards"], s["target_forwards"]
        else:
            accepted, rounds = s.get("accepted", 0), s.get("rounds", 0)
        self.accepted[cid] = self.accepted.get(cid, 0) + accepted
        self.rounds[cid] = self.rounds.get(cid, 0) + rounds

    def line(self, cid: str) -> str:
        def tps(c):
            return self.tokens.get(c, 0) / self.seconds[c] if self.seconds.get(c) else None

        parts = [cid]
        if self.rounds.get(cid):
            parts.append(f"tau {tau_of(self.accepted[cid], self.rounds[cid]):.2f}")
        mine, base = tps(cid), tps(AR)
        if mine is not None:
            parts.append(f"{mine:.1f} tok/s")
        if mine is not None and base:
            parts.append(f"speedup {mine / base:.2f}x")
        return "  ".join(parts)


def _progress(enabled: bool, total: int, done: int, label: str = "bench"):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    progress = Progress(
        TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TextColumn("elapsed"), TimeElapsedColumn(),
        TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}", markup=False),
        console=Console(stderr=True), disable=not enabled, transient=False,
    )
    task = progress.add_task(label, total=total, completed=done, info="")
    return progress, task


def run(
    pair, dataset: Dataset, configs: list[Config], peers: list[Config], settings: Settings, out_dir: Path, *,
    progress: bool = True, on_record: Callable[[dict], None] | None = None, models: BenchModels | None = None,
    skip: Callable[[Config, dict[str, dict]], bool] | None = None, label: str = "bench",
) -> list[dict]:
    """Run whatever is not finished yet; returns all records (loaded and new) of this run's
    samples. ``on_record`` is called after each line is durable (tests use it to inject crashes).
    ``skip(config, records by key)`` leaves a generation out when True (nothing is recorded: a
    rerun asks again; tune's stop rule). ``label`` names the progress bar.
    Unusable lines already in the folder are reported in one line on stderr and run again. The
    caller holds the folder's lock (:func:`specdec.bench.outputs.results.lock_out`). The models the run
    loads besides ``pair`` are kept in ``models``; without it, in a :class:`BenchModels` of its
    own, closed at the end, finished or not (llama.cpp's servers stop)."""
    own, models = models is None, BenchModels() if models is None else models
    results = ResultsFile(out_dir)
    existing = {r["key"]: r for r in results.load()}
    if results.report() is not None:
        print(results.report(), file=sys.stderr, flush=True)
    everything = [*configs, *peers]
    prompts: dict[str, Prompt] = {s.id: build_prompt(pair.tokenizer, s) for s in dataset.samples}
    scorer = Scorer(settings.sandbox_timeout, settings.sandbox_memory_mb, settings.unsafe_exec)
    constraints = sample_constraints(dataset)
    if constraints and peers:
        raise SpecdecError(f"peers cannot decode under {dataset.name}'s JSON schemas; drop --peers")
    running = Running()
    for rec in existing.values():
        running.add(rec)

    todo = [(s, rep, c) for i, s in enumerate(dataset.samples) for rep in range(settings.repeats)
            for c in turn(everything, i * settings.repeats + rep) if record_key(s.id, c.id, rep) not in existing]
    total = len(dataset.samples) * settings.repeats * len(everything)
    prompt_ids: dict[str, list[int]] = {}
    try:
        step_ms = _get_ready(pair, todo, prompts, everything, settings, models, constraints, existing.values())
        bar, task = _progress(progress, total, total - len(todo), label)
        with bar:
            for sample, rep, cfg in todo:
                if skip is not None and skip(cfg, existing):
                    bar.update(task, advance=1, info=f"{cfg.id}: stopped")
                    continue
                rec = _record(pair, cfg, sample, rep, prompts[sample.id], prompt_ids, settings, models, constraints)
                rec["step_ms"] = step_ms
                rec["quality"] = scorer.score(sample, rec["text"], rec.get("finish_reason"))
                _add_agreement(rec, existing.get(record_key(sample.id, AR, rep)))
                results.append(rec)
                existing[rec["key"]] = rec
                running.add(rec)
                bar.update(task, advance=1, info=running.line(cfg.id))
                if on_record is not None:
                    on_record(rec)
    finally:
        results.close()
        if own:
            models.close()
    wanted = {s.id for s in dataset.samples}
    return [r for r in existing.values() if r["sample_id"] in wanted]


def _record(pair, cfg: Config, sample: Sample, rep: int, prompt: Prompt, prompt_ids: dict[str, list[int]],
            settings: Settings, models: BenchModels, constraints: dict[str, Any]) -> dict:
    """One generation's record: a peer's from the prompt's token ids (encoded once per sample, kept
    in ``prompt_ids``), ours from its text under the sample's constraint."""
    if cfg.kind == "peer":
        if sample.id not in prompt_ids:
            prompt_ids[sample.id] = pair.encode(prompt.text, chat=False)
        return _peer_record(pair, cfg, sample, rep, prompt, prompt_ids[sample.id], settings, models)
    return _our_record(pair, cfg, sample, rep, prompt, settings, models, constraints.get(sample.id))


def turn(configs: list[Config], n: int) -> list[Config]:
    """``configs`` turned by ``n`` places: the order of the ``n``-th (sample, repeat) of a run."""
    n %= max(1, len(configs))
    return [*configs[n:], *configs[:n]]


def _get_ready(pair, todo: list, prompts: dict[str, Prompt], everything: list[Config], settings: Settings,
               models: BenchModels, constraints: dict[str, Any], existing: Iterable[dict]) -> float | None:
    """Before the first timed generation: the warm-up, then this machine's speed (None with nothing
    to do), with a line on stderr when the folder's results were timed at another."""
    if not todo:
        return None
    if settings.warmup:
        _warm_up_left(pair, todo, prompts, everything, settings, models, constraints)
    step_ms = machine_step_ms(pair)
    warning = speed_warning(existing, step_ms)
    if warning:
        print(f"specdec: {warning}", file=sys.stderr, flush=True)
    return step_ms


def machine_step_ms(pair) -> float:
    """This machine's speed as the run starts: milliseconds of one plain decoding step of the
    target (best of a few, :func:`specdec.models.costmodel.time_step`), stored in every record the run
    writes as ``step_ms``, so a folder resumed on a slower or faster machine is not timed across
    the two (:func:`specdec.bench.outputs.summary.same_speed`). About a second on a CPU."""
    from ...models.costmodel import time_step

    return round(1000.0 * time_step(pair.target), 3)


def speed_warning(existing: Iterable[dict], step_ms: float | None) -> str | None:
    """One line when the folder's records were timed at another machine speed than ``step_ms``
    (or before speeds were recorded), else None."""
    if step_ms is None:
        return None
    others = [r.get("step_ms") for r in existing]
    unprobed = sum(1 for s in others if s is None)
    off = sorted(float(s) for s in others if s is not None and not same_speed([{"step_ms": s}, {"step_ms": step_ms}]))
    if not unprobed and not off:
        return None
    where = []
    if off:
        speeds = f"{off[0]:.0f} ms" if round(off[0]) == round(off[-1]) else f"{off[0]:.0f}-{off[-1]:.0f} ms"
        where.append((len(off), f"at {speeds}"))
    if unprobed:
        where.append((unprobed, "before machine speeds were recorded"))
    if len(where) == 1 and where[0][0] == len(others):
        which = f"the folder's {len(others)} results were made {where[0][1]}"
    else:
        which = f"of the folder's {len(others)} results, " + " and ".join(f"{n} were made {w}" for n, w in where)
    return (f"this machine's one-token target pass takes {step_ms:.0f} ms; {which}: speed figures pair only "
            "generations timed at one speed, quality uses them all")


def _add_agreement(rec: dict, ar: dict | None) -> None:
    """``rec["agreement"]`` with ``ar``'s record of the same sample and repeat (when there is one)."""
    if rec["config"] == AR:
        rec["agreement"] = {"exact": True, "token": 1.0}
    elif ar is not None:
        exact, token = agreement(rec["token_ids"], ar["token_ids"])
        rec["agreement"] = {"exact": exact, "token": token}


def sample_constraints(dataset: Dataset) -> dict[str, Any]:
    """Sample id -> its structured-output :class:`~specdec.core.constrain.Constraint` (the sample's
    ``constraint_schema``), for the samples that carry one; checked here, before any generation."""
    out = {}
    for s in dataset.samples:
        if s.constraint_schema is not None:
            from ...core.constrain import constraint_from

            out[s.id] = constraint_from(json_schema=s.constraint_schema)
    return out


def _warm_up_left(pair, todo: list, prompts: dict[str, Prompt], everything: list[Config], settings: Settings,
                  models: BenchModels, constraints: dict[str, Any]) -> None:
    """:func:`warm_up` for the configurations with work left, on the shortest prompt with work
    left (a long prompt's prefill teaches the caches nothing more)."""
    first = min(dict.fromkeys(s.id for s, _, _ in todo), key=lambda sid: len(prompts[sid].text))
    left = {c.id for _, _, c in todo}
    warm_up(pair, prompts[first], [c for c in everything if c.id in left], settings, models, constraints.get(first))


#: the suffix of a configuration's caller id its warm-up runs as
WARM_UP = " (warm-up)"


def warm_up(pair, prompt: Prompt, configs: list[Config], settings: Settings, models: BenchModels,
            constraint=None) -> None:
    """Each configuration once on a short generation, not recorded (caches, kernels, allocator),
    under ``constraint`` when the run's samples carry one. Each runs as a caller of its own (its
    configuration's id and ``WARM_UP``): what it would teach the configuration's caller (a cut
    answer's length, its text to copy, copy rates) never reaches the measured samples."""
    n = max(1, min(settings.warmup_tokens, settings.max_new_tokens))
    for cfg in configs:
        if cfg.kind == "peer":
            run_peer(pair, cfg, pair.encode(prompt.text, chat=False), prompt.stop, max_new_tokens=n,
                     models=models, **settings.sampling())
        else:
            request = cfg.request_for(n, constraint, **settings.sampling())
            request = request.with_settings(caller=Caller.named(request.caller.name + WARM_UP))
            pair_for(pair, cfg, models).generate(prompt.text, chat=False, stop=list(prompt.stop) or None,
                                                 config=request)


def _base(sample: Sample, cfg: Config, rep: int) -> dict[str, Any]:
    return {"key": record_key(sample.id, cfg.id, rep), "sample_id": sample.id, "category": sample.category,
            "config": cfg.id, "kind": cfg.kind, "policy": cfg.policy, "drafter": cfg.drafter,
            "k": None if cfg.is_ar or cfg.kind == "peer" else cfg.k, "params": dict(cfg.params), "repeat": rep}


def pair_for(pair, cfg: Config, models: BenchModels):
    """The pair a configuration runs on: the run's own; for ``ar:dtype=X`` a target-only copy loaded
    in X; for ``...:backend=B`` (B other than the run's) the same models on backend B. Each is loaded
    once per run (kept in ``models``), so every configuration is timed in the same process."""
    dtype = cfg.ar_dtype
    backend = cfg.backend if cfg.backend and cfg.backend != pair.backend else None
    if dtype is None and backend is None:
        return pair
    variants = models.variants
    key = (dtype, backend, cfg.is_ar)
    if key not in variants:
        from ...frontends.api import load

        # calibrated (a cached table after the first run): the variant gets this machine's kernel choices
        draft = None if cfg.is_ar else pair.draft_name
        variants[key] = load(pair.target_name, draft=draft, backend=backend or pair.backend, dtype=dtype or "auto",
                             device=str(pair.target.device), progress=False)
    return variants[key]


def dtypes_of(pair) -> dict:
    """The variants a record was made with (what ``dtype="auto"`` resolved to) and the kernel
    choices in force, so a folder says what its figures are figures of."""
    kernels = [f"{role}:{k}" for role, t in (("target", pair.costs.target), ("draft", pair.costs.draft))
               if t is not None for k in t.kernels]
    return {"target": pair.target.variant, "draft": None if pair.draft is None else pair.draft.variant,
            "kernels": kernels, "backend": pair.backend}


def _our_record(pair, cfg: Config, sample: Sample, rep: int, prompt: Prompt, settings: Settings,
                models: BenchModels, constraint=None) -> dict:
    pair = pair_for(pair, cfg, models)
    request = cfg.request_for(settings.max_new_tokens, constraint, **settings.sampling(rep))
    if constraint is not None:  # compiled (and cached) for this pair's tokenizer before the clock starts
        from ...core.constrain import compile_constraint

        compile_constraint(pair.tokenizer, constraint)
    start = time.perf_counter()
    out = pair.generate(prompt.text, chat=False, stop=list(prompt.stop) or None, config=request)
    wall = time.perf_counter() - start
    rec = {**_base(sample, cfg, rep), "text": out.text, "token_ids": list(out.token_ids),
           "finish_reason": out.finish_reason, "prompt_tokens": out.prompt_tokens,
           "new_tokens": len(out.token_ids), "seconds": wall, "stats": out.stats.to_dict(),
           "dtypes": dtypes_of(pair), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if constraint is not None:
        rec["constraint"] = constraint.kind
    return rec


def _peer_record(pair, cfg: Config, sample: Sample, rep: int, prompt: Prompt, ids: list[int],
                 settings: Settings, models: BenchModels) -> dict:
    res = run_peer(pair, cfg, ids, prompt.stop, max_new_tokens=settings.max_new_tokens, models=models,
                   **settings.sampling(rep))
    stats = {"total_seconds": res["seconds"], "target_forwards": res["target_forwards"],
             "produced_tokens": res["produced_tokens"], "tau": res["tau"], "peer_settings": res["peer_settings"]}
    return {**_base(sample, cfg, rep), "text": res["text"], "token_ids": res["token_ids"],
            "finish_reason": res["finish_reason"], "prompt_tokens": res["prompt_tokens"],
            "new_tokens": res["new_tokens"], "seconds": res["seconds"], "stats": stats,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
