import pytest
import torch

from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, make_generator, next_token, probabilities


def test_greedy_is_one_hot_argmax():
    probs = probabilities(torch.tensor([[0.1, 2.0, 2.0, -1.0]]), SamplingParams())
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = probabilities(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(p, torch.tensor([[0.5, 0.3, 0.15, 0.05]]), atol=1e-6)
    p = probabilities(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5 + 0.3 reaches 0.8
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]), atol=1e-6)
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.1))  # always keeps the top token
    assert p.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    hot = probabilities(logits, SamplingParams(temperature=100.0))
    assert hot.max() - hot.min() < 0.02


def test_seeded_draws_repeat():
    logits = torch.randn(50)
    params = SamplingParams(temperature=1.0)
    a = [next_token(logits, params, make_generator(7, "cpu")) for _ in range(3)]
    assert len(set(a)) == 1


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -0.1}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"temperature": float("nan")}]
)
def test_bad_sampling_params(kwargs):
    with pytest.raises(SpecdecError):
        SamplingParams(**kwargs)
