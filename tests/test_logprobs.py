"""The target's log-probabilities of emitted tokens (whatever rule emitted them) and of a prompt's
own tokens, against a full forward pass of the target written out (float32, tiny models; tolerance
1e-4 in log-probability: a verify pass and a one-token pass round differently in the last bits)."""

from __future__ import annotations

import pytest
import torch

from specdec.frontends.api import Pair
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.core.request import make_config
from tinymodels import byte_tokenizer, perturbed_copy, tiny_model

TOL = 1e-4


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(9)
    return Pair(CausalLM(target), byte_tokenizer(), CausalLM(perturbed_copy(target, 0.05, 10)))


def reference(pair, ids: list[int]) -> torch.Tensor:
    """log_softmax of the target's logits at every position of ``ids``, one full forward pass."""
    with torch.no_grad():
        return torch.log_softmax(pair.target.model(torch.tensor([ids])).logits[0].float(), -1)


def check_against_forward(pair, prompt_ids: list[int], out, top: int) -> None:
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)
    ref = reference(pair, prompt_ids + out.token_ids)
    for i, lp in enumerate(out.logprobs):
        row = ref[len(prompt_ids) - 1 + i]
        assert lp.token == out.token_ids[i]
        assert abs(lp.logprob - float(row[lp.token])) < TOL, i
        assert len(lp.top) == top
        want = torch.topk(row, top)
        assert [t for t, _ in lp.top] == want.indices.tolist() or top == 0
        assert all(abs(v - float(row[t])) < TOL for t, v in lp.top)


@pytest.mark.parametrize("policy,drafter,extra", [
    ("ar", "model", {}), ("lossless", "model", {"k": 4}), ("lossless", "pld", {"k": 3}),
    ("lossless", "tree", {"tree_nodes": 6}), ("mars", "model", {"k": 4, "theta": 0.3}),
    ("typical", "model", {"k": 4}),
])
def test_emitted_tokens_carry_the_target_s_log_probabilities(pair, policy, drafter, extra):
    ids = pair.encode("abc abc abc")
    out = pair.generate(ids, policy=policy, drafter=drafter, max_new_tokens=24, logprobs=3, **extra)
    check_against_forward(pair, ids, out, 3)
    if policy in ("ar", "lossless"):  # greedy: each emitted token is the target's most likely
        assert all(lp.top[0][0] == lp.token for lp in out.logprobs)
    assert "logprobs" in out.to_dict() and pair.generate(ids, max_new_tokens=4).logprobs is None


def test_lossless_logprobs_equal_plain_decoding_s(pair):
    ids = pair.encode("def f(x):")
    ar = pair.generate(ids, policy="ar", max_new_tokens=20, logprobs=0)
    spec = pair.generate(ids, policy="lossless", k=5, max_new_tokens=20, logprobs=0)
    assert spec.token_ids == ar.token_ids and spec.stats.accepted > 0
    assert all(abs(a.logprob - b.logprob) < TOL for a, b in zip(ar.logprobs, spec.logprobs))


def test_a_stop_string_cuts_the_logprobs_with_the_tokens(pair):
    ids = pair.encode("abc abc abc")
    free = pair.generate(ids, policy="ar", max_new_tokens=30)
    stop = free.text[5:7]
    out = pair.generate(ids, policy="lossless", k=4, max_new_tokens=30, stop=[stop], logprobs=1)
    assert out.finish_reason == "stop" and len(out.logprobs) == len(out.token_ids) < 30


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_prompt_logprobs_are_one_forward_pass(pair, chunk):
    ids = pair.encode("The quick brown fox jumps")
    lps = pair.prompt_logprobs(ids, top=2, chunk=chunk)
    ref = reference(pair, ids)
    assert len(lps) == len(ids) and lps[0] is None
    for i in range(1, len(ids)):
        assert lps[i].token == ids[i] and abs(lps[i].logprob - float(ref[i - 1, ids[i]])) < TOL
        assert [t for t, _ in lps[i].top] == torch.topk(ref[i - 1], 2).indices.tolist()
    # the engine's caches stay usable after scoring
    assert pair.generate(ids, policy="lossless", k=3, max_new_tokens=8).token_ids == \
        pair.generate(ids, policy="ar", max_new_tokens=8).token_ids


@pytest.mark.parametrize("bad", [-1, 21, 2.5, "3"])
def test_bad_logprobs_are_one_line_errors(pair, bad):
    with pytest.raises(SpecdecError, match="logprobs"):
        make_config(logprobs=bad)
    with pytest.raises(SpecdecError, match="logprobs"):
        pair.prompt_logprobs("abc", top=bad)
