"""Table tests for the lossless rules on hand-made logits."""

import pytest
import torch

from specdec.core.sampling import SamplingParams
from specdec.core.verify import Lossless, Round, finish, lossless_mask
from specdec.core.verify.lossless import greedy_accept, leading_true, residual, sampling_accept

NEG = -1e4


def logits_with_argmax(tokens, vocab=6):
    """One row per entry, peaked at that token."""
    rows = torch.full((len(tokens), vocab), 0.0)
    for i, t in enumerate(tokens):
        rows[i, t] = 5.0
    return rows


@pytest.mark.parametrize(
    "target_argmax, drafts, accepted, token",
    [
        ([1, 2, 3, 4], [1, 2, 3], 3, 4),  # all match -> bonus from the last row
        ([1, 2, 3, 4], [0, 2, 3], 0, 1),  # first mismatch -> target's token at position 1
        ([1, 2, 3, 4], [1, 5, 3], 1, 2),  # later match after a mismatch is not kept
        ([1, 2, 3, 4], [1, 2, 0], 2, 3),
        ([5, 0], [5], 1, 0),  # K = 1
    ],
)
def test_greedy_table(target_argmax, drafts, accepted, token):
    rnd = Round(logits_with_argmax(target_argmax), torch.tensor(drafts), None, SamplingParams(), None)
    verdict = Lossless().verify(rnd)
    assert (verdict.accepted, verdict.token) == (accepted, token)
    assert not verdict.relaxed


def test_greedy_ties_go_to_lowest_id():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    assert greedy_accept(logits, torch.tensor([1])).tolist() == [True]
    assert greedy_accept(logits, torch.tensor([2])).tolist() == [False]
    rnd = Round(logits, torch.tensor([2]), None, SamplingParams(), None)
    assert Lossless().verify(rnd).token == 1


def test_leading_true():
    assert leading_true(torch.tensor([], dtype=torch.bool)) == 0
    assert leading_true(torch.tensor([True, True, False, True])) == 2
    assert leading_true(torch.tensor([False, True])) == 0
    assert leading_true(torch.tensor([True, True])) == 2


def test_sampling_accept_is_min_one_p_over_q():
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[0.25, 0.75, 0.0]])
    d = torch.tensor([1])  # p/q = 2/3
    assert sampling_accept(p, q, d, torch.tensor([0.66])).tolist() == [True]
    assert sampling_accept(p, q, d, torch.tensor([0.67])).tolist() == [False]
    d0 = torch.tensor([0])  # p/q = 2 -> always accepted
    assert sampling_accept(p, q, d0, torch.tensor([0.999])).tolist() == [True]


def test_sampling_accept_one_hot_draft_uses_p():
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    assert sampling_accept(p, None, torch.tensor([1]), torch.tensor([0.79])).tolist() == [True]
    assert sampling_accept(p, None, torch.tensor([1]), torch.tensor([0.81])).tolist() == [False]


def test_residual():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.6, 0.1, 0.3])
    assert torch.allclose(residual(p, q, 0), torch.tensor([0.0, 1.0, 0.0]))
    assert torch.allclose(residual(p, None, 0), torch.tensor([0.0, 0.6, 0.4]))
    assert torch.equal(residual(p, p.clone(), 1), p)  # no residual mass: fall back to p


def test_sampling_finish_never_resamples_rejected_draft():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.0, 1.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    rnd = Round(p.log(), torch.tensor([1]), q, SamplingParams(temperature=1.0), gen, target_probs=p)
    for _ in range(50):
        assert finish(rnd, 0) == 0  # residual max(p - q, 0) has all its mass on token 0
    assert finish(rnd, 1) == 2  # bonus from the last row


def test_lossless_mask_dispatches_on_temperature():
    logits = logits_with_argmax([1, 2])
    greedy = Round(logits, torch.tensor([1]), None, SamplingParams(), None)
    assert lossless_mask(greedy).tolist() == [True]
    p = torch.softmax(logits, -1)
    gen = torch.Generator().manual_seed(0)
    sampled = Round(logits, torch.tensor([0]), None, SamplingParams(temperature=1.0), gen, target_probs=p)
    hits = sum(lossless_mask(sampled).item() for _ in range(2000))
    assert 0 < hits < 100  # p(0) is about 0.0034 here
