"""Block verification (Sun et al., arXiv 2403.10444): hand-computed tables, the paper's toy example,
exactness (seeded chi-square, rule and engine), never fewer accepted drafts than token-wise
verification, greedy identity, and bad input."""

import pytest
import torch

from specdec.core.engine import DecodeConfig
from specdec.errors import SpecdecError
from specdec.core.sampling import SamplingParams
from tinymodels import ToyChain, chisquare_joint, engine_sample, table, tiny_engine
from specdec.core.verify import Block, Lossless, Round, Verdict, make_policy
from specdec.core.verify.block import block_accept, block_residual, block_weights
from specdec.core.verify.lossless import point_mass

P_MIN = 1e-3  # a correct implementation fails a seeded test with this probability
T1 = SamplingParams(temperature=1.0)
# the paper's toy pair (Section 2): context-free, vocabulary {a, b}
P_TOY = torch.tensor([1 / 3, 2 / 3])
Q_TOY = torch.tensor([2 / 3, 1 / 3])


def toy_rows(k: int = 2):
    return P_TOY.expand(k + 1, 2).clone(), Q_TOY.expand(k, 2).clone()


@pytest.mark.parametrize("drafts, uniforms, tau, weight", [
    # X = (a, a): w1 = 1/2, Z1 = 0 so h1 = 0; w2 = h2 = 1/4
    ((0, 0), (0.1, 0.2), 2, 0.25),
    ((0, 0), (0.1, 0.3), 0, 1.0),
    ((0, 0), (0.0, 0.9), 1, 0.5),  # eta_1 = 0 <= h_1 = 0 (the paper's <=) keeps position 1
    # X = (b, a): w1 = 1 (capped), Z1 = 1/3, h1 = 1 so tau >= 1; w2 = h2 = 1/2
    ((1, 0), (0.99, 0.4), 2, 0.5),
    ((1, 0), (0.99, 0.6), 1, 1.0),
])
def test_block_accept_table(drafts, uniforms, tau, weight):
    p, q = toy_rows()
    got = block_accept(p, q, torch.tensor(drafts), torch.tensor(uniforms))
    assert got[0] == tau and got[1] == pytest.approx(weight)


def test_weights_and_residual_by_hand():
    p, q = toy_rows()
    w = block_weights(p, q, torch.tensor([0, 0]))
    assert w.tolist() == pytest.approx([1.0, 0.5, 0.25])
    # tau = 0: the usual residual norm(max(P - Q, 0)) = b; tau = 1 with w = 1/2: max(P/2 - Q, 0) = 0 -> P
    assert block_residual(P_TOY, Q_TOY, 1.0).tolist() == pytest.approx([0.0, 1.0])
    assert block_residual(P_TOY, Q_TOY, 0.5).tolist() == pytest.approx(P_TOY.tolist())
    # a drafter without probabilities: point-mass q
    assert point_mass(torch.tensor([1, 0]), 3).tolist() == [[0, 1, 0], [1, 0, 0]]


def toy_round(gen, k=2):
    p, q = toy_rows(k)
    drafts = torch.multinomial(Q_TOY, k, replacement=True, generator=gen)
    return Round(torch.log(p), drafts, q, T1, gen, target_probs=p)


@pytest.mark.slow
def test_toy_example_accepts_eleven_ninths_against_ten_ninths():
    gen = torch.Generator().manual_seed(0)
    n = 20_000
    block = sum(Block().verify(toy_round(gen)).accepted for _ in range(n)) / n
    tokenwise = sum(Lossless().verify(toy_round(gen)).accepted for _ in range(n)) / n
    sigma = 0.8 / n ** 0.5  # accepted count has standard deviation < 0.8 here
    assert abs(block - 11 / 9) < 5 * sigma and abs(tokenwise - 10 / 9) < 5 * sigma


@pytest.mark.slow
@pytest.mark.parametrize("draft_kind", ["model", "one-hot"])
def test_block_reproduces_the_target_joint(draft_kind):
    chain = ToyChain(1234)
    fixed = None if draft_kind == "model" else (2, 1)
    counts, rejected, _ = chain.sample(Block(), T1, 100_000, seed=99, fixed=fixed)
    pvalue, outside = chisquare_joint(counts, chain.joint(T1))
    print(f"block, {draft_kind} drafts: chi-square p = {pvalue:.3f}")
    assert pvalue > P_MIN and outside == 0 and rejected > 0


class UnweightedResidual(Block):
    """A plausible bug: the residual after a partial block ignores the weight ``w_tau``."""

    def verify(self, rnd: Round) -> Verdict:
        p, q = rnd.target_probs, rnd.draft_probs
        uniforms = torch.rand(rnd.k, generator=rnd.generator)
        tau, _ = block_accept(p, q, rnd.draft_tokens, uniforms)
        row = p[tau] if tau == rnd.k else block_residual(p[tau], q[tau], 1.0)
        return Verdict(tau, int(torch.multinomial(row, 1, generator=rnd.generator)))


@pytest.mark.slow
def test_a_wrong_block_rule_is_caught():
    chain = ToyChain(1234)
    counts, _, _ = chain.sample(UnweightedResidual(), T1, 100_000, seed=99)
    assert chisquare_joint(counts, chain.joint(T1))[0] < P_MIN


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["model", "pld"])
def test_engine_block_sampling_matches_the_target(drafter):
    counts, expected, accepted, _ = engine_sample(tiny_engine(vocab=4), 3000, SamplingParams(temperature=0.9, top_p=0.95),
                                                  policy="block", drafter=drafter)
    pvalue, outside = chisquare_joint(counts, expected)
    assert pvalue > P_MIN and outside == 0


@pytest.mark.slow
def test_block_never_accepts_fewer_than_token_wise_in_expectation():
    gen = torch.Generator().manual_seed(5)
    for case in range(6):
        k, vocab = 4, 6
        p = table(gen, (k + 1,), vocab, 1.5)
        q = table(gen, (k,), vocab, 1.5)
        means = {}
        for rule in (Block(), Lossless()):
            g = torch.Generator().manual_seed(100 + case)
            total = 0
            for _ in range(4000):
                drafts = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(k)])
                total += rule.verify(Round(torch.log(p), drafts, q, T1, g, target_probs=p)).accepted
            means[rule.name] = total / 4000
        assert means["block"] >= means["lossless"] - 0.05, (case, means)


def test_greedy_block_is_greedy_matching():
    engine = tiny_engine(vocab=16, seeds=(3, 4))
    for prompt in ([1, 2, 3], [7, 7, 7, 7]):
        ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=12))
        # the draft model's drafts (the portfolio picks its sources by measured time: not the same each run)
        block = engine.generate(prompt, DecodeConfig(policy="block", drafter="model", k=3, max_new_tokens=12))
        lossless = engine.generate(prompt, DecodeConfig(policy="lossless", drafter="model", k=3, max_new_tokens=12))
        assert block.token_ids == ar.token_ids and block.stats.accepted == lossless.stats.accepted


@pytest.mark.parametrize("policy, params, match", [
    ("block", {"theta": 0.5}, "takes no parameters"),
    ("block+mars", {}, "does not combine with loose rules"),
    ("fly+block", {}, "does not combine with loose rules"),
])
def test_bad_block_policies_are_one_line_errors(policy, params, match):
    with pytest.raises(SpecdecError, match=match) as err:
        make_policy(policy, params)
    assert "\n" not in str(err.value)


def test_block_refuses_token_trees():
    with pytest.raises(SpecdecError, match="verifies chains only"):
        DecodeConfig(policy="block", drafter="tree")
