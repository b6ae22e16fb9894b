"""Loose rules at T>0 stay inside the request's sampling support, FLy is never silently inert, and
DropMatch's paths build no autograd graph."""

import pytest
import torch

from specdec.core.caller import Caller
from specdec.frontends.api import Pair
from specdec.models.costmodel import CostTable
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from specdec.core.sampling import SamplingParams, probabilities
from tinymodels import byte_tokenizer, perturbed_copy, tiny_model
from specdec.core.verify import Round, make_policy

POLICIES = ["mars", "typical", "dropmatch", "fly", "fly+mars", "mars+typical", "fly+dropmatch+mars+typical"]


def test_mars_repro_from_the_issue_commits_nothing_outside_top_k():
    logits = torch.tensor([[10.0, 9.5, 0.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.0, 1.0, 0.0]])
    for params in (SamplingParams(temperature=0.8, top_k=1, seed=0), SamplingParams(temperature=0.8, top_p=0.5, seed=0)):
        rnd = Round(logits, torch.tensor([1]), q, params, torch.Generator().manual_seed(0),
                    target_probs=probabilities(logits, params))
        assert make_policy("lossless").verify(rnd).accepted == 0
        v = make_policy("mars").verify(rnd)
        assert v.accepted == 0 and v.token == 0 and v.relaxed == {"mars": 0}
    # without the filter, MARS does relax there (z2/z1 = 0.95 > 0.9)
    params = SamplingParams(temperature=0.8, seed=0)
    rnd = Round(logits, torch.tensor([1]), q, params, torch.Generator().manual_seed(0),
                target_probs=probabilities(logits, params))
    assert make_policy("mars").verify(rnd).relaxed == {"mars": 1}


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(21)
    return Pair(CausalLM(target), byte_tokenizer(), CausalLM(perturbed_copy(target, 0.3, 22)))


@pytest.mark.parametrize("policy", POLICIES)
def test_top_k_one_makes_every_policy_greedy_plain_decoding(pair, policy):
    greedy = pair.generate("abc abd abe", chat=False, policy="ar", max_new_tokens=30)
    for seed in range(3):
        out = pair.generate("abc abd abe", chat=False, policy=policy, k=8, temperature=0.8, top_k=1, seed=seed,
                            max_new_tokens=30, **({"p": 0.5, "criterion": "naive"} if policy == "dropmatch" else {}))
        assert out.token_ids == greedy.token_ids, (policy, seed)
        assert sum(out.stats.relaxed.values()) == 0


def test_fly_refuses_a_block_its_window_cannot_act_on(pair):
    with pytest.raises(SpecdecError, match=r"FLy's window \(6\) acts only on draft blocks longer than it, so k=5"):
        pair.generate("hi", chat=False, policy="fly", k=5)
    with pytest.raises(SpecdecError, match="window"):
        pair.generate("hi", chat=False, policy="fly+mars", k=3, fly_window=3)
    pair.generate("hi", chat=False, policy="fly", k=4, window=3, max_new_tokens=4)  # k > window: fine


def test_fly_with_k_auto_keeps_a_window_aware_controller(tiny_dirs):
    import specdec

    target, draft = tiny_dirs
    p = specdec.load(str(target), draft=str(draft), dtype="float32", progress=False)
    # tiny models cost what the machine's overheads cost: give the controller a cost model where
    # drafting pays (flat verify, a cheap draft), as on a GPU
    widths = [1, 2, 4, 8, 16, 32]
    p.engine.target_costs = CostTable("t|x", "float32", widths, [0.01] * 6, 32)
    p.engine.draft_costs = CostTable("d|x", "float32", widths, [0.001] * 6, 32)
    p.engine.caches.controllers.clear()
    from specdec.core.engine import DecodeConfig

    ids = p.encode("abc abc abc", chat=False)
    # a caller's controller is kept across its requests (one without a caller starts fresh)
    cfg = DecodeConfig(policy="fly", drafter="model", max_new_tokens=60).with_settings(caller="t")
    out = p.engine.generate(ids, cfg)
    ks = out.stats.k_chosen
    assert len(ks) == out.stats.rounds and any(ks) and max(ks) < 60
    (control,) = [c for key, c in p.engine.caches.controllers.items() if key[:2] == (Caller.named("t"), "fly")]
    assert control.window == 6 and sum(control.bins.reached) > 0  # every drafting round taught the acceptance model
    # a drafting round runs past the window (shorter blocks would leave it inert), unless the answer's end is nearer
    assert all(k == 0 or k > 6 for k in ks[:-3])


def test_dropmatch_paths_build_no_autograd_graph(pair):
    hidden = torch.randn(3, pair.target.config.hidden_size)
    assert not pair.target.head_logits(hidden).requires_grad
