"""The draft model's window (``draft_window``): the draft reads the prompt's last W tokens and
everything generated. Lossless output never depends on it; the draft's reading does."""

from __future__ import annotations

import pytest
from specdec.frontends.api import Pair
from specdec.core.drafters.model import AUTO_WINDOW, window_start
from specdec.core.engine import DecodeConfig, Engine
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.core.request import make_config
from specdec.core.sampling import SamplingParams
from tinymodels import byte_tokenizer, chisquare_joint, engine_sample, perturbed_copy, tiny_engine, tiny_model

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):"
WINDOWS = [1, 2, 5, 16, 1000, "all", "auto"]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(5)
    return Pair(CausalLM(target), byte_tokenizer(), CausalLM(perturbed_copy(target, 0.1, 15)))


def test_window_start_table():
    assert window_start(100, 10) == 90
    assert window_start(100, 100) == 0
    assert window_start(100, 1000) == 0
    assert window_start(100, "all") == 0
    assert window_start(AUTO_WINDOW + 7, "auto") == 7
    assert window_start(3, "auto") == 0


@pytest.mark.parametrize("drafter", ["model", "model+pld", "tree"])
def test_lossless_greedy_equals_ar_for_every_window(pair, drafter):
    ar = pair.generate(PROMPT, chat=False, policy="ar", max_new_tokens=32)
    for w in WINDOWS:
        out = pair.generate(PROMPT, chat=False, policy="lossless", drafter=drafter, k=3, max_new_tokens=32,
                            draft_window=w)
        assert out.token_ids == ar.token_ids, (drafter, w)
        assert out.stats.drafted > 0


@pytest.mark.parametrize("drafter", ["model", "model+pld", "tree"])
def test_a_window_larger_than_the_prompt_is_no_window(pair, drafter):
    n = len(pair.encode(PROMPT, chat=False))
    runs = [pair.generate(PROMPT, chat=False, policy="lossless", drafter=drafter, k=4, max_new_tokens=24,
                          draft_window=w) for w in ("all", n, n + 50)]
    assert len({tuple(r.token_ids) for r in runs}) == 1
    assert len({(r.stats.drafted, r.stats.accepted, r.stats.rounds) for r in runs}) == 1


class Counting(CausalLM):
    """A model that counts the tokens it was fed."""

    fed = 0

    def _append(self, ids, num_logits, hidden):
        self.fed += len(ids)
        return super()._append(ids, num_logits, hidden)


def test_the_draft_reads_only_the_window():
    target = tiny_model(6)
    draft = Counting(perturbed_copy(target, 0.1, 16))
    engine = Engine(CausalLM(target), draft, eos_ids=[])
    prompt = list(range(3, 203))  # 200 tokens
    out = engine.generate(prompt, DecodeConfig(policy="lossless", drafter="model", k=3, max_new_tokens=12,
                                               drafter_params={"draft_window": 8}))
    assert out.stats.drafted > 0
    # the window, then at most the generated tokens and each round's drafts
    assert draft.fed <= 8 + len(out.token_ids) + out.stats.drafted
    assert draft.tokens[0] == prompt[-8]  # its text begins where the window does


@pytest.mark.parametrize("bad", [0, -3, 2.5, "most", True, None])
def test_bad_windows_are_one_line_errors(bad):
    with pytest.raises(SpecdecError) as err:
        make_config(policy="lossless", drafter="model", draft_window=bad)
    assert "draft_window" in str(err.value) and "\n" not in str(err.value)


def test_the_cli_flag_takes_words_and_numbers():
    from specdec.cli import build_parser

    p = build_parser()
    assert p.parse_args(["generate", "x", "--draft-window", "auto"]).draft_window == "auto"
    assert p.parse_args(["generate", "x", "--draft-window", "64"]).draft_window == 64
    with pytest.raises(SystemExit):
        p.parse_args(["generate", "x", "--draft-window", "lots"])


@pytest.mark.slow
def test_sampling_through_a_window_matches_the_target():
    """T>0: lossless speculation with a 2-token window still samples the target's distribution
    (chi-square over the joint of the first three tokens, 6000 seeded runs)."""
    params = SamplingParams(temperature=0.9, top_p=0.95)
    counts, expected, accept_rate, _ = engine_sample(tiny_engine(), 6000, params, policy="lossless",
                                                     drafter="model", drafter_params={"draft_window": 2})
    assert 0.2 < accept_rate < 0.95  # the draft was really used, and really rejected
    pvalue, outside = chisquare_joint(counts, expected)
    assert pvalue > 1e-3 and outside == 0
