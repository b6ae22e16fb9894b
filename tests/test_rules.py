"""Table tests for the loose rules on hand-made logits, and how policies compose."""

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.core.sampling import SamplingParams
from specdec.core.verify import Lossless, Round, make_policy
from specdec.core.verify.dropmatch import dropout_logits, js_accept, js_divergence, majority_accept, naive_accept
from specdec.core.verify.fly import fly_flips, topk_entropy
from specdec.core.verify.mars import mars_accept
from specdec.core.verify.typical import entropy, typical_accept

T, F = True, False


def rows(*logit_rows):
    return torch.tensor(logit_rows, dtype=torch.float32)


# ----------------------------------------------------------------------------- MARS
@pytest.mark.parametrize(
    "logits, draft, theta, expected",
    [
        ([10.0, 9.5, 1.0], 0, 0.9, T),  # exact match, inside the margin
        ([10.0, 9.5, 1.0], 1, 0.9, T),  # top-2, ratio 0.95 > 0.9
        ([10.0, 8.0, 1.0], 1, 0.9, F),  # top-2 outside the margin (0.8)
        ([10.0, 9.5, 9.4], 2, 0.9, F),  # top-3 never
        ([-1.0, -1.05, -5.0], 1, 0.9, F),  # both negative: ratio 1.05 > theta, guarded
        ([1.0, -0.5, -5.0], 1, 0.0, F),  # ratio negative
        ([10.0, 9.99, 0.0], 1, 1.0, F),  # theta = 1: never (reduces to lossless)
        ([10.0, 0.1, 0.0], 1, 0.0, T),  # theta = 0: any positive runner-up
    ],
)
def test_mars_table(logits, draft, theta, expected):
    assert mars_accept(rows(logits), torch.tensor([draft]), theta).tolist() == [expected]


def greedy_round(logits, drafts, **kw):
    return Round(rows(*logits), torch.tensor(drafts), None, SamplingParams(), None, **kw)


def test_mars_policy_on_a_block_with_several_mismatches():
    logits = [
        [5.0, 4.9, 0.0, 0.0],  # d=1: top-2 within margin -> relaxed
        [0.0, 6.0, 0.0, 0.0],  # d=1: exact
        [3.0, 0.0, 2.9, 0.0],  # d=2: top-2 within margin -> relaxed
        [9.0, 1.0, 0.0, 0.0],  # d=1: far outside -> reject, emit 0
        [0.0, 0.0, 0.0, 9.0],
    ]
    v = make_policy("mars").verify(greedy_round(logits, [1, 1, 2, 1]))
    assert (v.accepted, v.token, v.relaxed) == (3, 0, {"mars": 2})
    assert Lossless().verify(greedy_round(logits, [1, 1, 2, 1])).accepted == 0


# ----------------------------------------------------------------------------- typical
def test_typical_threshold():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    h = entropy(probs)
    assert torch.allclose(h, torch.tensor([-(0.5 * torch.log(torch.tensor(0.5)) + 0.3 * torch.log(torch.tensor(0.3))
                                            + 0.2 * torch.log(torch.tensor(0.2)))]))
    # threshold = min(0.25, 1.0 * exp(-H)) = min(0.25, 0.356) = 0.25
    assert typical_accept(probs.repeat(3, 1), torch.tensor([1, 2, 3]), 0.25, 1.0).tolist() == [T, F, F]
    # epsilon 1, huge delta: threshold 1, nothing passes (reduces to lossless)
    assert typical_accept(probs, torch.tensor([0]), 1.0, 1e9).tolist() == [F]


def test_typical_policy_uses_model_softmax_at_t0():
    logits = [[2.0, 1.9, 0.0], [0.0, 0.0, 5.0]]  # p(1) is about 0.45
    v = make_policy("typical").verify(greedy_round(logits, [1]))
    assert (v.accepted, v.token, v.relaxed) == (1, 2, {"typical": 1})


# ----------------------------------------------------------------------------- DropMatch
def test_dropmatch_criteria_on_hand_made_paths():
    tokens = torch.tensor([[0, 1], [0, 2], [3, 1]])  # [N=3 paths, M=2 positions]
    assert naive_accept(tokens, torch.tensor([3, 2])).tolist() == [T, T]
    assert naive_accept(tokens, torch.tensor([1, 0])).tolist() == [F, F]
    assert majority_accept(tokens, torch.tensor([0, 1])).tolist() == [T, T]  # 2 of 3
    assert majority_accept(tokens, torch.tensor([3, 2])).tolist() == [F, F]
    assert majority_accept(torch.tensor([[0], [1]]), torch.tensor([0])).tolist() == [F]  # a tie is no majority


def test_js_criterion_and_the_collapsed_case():
    collapsed = torch.tensor([[[4.0, 0.0, 0.0]]]).repeat(5, 1, 1)  # all paths agree: spread 0
    same = torch.softmax(torch.tensor([[4.0, 0.0, 0.0]]), -1)
    other = torch.softmax(torch.tensor([[0.0, 4.0, 0.0]]), -1)
    assert js_accept(collapsed, same, 0.0).tolist() == [T]
    assert js_accept(collapsed, other, 0.0).tolist() == [F]  # JS alone rejects ...
    assert majority_accept(collapsed.argmax(-1), torch.tensor([0])).tolist() == [T]  # ... majority catches it
    spread = torch.tensor([[[2.0, 1.5, 0.0]], [[1.5, 2.0, 0.0]]])
    near = torch.softmax(torch.tensor([[1.8, 1.7, 0.0]]), -1)
    assert js_accept(spread, near, 0.0).tolist() == [T]
    assert js_divergence(same, same).item() == pytest.approx(0.0, abs=1e-7)


def test_dropout_logits_shapes_scaling_and_p_zero():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 8)
    head = torch.nn.Linear(8, 5, bias=False)
    out = dropout_logits(hidden, head, paths=4, p=0.0, generator=gen)
    assert out.shape == (4, 3, 5)
    assert torch.allclose(out, head(hidden)[None].expand(4, 3, 5), atol=1e-6)
    many = dropout_logits(hidden, head, paths=4000, p=0.5, generator=gen)
    assert torch.allclose(many.mean(0), head(hidden), atol=0.15)  # inverted dropout keeps the mean
    a = dropout_logits(hidden, head, 3, 0.3, torch.Generator().manual_seed(1))
    b = dropout_logits(hidden, head, 3, 0.3, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def dropmatch_round(hidden_rows, drafts, head, temperature=0.0, seed=0):
    hidden = torch.tensor(hidden_rows)
    with torch.no_grad():
        logits = head(hidden)
    params = SamplingParams(temperature=temperature)
    probs = None if params.greedy else torch.softmax(logits / temperature, -1)
    return Round(logits, torch.tensor(drafts), None, params, torch.Generator().manual_seed(seed),
                 target_probs=probs, target_hidden=hidden, lm_head=lambda h: head(h).float())


def test_dropmatch_p_zero_reduces_to_lossless():
    head = torch.nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    rnd = dropmatch_round([[1.0, 0.99, 0.0], [0.0, 1.0, 0.0]], [1], head)
    for criterion in ("naive", "js", "majority", "paper"):
        v = make_policy("dropmatch", {"p": 0.0, "criterion": criterion}).verify(rnd)
        assert (v.accepted, v.token) == (0, 0) == tuple(Lossless().verify(rnd).__dict__[f] for f in ("accepted", "token"))
        assert v.relaxed == {"dropmatch": 0}


def test_dropmatch_naive_accepts_a_near_tie_under_dropout():
    head = torch.nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))  # logits == hidden: dropping unit 0 flips the argmax to 1
    rnd = dropmatch_round([[1.0, 0.99, 0.0], [0.0, 0.0, 1.0]], [1], head)
    v = make_policy("dropmatch", {"p": 0.5, "paths": 16, "criterion": "naive"}).verify(rnd)
    assert (v.accepted, v.token, v.relaxed) == (1, 2, {"dropmatch": 1})
    far = dropmatch_round([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], [2], head)  # unit 2 is 0: never the argmax
    assert make_policy("dropmatch", {"p": 0.5, "paths": 16, "criterion": "naive"}).verify(far).accepted == 0


# ----------------------------------------------------------------------------- FLy
HIGH = torch.full((12,), 1.0)  # entropy above any gate used below


@pytest.mark.parametrize(
    "accept, window, expected_flips",
    [
        ([F, T, T, T, T, T, T, T], 6, [0]),  # mismatch + 5 matches, block long enough
        ([T, F, T, T, T, T, T, T], 6, [1]),  # i + W = 7 < 8
        ([T, T, F, T, T, T, T, T], 6, []),  # i + W = 8, not < K: runs past the block end
        ([F, T, T, T, T, F, T, T], 6, []),  # a second mismatch inside the window blocks the first
        ([F, T, T, F, T, T, T, T, T, T, T, T], 3, [0, 3]),  # far-apart mismatches each flip
        ([F, T, T, T], 6, []),  # window longer than the block
        ([T, T, T, T], 2, []),  # nothing to flip
        ([F, F, T, T, T], 1, [0, 1]),  # W = 1: no later matches needed, last position excluded
    ],
)
def test_fly_window_table(accept, window, expected_flips):
    flips = fly_flips(torch.tensor(accept), HIGH[: len(accept)], theta=0.3, window=window)
    assert flips.nonzero().flatten().tolist() == expected_flips


def test_fly_entropy_gate():
    accept = torch.tensor([F, T, T, T, T, T, T, T])
    low = torch.tensor([0.1] + [1.0] * 7)
    assert not fly_flips(accept, low, theta=0.3, window=6).any()
    sharp = torch.tensor([[20.0, 0.0, 0.0, 0.0]])
    flat = torch.tensor([[1.0, 1.0, 1.0, -30.0]])
    assert topk_entropy(sharp).item() < 0.01
    assert topk_entropy(flat).item() == pytest.approx(torch.log(torch.tensor(3.0)).item(), rel=1e-4)


def fly_block(k=8, mismatch_at=(0,), uncertain=True):
    """A greedy round whose drafts match the argmax except at ``mismatch_at``."""
    logits = torch.zeros(k + 1, 5)
    drafts = []
    for i in range(k + 1):
        top = i % 4
        logits[i, top] = 2.0 if uncertain else 20.0
        logits[i, (top + 1) % 4] = 1.9 if uncertain else 0.0
        drafts.append((top + 1) % 4 if i in mismatch_at else top)
    return Round(logits, torch.tensor(drafts[:k]), None, SamplingParams(), None)


def test_fly_policy_flips_and_counts():
    v = make_policy("fly").verify(fly_block(8, (0,)))
    assert (v.accepted, v.token, v.relaxed) == (8, 0, {"fly": 1})  # all 8 kept, bonus = argmax of row 8
    assert make_policy("fly").verify(fly_block(8, (3,), uncertain=False)).accepted == 3  # no flip
    assert make_policy("fly").verify(fly_block(8, (0,), uncertain=False)).accepted == 0  # gate closed
    assert make_policy("fly", {"theta": 1.2}).verify(fly_block(8, (0,))).accepted == 0  # theta past max: lossless
    assert make_policy("fly", {"window": 9}).verify(fly_block(8, (0,))).accepted == 0  # window past block: lossless


def test_fly_plus_mars_counts_mars_acceptances_in_the_window():
    rnd = fly_block(10, (0, 2))  # mismatch at 2 is a top-2 within MARS's margin (2.0 vs 1.9)
    assert make_policy("fly").verify(rnd).accepted == 0  # the second mismatch blocks the first's window
    v = make_policy("fly+mars", {"mars_theta": 0.9}).verify(rnd)
    assert v.accepted == 10 and v.relaxed == {"mars": 2, "fly": 0}  # MARS takes both mismatches itself


# ----------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(
    "name, params, message",
    [
        ("bogus", {}, "unknown policy 'bogus'"),
        ("mars+bogus", {}, "'bogus' is not a rule"),
        ("mars+mars", {}, "names a rule twice"),
        ("lossless+mars", {}, "'lossless' is not a rule"),
        ("mars", {"theta": 1.5}, r"mars theta must be a number in \[0.0, 1.0\]"),
        ("mars", {"theta": "high"}, "must be a number"),
        ("mars", {"window": 3}, "has no parameter 'window'"),
        ("fly+mars", {"theta": 0.5}, "ambiguous"),
        ("fly", {"window": 0}, "integer in"),
        ("fly", {"theta": -1}, "fly theta must be a number >= 0.0"),
        ("dropmatch", {"p": 1.0}, r"dropmatch p must be a number in \[0.0, 1.0\)"),
        ("dropmatch", {"paths": 0}, "integer in"),
        ("dropmatch", {"criterion": "vote"}, "must be one of naive, js, majority, paper"),
        ("typical", {"epsilon": 2}, "typical epsilon"),
        ("lossless", {"theta": 0.9}, "takes no parameters"),
        ("ar", {"k": 1}, "takes no parameters"),
    ],
)
def test_bad_policies_and_parameters(name, params, message):
    with pytest.raises(SpecdecError, match=message):
        make_policy(name, params)


def test_parameters_prefixed_or_plain_and_recorded():
    p = make_policy("fly+mars", {"mars_theta": 0.8, "window": 4})
    schedule = {"exact_prefix": 2, "relax_ramp": 0}  # every loose policy's, never prefixed
    assert p.params == {"mars_theta": 0.8, "fly_theta": 0.3, "fly_window": 4, **schedule}
    assert p.lossy and not Lossless().lossy
    assert make_policy("mars+fly", {}).params == make_policy("fly+mars", {}).params
    assert make_policy("dropmatch").params == {"dropmatch_paths": 5, "dropmatch_p": 0.1, "dropmatch_criterion": "paper",
                                               **schedule}
    assert make_policy("fly+mars", {"exact_prefix": 0}).params["exact_prefix"] == 0
