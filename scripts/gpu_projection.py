"""Measure, on a GPU, what a replay needs to project the CPU traces there (docs/replay.md), with the
transformers backend's static KV cache and CUDA graphs on and off.

No weights travel: the bundled pair's shapes (their config.json) are built with random weights in
bf16 on the device and saved as Hugging Face folders. Then, for each way of running the models
(``graphs``: the static KV cache with its short passes replayed as CUDA graphs, on a CPU the static
cache alone; ``dynamic``: transformers' dynamic cache, eager, as before):

1. ``passes``: each model's pass over 1..16 new tokens on a 256-token cache, timed directly (the
   goals: a one-token pass of the 1.5B target <= 4 ms, of the 0.5B draft <= 2.5 ms on an H100);
2. ``calibrate``: ``specdec calibrate --backend transformers --export`` measures the pass costs a
   replay reads;
3. ``rounds``: the engine runs greedy generations, plain and at fixed K, with a draft that never
   agrees (another random model) and one that agrees at times (the target itself), recording each
   round; ``project`` compares their measured seconds with the tables' to give the engine's own
   seconds per round beside the model's passes (goal: <= 1 ms);
4. ``rules``: ``scripts/cuda_rules_check.py`` with the static cache and CUDA graphs (every rule's
   checks, the lossless rule's chi-square);
5. ``project``: the CPU traces replayed on the device's tables, a projection (run in the
   background on the device machine's spare cores while the GPU stages go on; or later, anywhere).

One command does everything, each stage a subprocess with its own time box inside ``--budget``
seconds (the ``graphs`` stages first: the ``dynamic`` ones repeat an earlier measurement); every
stage writes as it goes, so a time-out or a crash still leaves data::

    PYTHONPATH=src python scripts/gpu_projection.py all CONFIGS OUT [--device cuda] [--budget 470]

CONFIGS holds target/ and draft/, each with config.json and the tokenizer files (copied from
``$SPECDEC_HOME/models/qwen2.5-coder-1.5b`` and ``-0.5b``). It writes OUT/log.txt (everything
printed), OUT/status.json (each stage's exit and seconds), OUT/passes.json, OUT/{graphs,dynamic}/
{costs.json, rounds.json, projection.md}, OUT/cuda_rules_check.{log,json} and OUT/summary.md (the
goals against what was measured). Later, on any machine::

    python scripts/gpu_projection.py project OUT/graphs TRACES...

prints the engine's own seconds (per plain step, per round, per draft token: the measured seconds
less what the tables price, fitted over the generations) and the traces replayed on the device's
tables with them, the tables standing for the traces' models (same shapes, bf16): a projection.
``measure CONFIGS OUT`` is the earlier measurement alone (build, calibrate, rounds; dynamic cache).
``configs CONFIGS`` writes the CONFIGS folder of the bundled pair (on a machine with its packages).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = (
    "def fibonacci(n: int) -> int:\n"
    '    """Return the n-th Fibonacci number, computed iteratively, with a short explanation of why the '
    'iterative form is preferred over the naive recursive one for large n, and what its complexity is."""\n'
) * 6  # about 240 tokens, as HumanEval's prompts
#: the ways of running the models, and the load options each stands for (``graphs`` on a CPU: the static cache alone)
MODES = ("graphs", "dynamic")
#: the stages of ``all``, in order, with each one's most seconds (within what is left of the budget)
STAGES = {"build": 120, "passes": 120, "calibrate-graphs": 90, "rounds-graphs": 120, "rules": 150,
          "calibrate-dynamic": 75, "rounds-dynamic": 150}
#: pass widths timed by the ``passes`` stage, and the cache they run on
PASS_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 16)
PASS_CONTEXT = 256
#: the files of a CONFIGS folder the models need beside their weights (never weights: those are built here)
WEIGHTS = (".safetensors", ".bin", ".pt", ".gguf")
TRACES = ("benchmarks/replay-avx512bf16/traces-humaneval20-bf16.jsonl",
          "benchmarks/replay-avx512bf16/traces-spec-bench26-bf16.jsonl")
GOALS = {"target": 4.0, "draft": 2.5}  # ms, a one-token pass on an H100 at batch 1


def mode_options(mode: str, device: str) -> dict:
    """The load options of a way of running on ``device``."""
    if mode == "dynamic":
        return {"static_cache": "off", "cuda_graphs": "off"}
    return {"static_cache": "on", "cuda_graphs": "on" if device.startswith("cuda") else "off"}


def flags(options: dict) -> list[str]:
    return [x for k, v in options.items() for x in (f"--{k.replace('_', '-')}", v)]


def write_json(path: Path, data) -> None:
    """Write ``data`` atomically: a reader (or a time-out) never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- the stages
def make_configs(dest: Path) -> None:
    """CONFIGS for the bundled pair: each model's config.json and tokenizer files, no weights: from
    its cached bf16 folder (``$SPECDEC_HOME/models/<name>``) when built, else read from its GGUF file
    (assembled from the installed chunk packages and checked; nothing dequantized)."""
    from transformers import AutoConfig, AutoTokenizer

    from specdec.models.bundled import DEFAULT_DRAFT, DEFAULT_TARGET, cache_dir, gguf_file

    for role, name in (("target", DEFAULT_TARGET), ("draft", DEFAULT_DRAFT)):
        out = dest / role
        out.mkdir(parents=True, exist_ok=True)
        folder = cache_dir(name)
        if (folder / "config.json").exists():
            for f in folder.iterdir():
                if f.is_file() and not f.name.endswith(WEIGHTS) and not f.name.startswith("."):
                    shutil.copy(f, out / f.name)
            say(f"{role}: copied {name}'s config and tokenizer from {folder}")
            continue
        gguf = gguf_file(name)
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        for key in ("quantization_config",):
            if hasattr(config, key):
                delattr(config, key)
        config.save_pretrained(str(out))
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(out))
        say(f"{role}: {name}'s config and tokenizer read from {gguf} into {out}")


def build(configs: Path, work: Path, device: str) -> dict[str, Path]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = {}
    for role in ("target", "draft"):
        src, dst = configs / role, work / role
        cfg = AutoConfig.from_pretrained(str(src))
        torch.manual_seed(0 if role == "target" else 1)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        model.save_pretrained(str(dst))
        for f in src.iterdir():
            if f.is_file() and f.name != "config.json" and not f.name.endswith(WEIGHTS):
                shutil.copy(f, dst / f.name)
        del model
        out[role] = dst
        say(f"built {role}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, saved in {dst}")
    return out


def folders(work: Path) -> dict[str, Path]:
    return {role: work / role for role in ("target", "draft")}


def load_pair(work: Path, device: str, options: dict, draft: Path | None = None):
    import specdec

    f = folders(work)
    return specdec.load(str(f["target"]), draft=str(draft or f["draft"]), backend="transformers", device=device,
                        dtype="bfloat16", draft_dtype="bfloat16", draft_quant="none", progress=False, calibrate=False,
                        **options)


def graphs_of(lm) -> str | None:
    graphs = getattr(lm, "graphs", None)
    return None if graphs is None else f"{graphs.describe()}; {graphs.captures} captures, {graphs.replays} replays"


def passes(work: Path, out: Path, device: str, repeats: int) -> None:
    """Each model's pass over ``w`` new tokens on a ``PASS_CONTEXT``-token cache, per way of running:
    median and best of ``repeats`` timings after three untimed passes (a graph is captured by its
    second); OUT/passes.json rewritten after each model."""
    import torch

    path = out / "passes.json"
    data = json.loads(path.read_text()) if path.exists() else {"context": PASS_CONTEXT, "widths": list(PASS_WIDTHS),
                                                                    "rows": []}
    data["device"] = torch.cuda.get_device_name(0) if device.startswith("cuda") else device
    for mode in MODES:
        pair = load_pair(work, device, mode_options(mode, device))
        say(f"passes, {mode}: {pair.backend_why}")
        for role, lm in (("target", pair.target), ("draft", pair.draft)):
            ids = torch.randint(0, lm.vocab_limit, (PASS_CONTEXT + max(PASS_WIDTHS),),
                                generator=torch.Generator().manual_seed(0)).tolist()
            lm.reset()
            lm.forward(ids[:PASS_CONTEXT])
            row = {"mode": mode, "role": role, "why": pair.backend_why, "median_ms": {}, "best_ms": {}}
            for w in PASS_WIDTHS:
                times = []
                for i in range(3 + repeats):
                    sync(device)
                    t0 = time.perf_counter()
                    lm.forward(ids[PASS_CONTEXT:PASS_CONTEXT + w], num_logits=w)
                    sync(device)
                    if i >= 3:
                        times.append(time.perf_counter() - t0)
                    lm.truncate(PASS_CONTEXT)
                row["median_ms"][w] = round(statistics.median(times) * 1e3, 3)
                row["best_ms"][w] = round(min(times) * 1e3, 3)
            row["graphs"] = graphs_of(lm)
            data["rows"] = [r for r in data["rows"] if (r["mode"], r["role"]) != (mode, role)] + [row]
            write_json(path, data)
            say(f"passes, {mode}, {role}: " + ", ".join(f"{w}: {ms:.2f}" for w, ms in row["median_ms"].items())
                + f" ms (median of {repeats}){'; ' + row['graphs'] if row['graphs'] else ''}")
        pair.target.close()
        pair.draft.close()
        del pair
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def calibrate(work: Path, out: Path, device: str, mode: str) -> int:
    f = folders(work)
    (out / mode).mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "specdec", "calibrate", "--target", str(f["target"]), "--draft", str(f["draft"]),
           "--backend", "transformers", "--device", device, "--dtype", "bfloat16", "--draft-dtype", "bfloat16",
           "--draft-quant", "none", *flags(mode_options(mode, device)), "--export", str(out / mode / "costs.json")]
    say("$ " + " ".join(cmd))
    return subprocess.run(cmd).returncode


def rounds(work: Path, out: Path, device: str, mode: str, tokens: int, ks=(1, 3, 7)) -> None:
    """Greedy generations, plain and at each fixed K, with a draft that never agrees and one that
    agrees at times, each after a short untimed one of the same configuration (graphs captured,
    kernels warm); OUT/MODE/rounds.json rewritten after each."""
    (out / mode).mkdir(parents=True, exist_ok=True)
    path = out / mode / "rounds.json"
    rows: list[dict] = []
    for draft_name, draft in (("never", None), ("always", folders(work)["target"])):
        pair = load_pair(work, device, mode_options(mode, device), draft=draft)
        prompt = pair.encode(PROMPT, chat=False)
        prompt = prompt[: max(16, (pair.target.max_length or len(prompt) + tokens + 64) - tokens - 64)]  # tiny models
        for policy, k in [("ar", 0)] + [("lossless", k) for k in ks]:
            kw = dict(policy=policy, temperature=0)  # random weights: EOS is ~1/150k a step
            if k:
                kw.update(drafter="model", k=k)
            pair.generate(prompt, max_new_tokens=min(24, tokens), **kw)  # warm-up
            s = pair.generate(prompt, max_new_tokens=tokens, **kw).stats
            rows.append({"draft": draft_name, "policy": policy, "k": k, "prompt_tokens": s.prompt_tokens,
                         "new_tokens": s.new_tokens, "rounds": s.rounds, "k_chosen": list(s.k_chosen),
                         "accepted_per_round": list(s.accepted_per_round), "total_seconds": s.total_seconds,
                         "prefill_seconds": s.prefill_seconds, "draft_seconds": s.draft_seconds,
                         "verify_seconds": s.verify_seconds, "graphs": {"target": graphs_of(pair.target),
                                                                        "draft": graphs_of(pair.draft)}})
            write_json(path, {"prompt": PROMPT, "mode": mode, "why": pair.backend_why, "rows": rows})
            say(f"{mode} {draft_name:6s} {policy:8s} k={k}: {s.new_tokens} tokens, {s.rounds} rounds, "
                f"{s.total_seconds:.3f} s ({(s.total_seconds - s.prefill_seconds) / max(1, s.rounds) * 1e3:.2f} ms a "
                f"round), accepted {s.accepted}/{s.drafted}")
        pair.target.close()
        pair.draft.close()
        del pair


def rules(out: Path, device: str) -> int:
    cache = "graphs" if device.startswith("cuda") else "static"
    cmd = [sys.executable, str(ROOT / "scripts" / "cuda_rules_check.py"), "--device", device, "--cache", cache,
           "--out", str(out / "cuda_rules_check.json")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    say("$ " + " ".join(cmd))
    with open(out / "cuda_rules_check.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            print(line, end="", flush=True)
            log.write(line)
            log.flush()
    return proc.wait()


# ----------------------------------------------------------------------------- the engine's own seconds
def overheads(out: Path) -> tuple[dict, list[str]]:
    """The engine's own seconds per plain step, per drafting round and per draft token: each
    measured generation against its replay on the device's tables (least squares over K)."""
    import numpy as np

    from specdec.core.autok import Fixed
    from specdec.traces.runs import read_tables
    from specdec.traces.replay import Clock, replay
    from specdec.traces.trace import DraftTrace, Trace

    costs = json.loads((out / "costs.json").read_text())
    roles = {t["role"]: t["model"] for t in costs["tables"]}
    tables = read_tables([str(out / "costs.json")])
    target, draft = tables[roles["target"].split("|")[0]], tables[roles["draft"].split("|")[0]]
    rows = json.loads((out / "rounds.json").read_text())["rows"]
    steps, rounds_, lines = [], [], []
    for r in rows:
        n, agree, t = r["new_tokens"], [False] * r["new_tokens"], 0
        for k, a in zip(r["k_chosen"] or [r["k"]] * r["rounds"], r["accepted_per_round"]):
            for i in range(a):
                agree[t + i] = True
            t += a + 1
        dt = DraftTrace("auto", min(256, r["prompt_tokens"]), agree, [0.5] * n, [False] * n, {})
        tr = Trace("g", r["prompt_tokens"], list(range(n)), "length", n, {"d": dt})
        dr = draft if r["draft"] == "never" else target
        rep = replay(tr, None if r["policy"] == "ar" else "d", None if r["policy"] == "ar" else Fixed(r["k"]),
                     Clock(target, dr))
        extra = (r["total_seconds"] - rep.seconds) / rep.rounds
        lines.append(f"| {r['draft']} | {r['policy']} K={r['k']} | {r['rounds']} | {r['total_seconds']:.2f} | "
                     f"{rep.seconds:.2f} | {extra * 1e3:.2f} |")
        (steps if r["policy"] == "ar" else rounds_).append((rep.drafted / rep.rounds, extra))
    fit = {"step_overhead": max(0.0, float(np.mean([e for _, e in steps]))) if steps else 0.0}
    if len(rounds_) >= 2:
        x = np.array([[1.0, d] for d, _ in rounds_])
        (per_round, per_token), *_ = np.linalg.lstsq(x, np.array([e for _, e in rounds_]), rcond=None)
        fit.update(round_overhead=max(0.0, float(per_round)), token_overhead=max(0.0, float(per_token)))
    head = ["| draft | configuration | rounds | measured s | tables' s | engine ms per round |", "|---|---|---:|---:|---:|---:|"]
    return fit, head + lines


def project(a: argparse.Namespace) -> int:
    from specdec.traces.runs import DEFAULT_KS, LOOKUP_DRAFTERS, read_tables, replay_all
    from specdec.traces.replay import Clock
    from specdec.traces.trace import read_traces

    costs = json.loads((a.out / "costs.json").read_text())
    machine = costs.get("machine") or {}
    where = machine.get("gpu") or machine.get("cpu") or "this device"
    print(f"Projection, not a run: the CPU traces replayed on the pass costs measured on {where} "
          f"(torch {machine.get('torch', '?')}; {json.loads((a.out / 'rounds.json').read_text()).get('why', '')}); "
          "'+ engine' adds the engine's own seconds fitted from the measured generations.\n")
    fit, lines = overheads(a.out)
    print("\n".join(lines))
    print("engine's own seconds (fitted): " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in fit.items()))
    roles = {t["role"]: t["model"].split("|")[0] for t in costs["tables"]}
    tables = read_tables([str(a.out / "costs.json")])
    gpu_t, gpu_d = tables[roles["target"]], tables[roles["draft"]]
    print("| traces | draft | plain s | best fixed K | k=auto | oracle |\n|---|---|---:|---:|---:|---:|", flush=True)
    for path in a.traces:
        head, traces = read_traces(path)
        names = [n for n in traces[0].drafts if n.startswith(head["drafts"][n]["source"]) and "@" not in n.split("|")[0]]
        for name in names + list(LOOKUP_DRAFTERS):
            for overhead in (False, True):
                clock = Clock(gpu_t, gpu_d, **(fit if overhead else {}))
                lookup = name in LOOKUP_DRAFTERS
                prior = None if lookup else (head.get("priors") or {}).get(name.rsplit("|w", 1)[0])
                r = replay_all(traces, name, gpu_t, None if lookup else gpu_d, list(DEFAULT_KS), prior,
                               stop_ids=head.get("stop_ids") or (), clock=clock)["total"]
                best = min(r["fixed"], key=lambda k: r["fixed"][k])
                x = lambda s: f"{r['plain'] / s:.2f}x" if s else "-"  # noqa: E731
                print(f"| {Path(path).name} | {name}{' + engine' if overhead else ''} | {r['plain']:.1f} | "
                      f"K={best} {x(r['fixed'][best])} | {x(r['auto'])} | {x(r['oracle'])} |", flush=True)
    return 0


# ----------------------------------------------------------------------------- the one command
class Logged:
    """Children run with their output streamed to the terminal and OUT/log.txt, each within a time box."""

    def __init__(self, out: Path):
        self.file = open(out / "log.txt", "a", encoding="utf-8")
        self.lock = threading.Lock()

    def line(self, text: str) -> None:
        with self.lock:
            print(text, end="" if text.endswith("\n") else "\n", flush=True)
            self.file.write(text if text.endswith("\n") else text + "\n")
            self.file.flush()

    def say(self, msg: str) -> None:
        self.line(f"[{time.strftime('%H:%M:%S')}] {msg}")

    def run(self, cmd: list[str], timeout: float, env: dict) -> tuple[int | None, float]:
        """``(exit status, seconds)``; None when it ran out of time (its process group is stopped)."""
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)

        def pump():
            for text in proc.stdout:
                self.line(text)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            stop(proc)
            rc = None
        reader.join(timeout=5)
        return rc, time.time() - t0


def stop(proc: subprocess.Popen) -> None:
    """Stop a child started by this script and everything it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def run_all(a: argparse.Namespace) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    log = Logged(a.out)
    deadline = time.time() + a.budget
    env = {**os.environ, "SPECDEC_HOME": str(a.work / "home"),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    status_path = a.out / "status.json"
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    chosen = [s for s in STAGES if s in a.stages]
    log.say(f"stages {', '.join(chosen)} within {a.budget:.0f} s on {a.device}; out {a.out}, work {a.work}")
    background: list[tuple[str, subprocess.Popen, object]] = []
    for name in chosen:
        left = deadline - time.time() - a.reserve
        if left < 15:
            log.say(f"{name}: skipped, {left:.0f} s left in the budget")
            status[name] = {"rc": None, "seconds": 0, "skipped": True}
            write_json(status_path, status)
            continue
        timeout = min(STAGES[name], left)
        log.say(f"{name}: starting (at most {timeout:.0f} s)")
        cmd = [sys.executable, __file__, "stage", name, str(a.configs), str(a.out), "--device", a.device,
               "--tokens", str(a.tokens), "--work", str(a.work), "--repeats", str(a.repeats)]
        rc, seconds = log.run(cmd, timeout, env)
        status[name] = {"rc": rc, "seconds": round(seconds, 1), "timed_out": rc is None}
        write_json(status_path, status)
        log.say(f"{name}: {'timed out' if rc is None else f'exit {rc}'} after {seconds:.0f} s")
        if name == "build" and rc != 0:
            log.say("no models were built: nothing else can run")
            break
        mode = name.split("-", 1)[1] if name.startswith("rounds-") else None
        if mode and a.traces and (a.out / mode / "costs.json").exists() and (a.out / mode / "rounds.json").exists():
            sink = open(a.out / mode / "projection.md", "w", encoding="utf-8")
            cmd = [sys.executable, __file__, "project", str(a.out / mode), *map(str, a.traces)]
            log.say(f"project {mode}: in the background (CPU only) -> {a.out / mode / 'projection.md'}")
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, env=env,
                                    start_new_session=True)
            background.append((mode, proc, sink))
        summarize(a.out, log)
    for mode, proc, sink in background:
        left = deadline - time.time()
        try:
            rc = proc.wait(timeout=max(1.0, left))
            log.say(f"project {mode}: exit {rc}")
        except subprocess.TimeoutExpired:
            stop(proc)
            log.say(f"project {mode}: stopped at the budget's end (run 'project {a.out / mode} TRACES' later)")
        sink.close()
    summarize(a.out, log)
    log.say(f"done in {a.budget - (deadline - time.time()):.0f} s; the summary: {a.out / 'summary.md'}")
    failed = [n for n, s in status.items() if n in chosen and s.get("rc") not in (0,)]
    return 1 if failed else 0


def summarize(out: Path, log: Logged | None = None) -> str:
    """OUT/summary.md from whatever the stages have written so far: the goals against the measured
    figures, the pass costs per width, each stage's status."""
    lines = ["# GPU measurement: static KV cache and CUDA graphs against the dynamic cache", ""]
    passes_path = out / "passes.json"
    if passes_path.exists():
        data = json.loads(passes_path.read_text())
        rows = {(r["mode"], r["role"]): r for r in data["rows"]}
        device = data.get("device", "?")
        lines += [f"Passes over w new tokens on a {data['context']}-token cache on {device}, ms (median; measured):",
                  "", "| w | " + " | ".join(f"{role} {mode}" for mode, role in rows) + " |", "|---:|" + "---:|" * len(rows)]

        def ms(r, w):
            v = r["median_ms"].get(str(w), r["median_ms"].get(w))
            return "-" if v is None else f"{v:.2f}"

        for w in data["widths"]:
            lines.append(f"| {w} | " + " | ".join(ms(r, w) for r in rows.values()) + " |")
        lines.append("")
        for (mode, role), r in rows.items():
            one = r["median_ms"].get("1", r["median_ms"].get(1))
            goal = GOALS.get(role)
            if mode == "graphs" and one is not None and goal:
                lines.append(f"- goal on an H100: a one-token pass of the {role} <= {goal} ms; here {one:.2f} ms "
                             f"({'met' if one <= goal else 'not met'}{'' if 'H100' in device else ', not an H100'})")
            if r.get("graphs"):
                lines.append(f"- {mode} {role}: {r['graphs']}")
        lines.append("")
    for mode in MODES:
        if (out / mode / "costs.json").exists() and (out / mode / "rounds.json").exists():
            try:
                fit, table = overheads(out / mode)
            except Exception as exc:  # noqa: BLE001 - a partial folder still gets its summary
                lines += [f"{mode}: the engine's own seconds could not be fitted ({type(exc).__name__}: {exc})", ""]
                continue
            lines += [f"The engine's own seconds, {mode} (measured generations less the tables' prices):", "", *table,
                      "", "fitted: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in fit.items())]
            if mode == "graphs" and "round_overhead" in fit:
                per_round = fit["round_overhead"]
                lines.append(f"- goal on an H100: engine overhead per round <= 1 ms; here {per_round * 1e3:.2f} ms a round "
                             f"+ {fit['token_overhead'] * 1e3:.2f} ms a draft token "
                             f"({'met' if per_round <= 1e-3 else 'not met'})")
            lines.append("")
        if (out / mode / "projection.md").exists():
            lines += [f"Projection ({mode}): {out / mode / 'projection.md'} (a projection, not a run)", ""]
    if (out / "cuda_rules_check.log").exists():
        tail = [x for x in (out / "cuda_rules_check.log").read_text().splitlines() if x.strip()][-1:]
        lines += [f"cuda_rules_check (static cache, CUDA graphs): {tail[0] if tail else 'no output'}", ""]
    if (out / "status.json").exists():
        lines += ["| stage | exit | seconds |", "|---|---|---:|"]
        for name, s in json.loads((out / "status.json").read_text()).items():
            rc = "skipped" if s.get("skipped") else ("timed out" if s.get("timed_out") else s.get("rc"))
            lines.append(f"| {name} | {rc} | {s.get('seconds')} |")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def stage(a: argparse.Namespace) -> int:
    """One stage of ``all``, in this process."""
    a.out.mkdir(parents=True, exist_ok=True)
    if a.name == "build":
        t0 = time.time()
        try:
            import torch

            if a.device.startswith("cuda"):
                say(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuda {torch.version.cuda}")
            import transformers

            say(f"transformers {transformers.__version__}")
        except Exception as exc:  # noqa: BLE001 - the log line only
            say(f"device: unknown ({exc})")
        build(a.configs, a.work, a.device)
        say(f"random bf16 models built and saved in {time.time() - t0:.1f} s")
        return 0
    if a.name == "passes":
        passes(a.work, a.out, a.device, a.repeats)
        return 0
    if a.name == "rules":
        return rules(a.out, a.device)
    what, mode = a.name.split("-", 1)
    if what == "calibrate":
        return calibrate(a.work, a.out, a.device, mode)
    rounds(a.work, a.out, a.device, mode, a.tokens)
    return 0


def measure(a: argparse.Namespace) -> int:
    """The earlier measurement (dynamic cache) into OUT itself: build, calibrate, rounds."""
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPECDEC_HOME", str(a.work / "home"))
    build(a.configs, a.work, a.device)
    rc = calibrate(a.work, a.out, a.device, "dynamic")
    if rc != 0:
        return rc
    rounds(a.work, a.out, a.device, "dynamic", a.tokens)
    for name in ("costs.json", "rounds.json"):
        shutil.move(str(a.out / "dynamic" / name), str(a.out / name))
    (a.out / "dynamic").rmdir()
    return 0


def main() -> int:
    from specdec.checks import number_arg
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("all", "measure", "stage"):
        m = sub.add_parser(name)
        if name == "stage":
            m.add_argument("name", choices=list(STAGES))
        m.add_argument("configs", type=Path)
        m.add_argument("out", type=Path)
        m.add_argument("--device", default="cuda")
        m.add_argument("--tokens", type=number_arg(int, 1, 1 << 16),
                       default=128, help="new tokens per generation (default 128)")
        m.add_argument("--work", type=Path, default=Path("/tmp/specdec-projection"),
                       help="where the random models and the cost cache go")
        m.add_argument("--repeats", type=number_arg(int, 1, 10_000),
                       default=30, help="timed passes per width (default 30)")
        if name == "all":
            m.add_argument("--budget", type=number_arg(float, 0, 86_400, lo_open=True),
                           default=470, help="seconds for everything (default 470)")
            m.add_argument("--reserve", type=number_arg(float, 0, 86_400),
                           default=10, help="seconds kept back for the summary")
            m.add_argument("--stages", default=",".join(STAGES),
                           type=lambda s: [x for x in s.split(",") if x],
                           help=f"which stages, in their order (default all: {','.join(STAGES)})")
            m.add_argument("--traces", nargs="*", type=Path, default=[ROOT / t for t in TRACES],
                           help="CPU traces to project in the background (default: the bf16 HumanEval 20 and "
                                "Spec-Bench 26 traces); none: no projection")
    j = sub.add_parser("project")
    j.add_argument("out", type=Path)
    j.add_argument("traces", nargs="+")
    c = sub.add_parser("configs", help="write CONFIGS for the bundled pair (configs and tokenizers, no weights)")
    c.add_argument("dest", type=Path)
    a = p.parse_args()
    if a.command == "project":
        return project(a)
    if a.command == "configs":
        make_configs(a.dest)
        return 0
    if a.command == "stage":
        return stage(a)
    if a.command == "measure":
        return measure(a)
    unknown = [s for s in a.stages if s not in STAGES]
    if unknown:
        p.error(f"--stages: unknown {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    missing = [str(a.configs / r / "config.json") for r in ("target", "draft") if not (a.configs / r / "config.json").exists()]
    if missing and "build" in a.stages:
        p.error(f"CONFIGS: no {', '.join(missing)} (copy config.json and the tokenizer files of each model there)")
    return run_all(a)


if __name__ == "__main__":
    sys.exit(main())
