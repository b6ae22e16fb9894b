#!/usr/bin/env python3
"""Block vs token-wise verification on hand-made draft/target pairs: mean accepted drafts per
round at K=8, by Monte Carlo with specdec's own rules (`Block`, `Lossless`). Not a benchmark of the
models: it shows how large the block gain can be when the draft is off by a given amount.

    python scripts/block_gain_sim.py            # ~1 minute on 2 CPU cores

Each setting: 30 random contexts; target logits N(0, sharp^2) over a 50-token vocabulary per
position, draft logits = target logits + N(0, (noise * sharp / 2)^2); 200 rounds per context and rule.
"""
import torch

from specdec.core.sampling import SamplingParams
from specdec.core.verify import Block, Lossless, Round

K, VOCAB, CONTEXTS, ROUNDS = 8, 50, 30, 200
T1 = SamplingParams(temperature=1.0)


def main() -> None:
    print("| target sharpness | draft noise | token-wise acceptance per position | accepted, token-wise | accepted, block | tau ratio |")
    print("|---:|---:|---:|---:|---:|---:|")
    for sharp, noise in [(4.0, 0.5), (4.0, 1.0), (2.0, 1.0), (6.0, 1.5)]:
        gen = torch.Generator().manual_seed(1)
        means, overlap = {"block": 0.0, "lossless": 0.0}, 0.0
        for ctx in range(CONTEXTS):
            logits = torch.randn(K + 1, VOCAB, generator=gen) * sharp
            p = logits.softmax(-1)
            q = (logits[:K] + torch.randn(K, VOCAB, generator=gen) * noise * sharp / 2).softmax(-1)
            overlap += torch.minimum(p[:K], q).sum(-1).mean().item() / CONTEXTS
            for rule in (Block(), Lossless()):
                g = torch.Generator().manual_seed(100 + ctx)
                for _ in range(ROUNDS):
                    drafts = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(K)])
                    verdict = rule.verify(Round(torch.log(p), drafts, q, T1, g, target_probs=p))
                    means[rule.name] += verdict.accepted / (CONTEXTS * ROUNDS)
        b, t = means["block"], means["lossless"]
        print(f"| {sharp} | {noise} | {overlap:.2f} | {t:.2f} | {b:.2f} | {(1 + b) / (1 + t):.3f} |")


if __name__ == "__main__":
    main()
