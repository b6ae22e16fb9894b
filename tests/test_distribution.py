"""Seeded chi-square tests: speculative sampling reproduces the target distribution exactly."""

import pytest
import torch

from specdec.core.sampling import SamplingParams
from tinymodels import ToyChain, chisquare_joint, engine_sample, table, tiny_engine
from specdec.core.verify import Lossless

pytestmark = pytest.mark.slow
P_MIN = 1e-3  # a correct implementation fails a seeded test with this probability
ENGINE_SAMPLING = SamplingParams(temperature=0.9, top_p=0.95)


@pytest.mark.parametrize("draft_kind", ["model", "one-hot"])
def test_verify_rule_reproduces_target_joint(draft_kind):
    """K = 2 drafts; the first three output tokens (draft positions 1, 2 and the bonus, or a
    residual draw) must follow the target's joint distribution p(x1) p(x2|x1) p(x3|x1,x2)."""
    chain, params = ToyChain(1234), SamplingParams(temperature=1.0)
    fixed = None if draft_kind == "model" else (2, 1)  # what a lookup drafter would propose every time
    counts, _, _ = chain.sample(Lossless(), params, 100_000, seed=1234, fixed=fixed)
    pvalue, outside = chisquare_joint(counts, chain.joint(params))
    assert pvalue > P_MIN and outside == 0


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
    assert chisquare_joint(counts, p)[0] < P_MIN


@pytest.mark.parametrize("drafter", ["model", "model+pld"])
def test_engine_sampling_matches_target_distribution(drafter):
    """End to end through the engine with tiny models (vocabulary 4, temperature 0.9, top-p 0.95):
    the joint of the first three generated tokens equals the target's. ``model+pld`` also checks
    that the lookup-accelerated draft keeps the draft's distribution."""
    counts, expected, accept_rate, _ = engine_sample(tiny_engine(), 6000, ENGINE_SAMPLING, drafter=drafter)
    assert 0.2 < accept_rate < 0.95  # rejections and residual draws really happened
    pvalue, outside = chisquare_joint(counts, expected)
    assert pvalue > P_MIN and outside == 0  # ... and nothing outside top-p's support
