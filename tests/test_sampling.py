import pytest
import torch

from specdec.errors import SpecdecError
from specdec.core.sampling import SamplingParams, make_generator, next_token, probabilities


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


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-6])
def test_temperature_below_the_floor_is_greedy(temperature):
    """1e-300 and 5e-324 overflowed float32 logits to inf, then NaN in multinomial."""
    params = SamplingParams(temperature=temperature)
    assert params.greedy and params.temperature == 0.0
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0]]) * 30
    assert probabilities(logits, params).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert next_token(logits[0], params, make_generator(0, "cpu")) == 1
    assert not SamplingParams(temperature=1e-5).greedy  # the floor itself samples


@pytest.mark.parametrize("top_p", [1e-46, 5e-324, 1e-9])
def test_tiny_top_p_keeps_the_top_token(top_p):
    """1e-46 is 0 in float32: every token was dropped and the distribution was NaN."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]]))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=top_p))
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
    assert next_token(logits[0], SamplingParams(temperature=1.0, top_p=top_p), make_generator(0, "cpu")) == 0
