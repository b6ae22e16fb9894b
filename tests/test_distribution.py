"""Seeded chi-square tests: speculative sampling reproduces the target distribution exactly."""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from specdec.engine import DecodeConfig, Engine
from specdec.models import CausalLM
from specdec.sampling import SamplingParams, probabilities
from specdec.testing import tiny_model
from specdec.verify import Lossless, Round

pytestmark = pytest.mark.slow
P_MIN = 1e-3  # a correct implementation fails a seeded test with this probability


def table(gen, shape, vocab, sharpness=2.0):
    """Random conditional distributions: table[prefix...] -> [vocab]."""
    return torch.softmax(torch.randn(*shape, vocab, generator=gen) * sharpness, dim=-1)


@pytest.mark.parametrize("draft_kind", ["model", "one-hot"])
def test_verify_rule_reproduces_target_joint(draft_kind):
    """K = 2 drafts; the first three output tokens (draft positions 1, 2 and the bonus, or a
    residual draw) must follow the target's joint distribution p(x1) p(x2|x1) p(x3|x1,x2)."""
    V, N = 4, 100_000
    gen = torch.Generator().manual_seed(1234)
    p1, p2, p3 = table(gen, (), V), table(gen, (V,), V), table(gen, (V, V), V)
    q1, q2 = table(gen, (), V, 1.0), table(gen, (V,), V, 1.0)
    fixed = (2, 1)  # what a lookup drafter would propose every time
    rule, params = Lossless(), SamplingParams(temperature=1.0)
    counts = torch.zeros(V, V, V)
    for _ in range(N):
        if draft_kind == "model":
            d1 = int(torch.multinomial(q1, 1, generator=gen))
            d2 = int(torch.multinomial(q2[d1], 1, generator=gen))
            q = torch.stack([q1, q2[d1]])
        else:
            (d1, d2), q = fixed, None
        target = torch.stack([p1, p2[d1], p3[d1, d2]])
        rnd = Round(target.log(), torch.tensor([d1, d2]), q, params, gen, target_probs=target)
        v = rule.verify(rnd)
        out = [d1, d2][: v.accepted] + [v.token]
        while len(out) < 3:  # later rounds: the target's own next-token distribution
            row = p2[out[0]] if len(out) == 1 else p3[out[0], out[1]]
            out.append(int(torch.multinomial(row, 1, generator=gen)))
        counts[tuple(out)] += 1
    expected = (p1[:, None, None] * p2[:, :, None] * p3) * N
    stat = chisquare(counts.flatten().numpy(), expected.flatten().numpy())
    assert stat.pvalue > P_MIN, stat


def test_wrong_rule_is_caught():
    """The same test rejects a rule that skips residual resampling (sanity check of its power)."""
    V, N = 4, 20_000
    gen = torch.Generator().manual_seed(7)
    p, q = table(gen, (), V), table(gen, (), V, 1.0)
    counts = torch.zeros(V)
    for _ in range(N):
        d = int(torch.multinomial(q, 1, generator=gen))
        accept = torch.rand((), generator=gen) < p[d] / q[d]
        counts[d if accept else int(torch.multinomial(p, 1, generator=gen))] += 1  # wrong: p, not residual
    assert chisquare(counts.numpy(), (p * N).numpy()).pvalue < P_MIN


@pytest.mark.parametrize("drafter", ["model", "model+pld"])
def test_engine_sampling_matches_target_distribution(drafter):
    """End to end through the engine with tiny models (vocabulary 4, temperature 0.9, top-p 0.95):
    the joint of the first three generated tokens equals the target's. ``model+pld`` also checks
    that the lookup-accelerated draft keeps the draft's distribution."""
    V, N = 4, 6000
    target = CausalLM(tiny_model(21, vocab_size=V, layers=1, hidden=16, initializer_range=0.2))
    draft = CausalLM(tiny_model(22, vocab_size=V, layers=1, hidden=16, initializer_range=0.2))
    engine = Engine(target, draft, eos_ids=[])
    prompt = [1, 3, 0, 2]
    params = SamplingParams(temperature=0.9, top_p=0.95)

    def dist(context):
        target.reset()
        return probabilities(target.forward(context), params)[0]

    expected = torch.zeros(V, V, V)
    for x1, x2 in itertools.product(range(V), range(V)):
        expected[x1, x2] = dist(prompt)[x1] * dist(prompt + [x1])[x2] * dist(prompt + [x1, x2])
    counts = torch.zeros(V, V, V)
    accepted = 0
    for seed in range(N):
        cfg = DecodeConfig(policy="lossless", drafter=drafter, k=2, max_new_tokens=3,
                           sampling=SamplingParams(temperature=0.9, top_p=0.95, seed=seed))
        out = engine.generate(prompt, cfg)
        counts[tuple(out.token_ids)] += 1
        accepted += out.stats.accepted
    assert 0.2 < accepted / (N * 2) < 0.95  # rejections and residual draws really happened
    mask = expected.flatten() > 0
    stat = chisquare(counts.flatten()[mask].numpy(), (expected.flatten()[mask] * N).numpy())
    assert stat.pvalue > P_MIN, stat
    assert counts.flatten()[~mask].sum() == 0  # nothing outside top-p's support
