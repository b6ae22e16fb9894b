"""Property: at T=0 every loose rule and composition accepts at least what lossless accepts."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.core.sampling import SamplingParams
from specdec.core.verify import Lossless, Round, make_policy

POLICIES = ["mars", "typical", "dropmatch", "fly", "fly+mars", "mars+typical", "fly+dropmatch",
            "dropmatch+mars+typical"]
HEAD = torch.nn.Linear(6, 7, bias=False)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    k=st.integers(1, 12),
    scale=st.sampled_from([0.1, 1.0, 5.0]),
    agree=st.floats(0.0, 1.0),
    theta=st.floats(0.0, 1.0),
    policy=st.sampled_from(POLICIES),
)
def test_loose_rules_accept_at_least_lossless(seed, k, scale, agree, theta, policy):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(k + 1, 6, generator=gen) * scale
    with torch.no_grad():
        logits = HEAD(hidden)
    argmax = logits[:-1].argmax(-1)
    noise = torch.randint(0, 7, (k,), generator=gen)
    drafts = torch.where(torch.rand(k, generator=gen) < agree, argmax, noise)
    rnd = Round(logits, drafts, None, SamplingParams(), gen, target_hidden=hidden,
                lm_head=lambda h: HEAD(h).float(), draft_logits=torch.randn(k, 7, generator=gen))
    lossless = Lossless().verify(rnd)
    params = {"fly_theta": theta} if policy.startswith("fly") else {}
    loose = make_policy(policy, params).verify(rnd)
    assert loose.accepted >= lossless.accepted
    if loose.accepted == lossless.accepted:
        assert loose.token == lossless.token  # same prefix, same target token
    rejected_by_lossless = int((logits[:-1].argmax(-1) != drafts)[: loose.accepted].sum())
    assert sum(loose.relaxed.values()) >= rejected_by_lossless  # every kept mismatch is attributed
