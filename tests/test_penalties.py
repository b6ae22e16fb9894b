"""Penalties (repetition, presence, frequency) on the target's logits and stop_token_ids: the same
numbers as transformers' processors and OpenAI's formula on hand-made logits, and through the
engine every lossless drafter under penalties gives plain decoding's tokens under the same penalties."""

from __future__ import annotations

import pytest
import torch

from specdec.frontends.api import Pair
from specdec.core.drafters.base import Draft, TreeDraft
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.core.request import make_config
from specdec.core.sampling import SamplingParams, penalize
from tinymodels import byte_tokenizer, perturbed_copy, tiny_model


def test_repetition_penalty_is_transformers_processor():
    from transformers import RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 50, generator=gen) * 3
    prompt, output = [3, 7, 7, 11], [20, 3, 41]
    ours = penalize(logits, SamplingParams(repetition_penalty=1.3), prompt, output, [[]])
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + output]), logits.clone())
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, logits)  # it did something, and left the input alone
    assert penalize(logits, SamplingParams(), prompt, output, [[]]) is logits  # off: untouched


def test_presence_and_frequency_penalties_are_openai_s_formula():
    logits = torch.zeros(1, 8)
    out = penalize(logits, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [1, 1, 1], [2, 2, 5], [[]])
    # the output only: token 2 twice (-0.5 - 2*0.25), token 5 once (-0.5 - 0.25); the prompt's 1 untouched
    assert out[0].tolist() == [0, 0, -1.0, 0, 0, -0.75, 0, 0]
    neg = penalize(logits, SamplingParams(presence_penalty=-1.0), [], [4], [[]])
    assert neg[0, 4] == 1.0  # negative values encourage


def test_each_verify_row_sees_the_drafts_before_it():
    logits = torch.zeros(3, 8)
    out = penalize(logits, SamplingParams(frequency_penalty=1.0), [], [6], [[], [6], [6, 7]])
    assert out[:, 6].tolist() == [-1.0, -2.0, -2.0] and out[:, 7].tolist() == [0.0, 0.0, -1.0]
    assert Draft([4, 5, 6]).row_paths() == [[], [4], [4, 5], [4, 5, 6]]
    # a tree: nodes 0 and 1 under the root, node 2 under node 0
    assert TreeDraft([4, 5, 6], parents=[-1, -1, 0]).row_paths() == [[], [4], [5], [4, 6]]


@pytest.mark.parametrize("bad", [dict(repetition_penalty=0), dict(repetition_penalty=-1.0),
                                 dict(presence_penalty=2.5), dict(frequency_penalty=-2.01),
                                 dict(stop_token_ids=[-1]), dict(stop_token_ids="12")])
def test_bad_values_are_one_line_errors(bad):
    with pytest.raises(SpecdecError) as err:
        make_config(**bad)
    assert "\n" not in str(err.value) and next(iter(bad)) in str(err.value)


def test_dropmatch_paths_judge_against_the_penalised_law():
    """DropMatch's own LM-head paths get the request's penalties for their verify rows, as the
    target's row does: a draft every path picks is refused once a penalty rules it out there."""
    from specdec.core.verify.base import Round
    from specdec.core.verify.dropmatch import DropMatch

    hidden = torch.tensor([[0.0, 0.0, 1.0, 5.0], [0.0, 0.0, 0.0, 0.0]])  # row 0 strongly prefers token 3
    rule = DropMatch(paths=5, p=0.01, criterion="majority")
    where = torch.tensor([True])

    def round_(penalize_rows):
        return Round(target_logits=hidden.clone(), draft_tokens=torch.tensor([3]), draft_probs=None,
                     params=SamplingParams(presence_penalty=2.0), generator=torch.Generator().manual_seed(0),
                     target_hidden=hidden, lm_head=lambda h: h.float(), penalize_rows=penalize_rows)

    assert rule.accepts(round_(None), where).tolist() == [True]
    rows_seen = []

    def minus_ten_at_3(rows, idx):
        rows_seen.append(idx.tolist())
        out = rows.clone()
        out[..., 3] -= 10.0
        return out

    assert rule.accepts(round_(minus_ten_at_3), where).tolist() == [False] and rows_seen == [[0]]


def test_dropmatch_decodes_under_penalties(pair):
    out = pair.generate([1, 2, 3, 4], policy="dropmatch", k=3, max_new_tokens=12, repetition_penalty=1.3,
                        frequency_penalty=0.5)
    assert len(out.token_ids) == 12


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(5)
    return Pair(CausalLM(target), byte_tokenizer(), CausalLM(perturbed_copy(target, 0.05, 6)))


def reference_greedy(pair, prompt: list[int], n: int, penalty: float) -> list[int]:
    """Plain greedy decoding written out: the full forward pass, transformers' processor, argmax."""
    from transformers import RepetitionPenaltyLogitsProcessor

    model, ids = pair.target.model, list(prompt)
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[:, -1].float()
        ids.append(int(RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([ids]), logits).argmax()))
    return ids[len(prompt):]


PENALTIES = [dict(repetition_penalty=1.8), dict(presence_penalty=1.0, frequency_penalty=0.7),
             dict(repetition_penalty=0.7, frequency_penalty=-0.5)]


@pytest.mark.parametrize("penalty", PENALTIES, ids=["repetition", "presence+frequency", "encouraging"])
def test_lossless_under_penalties_equals_ar_under_them(pair, penalty):
    prompt = "abc abc abc abc"
    free = pair.generate(prompt, policy="ar", max_new_tokens=40).token_ids
    ar = pair.generate(prompt, policy="ar", max_new_tokens=40, **penalty).token_ids
    assert ar != free  # the penalty changed plain decoding
    for drafter, extra in (("model", {}), ("pld", {}), ("model+pld", {}), ("tree", {"tree_nodes": 6})):
        for k in (1, 3, 6):
            out = pair.generate(prompt, policy="lossless", drafter=drafter, k=k, max_new_tokens=40, **penalty, **extra)
            assert out.token_ids == ar, (drafter, k)


def test_repetition_penalty_through_the_engine_matches_the_written_out_loop(pair):
    prompt = pair.encode("abc abc abc abc")
    ours = pair.generate(prompt, policy="ar", max_new_tokens=24, repetition_penalty=1.8).token_ids
    assert ours == reference_greedy(pair, prompt, 24, 1.8)
    spec = pair.generate(prompt, policy="lossless", drafter="model", k=4, max_new_tokens=24, repetition_penalty=1.8)
    assert spec.token_ids == ours and spec.stats.accepted > 0


def test_stop_token_ids_end_the_answer_like_eos(pair):
    ar = pair.generate("abc abc abc", policy="ar", max_new_tokens=30)
    stop = ar.token_ids[6]
    first = ar.token_ids.index(stop)
    for policy, k in (("ar", 1), ("lossless", 4)):
        out = pair.generate("abc abc abc", policy=policy, k=k, max_new_tokens=30, stop_token_ids=[stop])
        assert out.token_ids == ar.token_ids[: first + 1] and out.finish_reason == "stop", policy
