#!/usr/bin/env python
"""An agent-like workload through ``specdec serve``'s app: a tool-calling loop of 20 chat requests,
run in order, whose answers repeat one JSON structure and the calls before them; plain decoding
against the default (the portfolio, drafter auto: the draft model, prompt lookup and suffix decoding
chosen per round) and drafters that need no draft model (prompt lookup, suffix decoding), in one process.

    python scripts/bench_agent_loop.py --target qwen2.5-coder-1.5b@bf16 --out benchmarks/agent-loop-bf16-avx2

The loop (written to OUT/requests.jsonl): a system message lists three tools and asks for exactly
one JSON tool call per turn; the user asks to file 20 tasks in a tracker; request i carries the
conversation so far: the i-1 earlier calls (as the assistant's turns, the calls an agent would
have made) and their tool results. Each answer is the next call: the same JSON structure with
the next task's fields, as agents' tool calls are. Greedy, 96 new tokens at most, non-streaming,
through the openai client on loopback; one warm-up request first. Each configuration starts with
an empty suffix cache, so its first request drafts only from its own prompt and later ones also
from the earlier answers (suffix decoding's cross-request cache). The configurations take turns on
each request (the order rotated from one request to the next), so a drift of the machine's speed
falls on all of them alike; each keeps its own suffix cache. The server's prefix caching is on, so a
request reads only what the cache lacks of its prompt: its wall time depends a little on which
configuration ran before it, its decode time (after the prefill) does not.

Times: each request's wall time at the client (prefill included: every request reads a prompt of
~1-3k tokens) and its decode time (the engine's seconds after the prefill, from the response's
``usage.speculative``). Writes OUT/records.jsonl (one line per configuration and request: seconds,
tokens, tau, text),
OUT/summary.json and OUT/table.md; prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from pathlib import Path

TOOLS = [
    {"name": "add_task", "description": "File a task in the tracker.",
     "parameters": {"title": "string", "priority": "low | medium | high", "due": "YYYY-MM-DD",
                    "tags": "list of strings", "assignee": "string"}},
    {"name": "list_tasks", "description": "List the tracker's open tasks.", "parameters": {"status": "open | done"}},
    {"name": "complete_task", "description": "Mark a task done.", "parameters": {"id": "integer"}},
]
PEOPLE = ["alice", "bob", "carol", "dave"]
TASKS = [
    ("Write the release notes for version 2.4", "high", "2026-12-01", ["release", "docs"]),
    ("Fix the login timeout on slow networks", "high", "2026-12-02", ["bug", "auth"]),
    ("Update the onboarding guide screenshots", "low", "2026-12-05", ["docs"]),
    ("Add retries to the payment webhook", "high", "2026-12-03", ["payments", "reliability"]),
    ("Review the database index proposal", "medium", "2026-12-04", ["database", "review"]),
    ("Rotate the staging API keys", "medium", "2026-12-02", ["security"]),
    ("Remove the deprecated v1 endpoints", "medium", "2026-12-10", ["api", "cleanup"]),
    ("Profile the search page under load", "high", "2026-12-06", ["performance"]),
    ("Translate the settings page into German", "low", "2026-12-12", ["i18n"]),
    ("Set up alerts for disk usage", "medium", "2026-12-03", ["ops", "reliability"]),
    ("Write tests for the export service", "medium", "2026-12-08", ["tests"]),
    ("Upgrade the CI runners to the new image", "low", "2026-12-09", ["ci", "ops"]),
    ("Fix the broken links in the API reference", "low", "2026-12-07", ["docs", "bug"]),
    ("Add dark mode to the dashboard", "medium", "2026-12-15", ["ui"]),
    ("Audit the third-party licences", "medium", "2026-12-11", ["legal", "review"]),
    ("Cache the pricing table responses", "high", "2026-12-05", ["performance", "api"]),
    ("Document the on-call rota", "low", "2026-12-14", ["ops", "docs"]),
    ("Migrate the image store to the new bucket", "high", "2026-12-09", ["storage", "ops"]),
    ("Fix the timezone bug in the calendar export", "medium", "2026-12-04", ["bug", "calendar"]),
    ("Plan the Q1 roadmap review", "medium", "2026-12-16", ["planning"]),
]
SYSTEM = ("You are an agent that operates a task tracker through tools. Tools:\n" + json.dumps(TOOLS, indent=1)
          + "\nAnswer every turn with exactly one tool call as one JSON object: "
            '{"tool": NAME, "arguments": {...}} and nothing else.')


def call(i: int) -> dict:
    title, priority, due, tags = TASKS[i]
    return {"tool": "add_task", "arguments": {"title": title, "priority": priority, "due": due, "tags": tags,
                                              "assignee": PEOPLE[i % len(PEOPLE)]}}


def goal() -> str:
    lines = [f"{i + 1}. \"{t}\" ({p} priority, due {d}, tags {', '.join(g)}, assignee {PEOPLE[i % len(PEOPLE)]})"
             for i, (t, p, d, g) in enumerate(TASKS)]
    return "File these tasks in the tracker, one tool call per turn, in this order:\n" + "\n".join(lines)


def requests() -> list[list[dict]]:
    """The 20 requests' messages: request i holds the i earlier calls and their results."""
    out = []
    for i in range(len(TASKS)):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": goal()}]
        for j in range(i):
            messages.append({"role": "assistant", "content": json.dumps(call(j))})
            messages.append({"role": "user", "content": "Tool result: " + json.dumps({"ok": True, "id": 101 + j})
                             + "\nNext call."})
        out.append(messages)
    return out


CONFIGS = {
    "ar": None,
    "auto": {"policy": "lossless", "drafter": "auto"},  # the default: the portfolio (the draft model among its sources)
    "model": {"policy": "lossless", "drafter": "model"},
    "pld": {"policy": "lossless", "drafter": "pld"},
    "suffix": {"policy": "lossless", "drafter": "suffix"},
    "suffix-tree": {"policy": "lossless", "drafter": "suffix-tree"},
    "lookahead": {"policy": "lossless", "drafter": "lookahead"},
}
#: llama.cpp's own server (``pip install xllamacpp``) on the same GGUF target, one server per mode, asked
#: through the same client with the same messages (its prompt cache on, as it is by default)
SERVER_MODES = ("llama-server", "llama-server-ngram-mod", "llama-server-ngram-simple", "llama-server-ngram-map-k")


def parse_args(argv=None) -> argparse.Namespace:
    from specdec.checks import number_arg
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None, help="target model (default: the bundled target)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--configs", default="ar,auto,pld,suffix",
                   help=f"comma-separated, of: {', '.join([*CONFIGS, *SERVER_MODES])}")
    p.add_argument("--draft", default="auto", help="draft model for the configurations that use one (auto, model): "
                                                   "auto (the bundled draft, its format chosen by measurement) or none")
    p.add_argument("--max-tokens", type=number_arg(int, 1, 1 << 16), default=96)
    p.add_argument("--limit", type=number_arg(int, 1, len(TASKS)), default=len(TASKS), help="requests (default: all 20)")
    p.add_argument("--out", required=True, help="output folder")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    import openai

    import specdec
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.core.drafters import SuffixCache
    from specdec.frontends.server import Limits, create_app, serve_in_thread

    names = [c.strip() for c in a.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS and c not in SERVER_MODES]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; choose from {', '.join([*CONFIGS, *SERVER_MODES])}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    reqs = requests()[: a.limit]
    (out / "requests.jsonl").write_text("".join(json.dumps(m) + "\n" for m in reqs))
    target = a.target or DEFAULT_TARGET
    uses_model = any(CONFIGS.get(n) and CONFIGS[n]["drafter"] in ("auto", "model") for n in names)
    draft = None if a.draft == "none" or not uses_model else a.draft
    pair = specdec.load(target, draft=draft, backend=a.backend, generation_config="specdec", progress=False)
    # one user's loop: every request shares the suffix cache and k=auto's state (no API key: opted in)
    app = create_app(pair, {"max_new_tokens": a.max_tokens, "temperature": 0.0}, limits=Limits(max_tokens=4096),
                     model_name="agent", shared_caches=True)
    records = []
    with contextlib.ExitStack() as stack:  # on the way out: our server, then llama.cpp's, stopped and freed
        servers = {}
        for name in (n for n in names if n in SERVER_MODES):
            servers[name] = llama_server(name, target)
            stack.callback(servers[name].close)
        url = stack.enter_context(serve_in_thread(app))
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)
        theirs = {name: openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=3600)
                  for name, s in servers.items()}

        def ask(messages, name):
            """(text, seconds, usage) of one request; llama.cpp's server reports its own counts and
            times (``timings``), turned into our ``usage.speculative`` fields."""
            spec = CONFIGS.get(name)
            extra = {"extra_body": {"speculative": spec}} if name in CONFIGS else {}
            t = time.perf_counter()
            r = (theirs.get(name) or client).chat.completions.create(
                model="agent", messages=messages, max_tokens=a.max_tokens, temperature=0, **extra)
            seconds = time.perf_counter() - t
            u = r.usage.model_dump()
            timings = r.model_dump().get("timings")
            if timings:
                accepted = timings.get("draft_n_accepted") or 0
                u["speculative"] = {"drafted": timings.get("draft_n") or 0, "accepted": accepted,
                                    "rounds": u["completion_tokens"] - accepted,
                                    "tau": u["completion_tokens"] / max(1, u["completion_tokens"] - accepted),
                                    "prefill_seconds": timings["prompt_ms"] / 1e3,
                                    "total_seconds": (timings["prompt_ms"] + timings["predicted_ms"]) / 1e3}
            return r.choices[0].message.content, seconds, u

        ask(reqs[0], "ar")  # warm-up
        for name in servers:
            ask(reqs[0], name)
        caches = {name: SuffixCache() for name in names}  # each configuration's own, empty at the start
        for i, messages in enumerate(reqs):
            for name in names[i % len(names):] + names[: i % len(names)]:  # interleaved, order rotated per request
                pair.engine.caches.suffix = caches[name]
                text, seconds, u = ask(messages, name)
                spec = u.get("speculative") or {}
                rec = {"config": name, "request": i, "seconds": seconds, "prompt_tokens": u["prompt_tokens"],
                       "completion_tokens": u["completion_tokens"], "tau": spec.get("tau"),
                       "rounds": spec.get("rounds"), "drafted": spec.get("drafted"), "accepted": spec.get("accepted"),
                       "prefill_seconds": spec.get("prefill_seconds"), "engine_seconds": spec.get("total_seconds"),
                       "text": text}
                records.append(rec)
                print(f"{name:12s} {i:2d} {seconds:6.2f} s {u['completion_tokens']:3d} tok tau {spec.get('tau') or 1:.2f}",
                      file=sys.stderr, flush=True)
                with (out / "records.jsonl").open("a") as f:
                    f.write(json.dumps(rec) + "\n")
    summary = summarize(records, names, pair, target, a)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text(table(summary))
    print(table(summary))
    return 0


def llama_server(mode: str, target: str):
    """llama.cpp's server in ``mode`` on the target's GGUF file (the bench's peer, kept running)."""
    from specdec.bench.running.llama_server import LlamaServer
    from specdec.bench.running.peers import gguf_of, peer_threads

    return LlamaServer(mode, gguf_of(target), None, peer_threads(), {})


def summarize(records: list[dict], names: list[str], pair, target: str, a) -> dict:
    from specdec.bench.running.environment import describe

    by = {n: [r for r in records if r["config"] == n] for n in names}
    ar = by.get("ar")
    rows = {}
    for n, rs in by.items():
        secs = sum(r["seconds"] for r in rs)
        toks = sum(r["completion_tokens"] for r in rs)
        later = rs[1:]
        row = {"requests": len(rs), "seconds": secs, "tokens": toks, "tokens_per_second": toks / secs if secs else None,
               "tau": _tau(rs), "first_seconds": rs[0]["seconds"], "first_tau": _tau(rs[:1]),
               "later_seconds": sum(r["seconds"] for r in later), "later_tau": _tau(later)}
        row["decode_seconds"] = sum(_decode(r) for r in rs)
        if ar:
            row["time_vs_ar"] = sum(r["seconds"] for r in ar) / secs
            row["decode_time_vs_ar"] = sum(_decode(r) for r in ar) / row["decode_seconds"]
            row["later_decode_time_vs_ar"] = (sum(_decode(r) for r in ar[1:]) / sum(_decode(r) for r in later)
                                              if later else None)
            row["first_time_vs_ar"] = ar[0]["seconds"] / rs[0]["seconds"]
            row["later_time_vs_ar"] = sum(r["seconds"] for r in ar[1:]) / row["later_seconds"] if later else None
            row["text_equal_ar"] = sum(x["text"] == y["text"] for x, y in zip(rs, ar))
        rows[n] = row
    env = describe()
    return {"target": target, "backend": pair.backend, "variant": pair.target.variant, "max_tokens": a.max_tokens,
            "requests": len(by[names[0]]), "cpu": env["hardware"]["cpu"], "cpu_flags": env["hardware"]["cpu_flags"],
            "python": platform.python_version(), "command": " ".join(["python", "scripts/bench_agent_loop.py", *sys.argv[1:]]),
            "configs": rows}


def _decode(r: dict) -> float:
    """A request's seconds in the engine after its prefill (the rounds that generate)."""
    return (r["engine_seconds"] or 0.0) - (r["prefill_seconds"] or 0.0)


def _tau(rs: list[dict]) -> float | None:
    rounds = sum(r["rounds"] or 0 for r in rs)
    return sum(r["completion_tokens"] for r in rs) / rounds if rounds else None


def table(s: dict) -> str:
    head = (f"Agent loop, {s['requests']} requests in order, {s['target']} ({s['variant']}) on {s['backend']}, "
            f"greedy, max {s['max_tokens']} tokens; CPU {s['cpu']} flags {' '.join(s['cpu_flags'])}\n\n"
            "| config | seconds | tok/s | time vs ar | decode time vs ar | tau | first request: time vs ar, tau | "
            "requests 2..: time vs ar, decode time vs ar, tau | text = ar |\n|---|---:|---:|---:|---:|---:|---|---|---:|\n")

    def f(x, spec=".2f"):
        return "-" if x is None else format(x, spec)

    lines = [f"| {n} | {f(r['seconds'], '.1f')} | {f(r['tokens_per_second'], '.1f')} | {f(r.get('time_vs_ar'))}x | "
             f"{f(r.get('decode_time_vs_ar'))}x | {f(r['tau'])} | {f(r.get('first_time_vs_ar'))}x, {f(r['first_tau'])} | "
             f"{f(r.get('later_time_vs_ar'))}x, {f(r.get('later_decode_time_vs_ar'))}x, {f(r['later_tau'])} | "
             f"{r.get('text_equal_ar', '-')}/{r['requests']} |"
             for n, r in s["configs"].items()]
    return head + "\n".join(lines) + "\n\nCommand: `" + s["command"] + "`\n"


if __name__ == "__main__":
    raise SystemExit(main())
