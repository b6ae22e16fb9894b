"""Write benchmarks/README.md: one row per folder under benchmarks/, from what each folder records.

    python scripts/benchmarks_index.py           # rewrite benchmarks/README.md
    python scripts/benchmarks_index.py --check   # exit 1 when the committed index is not what this writes

For each folder: what it measured (dataset, prompts, new tokens, temperature, configurations, backend
and target), the machine kind (:func:`recorded_kind`: the CPU flags and GPU its JSON files recorded;
where they recorded none, what its README names, else the folder's name), the date (its first invocation; else the first date its README
names) and the command that re-reports it (a ``specdec bench`` folder: ``specdec bench
--report-only --out FOLDER``, which takes every setting from the folder's run.json), re-reports a
tune (``specdec tune ... --status``) or regenerates it (a summary-only folder: its recorded command
runs the measurement again; any other folder: the script its README names). Standard library only.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
INDEX = BENCH / "README.md"
STAGES = ("proxy", "confirm", "validate")

HEAD = """\
# Benchmark folders

Every folder under `benchmarks/`, one row each, written by `python scripts/benchmarks_index.py`
from what each folder records (a test checks that the index lists every folder and is what the
script writes). All were measured on the bundled pair (Qwen2.5-Coder-1.5B-Instruct target,
Qwen2.5-Coder-0.5B-Instruct draft), or its shapes, on five machine kinds, each folder's kind read
from the CPU flags (and GPU) it recorded (where a folder recorded none, the kind its README or name
gives, marked so):

- **AVX2-only**: 2-core AMD EPYC, `lscpu` flags `avx2 fma f16c`, no `avx512*` (no native bf16);
- **AVX-512 BF16**: 2-core AMD EPYC, flags `avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16`
  (native bf16);
- **Intel Xeon, AVX-512 BF16 and AMX**: 2-core Intel Xeon (Sapphire Rapids), the flags above and
  `avx512_fp16 avx_vnni amx_tile amx_bf16 amx_int8` (folders named `*-xeon-amx`);
- **Intel Xeon, AVX-512 BF16, no AMX shown**: 2-core Intel Xeon (family 6, model 207), the AVX-512
  BF16 flags and `avx512_fp16 avx_vnni`, its hypervisor showing no `amx_*` (folders named `*-xeon`,
  `*-xeon-llama-server`, kinds read from their recorded flags);
- **GPU: NVIDIA H100 80GB** (folders named `*-h100`) and **GPU: NVIDIA H200** (`gpu-static-h200`):
  one GPU each; the host's CPU flags are not the kind.

A kind is a set of CPU flags, not a speed: the hosts lent as one kind differed, and one host changed
state from day to day (the AVX2-only kind's 4-bit target read a one-token step of 35-40 ms on some
days and 64-82 ms on others). The *one-token step* column gives, for a bench folder whose records
carry it, the bench's speed probe (the median `step_ms` of its records) and the target's format:
compare folders of one kind where it agrees, and ratios within a folder, never tokens/s across
folders.

Kinds of folder, and the command in the last column:

- *bench*: a `specdec bench` folder (`run.json`, `results.jsonl`). `specdec bench --report-only
  --out FOLDER` re-reports it (summary.json, report.md, plots) from its records, on any machine,
  with no model loaded: every setting comes from the command its run.json records.
- *tune*: a `specdec tune` folder (a bench folder per stage). The command with `--status` reports
  where it stands; without `--status` it resumes (and on another machine measures that machine).
- *summary only*: the summary, report and plots of an early run whose `results.jsonl` was never
  committed. It cannot be re-reported; the command shown is the one that made it and runs the
  measurement again.
- *other*: made by a script (its README says which and how); the script's command is shown.

Dates are the run's first invocation (UTC). Speeds are the machine's that ran them; a folder
re-reported elsewhere keeps them. Figures from these folders, with their tables:
[docs/results.md](../docs/results.md).
"""

AVX512 = "AVX-512 BF16"
AVX2 = "AVX2-only"
XEON_AMX = "Intel Xeon, AVX-512 BF16 and AMX"
XEON = "Intel Xeon, AVX-512 BF16, no AMX shown"
H100 = "GPU: NVIDIA H100 80GB"
#: a folder name's last part -> the kind its records must show (tests/test_figures.py checks it)
NAME_KINDS = {"-avx2": AVX2, "-avx512bf16": AVX512, "-xeon-amx": XEON_AMX, "-h100": H100}


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def kind_of(flags, gpu=None) -> str | None:
    """The machine kind of recorded CPU ``flags`` and ``gpu`` (None when neither is recorded)."""
    if gpu:
        return H100 if "H100" in str(gpu) else f"GPU: {gpu}"
    if not flags:
        return None
    if "amx_bf16" in flags:
        return XEON_AMX
    if "avx512_fp16" in flags:  # Intel's (Sapphire Rapids on), not the AMD EPYC's AVX-512
        return XEON
    return AVX512 if "avx512_bf16" in flags else AVX2


def recorded_machines(folder: Path) -> set[tuple[tuple[str, ...], str | None]]:
    """Every (CPU flags, GPU) that the JSON files of ``folder`` and of its subfolders record: a
    bench folder's run.json settings and summary, a cost table's machine, a script's summary."""
    found: set[tuple[tuple[str, ...], str | None]] = set()

    def walk(x, depth: int = 0) -> None:
        if isinstance(x, dict) and depth < 4:
            if x.get("cpu_flags") or x.get("gpu"):
                found.add((tuple(x.get("cpu_flags") or ()), x.get("gpu")))
            for key, value in x.items():
                if key not in ("configs", "tables", "prompts", "results"):
                    walk(value, depth + 1)

    for path in sorted([*folder.glob("*.json"), *folder.glob("*/*.json")]):
        walk(_read(path))
    return found


def recorded_kind(folder: Path) -> str | None:
    """The kind the folder's records show (a GPU over its host's CPU); None where they show none.
    Records that show two kinds give both, joined by " and "."""
    kinds = {kind_of(flags, gpu) for flags, gpu in recorded_machines(folder)} - {None}
    if any(k.startswith("GPU") for k in kinds):
        kinds = {k for k in kinds if k.startswith("GPU")}
    return " and ".join(sorted(kinds)) or None


def _kind_of_flags(flags, name: str) -> str:
    if flags:
        return kind_of(flags)
    for suffix, kind in NAME_KINDS.items():
        if name.endswith(suffix) or f"{suffix}-" in name:
            return kind
    return "not recorded"


def _recorded_command(run: dict) -> list[str]:
    migrations = run.get("migrations") or []
    if migrations and migrations[-1].get("command"):
        return list(migrations[-1]["command"])
    return list((run.get("invocations") or [{}])[-1].get("argv") or [])


def _flag(argv: list[str], name: str, default=None):
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else default


def _what(summary: dict, run: dict, argv: list[str]) -> str:
    r = summary.get("run") or {}
    settings = run.get("settings") or {}
    dataset = str(r.get("dataset") or _flag(argv, "--dataset", "humaneval"))
    n = r.get("samples")
    limit = _flag(argv, "--limit")
    if dataset.startswith("spec-bench"):
        cats = dataset.split(":", 1)[1].split(",") if ":" in dataset else []
        name = "Spec-Bench" + (f" {', '.join(cats)}" if 0 < len(cats) <= 3 else "")
        prompts = f"{name}, {limit} per category ({n} prompts)" if limit else f"{name}, {n} prompts"
    else:
        name = {"humaneval": "HumanEval", "json-extraction": "JSON extraction"}.get(dataset, dataset)
        samples = _flag(argv, "--samples")
        prompts = f"{name} {n} problems" + (f" (positions {samples})" if samples else "")
    tokens = r.get("max_new_tokens") or settings.get("max_new_tokens") or _flag(argv, "--max-new-tokens")
    temp = r.get("temperature", settings.get("temperature"))
    backend = settings.get("backend") or ((r.get("models") or {}).get("backend")) or _flag(argv, "--backend") \
        or "transformers"
    target = str(settings.get("target") or (r.get("models") or {}).get("target") or "qwen2.5-coder-1.5b")
    dtype = (r.get("models") or {}).get("dtype") or settings.get("dtype")
    if dtype and ("as asked" in str(dtype) or "@" in target):
        dtype = None
    configs = list((summary.get("configs") or {}))
    shown = ", ".join(f"`{c}`" for c in configs[:6]) + (f" and {len(configs) - 6} more" if len(configs) > 6 else "")
    temp_text = "greedy" if temp in (0, 0.0) else f"T={temp:g}"
    target_text = target + (f" ({dtype})" if dtype else "")
    return f"{prompts}, {tokens} new tokens, {temp_text}; {backend}, target {target_text}: {shown}"


def _readme_title(folder: Path) -> str:
    """The README's title; where the title is only the folder's name, its first sentence."""
    readme = folder / "README.md"
    if not readme.is_file():
        return ""
    text = readme.read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.startswith("# "):
            title = line[2:].strip()
            if title != folder.name:
                return title
            break
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip() and not p.startswith("#")]
    if not paragraphs:
        return ""
    first = " ".join(paragraphs[0].split())
    first = re.sub(r"^Not a `specdec bench` folder \(no `run.json`\):\s*", "", first)
    first = re.split(r"(?<=[.:])\s", first)[0].rstrip(":.")
    return first[:1].upper() + first[1:]


def _readme_kind(folder: Path) -> str:
    """The machine kind a README names (for folders that record no CPU flags)."""
    text = ""
    for name in ("README.md", "NOTE.md"):
        if (folder / name).is_file():
            text += (folder / name).read_text(encoding="utf-8")
    if "H100" in text:
        return H100
    if "amx_bf16" in text:
        return XEON_AMX
    if "avx512_bf16" in text and "no `avx512" not in text:
        return AVX512
    if "AVX2" in text or "avx2 fma f16c" in text:
        return AVX2
    return "not recorded"


def _readme_date(folder: Path) -> str:
    for name in ("README.md", "NOTE.md"):
        p = folder / name
        if p.is_file():
            m = re.search(r"20\d\d-\d\d-\d\d", p.read_text(encoding="utf-8"))
            if m:
                return m.group(0)
    return "not recorded"


def _script_of(folder: Path) -> str:
    text = (folder / "README.md").read_text(encoding="utf-8") if (folder / "README.md").is_file() else ""
    shown = re.search(r"^    (\S.*\bspecdec .+)$", text, flags=re.M)   # an indented command line
    if shown and "scripts/" not in text:
        return shown.group(1).strip()
    m = re.search(r"`((?:python |bash )?scripts/[\w./-]+(?: [^`]*)?)`", text)
    if m:
        cmd = m.group(1)
        return cmd if cmd.startswith(("python ", "bash ")) else (
            ("bash " if cmd.endswith(".sh") else "python ") + cmd)
    m = re.search(r"scripts/[\w.-]+", text)
    if m:
        return ("bash " if m.group(0).endswith(".sh") else "python ") + m.group(0)
    return "see its README.md"


def _date(run: dict) -> str:
    t = (run.get("invocations") or [{}])[0].get("time") or ""
    return t[:10] or "not recorded"


def row(folder: Path) -> tuple[str, str, str, str, str, str]:
    """(name, kind, what, machine, date, command) of one folder."""
    name = folder.name
    run = _read(folder / "run.json")
    if run:
        argv = _recorded_command(run)
        summary = _read(folder / "summary.json")
        what = _what(summary, run, argv)
        machine = _kind_of_flags((run.get("settings") or {}).get("cpu_flags"), name)
        return name, "bench", what, machine, _date(run), f"specdec bench --report-only --out benchmarks/{name}"
    stages = [s for s in STAGES if (folder / s / "run.json").is_file()]
    if stages:
        run = _read(folder / stages[0] / "run.json")
        main_stage = _read(folder / ("confirm" if "confirm" in stages else stages[-1]) / "run.json")
        argv = _recorded_command(run)
        argv = [("benchmarks/" + name) if i and argv[i - 1] == "--out" else w for i, w in enumerate(argv)]
        tune = _read(folder / "tune.json")
        policies = _flag(argv, "--policy") or ", ".join(sorted({str(tune.get("policy"))} - {"None"}))
        s = main_stage.get("settings") or {}
        samples = _flag(argv, "--samples") or "82..163 (the default)"
        what = (f"`specdec tune` of {policies} on HumanEval positions {samples}: stages {', '.join(stages)}; "
                f"{s.get('backend', 'transformers')}, {s.get('max_new_tokens')} new tokens")
        title = _readme_title(folder)
        if title:
            what = f"{title}: {what}"
        machine = _kind_of_flags(s.get("cpu_flags"), name)
        return name, "tune", what, machine, _date(run), "specdec " + shlex.join(argv) + " --status"
    summary = _read(folder / "summary.json")
    original = _read(folder / "original-run.json")
    if summary and original:
        argv = _recorded_command(original)
        argv = [("benchmarks/" + name) if i and argv[i - 1] == "--out" else w for i, w in enumerate(argv)]
        what = _what(summary, original, argv)
        flags = ((summary.get("environment") or {}).get("hardware") or {}).get("cpu_flags")
        kind = _kind_of_flags(flags, name)
        return (name, "summary only", what, _readme_kind(folder) if kind.endswith("not recorded") else kind, _date(original),
                "specdec " + shlex.join(argv))
    title = _readme_title(folder) or "see its README.md"
    kind = _readme_kind(folder)
    kind = _kind_of_flags(None, name) if kind == "not recorded" or "-avx" in name else kind
    return name, "other", title, kind, _readme_date(folder), _script_of(folder)


def machine(folder: Path, shown: str) -> str:
    """The kind the folder's records show, else ``shown`` (what its README or name says), marked as
    not recorded."""
    return recorded_kind(folder) or (shown if shown == "not recorded" else f"{shown} (named; no flags recorded)")


def folder_probe(folder: Path) -> dict | None:
    """A bench folder's machine state as its runs probed it: the median ``step_ms`` (the bench's
    one-token speed probe) of its records and the target format they ran; None where the folder
    records no probe (agent loops, traces, cost tables, early runs)."""
    path = folder / "results.jsonl"
    if not path.is_file():
        return None
    steps, dtypes = [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            if r.get("step_ms"):
                steps.append(float(r["step_ms"]))
                dtypes.add(str((r.get("dtypes") or {}).get("target")))
    if not steps:
        return None
    steps.sort()
    mid = len(steps) // 2
    median = steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2
    return {"step_ms": round(median, 1), "target": ", ".join(sorted(dtypes))}


def probe_text(folder: Path) -> str:
    probe = folder_probe(folder)
    if probe is None:
        return "not recorded"
    return f"{probe['step_ms']:.0f} ms ({probe['target'].removeprefix('gguf:')})"


def folders() -> list[Path]:
    return sorted(p for p in BENCH.iterdir() if p.is_dir())


def render() -> str:
    lines = [HEAD, "| folder | kind | what it measured | machine | date | one-token step | command |",
             "|---|---|---|---|---|---|---|"]
    for f in folders():
        name, kind, what, shown, date, command = row(f)
        what = what.replace("|", "\\|")
        lines.append(f"| [`{name}`]({name}/) | {kind} | {what} | {machine(f, shown)} | {date} | {probe_text(f)} | "
                     f"`{command}` |")
    logs = sorted(p.name for p in BENCH.glob("*.log"))
    if logs:
        lines += ["", "Log files beside the folders (the progress a tune printed, kept with its folder): "
                  + ", ".join(f"`{x}`" for x in logs) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not INDEX.is_file() or INDEX.read_text(encoding="utf-8") != text:
            print("benchmarks/README.md is not what scripts/benchmarks_index.py writes; run it", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(text, encoding="utf-8")
    print(f"wrote {INDEX.relative_to(ROOT)} ({len(folders())} folders)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
