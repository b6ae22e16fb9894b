"""Every verification rule through the engine on CUDA tensors (the transformers backend), on a
tiny random pair built from a config: what the CPU test suite cannot reach.

    PYTHONPATH=src:tests python scripts/cuda_rules_check.py [--device cuda] [--cache auto] [--out FILE]

``--cache``: how the transformers backend runs the models: ``auto`` (as ``specdec.load`` would on
the device: the static KV cache with CUDA graphs on CUDA, the dynamic cache elsewhere),
``dynamic``, ``static`` (any device) or ``graphs`` (the static cache with CUDA graphs; CUDA only).

For each dtype (float32, bfloat16), drafter (model, tree, pld) and policy (plain decoding, the
lossless rule, every loose rule, fuzzy with each divergence, FLy composed with fuzzy), greedy and at
temperature 0.8 with a seed, it checks:

- the lossless rule writes plain decoding's tokens under greedy;
- a loose rule with ``exact_prefix=2`` writes plain decoding's first two tokens under greedy;
- a seeded generation at T > 0 repeats itself;
- the lossless rule's second token at T = 1 (the first a round verifies) follows the target's
  marginal there (chi-square, seeded);

and prints one line per case with its tau and relaxations. Exit 1 on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

POLICIES = [  # each with each drafter, after plain decoding
    ("lossless", {}), ("mars", {"theta": 0.8}), ("typical", {}), ("dropmatch", {}),
    ("fly", {"theta": 0.5, "window": 2}), ("fuzzy", {"divergence": "js", "threshold": 0.3}),
    ("fuzzy", {"divergence": "kl", "threshold": 0.3}), ("fuzzy", {"divergence": "tv", "threshold": 0.3}),
    ("fly+fuzzy", {"fly_theta": 0.5, "window": 2, "threshold": 0.3}),
]
DRAFTERS = ("model", "tree", "pld")
BINS = 10
PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):"


#: ``--cache``: the load options ``static_cache`` and ``cuda_graphs`` it stands for
CACHES = {"auto": ("auto", "auto"), "dynamic": ("off", "off"), "static": ("on", "off"), "graphs": ("on", "on")}


def build_pair(device: str, dtype: torch.dtype, run):
    """The tiny pair on ``device`` in ``dtype``, each model run as ``run`` says (an ``Execution``)."""
    from specdec.frontends.api import Pair
    from tinymodels import byte_tokenizer, perturbed_copy, tiny_model

    target = tiny_model(11)
    draft = perturbed_copy(target, 0.2, 12)
    return Pair(run.wrap(target.to(device=device, dtype=dtype), "target"), byte_tokenizer(),
                run.wrap(draft.to(device=device, dtype=dtype), "draft"))


def second_token_test(pair, device: str, n: int = 600) -> tuple[float, str]:
    """Chi-square p-value of the lossless rule's second token at T = 1 (the first is the prefill's
    own draw; the second is the first one a verification round decides) against the target's
    exact marginal there, sum over t1 of p(t1) p(t2 | t1) given that t1 is not an end token, in
    equal-mass bins."""
    from tinymodels import chisquare_joint

    ids = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    model = pair.target.model
    with torch.no_grad():
        p1 = torch.softmax(model(torch.tensor([ids], device=device)).logits[0, -1].float(), -1)
        both = torch.cat([torch.tensor(ids, device=device).expand(p1.numel(), -1),
                          torch.arange(p1.numel(), device=device)[:, None]], 1)
        p1[list(pair.eos_ids)] = 0.0  # an answer that ends at its first token has no second
        p = (p1[:, None] * torch.softmax(model(both).logits[:, -1].float(), -1)).sum(0).cpu() / p1.sum().cpu()
    counts = torch.zeros_like(p)
    drafted = 0
    for seed in range(n):
        out = pair.generate(ids, policy="lossless", drafter="model", k=4, max_new_tokens=3, temperature=1.0,
                            top_p=1.0, top_k=0, seed=seed)
        if len(out.token_ids) > 1:
            counts[out.token_ids[1]] += 1
        drafted += out.stats.drafted
    order = torch.argsort(p, descending=True)  # tokens in equal-mass bins (a tiny model's softmax is flat)
    bins = torch.empty_like(order)
    bins[order] = (torch.cumsum(p[order], 0) - p[order] / 2).mul(BINS).long().clamp(max=BINS - 1)
    exp = torch.zeros(BINS).index_add_(0, bins, p) * counts.sum()
    obs = torch.zeros(BINS).index_add_(0, bins, counts)
    keep = exp >= 5
    pval, _ = chisquare_joint(obs[keep], exp[keep])
    what = f"{int(keep.sum())} equal-mass bins, {drafted} tokens drafted in {n} generations"
    return pval, what


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cache", default="auto", choices=list(CACHES),
                    help="the KV cache: auto (static with CUDA graphs on CUDA, dynamic elsewhere), dynamic, static, "
                         "graphs (static with CUDA graphs; CUDA only)")
    ap.add_argument("--out", default=None, help="also write the lines as JSON here")
    a = ap.parse_args()
    from specdec.models.backends.transformers.execution import choose_execution
    from specdec.errors import SpecdecError

    try:
        cuda = torch.device(a.device).type == "cuda"
        run = choose_execution(*CACHES[a.cache], a.device)
    except RuntimeError as exc:
        ap.error(f"--device {a.device!r}: {exc}")
    except SpecdecError as exc:
        ap.error(f"--cache {a.cache}: {exc}")
    if a.out and not os.path.isdir(os.path.dirname(os.path.abspath(a.out))):
        ap.error(f"--out {a.out!r}: its folder does not exist")
    if cuda and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name(a.device) if cuda else a.device}; {run.why}")
    failures, rows = [], []
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        pair = build_pair(a.device, dtype, run)
        assert next(pair.target.model.parameters()).device.type == torch.device(a.device).type
        plain = pair.generate(PROMPT, policy="ar", max_new_tokens=32, chat=False).token_ids
        cases = [("-", "ar", {}, {})] + [(d, p, params, {"drafter": d, "k": 4, **params})
                                          for d in DRAFTERS for p, params in POLICIES]
        for drafter, policy, params, options in cases:
            kw = dict(chat=False, max_new_tokens=32, policy=policy, **options)
            case = f"{name:8} {drafter:5} {policy}{json.dumps(params) if params else ''}"
            t0 = time.perf_counter()
            try:
                g = pair.generate(PROMPT, **kw)
                s1 = pair.generate(PROMPT, temperature=0.8, seed=3, **kw)
                s2 = pair.generate(PROMPT, temperature=0.8, seed=3, **kw)
                checks = {"repeats at T>0": s1.token_ids == s2.token_ids}
                if policy == "lossless":
                    checks["greedy = ar"] = g.token_ids == plain
                elif policy != "ar":
                    e = pair.generate(PROMPT, exact_prefix=2, **kw)
                    checks["exact_prefix=2 keeps ar's first 2"] = e.token_ids[:2] == plain[:2]
                bad = [k for k, ok in checks.items() if not ok]
                line = (f"{case:70} tau {g.stats.tau:.2f} relaxed {sum(g.stats.relaxed.values()):2d} "
                        f"same as ar {g.token_ids == plain!s:5} {time.perf_counter() - t0:5.2f} s "
                        + ("ok" if not bad else "FAIL: " + ", ".join(bad)))
            except Exception as exc:  # noqa: BLE001 - report every case
                bad = [f"{type(exc).__name__}: {exc}"]
                line = f"{case:70} FAIL: {bad[0]}"
            print(line, flush=True)
            rows.append({"case": case, "failures": bad})
            if bad:
                failures.append(case)
        pval, what = second_token_test(pair, a.device)
        ok = pval > 1e-3
        print(f"{name:8} lossless second token at T=1 vs the target's marginal: chi-square p = {pval:.3f} "
              f"({what}) {'ok' if ok else 'FAIL'}", flush=True)
        rows.append({"case": f"{dtype} chi-square", "p": pval, "failures": [] if ok else ["chi-square"]})
        if not ok:
            failures.append(f"{dtype} chi-square")
        for role, lm in (("target", pair.target), ("draft", pair.draft)):
            graphs = getattr(lm, "graphs", None)  # the static cache's CUDA graphs, when on
            if graphs is not None:  # every pass it takes captured and replayed, none refused
                ok = bool(graphs.graphs) and graphs.replays > 0 and not graphs.failed
                print(f"{name:8} {role} {graphs.describe()}; {graphs.replays} replays {'ok' if ok else 'FAIL'}",
                      flush=True)
                rows.append({"case": f"{dtype} {role} graphs", "failures": [] if ok else [graphs.describe()]})
                if not ok:
                    failures.append(f"{dtype} {role} graphs")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    print(f"{len(rows) - len(failures)} of {len(rows)} cases ok" + (f"; failed: {failures}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
