"""The static cache's fused step (merged q/k/v and gate/up, grouped-query attention under a boolean
mask) against transformers' own modules, and the draft's K steps as one loop on the device
(replayed eagerly here; captured for real by tests/test_cuda_capture.py on a GPU)."""

from __future__ import annotations

import pytest
import torch

from specdec.core.drafters.model import ModelDrafter
from specdec.core.engine import DecodeConfig, Engine
from specdec.core.sampling import SamplingParams, device_chooser, probabilities
from specdec.models.backends.transformers.fused import FusedDecoder, fused_refusal
from specdec.models.backends.transformers.graphs import WidthGraphs, replay_eagerly
from specdec.models.backends.transformers.kernels import pack_linears
from specdec.models.backends.transformers.model import HFModel
from specdec.models.backends.transformers.static import StaticHFModel
from tinymodels import chisquare_joint, engine_sample, perturbed_copy, tiny_config, tiny_model


def with_loop(model, **kw):
    """The static cache with graphs replayed eagerly, so the draft loop runs (as on CUDA)."""
    return StaticHFModel(model, graphs=lambda step, device: WidthGraphs(step, device, capture=replay_eagerly), **kw)


def without_loop(model, **kw):
    return StaticHFModel(model, graphs=lambda step, device: WidthGraphs(step, device, capture=replay_eagerly),
                         draft_loop=False, **kw)


# ----------------------------------------------------------------------------- the fused step
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_fused_passes_equal_the_modules_passes(kv_heads):
    ids = torch.randint(0, 259, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    modules = StaticHFModel(tiny_model(5, num_key_value_heads=kv_heads), fused=False)
    fused = StaticHFModel(tiny_model(5, num_key_value_heads=kv_heads))
    assert modules.fused is None and fused.fused is not None and fused.step_kind == "fused"
    for lm in (modules, fused):
        lm.forward(ids[:30])
    for width in (1, 3, 1, 6):
        a = modules.forward(ids[30:30 + width], num_logits=width)
        b = fused.forward(ids[30:30 + width], num_logits=width)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        modules.truncate(30 + width // 2)
        fused.truncate(30 + width // 2)
        assert fused.tokens == modules.tokens
    plain = HFModel(tiny_model(5, num_key_value_heads=kv_heads)).forward(fused.tokens + [7, 8, 9], num_logits=3)
    torch.testing.assert_close(fused.forward([7, 8, 9], num_logits=3), plain, atol=1e-5, rtol=1e-5)


def test_merged_weights_are_the_modules_own_storage():
    model = tiny_model(0)
    before = HFModel(tiny_model(0)).forward(list(range(12)), num_logits=4)
    decoder = FusedDecoder(model)
    attn, mlp, layer = model.model.layers[0].self_attn, model.model.layers[0].mlp, decoder.layers[0]
    assert attn.q_proj.weight.data_ptr() == layer.wqkv.data_ptr()
    assert attn.v_proj.bias.data_ptr() > attn.k_proj.bias.data_ptr() > layer.bqkv.data_ptr()
    assert mlp.up_proj.weight.data_ptr() > mlp.gate_proj.weight.data_ptr() == layer.w13.data_ptr()
    assert layer.wqkv.shape == (64 + 2 * 64 // 4 * 2, 64)  # 4 heads of 16, 2 kv heads (tiny_config)
    # transformers' own forward still runs, on the merged storage, to the same logits
    torch.testing.assert_close(HFModel(model).forward(list(range(12)), num_logits=4), before)


def test_a_model_the_fused_step_cannot_run_falls_back_to_the_modules():
    assert fused_refusal(tiny_model(0)) is None
    packed = tiny_model(0)
    if pack_linears(packed):
        assert "plain linear" in fused_refusal(packed)
    gelu = tiny_model(0, hidden_act="gelu")
    assert "gelu" in fused_refusal(gelu)
    lm = StaticHFModel(gelu)
    assert lm.fused is None and lm.step_kind == "modules" and "gelu" in lm.fused_refusal
    assert lm.forward([1, 2, 3]).shape == (1, 259)
    assert lm.fingerprint_extra() == {"kv_cache": "static"}
    assert StaticHFModel(tiny_model(0)).fingerprint_extra() == {"kv_cache": "static", "step": "fused"}


def test_the_fused_step_holds_no_host_sync():
    """dynamo traces the fused step whole: it can be compiled with fullgraph=True and captured."""
    lm = StaticHFModel(tiny_model(0))
    lm.forward(list(range(10)))
    try:
        with torch.inference_mode():
            explained = torch._dynamo.explain(lm.step)(torch.tensor([[5, 6], [10, 11]]))
    finally:
        torch._dynamo.reset()
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


# ----------------------------------------------------------------------------- the draft loop
def drafts(lm, k: int, params: SamplingParams, seed: int = 0, **options):
    drafter = ModelDrafter(lm, **options)
    context = list(b"def fib(n): return fib(n - 1)")
    drafter.start(context)
    gen = torch.Generator().manual_seed(seed)
    return drafter.propose(context, k, params, gen), lm.tokens[:]


@pytest.mark.parametrize("options", [{}, {"min_confidence": 0.5}, {"stop_ids": frozenset({ord("n")})}])
def test_the_greedy_draft_loop_equals_the_host_loop(options):
    target = tiny_model(1)
    draft = perturbed_copy(target, 0.1, 11)
    (host, host_tokens), (loop, loop_tokens) = (drafts(make(draft), 6, SamplingParams(), **options)
                                                for make in (without_loop, with_loop))
    assert loop.tokens == host.tokens and loop_tokens == host_tokens
    torch.testing.assert_close(loop.logits, host.logits)
    assert loop.probs is None and host.probs is None


def test_a_draft_longer_than_its_first_block_goes_on_in_the_next():
    draft = perturbed_copy(tiny_model(1), 0.1, 11)
    loop, loop_tokens = drafts(with_loop(draft), 7, SamplingParams(temperature=0.9), seed=1)
    assert len(loop.tokens) == 7 and loop_tokens[-6:] == loop.tokens[:6]  # blocks of 4 and 3, each fed
    assert loop.probs.shape == loop.logits.shape == (7, 259)
    torch.testing.assert_close(loop.probs.sum(-1), torch.ones(7))


def test_the_draft_loop_is_cut_where_the_k_policy_stops_and_shows_it_each_probability():
    draft = with_loop(tiny_model(2))
    drafter = ModelDrafter(draft)
    shown = []
    drafter.more = lambda i, p: shown.append((i, round(p, 6))) or i < 3
    context = [5, 17, 99, 3]
    drafter.start(context)
    out = drafter.propose(context, 6, SamplingParams(), None)
    assert len(out.tokens) == 3 and [i for i, _ in shown] == [1, 2, 3]
    assert draft.tokens == context + out.tokens[:2]  # the fed tokens past the cut are gone
    softmax = torch.softmax(out.logits, -1)
    assert [p for _, p in shown] == [round(float(softmax[i, t]), 6) for i, t in enumerate(out.tokens)]
    assert draft.loop.replays == 1 and drafter.block == 3  # the next round's first block: this one's length


def test_the_gumbel_max_choice_draws_from_the_sampling_distribution():
    from scipy.stats import chisquare

    params = SamplingParams(temperature=0.7, top_k=5)
    raw = torch.randn(8, generator=torch.Generator().manual_seed(4)) * 2
    q = probabilities(raw[None], params)[0]
    choose = device_chooser(params)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(8)
    for _ in range(4000):
        token, p, p1, rows = choose(raw, torch.rand(8, generator=gen))
        counts[token] += 1
        assert float(p) == float(q[token]) and torch.equal(rows, q)
    assert counts[q == 0].sum() == 0
    kept = q > 0
    assert chisquare(counts[kept].numpy(), (q[kept] * 4000).numpy()).pvalue > 1e-3


def test_seeded_sampling_with_the_draft_loop_repeats_and_keeps_the_target_law():
    target = tiny_model(21, vocab_size=4, layers=1, hidden=16, initializer_range=0.2)
    draft = tiny_model(22, vocab_size=4, layers=1, hidden=16, initializer_range=0.2)
    engine = Engine(with_loop(target), with_loop(draft), eos_ids=[])
    params = SamplingParams(temperature=1.0)
    cfg = DecodeConfig(drafter="model", k=3, max_new_tokens=8, sampling=SamplingParams(temperature=1.0, seed=7))
    assert engine.generate([1, 3, 0, 2], cfg).token_ids == engine.generate([1, 3, 0, 2], cfg).token_ids
    counts, joint, accepted, _ = engine_sample(engine, 1500, params)
    assert engine.draft.loop.replays > 0 and 0.1 < accepted < 0.95
    p, dof = chisquare_joint(counts, joint)
    assert p > 1e-3, (p, dof)


def test_tiny_config_has_grouped_query_heads():
    assert tiny_config().num_key_value_heads < tiny_config().num_attention_heads
