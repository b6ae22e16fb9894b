"""How much of the prompt the draft model needs: greedy acceptance against the draft's window.

For each prompt the target writes its greedy continuation once (plain decoding); then, for each
window W, the draft model reads the prompt's last W tokens and the continuation in one pass
(teacher forcing) and its greedy choice is compared with the target's token at every position.
Under greedy lossless speculation this agreement *is* the per-position acceptance: a draft token
is kept exactly when it equals the target's, and every draft after a kept one is the draft's
choice on the target's own text. The expected tokens per round at a fixed K follow exactly from
the runs of agreement (:func:`tokens_per_round`), without timing anything, so this runs beside
other work.

    python scripts/draft_window_agreement.py --out benchmarks/draft-window-agreement-avx2 \\
        --max-new-tokens 256 --windows 16,32,64,128,256,512,all

Resumable: records go to OUT/records.jsonl, one per (sample, W), and the target's continuations
to OUT/continuations.jsonl; a second run skips what is there. Prints the table (mean agreement,
tokens per round at K = 3, 5, 7, mean tokens the draft reads before its first draft) per dataset.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from specdec import load
from specdec.bench.tasks.datasets import load_dataset
from specdec.bench.tasks.prompts import build_prompt
from specdec.core.drafters.model import window_start

DATASETS = (("humaneval", 20), ("spec-bench", 2))
KS = (3, 5, 7)


def tokens_per_round(agree: list[bool], k: int) -> float:
    """Tokens per round of greedy lossless speculation with K = ``k`` drafts over a text where
    ``agree[i]`` says whether the draft's greedy choice equals the target's token ``i``: each
    round keeps the run of agreements from its first position (at most k) plus the target's token."""
    pos = rounds = 0
    while pos < len(agree):
        run = 0
        while run < k and pos + run < len(agree) and agree[pos + run]:
            run += 1
        pos += run + 1
        rounds += 1
    return len(agree) / max(rounds, 1)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main(argv=None) -> int:
    from specdec.checks import number_arg
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-new-tokens", type=number_arg(int, 1, 1 << 16), default=256)
    p.add_argument("--windows", default="16,32,64,128,256,512,all")
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b")
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    windows = [w if w == "all" else int(w) for w in a.windows.split(",")]
    cont_path, rec_path = out / "continuations.jsonl", out / "records.jsonl"
    conts = {c["id"]: c for c in read(cont_path)}
    done = {(r["id"], str(r["window"])) for r in read(rec_path)}
    if not a.report_only:
        pair = load(a.target, a.draft, backend="llama.cpp", calibrate=False, progress=True)
        for name, limit in DATASETS:
            for sample in load_dataset(name, limit=limit).samples:
                prompt = build_prompt(pair.tokenizer, sample)
                ids = pair.encode(prompt.text, chat=False)
                if sample.id not in conts:
                    gen = pair.generate(prompt.text, chat=False, policy="ar", max_new_tokens=a.max_new_tokens,
                                        stop=list(prompt.stop) or None)
                    conts[sample.id] = {"id": sample.id, "dataset": name, "category": sample.category,
                                        "prompt_tokens": len(ids), "token_ids": gen.token_ids}
                    with cont_path.open("a") as f:
                        f.write(json.dumps(conts[sample.id]) + "\n")
                new = conts[sample.id]["token_ids"]
                if len(new) < 2:
                    continue
                for w in windows:
                    if (sample.id, str(w)) in done:
                        continue
                    start = window_start(len(ids), w)
                    pair.draft.reset()
                    rows = pair.draft.forward(ids[start:] + new[:-1], num_logits=len(new))
                    agree = [bool(x) for x in (rows.argmax(-1) == torch.tensor(new)).tolist()]
                    rec = {"id": sample.id, "dataset": name, "category": sample.category, "window": w,
                           "prompt_tokens": len(ids), "read": len(ids) - start, "agree": agree}
                    with rec_path.open("a") as f:
                        f.write(json.dumps(rec) + "\n")
                    done.add((sample.id, str(w)))
                print(f"{sample.id}: done", file=sys.stderr, flush=True)
    report(read(rec_path), windows)
    return 0


def report(records: list[dict], windows: list) -> None:
    groups = [("HumanEval", lambda r: r["dataset"] == "humaneval"),
              ("Spec-Bench", lambda r: r["dataset"] == "spec-bench"),
              ("Spec-Bench rag+summarization", lambda r: r["category"] in ("rag", "summarization"))]
    print(f"| prompts | W | agreement | " + " | ".join(f"tokens/round K={k}" for k in KS) + " | draft reads (mean) |")
    print("|---|---:|---:|" + "---:|" * len(KS) + "---:|")
    for label, keep in groups:
        for w in windows:
            rs = [r for r in records if keep(r) and str(r["window"]) == str(w)]
            if not rs:
                continue
            agree = sum(sum(r["agree"]) for r in rs) / sum(len(r["agree"]) for r in rs)
            tpr = [statistics.mean(tokens_per_round(r["agree"], k) for r in rs) for k in KS]
            reads = statistics.mean(r["read"] for r in rs)
            print(f"| {label} ({len(rs)}) | {w} | {agree:.3f} | " + " | ".join(f"{x:.2f}" for x in tpr)
                  + f" | {reads:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
