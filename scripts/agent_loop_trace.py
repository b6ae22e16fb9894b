#!/usr/bin/env python
"""Traces of an agent-loop run's plain answers (``scripts/bench_agent_loop.py``), so ``specdec
replay`` can price the portfolio and its oracle on them; also prints the replay without the
prefill (the server's prefix cache makes a request's prefill the new turn only, which a replay,
pricing the whole prompt, does not know).

The traces hold the copy sources only (prompt lookup, suffix: on the 4-bit target of a small CPU
the draft model never pays): each request's prompt ids are the chat template applied to its
messages, its answer the plain answer's text tokenized (and the end token when the request
stopped there).

    python scripts/agent_loop_trace.py benchmarks/agent-loop-auto-q4_k_m-avx2-width-premium \\
        --out benchmarks/agent-loop-auto-q4_k_m-avx2-width-premium/traces.jsonl \\
        --costs benchmarks/free-drafts-avx2/costs.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    from specdec.checks import number_arg
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="an agent-loop run folder (requests.jsonl, records.jsonl)")
    p.add_argument("--out", required=True, help="the trace file to write")
    p.add_argument("--costs", action="append", required=True, help="cost tables to replay on")
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--max-tokens", type=number_arg(int, 1, 1 << 16), default=96, help="the run's max_tokens")
    a = p.parse_args()
    import specdec
    from specdec.traces.runs import read_tables, replay_all, replay_portfolio
    from specdec.traces.replay import Clock
    from specdec.traces.trace import header, tokenizer_fingerprint, trace_answer, write_traces

    folder = Path(a.folder)
    requests = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    plain = {r["request"]: r for r in map(json.loads, (folder / "records.jsonl").read_text().splitlines())
             if r["config"] == "ar"}
    pair = specdec.load(a.target, draft=None, backend="llama.cpp", progress=False)
    eos = sorted(pair.eos_ids)
    traces = []
    for i, messages in enumerate(requests):
        rec = plain[i]
        prompt = pair.encode(messages, chat=True)
        if len(prompt) != rec["prompt_tokens"]:
            raise SystemExit(f"request {i}: the prompt is {len(prompt)} tokens here, {rec['prompt_tokens']} in the run")
        answer = pair.encode(rec["text"], chat=False)
        if rec["completion_tokens"] == len(answer) + 1:
            answer.append(eos[0])
        elif rec["completion_tokens"] != len(answer):
            print(f"request {i}: {len(answer)} tokens re-tokenized, {rec['completion_tokens']} generated")
        finish = "length" if rec["completion_tokens"] >= a.max_tokens else "stop"
        traces.append(trace_answer(pair.target, {}, prompt, answer, finish, a.max_tokens, frozenset(eos),
                                   sample_id=f"agent/{i}", category="agent", check_target=False))
    head = header(a.target, tokenizer_fingerprint(pair.tokenizer), count=len(traces), source=str(folder),
                  dataset="agent-loop", target_variant=pair.target.variant, priors={}, stop_ids=eos, drafts={})
    write_traces(Path(a.out), head, traces)
    print(f"wrote {len(traces)} traces to {a.out}")
    tables = read_tables(a.costs)
    target = tables[a.target]
    clock = Clock(target, None)
    prefill = sum(clock.prefill(t.prompt_tokens - 1) for t in traces)
    auto = replay_portfolio(traces, None, target, None, stop_ids=frozenset(eos))["total"]
    alone = {d: replay_all(traces, d, target, None, [], stop_ids=frozenset(eos))["total"]["auto"] for d in ("pld", "suffix")}
    rows = {"pld alone": alone["pld"], "suffix alone": alone["suffix"], "default": auto["auto"],
            "fitted bound": auto["fitted"], "portfolio oracle": auto["oracle"]}
    print("replayed without the prefill (decode time vs plain):")
    for name, s in rows.items():
        print(f"  {name:17s} {(auto['plain'] - prefill) / (s - prefill):.2f}x")
    print(f"  default / oracle  {(auto['oracle'] - prefill) / (auto['auto'] - prefill):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
