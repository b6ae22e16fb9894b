#!/usr/bin/env python
"""What the target says for free at each position of a trace's answer: the entropy of its next-token
distribution and its top-1 margin (top-1 minus top-2 probability), for trying them as a stop signal
in the replay (``scripts/stop_signals.py``).

The target (a GGUF file, llama.cpp) reads each trace's prompt and answer in one pass, logits at
every answer position; position ``j``'s distribution is the one that picked ``answer[j]``. (One wide
pass, not the answer's own one-token passes: a 4-bit file's wide pass can round a near-tie the other
way, so the share of positions whose top-1 is the answer's token is printed beside each file.)

    python scripts/target_signals.py benchmarks/free-drafts-avx2/traces-spec-bench2-256-q4_k_m-avx2.jsonl \\
        --out benchmarks/free-drafts-avx2/signals-spec-bench2-256-q4_k_m-avx2.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from specdec.traces.trace import read_traces


def signals(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of logits: (entropy in nats, top-1 minus top-2 probability, the top-1 token)."""
    z = scores - scores.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    entropy = -(p * np.log(np.clip(p, 1e-30, None))).sum(axis=1)
    top2 = np.partition(p, -2, axis=1)[:, -2:]
    return entropy, top2[:, 1] - top2[:, 0], scores.argmax(axis=1)


def main() -> int:
    from specdec.checks import number_arg
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", help="a trace file with prompt ids ('specdec trace')")
    p.add_argument("--out", required=True, help="the signals file (JSON) to write")
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="the target: a bundled name or a .gguf file")
    p.add_argument("--threads", type=number_arg(int, 1, 1024), default=2)
    a = p.parse_args()
    from llama_cpp import Llama

    from specdec.bench.running.peers import gguf_of

    head, traces = read_traces(a.traces)
    if any(t.prompt is None for t in traces):
        raise SystemExit(f"{a.traces}: traces without prompt ids; make them again with 'specdec trace'")
    path = gguf_of(a.target)
    n_ctx = max(len(t.prompt) + len(t.answer) for t in traces) + 8
    llm = Llama(model_path=path, n_ctx=n_ctx, n_batch=512, logits_all=True, n_threads=a.threads, verbose=False)
    out, agree, judged, start = {}, 0, 0, time.time()
    for i, tr in enumerate(traces):
        llm.reset()
        ids = list(tr.prompt) + list(tr.answer)
        llm.eval(ids)
        rows = np.asarray(llm.scores[len(tr.prompt) - 1: len(ids) - 1], dtype=np.float32)
        entropy, margin, top1 = signals(rows)
        agree += int((top1 == np.asarray(tr.answer)).sum())
        judged += len(tr.answer)
        out[tr.sample_id] = {"entropy": [round(float(x), 4) for x in entropy],
                             "margin": [round(float(x), 4) for x in margin]}
        print(f"{i + 1}/{len(traces)} {tr.sample_id}: {len(ids)} tokens, {time.time() - start:.0f} s", flush=True)
    Path(a.out).write_text(json.dumps({
        "kind": "specdec-target-signals", "traces": a.traces, "target": Path(path).name,
        "machine": platform.processor() or platform.machine(), "top1_is_answer": round(agree / max(judged, 1), 4),
        "samples": out}))
    print(f"wrote {a.out}: {len(out)} answers, top-1 = the answer's token at {agree}/{judged} positions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
