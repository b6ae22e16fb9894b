"""What ``exact=True`` costs on llama.cpp, and whether it holds: one GGUF model loaded twice (today's
passes and exact ones), timed interleaved in one process.

    python scripts/exact_cost.py --target qwen2.5-coder-1.5b --widths 1,2,4 --rounds 10 --steps 16
    python scripts/exact_cost.py --target qwen2.5-coder-1.5b@bf16 --threads 2

For each width W: the time of a pass of W tokens after a --context-token context (W=1 is plain
decoding's step), the median over --rounds rounds of --steps passes, the two models alternating
round by round (first one, then the other, then reversed). Then the check: the logits of 24
positions scored one token at a time against in passes of 2, 4, 8 and 24, bit for bit, for both.
Widths 8+ are not timed here: ggml's tiled K-quant path (on for today's passes) is switched per
process, and the exact model turns it off for the whole process (``GGML_CPU_TILED_MM=0``).
Run it on quiet cores: other work on a core slows every llama.cpp step (``busy_note``); on shared
cores ``--threads 1 --clock cpu`` (the process's CPU time) is the steadier measure.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from specdec.checks import number_arg
from specdec.models.backends import REGISTRY
from specdec.models.backends.llamacpp.model import LlamaCppModel


def ids(n: int, seed: int = 0, vocab: int = 20000) -> list[int]:
    return np.random.default_rng(seed).integers(3, min(vocab, 20000), n).tolist()


CLOCK = time.perf_counter


def timed_round(m: LlamaCppModel, context: int, width: int, steps: int, tokens: list[int]) -> float:
    m.truncate(context)
    t0 = CLOCK()
    for s in range(steps):
        m.forward(tokens[s * width:(s + 1) * width], width)
    return (CLOCK() - t0) / steps


def by_width(m: LlamaCppModel, tokens: list[int], context: int, width: int) -> np.ndarray:
    m.truncate(context)
    rest = tokens[context:]
    return np.concatenate([m.forward(rest[s:s + width], len(rest[s:s + width])).numpy()
                           for s in range(0, len(rest), width)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--widths", default="1,2,4")
    ap.add_argument("--rounds", type=number_arg(int, lo=1, hi=10000), default=10)
    ap.add_argument("--steps", type=number_arg(int, lo=1, hi=10000), default=16)
    ap.add_argument("--context", type=number_arg(int, lo=1, hi=100000), default=300,
                    help="context tokens before the timed passes")
    ap.add_argument("--threads", type=number_arg(int, lo=1, hi=1024), default=None)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: the process's CPU time (with --threads 1 on shared cores)")
    a = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if a.clock == "cpu" else time.perf_counter
    path = REGISTRY.get("llama.cpp").prepare(a.target)  # the GGUF file, or its @format copy made once
    models = {"exact": LlamaCppModel(path, a.target, n_ctx=2048, threads=a.threads, exact=True),
              "today": LlamaCppModel(path, a.target, n_ctx=2048, threads=a.threads)}
    vocab = models["exact"].vocab_size
    context = ids(a.context, vocab=vocab)
    for m in models.values():
        m.forward(context, 1)
    for width in (int(w) for w in a.widths.split(",")):
        tokens = ids(width * a.steps, seed=width, vocab=vocab)
        times: dict[str, list[float]] = {k: [] for k in models}
        for m in models.values():  # warm-up, untimed
            timed_round(m, a.context, width, 1, tokens)
        for r in range(a.rounds):
            for k in (list(models) if r % 2 == 0 else list(models)[::-1]):
                times[k].append(timed_round(models[k], a.context, width, a.steps, tokens))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"width {width}: today {med['today'] * 1e3:.1f} ms, exact {med['exact'] * 1e3:.1f} ms per pass "
              f"(exact/today {med['exact'] / med['today']:.3f}; rounds {a.rounds} x {a.steps})", flush=True)
    tokens = context + ids(24, seed=99, vocab=vocab)
    for k, m in models.items():
        one = by_width(m, tokens, a.context, 1)
        same = {w: int((by_width(m, tokens, a.context, w) == one).all(axis=1).sum()) for w in (2, 4, 8, 24)}
        print(f"{k}: positions (of 24) whose logits equal one-token passes' bit for bit, by width: {same}")


if __name__ == "__main__":
    main()
