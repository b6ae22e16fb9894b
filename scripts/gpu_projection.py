"""Measure, on a GPU, what a replay needs to project the CPU traces there (docs/replay.md).

No weights travel: the bundled pair's shapes (their config.json) are built with random weights in
bf16 on the device, saved as Hugging Face folders, and then

1. ``specdec calibrate --backend transformers --export`` measures their pass costs (the tables a
   replay reads);
2. the engine runs greedy generations on them, plain and at fixed K, with a draft that never
   agrees (another random model: every round keeps 0 drafts) and one that always agrees (the
   target itself: every round keeps K), recording each round; ``specdec`` compares their measured
   seconds with the tables' to give the engine's own seconds per round beside the model's passes.

Usage (the device tool; CONFIGS holds target/ and draft/ with config.json and the tokenizer files)::

    python scripts/gpu_projection.py measure CONFIGS OUT [--device cuda] [--tokens 128]

writes OUT/costs.json (the export), OUT/rounds.json (per generation: prompt tokens, K, each
round's drafts and kept drafts, measured seconds) and OUT/log.txt. Then, on any machine::

    python scripts/gpu_projection.py project OUT TRACES...

prints the engine's own seconds (per plain step, per round, per draft token: the measured seconds
less what the tables price, fitted over the generations) and the traces replayed on the device's
tables with them, the tables standing for the traces' models (same shapes, bf16): a projection.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PROMPT = (
    "def fibonacci(n: int) -> int:\n"
    '    """Return the n-th Fibonacci number, computed iteratively, with a short explanation of why the '
    'iterative form is preferred over the naive recursive one for large n, and what its complexity is."""\n'
) * 6  # about 240 tokens, as HumanEval's prompts


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
            if f.name != "config.json" and f.is_file():
                shutil.copy(f, dst / f.name)
        del model
        out[role] = dst
    return out


def generations(folders: dict[str, Path], device: str, tokens: int, log) -> list[dict]:
    import specdec

    rows = []
    for draft_name, draft in (("never", folders["draft"]), ("always", folders["target"])):
        pair = specdec.load(str(folders["target"]), draft=str(draft), backend="transformers",
                            device=device, progress=False)
        prompt = pair.encode(PROMPT, chat=False)
        runs = [("ar", 0)] + [("lossless", k) for k in (1, 3, 7)]
        for warm, (policy, k) in [(w, r) for w in (True, False) for r in runs]:  # a warm-up pass, then the kept one
            kw = dict(policy=policy, max_new_tokens=tokens, temperature=0)  # random weights: EOS is ~1/150k a step
            if k:
                kw.update(drafter="model", k=k)
            out = pair.generate(prompt, **kw)
            s = out.stats
            if warm:
                continue
            rows.append({"draft": draft_name, "policy": policy, "k": k, "prompt_tokens": s.prompt_tokens,
                         "new_tokens": s.new_tokens, "rounds": s.rounds, "k_chosen": list(s.k_chosen),
                         "accepted_per_round": list(s.accepted_per_round), "total_seconds": s.total_seconds,
                         "prefill_seconds": s.prefill_seconds, "draft_seconds": s.draft_seconds,
                         "verify_seconds": s.verify_seconds})
            log(f"{draft_name:6s} {policy:8s} k={k}: {s.new_tokens} tokens, {s.rounds} rounds, "
                f"{s.total_seconds:.3f} s, accepted {s.accepted}/{s.drafted}")
        del pair
    return rows


def _table(tables: dict, role: str):
    return next(t for t in tables.values() if t.model.startswith(str(role)))


def overheads(out: Path) -> tuple[dict, list[str]]:
    """The engine's own seconds per plain step, per drafting round and per draft token: each
    measured generation against its replay on the device's tables (least squares over K)."""
    import numpy as np

    from specdec.autok import Fixed
    from specdec.bench.replaycli import read_tables
    from specdec.replay import Clock, replay
    from specdec.trace import DraftTrace, Trace

    costs = json.loads((out / "costs.json").read_text())
    roles = {t["role"]: t["model"] for t in costs["tables"]}
    tables = read_tables([str(out / "costs.json")])
    target, draft = tables[roles["target"].split("|")[0]], tables[roles["draft"].split("|")[0]]
    rows = json.loads((out / "rounds.json").read_text())["rows"]
    steps, rounds, lines = [], [], []
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
        (steps if r["policy"] == "ar" else rounds).append((rep.drafted / rep.rounds, extra))
    x = np.array([[1.0, d] for d, _ in rounds])
    y = np.array([e for _, e in rounds])
    (per_round, per_token), *_ = np.linalg.lstsq(x, y, rcond=None)
    fit = {"step_overhead": max(0.0, float(np.mean([e for _, e in steps]))), "round_overhead": max(0.0, float(per_round)),
           "token_overhead": max(0.0, float(per_token))}
    head = ["| draft | configuration | rounds | measured s | tables' s | engine ms per round |", "|---|---|---:|---:|---:|---:|"]
    return fit, head + lines


def project(a: argparse.Namespace) -> int:
    import dataclasses

    from specdec.bench.replaycli import DEFAULT_KS, LOOKUP_DRAFTERS, read_tables, replay_all
    from specdec.replay import Clock
    from specdec.trace import read_traces

    fit, lines = overheads(a.out)
    print("\n".join(lines))
    print("engine's own seconds (fitted): " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in fit.items()))
    costs = json.loads((a.out / "costs.json").read_text())
    roles = {t["role"]: t["model"].split("|")[0] for t in costs["tables"]}
    tables = read_tables([str(a.out / "costs.json")])
    gpu_t, gpu_d = tables[roles["target"]], tables[roles["draft"]]
    print("| traces | draft | plain s | best fixed K | k=auto | oracle |\n|---|---|---:|---:|---:|---:|")
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
                      f"K={best} {x(r['fixed'][best])} | {x(r['auto'])} | {x(r['oracle'])} |")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("configs", type=Path)
    m.add_argument("out", type=Path)
    m.add_argument("--device", default="cuda")
    m.add_argument("--tokens", type=int, default=128)
    m.add_argument("--work", type=Path, default=Path("/tmp/specdec-projection"))
    j = sub.add_parser("project")
    j.add_argument("out", type=Path)
    j.add_argument("traces", nargs="+")
    a = p.parse_args()
    if a.command == "project":
        return project(a)
    a.out.mkdir(parents=True, exist_ok=True)
    logf = open(a.out / "log.txt", "a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    os.environ.setdefault("SPECDEC_HOME", str(a.work / "home"))
    t0 = time.time()
    folders = build(a.configs, a.work, a.device)
    log(f"random bf16 models built and saved in {time.time() - t0:.1f} s")
    try:
        import torch

        if torch.cuda.is_available():
            log(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuda {torch.version.cuda}")
    except Exception as exc:  # noqa: BLE001 - the log line only
        log(f"device: unknown ({exc})")
    cmd = [sys.executable, "-m", "specdec", "calibrate", "--target", str(folders["target"]),
           "--draft", str(folders["draft"]), "--backend", "transformers", "--device", a.device,
           "--dtype", "bfloat16", "--draft-dtype", "bfloat16", "--draft-quant", "none",
           "--export", str(a.out / "costs.json")]
    log("$ " + " ".join(cmd))
    t0 = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True)
    log(res.stdout + res.stderr)
    log(f"calibrate: exit {res.returncode} in {time.time() - t0:.1f} s")
    if res.returncode != 0:
        return res.returncode
    rows = generations(folders, a.device, a.tokens, log)
    (a.out / "rounds.json").write_text(json.dumps({"prompt": PROMPT, "rows": rows}, indent=1))
    log(f"wrote {a.out / 'rounds.json'} ({len(rows)} generations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
