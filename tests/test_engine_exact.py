"""Greedy lossless decoding must be token-identical to plain decoding (float32, tiny models)."""

import pytest
import torch

from specdec.frontends.api import Pair
from specdec.core.engine import DecodeConfig, Engine, Generation
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from tinymodels import byte_tokenizer, perturbed_copy, tiny_model

PROMPTS = ["def hello():", "abc abc abc", "The quick brown fox", "x"]


@pytest.fixture(scope="module", params=[0, 1, 2], ids=lambda s: f"model{s}")
def pair(request):
    seed = request.param
    target = tiny_model(seed)
    draft = perturbed_copy(target, 0.1, seed + 10)
    return Pair(CausalLM(target), byte_tokenizer(), CausalLM(draft))


@pytest.mark.parametrize("drafter", ["model", "pld", "model+pld"])
def test_lossless_equals_ar_for_every_k(pair, drafter):
    for prompt in PROMPTS:
        ar = pair.generate(prompt, chat=False, policy="ar", max_new_tokens=48)
        assert len(ar.token_ids) == 48 and ar.finish_reason == "length"
        accepted = 0
        for k in range(1, 9):
            out = pair.generate(prompt, chat=False, policy="lossless", drafter=drafter, k=k, max_new_tokens=48)
            assert out.token_ids == ar.token_ids, (prompt, drafter, k)
            assert out.text == ar.text
            assert out.stats.rounds < 48 or drafter == "pld"
            accepted += out.stats.accepted
        assert accepted > 0  # the comparison exercised real acceptances


@pytest.mark.parametrize("drafter", ["model", "pld", "model+pld"])
def test_eos_inside_a_draft(drafter):
    target = tiny_model(3)
    draft = perturbed_copy(target, 0.05, 4)
    base = Pair(CausalLM(target), byte_tokenizer(), CausalLM(draft))
    prompt = base.encode("abc abc abc", chat=False)
    plain = Engine(base.target, eos_ids=[]).generate(prompt, DecodeConfig(policy="ar", max_new_tokens=60))
    eos = plain.token_ids[20]  # pretend a token from the middle of the output ends the sequence
    first = plain.token_ids.index(eos)
    engine = Engine(base.target, base.draft, eos_ids=[eos])
    ar = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=60))
    assert ar.token_ids == plain.token_ids[: first + 1] and ar.finish_reason == "stop"
    for k in range(1, 9):
        out = engine.generate(prompt, DecodeConfig(policy="lossless", drafter=drafter, k=k, max_new_tokens=60))
        assert out.token_ids == ar.token_ids, k
        assert out.finish_reason == "stop"


@pytest.mark.parametrize("drafter", ["model", "pld", "model+pld"])
def test_stop_string_inside_a_draft(pair, drafter):
    ar_full = pair.generate("abc abc abc", chat=False, policy="ar", max_new_tokens=60)
    ids = ar_full.token_ids
    stop = pair.tokenizer.decode(ids[25:27])  # text of two tokens in the middle of the output
    ar = pair.generate("abc abc abc", chat=False, policy="ar", max_new_tokens=60, stop=[stop])
    assert ar.finish_reason == "stop" and stop not in ar.text
    assert ar_full.text.startswith(ar.text) and ar_full.text[len(ar.text):].startswith(stop)
    for k in (2, 5, 8):
        out = pair.generate("abc abc abc", chat=False, policy="lossless", drafter=drafter, k=k,
                            max_new_tokens=60, stop=[stop])
        assert (out.token_ids, out.text, out.finish_reason) == (ar.token_ids, ar.text, "stop")


def test_streaming_pieces_add_up_to_text(pair):
    pieces = []
    out = pair.generate("def hello():", chat=False, k=4, max_new_tokens=40, on_text=pieces.append,
                        stop=["zz"])
    assert "".join(pieces) == out.text
    stream = pair.stream("def hello():", chat=False, k=4, max_new_tokens=40)
    assert "".join(stream) == stream.output.text == out.text


def test_a_string_is_continued_and_messages_are_a_chat(pair):
    """As vLLM's LLM.generate / LLM.chat, llama-cpp-python and the OpenAI API: a string is text to
    continue, a message list a chat; chat=True (or a system message) templates a string."""
    assert pair.encode("hi") == pair.encode("hi", chat=False) == pair.tokenizer.encode("hi")
    ids = pair.encode("hi", chat=True)
    text = pair.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nhi<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    msgs = [{"role": "user", "content": "hi"}]
    assert pair.encode(msgs) == ids
    assert pair.encode("hi", system="be brief") == pair.encode([{"role": "system", "content": "be brief"}, *msgs])
    assert pair.encode("hi", system="be brief") != ids
    plain = pair.generate("hi", policy="ar", max_new_tokens=6)
    assert plain.prompt_tokens == len(pair.tokenizer.encode("hi"))
    assert plain.token_ids == pair.generate("hi", chat=False, policy="ar", max_new_tokens=6).token_ids
    chat = pair.chat("hi", policy="ar", max_new_tokens=6)
    assert chat.prompt_tokens == len(ids)
    assert chat.token_ids == pair.generate(msgs, policy="ar", max_new_tokens=6).token_ids
    assert chat.token_ids == pair.chat(msgs, policy="ar", max_new_tokens=6).token_ids
    with pytest.raises(SpecdecError, match="use generate"):
        pair.chat("hi", chat=False)


def test_stats_are_consistent(pair):
    out = pair.generate("abc abc abc", chat=False, k=5, max_new_tokens=64)
    s = out.stats
    assert s.new_tokens == len(out.token_ids) == 64
    assert s.rounds + s.accepted == s.new_tokens  # each round emits its kept drafts + one token
    assert s.mean_acceptance_length == pytest.approx(1 + s.accepted / s.rounds)
    assert s.drafted_at[0] >= s.drafted_at[-1] and all(a <= d for a, d in zip(s.accepted_at, s.drafted_at))
    assert sum(s.accepted_at) == s.accepted and sum(s.drafted_at) == s.drafted
    assert 0 <= s.zero_accept_share <= 1 and s.tokens_per_second > 0
    assert s.total_seconds >= s.draft_seconds + s.verify_seconds
    ar = pair.generate("abc abc abc", chat=False, policy="ar", max_new_tokens=64).stats
    assert ar.mean_acceptance_length == 1.0 and ar.rounds == 64 and ar.drafted == 0


@pytest.mark.parametrize("drafter", ["auto", "suffix"])
def test_sampling_is_reproducible_with_a_seed(pair, drafter):
    """Whatever ran before: a seeded sample reads no earlier answer (suffix) and no learned K."""
    a = pair.generate("abc", chat=False, temperature=0.8, top_p=0.9, seed=11, max_new_tokens=30, drafter=drafter)
    b = pair.generate("abc", chat=False, temperature=0.8, top_p=0.9, seed=11, max_new_tokens=30, drafter=drafter)
    c = pair.generate("abc", chat=False, temperature=0.8, top_p=0.9, seed=12, max_new_tokens=30, drafter=drafter)
    assert a.token_ids == b.token_ids != c.token_ids


def test_closing_a_stream_stops_the_engine(pair):
    stream = pair.stream("abc abc abc", chat=False, k=3, max_new_tokens=200)
    it = iter(stream)
    next(it)
    calls = pair.target.forward_calls
    stream.close()
    assert list(it) == []
    assert pair.target.forward_calls == calls
    assert stream.output.finish_reason == "cancelled" and 0 < len(stream.output.token_ids) < 200
    assert len(pair.generate("abc", chat=False, max_new_tokens=5).token_ids) == 5  # the pair is reusable


def test_should_stop_is_asked_every_round(pair):
    ids, cfg, stop = pair.encode("abc abc abc", chat=False), DecodeConfig(k=3, max_new_tokens=200), []
    out = Generation(list(ids))
    for _ in pair.engine.run(ids, cfg, out, should_stop=lambda: bool(stop)):
        if out.stats.rounds == 4:
            stop.append(True)
    assert out.finish_reason == "cancelled" and out.stats.rounds == 4


def test_should_stop_is_asked_inside_a_round(pair):
    """The model drafter asks between its passes and the engine before verifying: told to stop
    after the drafter's second pass, the generation ends in its first round, before any verify pass
    (a client that leaves frees the engine within a pass, not a round)."""
    calls = []
    out = pair.generate("abc abc abc", chat=False, k=3, drafter="model", max_new_tokens=200,
                        should_stop=lambda: calls.append(1) or len(calls) > 2)
    assert out.finish_reason == "cancelled" and out.stats.rounds == 0 and out.token_ids == []


def test_token_id_prompts(pair):
    ids = pair.encode("abc abc", chat=False)
    assert pair.generate(ids, max_new_tokens=8).token_ids == pair.generate("abc abc", chat=False, max_new_tokens=8).token_ids
    from specdec.errors import SpecdecError

    with pytest.raises(SpecdecError, match="outside the vocabulary"):
        pair.generate([1, 10**6])
    with pytest.raises(SpecdecError, match="no chat template"):
        pair.generate(ids, chat=True)
