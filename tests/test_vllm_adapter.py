"""specdec.frontends.vllm without vLLM: the ragged-batch adapter, the config keys and the import boundary.

The adapter's decisions on a batch of ragged rows must equal, row by row, what specdec's own engine
decides on the same logits (the same ``policy.verify`` on the round the engine would build).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.core.sampling import SamplingParams, probabilities
from specdec.core.verify import Round, make_policy
from specdec.frontends.vllm.config import (Selection, engine_selection, request_args, request_selection, selection)
from specdec.frontends.vllm.patch import check_engine_args
from specdec.frontends.vllm.ragged import PLACEHOLDER, RaggedBatch, verify_ragged

VOCAB, HIDDEN = 13, 8
POLICIES = [
    ("lossless", {}),
    ("mars", {"theta": 0.5}),
    ("typical", {"epsilon": 0.3}),
    ("dropmatch", {"p": 0.3, "criterion": "naive"}),
    ("fly", {"window": 2, "theta": 0.0}),
    ("fly+mars", {"fly_window": 2, "fly_theta": 0.0, "mars_theta": 0.5}),
    ("fly+typical+dropmatch", {"window": 2, "fly_theta": 0.0, "p": 0.3}),
    ("fuzzy", {"divergence": "tv", "threshold": 0.9}),
    ("fly+fuzzy", {"window": 2, "fly_theta": 0.0, "threshold": 0.3, "exact_prefix": 4}),
]


def make_step(seed: int, ks: list[int], temps: list[float], pad: dict[int, int] | None = None):
    """A random ragged step: per request ``K_i + 1`` target rows (the last is the bonus row), drafts
    that often equal the target's top-1 or top-2, a linear LM head over random hidden states;
    request ``i`` has written ``i`` tokens of its answer (its drafts start at position ``i``)."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randn(HIDDEN, VOCAB, generator=g)
    reqs = []
    for i, (k, t) in enumerate(zip(ks, temps)):
        hidden = torch.randn(k + 1, HIDDEN, generator=g) * 2
        logits = hidden @ head + 3.0  # positive top logits, so MARS's ratio applies
        top2 = logits[:k].topk(2, dim=-1).indices
        pick = torch.randint(0, 4, (k,), generator=g)
        drafts = torch.where(pick == 0, top2[:, 0], torch.where(pick == 1, top2[:, 1],
                             torch.randint(0, VOCAB, (k,), generator=g)))
        if pad and i in pad:
            drafts[pad[i]:] = -1
        params = SamplingParams(temperature=t, top_k=8 if t else 0)
        probs = probabilities(logits, params) if t else None
        bonus = int(logits[k].argmax()) if not t else int(torch.multinomial(probs[k], 1, generator=g))
        reqs.append(dict(k=k, logits=logits, hidden=hidden, drafts=drafts, params=params, probs=probs, bonus=bonus,
                         position=i))
    return reqs, (lambda h: (h @ head).float())


def batch_of(reqs, lm_head, seed: int) -> RaggedBatch:
    """vLLM's layout: drafts and draft rows flattened, bonus rows apart (their tokens only)."""
    any_random = any(not r["params"].greedy for r in reqs)
    return RaggedBatch(
        draft_token_ids=torch.cat([r["drafts"] for r in reqs]).to(torch.int32),
        num_draft_tokens=[r["k"] for r in reqs],
        target_logits=torch.cat([r["logits"][: r["k"]] for r in reqs]),
        bonus_token_ids=torch.tensor([[r["bonus"]] for r in reqs]),
        params=[r["params"] for r in reqs],
        target_probs=torch.cat([r["probs"][: r["k"]] if r["probs"] is not None else
                                torch.zeros(r["k"], VOCAB) for r in reqs]) if any_random else None,
        generators={i: torch.Generator().manual_seed(seed + i) for i in range(len(reqs))},
        hidden=torch.cat([r["hidden"][: r["k"]] for r in reqs]),
        lm_head=lm_head,
        positions=[r["position"] for r in reqs],
    )


def engine_round(r, lm_head, generator) -> Round:
    """The round specdec's engine builds for the same request: K + 1 target rows, bonus row included."""
    return Round(target_logits=r["logits"], draft_tokens=r["drafts"].to(torch.int64), draft_probs=None,
                 params=r["params"], generator=generator, target_probs=r["probs"], target_hidden=r["hidden"],
                 lm_head=lm_head, position=r["position"])


@pytest.mark.parametrize("policy_name, params", POLICIES)
@pytest.mark.parametrize("temps", [[0.0] * 6, [0.0, 0.8, 1.0, 0.0, 0.7, 1.3]])
def test_each_row_decides_as_the_engine_does_on_the_same_logits(policy_name, params, temps):
    ks = [3, 0, 5, 1, 6, 4]
    for seed in range(12):
        reqs, lm_head = make_step(seed, ks, temps)
        policy = make_policy(policy_name, params)
        out, verdicts = verify_ragged(batch_of(reqs, lm_head, 100 * seed), [policy] * len(ks))
        assert out.shape == (len(ks), max(ks) + 1) and out.dtype == torch.int32
        for i, r in enumerate(reqs):
            if r["k"] == 0:
                assert out[i].tolist() == [r["bonus"]] + [PLACEHOLDER] * max(ks)
                continue
            gen = torch.Generator().manual_seed(100 * seed + i)
            expected = policy.verify(engine_round(r, lm_head, gen))
            assert verdicts[i].accepted == expected.accepted
            assert dict(verdicts[i].relaxed) == dict(expected.relaxed)
            if expected.accepted < r["k"]:  # recovered token: the same rule, the same draws
                assert verdicts[i].token == expected.token
            else:  # every draft passed: vLLM's bonus token (at T=0 the engine's argmax too)
                assert verdicts[i].token == r["bonus"]
                if r["params"].greedy:
                    assert expected.token == r["bonus"]
            row = r["drafts"][: verdicts[i].accepted].tolist() + [verdicts[i].token]
            assert out[i].tolist() == row + [PLACEHOLDER] * (max(ks) + 1 - len(row))


def test_loose_rules_relax_somewhere_in_these_batches():
    """The equality test above is not vacuous: the loose rules do keep drafts lossless rejects."""
    relaxed = {}
    for seed in range(12):
        reqs, lm_head = make_step(seed, [3, 0, 5, 1, 6, 4], [0.0] * 6)
        for name, params in POLICIES[1:]:
            _, verdicts = verify_ragged(batch_of(reqs, lm_head, seed), [make_policy(name, params)] * 6)
            relaxed[name] = relaxed.get(name, 0) + sum(sum(v.relaxed.values()) for v in verdicts)
    assert all(n > 0 for n in relaxed.values()), relaxed


def test_padded_drafts_end_the_request_and_lossless_matches_vllms_rule():
    """vLLM marks padded drafts with -1 and always rejects them: the target's own token there."""
    for seed in range(20):
        reqs, lm_head = make_step(seed, [4, 3, 2], [0.0] * 3, pad={0: 2, 1: 0})
        out, verdicts = verify_ragged(batch_of(reqs, lm_head, seed), [make_policy("lossless")] * 3)
        for i, r in enumerate(reqs):
            expected, j = [], 0
            while j < r["k"]:  # vLLM's greedy kernel, written out
                top = int(r["logits"][j].argmax())
                expected.append(top)
                if int(r["drafts"][j]) != top:
                    break
                j += 1
            else:
                expected.append(r["bonus"])
            assert out[i].tolist()[: len(expected)] == expected
            assert all(t == PLACEHOLDER for t in out[i].tolist()[len(expected):])


def test_rows_without_a_policy_are_left_to_vllm():
    reqs, lm_head = make_step(0, [2, 3], [0.0, 0.0])
    out = torch.full((2, 4), 7, dtype=torch.int32)
    out, verdicts = verify_ragged(batch_of(reqs, lm_head, 0), [None, make_policy("mars")], out)
    assert out[0].tolist() == [7, 7, 7, 7] and verdicts[0] is None and verdicts[1] is not None


def test_the_bonus_row_is_vllms_token_as_a_point_mass():
    reqs, lm_head = make_step(3, [2], [0.9])
    rnd = batch_of(reqs, lm_head, 0).round(0)
    assert rnd.k == 2 and rnd.target_logits.shape == (3, VOCAB)
    assert rnd.target_probs[2].tolist() == [1.0 if v == reqs[0]["bonus"] else 0.0 for v in range(VOCAB)]
    assert torch.equal(rnd.target_logits[:2], reqs[0]["logits"][:2])


def test_batch_shape_errors():
    reqs, lm_head = make_step(0, [2, 3], [0.0, 0.0])
    batch = batch_of(reqs, lm_head, 0)
    with pytest.raises(ValueError, match="num_draft_tokens sums to"):
        RaggedBatch(batch.draft_token_ids, [2, 2], batch.target_logits, batch.bonus_token_ids, batch.params)
    with pytest.raises(ValueError, match="2 policies for 2 requests|policies for"):
        verify_ragged(batch, [None])


# ------------------------------------------------------------------------------------------ config keys
def test_engine_key_parses_and_validates():
    assert engine_selection({}) is None and engine_selection(None) is None
    sel = engine_selection({"specdec": {"policy": "fly+mars", "mars_theta": 0.8}})
    assert sel == Selection("fly+mars", (("mars_theta", 0.8),))
    assert sel.parsed().params["mars_theta"] == 0.8
    with pytest.raises(SpecdecError, match="must be an object with a 'policy' key"):
        engine_selection({"specdec": "mars"})
    with pytest.raises(SpecdecError, match="unknown policy"):
        engine_selection({"specdec": {"policy": "marz"}})
    with pytest.raises(SpecdecError, match="mars theta must be"):
        engine_selection({"specdec": {"policy": "mars", "theta": 2}})
    with pytest.raises(SpecdecError, match="without a speculative_config"):
        engine_selection({"specdec": {"policy": "ar"}}).parsed()


def test_request_keys_override_the_engine_default():
    default = selection("fly+mars", {"mars_theta": 0.8, "fly_window": 4})
    assert request_selection(None, default) is default
    assert request_selection({"other": 1}, None) is None
    same = request_selection({"specdec_mars_theta": 0.7}, default)
    assert dict(same.params) == {"mars_theta": 0.7, "fly_window": 4}
    other = request_selection({"specdec_policy": "typical", "specdec_epsilon": 0.2}, default)
    assert other == Selection("typical", (("epsilon", 0.2),))
    assert request_selection({"specdec_policy": "vllm"}, default).parsed() is None
    with pytest.raises(SpecdecError, match="names no specdec_policy"):
        request_selection({"specdec_theta": 0.5}, None)
    with pytest.raises(SpecdecError, match="has no parameter"):
        request_selection({"specdec_policy": "mars", "specdec_window": 3}, None)
    assert request_args("mars", theta=0.7) == {"specdec_policy": "mars", "specdec_theta": 0.7}
    with pytest.raises(SpecdecError):
        request_args("mars", theta="high")


def test_engine_args_check(monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    spec = {"model": "d", "num_speculative_tokens": 8}
    assert check_engine_args({}, None) is None
    assert check_engine_args({"specdec": {"policy": "mars"}}, spec).policy == "mars"
    import os

    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"  # the runner whose sampler the plugin replaces
    with pytest.raises(SpecdecError, match="there is no speculative_config"):
        check_engine_args({"specdec": {"policy": "mars"}}, None)
    with pytest.raises(SpecdecError, match="leave rejection_sample_method"):
        check_engine_args({"specdec": {"policy": "mars"}}, {**spec, "rejection_sample_method": "block"})
    with pytest.raises(SpecdecError, match="FLy's window"):
        check_engine_args({"specdec": {"policy": "fly"}}, {**spec, "num_speculative_tokens": 6})
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(SpecdecError, match="V1 model runner"):
        check_engine_args({"specdec": {"policy": "mars"}}, spec)


# ------------------------------------------------------------------------------------------ boundaries
def test_specdec_does_not_import_vllm_and_the_adapter_needs_no_vllm():
    code = ("import sys, specdec, specdec.cli, specdec.frontends.vllm, specdec.frontends.vllm.ragged, "
            "specdec.frontends.vllm.config; "
            "import specdec.frontends.vllm.patch; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_make_llm_without_vllm_is_one_clear_error(monkeypatch):
    import importlib.util

    import specdec.frontends.vllm as sv

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    with pytest.raises(SpecdecError, match=r"needs vLLM: pip install 'specdec-rules\[vllm\]'"):
        sv.make_llm("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b", policy="fly+mars", k=8)


def test_lossless_in_make_llm_is_specdecs_rule_and_vllm_names_vllms(monkeypatch):
    """``lossless`` means specdec's exact rule everywhere: make_llm runs it through the plugin (the
    engine's additional_config selects it), and ``vllm`` names vLLM's own rule (no selection)."""
    from types import SimpleNamespace

    import specdec.frontends.vllm as sv
    import specdec.frontends.vllm.patch as patch

    monkeypatch.setattr(sv, "_require_vllm", lambda: SimpleNamespace(LLM=lambda **kw: kw))
    monkeypatch.setattr(sv, "_check_plugin_registered", lambda: None)
    monkeypatch.setattr(sv, "_model_ref", lambda source, what: source)
    monkeypatch.setattr(patch, "check_version", lambda: None)
    monkeypatch.setattr(patch, "install", lambda: None)
    lossless = sv.make_llm("t", draft="d", k=4)  # the default with a draft
    assert lossless["additional_config"] == {"specdec": {"policy": "lossless"}}
    assert lossless["speculative_config"]["num_speculative_tokens"] == 4
    assert sv.make_llm("t", draft="d", policy="lossless")["additional_config"] == lossless["additional_config"]
    assert sv.make_llm("t", draft="d", policy="vllm")["additional_config"] == {}
    assert sv.make_llm("t", draft="d", policy="mars", theta=0.8)["additional_config"]["specdec"]["policy"] == "mars"
