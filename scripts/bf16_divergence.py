"""Why greedy `lossless` can differ from `ar` in bfloat16, with evidence.

For each HumanEval prompt where the two outputs differ, find the first differing token and score
that position twice with the same committed prefix: as plain decoding does (one token per forward
pass) and as a verify pass does (the position inside a block of K+1 tokens). Print the target's
top-2 logits from both. A divergence is explained when the two passes round the top-2 logits
differently at a near-tie (bf16 keeps 8 significant bits, so logits near 20 are spaced 0.125
apart); in float32 the same comparison gives identical outputs (see docs/results.md, "Greedy
identity: float32 and bf16").

    python scripts/bf16_divergence.py --limit 10 --k 5
"""

from __future__ import annotations

import argparse
import json

import torch

import specdec
from specdec.bench.tasks.datasets import load_dataset
from specdec.bench.tasks.prompts import build_prompt


def top2(row: torch.Tensor) -> list[tuple[int, float]]:
    values, ids = row.topk(2)
    return [(int(i), float(v)) for i, v in zip(ids, values)]


def main() -> None:
    from specdec.checks import number_arg
    from specdec.draftlength import MAX_K
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=number_arg(int, 1, 164), default=10)
    ap.add_argument("--k", type=number_arg(int, 1, MAX_K), default=5)
    ap.add_argument("--max-new-tokens", type=number_arg(int, 1, 1 << 16), default=128)
    ap.add_argument("--dtype", default="bfloat16")
    a = ap.parse_args()
    pair = specdec.load(dtype=a.dtype, progress=False)
    lm = pair.target
    found = []
    for sample in load_dataset("humaneval", limit=a.limit).samples:
        prompt = build_prompt(pair.tokenizer, sample)
        kw = dict(chat=False, stop=list(prompt.stop), max_new_tokens=a.max_new_tokens)
        ar = pair.generate(prompt.text, policy="ar", **kw)
        spec = pair.generate(prompt.text, policy="lossless", drafter="model", k=a.k, **kw)
        if ar.token_ids == spec.token_ids:
            print(f"{sample.id}: identical ({len(ar.token_ids)} tokens)")
            continue
        i = next(j for j, (x, y) in enumerate(zip(ar.token_ids, spec.token_ids)) if x != y)
        prefix = pair.encode(prompt.text, chat=False) + ar.token_ids[:i]
        lm.reset()
        one = lm.logits_for(prefix, 1)[0]  # how plain decoding scores position i
        block = prefix + spec.token_ids[i : i + a.k]  # the position inside a verify block
        lm.reset()
        lm.forward(prefix[:-1])
        multi = lm.forward(block[len(prefix) - 1 :], num_logits=len(block) - len(prefix) + 1)[0]
        row = {
            "sample": sample.id, "position": i, "ar_token": ar.token_ids[i], "lossless_token": spec.token_ids[i],
            "one_token_pass_top2": top2(one), "verify_pass_top2": top2(multi),
            "max_abs_logit_difference": float((one - multi).abs().max()),
        }
        found.append(row)
        print(json.dumps(row))
    print(json.dumps({"prompts": a.limit, "dtype": a.dtype, "diverged": len(found)}))


if __name__ == "__main__":
    main()
