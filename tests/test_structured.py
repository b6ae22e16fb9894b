"""Structured output (specdec.core.constrain): every rule, drafter and backend respects the grammar.

Greedy constrained lossless speculation equals constrained plain decoding token for token; no loose
rule ever commits a token the grammar forbids, even from drafts that ignore it; at T>0 lossless
speculation samples the target's law restricted to the grammar (seeded chi-square); bad input is a
one-line error before any work."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("llguidance")

from specdec.frontends.api import Pair, make_config  # noqa: E402
from specdec.core.constrain import Constraint, Constraints, constraint_from, make_guide  # noqa: E402
from specdec.core.drafters import DRAFTERS, Draft, Drafter, ModelDrafter  # noqa: E402
from specdec.core.drafters.tree import TreeDrafter  # noqa: E402
from specdec.core.engine import DecodeConfig, Engine  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.models.backends.transformers.model import HFModel as CausalLM  # noqa: E402
from specdec.core.sampling import SamplingParams, probabilities  # noqa: E402
from tinymodels import byte_tokenizer, chisquare_joint, joint3, memo_lm, perturbed_copy, tiny_model  # noqa: E402

EOS = 258  # the byte tokenizer's <|im_end|>
REGEX = r"[a-c]{2,5}(-[0-9]{1,2}){1,3}"
SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["ab", "cd"]}},
    "required": ["id", "tag"], "additionalProperties": False,
    "x-guidance": {"whitespace_flexible": False},
}
PROMPTS = ["def hello():", "abc-12 abc-3", "The quick brown fox", '{"id": 5, "tag": "cd"}']
TOK = byte_tokenizer()


def constraint(kind: str) -> Constraint:
    return constraint_from(regex=REGEX) if kind == "regex" else constraint_from(json_schema=SCHEMA)


def complete_text_ok(kind: str, text: str) -> bool:
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    value = json.loads(text)
    return set(value) == {"id", "tag"} and 0 <= value["id"] <= 99 and value["tag"] in ("ab", "cd")


def check_output(engine: Engine, cfg: DecodeConfig, ids: list[int], finish: str) -> None:
    """Every generated token is one the grammar allows; a text that ended (EOS) is complete."""
    guide = engine.constraints.guide(cfg.constraint)
    assert guide.valid_prefix(ids) == len(ids), (ids, TOK.decode(ids))
    if finish == "stop":
        assert ids[-1] == EOS
        kind = "regex" if cfg.constraint.kind == "regex" else "json"
        assert complete_text_ok(kind, TOK.decode(ids[:-1])), TOK.decode(ids[:-1])


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(5, layers=1, hidden=32, initializer_range=0.2)
    draft = perturbed_copy(target, 0.3, 6)
    return Pair(CausalLM(target), TOK, CausalLM(draft))


# --------------------------------------------------------------------------- the guide


def test_guide_masks_follow_the_tokens_and_roll_back():
    guide = make_guide(TOK, constraint_from(regex="ab+c"), 259, [EOS])
    first = guide.mask()
    assert first.nonzero().flatten().tolist() == [97]  # 'a' only: no EOS before the text can end
    rows = guide.masks([97, 98, 98, 120, 99])  # 'x' is refused: the rows after it are unreachable
    assert rows.shape == (6, 259) and rows[4:].all()
    assert rows[1].nonzero().flatten().tolist() == [98] and rows[2].nonzero().flatten().tolist() == [98, 99]
    assert guide.consumed == 0 and torch.equal(guide.mask(), first)  # left as it was
    assert guide.valid_prefix([97, 98, 120]) == 2
    assert guide.valid_prefix([97, 98, 99, EOS]) == 4 and guide.valid_prefix([97, EOS]) == 1
    masked = guide.restrict(torch.zeros(3, 259), [97, 98])
    assert masked[0, 97] == 0 and masked[0, 98] == float("-inf") and masked[2, 99] == 0
    guide.advance([97, 98, 99])
    assert guide.done and guide.mask().nonzero().flatten().tolist() == [EOS]  # complete: EOS only
    guide.rollback(1)
    assert not guide.done and guide.consumed == 2
    wide = guide.mask(300)  # rows past the tokenizer's table are never allowed
    assert wide.shape == (300,) and not wide[259:].any()


def test_tree_masks_follow_each_path_and_prune_refused_branches():
    guide = make_guide(TOK, constraint_from(regex="ab+c"), 259, [EOS])
    a, b, c, x = 97, 98, 99, 120
    # node 0 'a'; node 1 'x' (refused: pruned); node 2 'b' under 'a'; node 3 'c' under "ab";
    # node 4 'b' under "ab"; node 5 'c' under the pruned 'x' (unreachable); node 6 EOS under "abc"
    tokens, parents = [a, x, b, c, b, c, EOS], [-1, -1, 0, 2, 2, 1, 3]
    rows = guide.tree_masks(tokens, parents)
    allowed = [r.nonzero().flatten().tolist() for r in rows]
    assert allowed[0] == [a] and allowed[1] == [b] and allowed[3] == [b, c] and allowed[5] == [b, c]
    assert allowed[4] == [EOS]  # "abc" is complete
    assert rows[2].all() and rows[6].all() and rows[7].all()  # pruned, unreachable, after EOS
    assert guide.consumed == 0 and allowed[0] == guide.mask().nonzero().flatten().tolist()
    masked = guide.restrict_tree(torch.zeros(8, 259), tokens, parents)
    assert masked[1, b] == 0 and masked[1, c] == float("-inf") and masked[4, c] == float("-inf")
    assert guide.seconds > 0


def test_grammar_work_is_in_the_stats(pair):
    free = pair.generate(PROMPTS[0], chat=False, k=3, max_new_tokens=10)
    assert free.stats.mask_seconds == 0 and free.stats.draft_mask_seconds == 0
    out = pair.generate(PROMPTS[0], chat=False, k=3, max_new_tokens=20, regex=REGEX)
    assert 0 < out.stats.mask_seconds < out.stats.total_seconds and out.stats.draft_mask_seconds > 0
    assert {"mask_seconds", "draft_mask_seconds"} <= set(out.stats.to_dict())


# --------------------------------------------------------------------------- exactness at T=0


@pytest.mark.parametrize("kind", ["regex", "json"])
@pytest.mark.parametrize("drafter", ["model", "pld", "model+pld", "tree"])
def test_greedy_constrained_lossless_equals_constrained_ar(pair, kind, drafter):
    keywords = {"regex": REGEX} if kind == "regex" else {"json_schema": SCHEMA}
    accepted = 0
    for prompt in PROMPTS:
        ar = pair.generate(prompt, chat=False, policy="ar", max_new_tokens=40, **keywords)
        cfg = make_config(policy="ar", max_new_tokens=40, **keywords)
        check_output(pair.engine, cfg, ar.token_ids, ar.finish_reason)
        for policy, k in (("lossless", 1), ("lossless", 3), ("lossless", 6), ("block", 4)):
            if policy == "block" and drafter == "tree":
                continue  # block verification verifies chains only
            out = pair.generate(prompt, chat=False, policy=policy, drafter=drafter, k=k, max_new_tokens=40,
                                **keywords)
            assert out.token_ids == ar.token_ids, (prompt, policy, k)
            assert out.finish_reason == ar.finish_reason
            accepted += out.stats.accepted
    assert accepted > 0  # real acceptances were compared


def test_unconstrained_outputs_differ_and_choice_api(pair):
    """The grammar really acts (the unconstrained text is not in it); choice, response_format and
    stream go through the same path."""
    free = pair.generate(PROMPTS[0], chat=False, policy="ar", max_new_tokens=20)
    assert re.fullmatch(REGEX, free.text) is None
    out = pair.generate(PROMPTS[0], chat=False, choice=["yes", "no", "maybe"], k=3, max_new_tokens=10)
    assert out.finish_reason == "stop" and out.text in ("yes", "no", "maybe")
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    js = pair.generate(PROMPTS[1], chat=False, response_format=rf, k=4, max_new_tokens=40)
    assert js.token_ids == pair.generate(PROMPTS[1], chat=False, json_schema=SCHEMA, policy="ar",
                                         max_new_tokens=40).token_ids
    stream = pair.stream(PROMPTS[2], chat=False, regex=REGEX, k=4, max_new_tokens=30)
    assert "".join(stream) == stream.output.text
    obj = pair.generate(PROMPTS[3], chat=False, response_format={"type": "json_object"}, k=3, max_new_tokens=12)
    guide = make_guide(TOK, Constraint("json_object"), 259, [EOS])
    assert guide.valid_prefix(obj.token_ids) == len(obj.token_ids)


# --------------------------------------------------------------------------- loose rules never leave the grammar


class GrammarBlind:
    """A drafter that never sees the grammar (the engine's ``guide`` is dropped)."""

    @property
    def guide(self):
        return None

    @guide.setter
    def guide(self, value):
        pass


class Blind(GrammarBlind, ModelDrafter):
    """The draft model ignoring the grammar: most of its drafts are refused."""

    name = "blind"


class BlindTree(GrammarBlind, TreeDrafter):
    """The tree drafter ignoring the grammar: the target's tree masks alone keep the text in it."""

    name = "blindtree"


@dataclasses.dataclass(frozen=True)
class NoiseOptions:
    pass


class Noise(Drafter):
    """Random tokens from the grammars' alphabet and a few others, end-of-sequence included."""

    name = "noise"
    requires_model = False
    Options = NoiseOptions

    def __init__(self, lm=None, stop_ids=frozenset()):
        self.gen = torch.Generator().manual_seed(0)

    @classmethod
    def build(cls, lm, stop_ids, **options):
        return cls()

    def start(self, prompt):
        pass

    def propose(self, context, k, params, generator):
        alphabet = list(b'abcd-0123456789{}":,idtag ') + [EOS, 200]
        picks = torch.randint(len(alphabet), (k,), generator=self.gen).tolist()
        return Draft([alphabet[i] for i in picks])

    def commit(self, context, drafted, accepted):
        pass


LOOSE = {
    "mars": {"mars_theta": 0.3},
    "typical": {"typical_epsilon": 0.5, "typical_delta": 1.0},
    "dropmatch": {"dropmatch_p": 0.5, "dropmatch_paths": 8, "dropmatch_criterion": "naive"},
    "fuzzy": {"fuzzy_divergence": "tv", "fuzzy_threshold": 1.0},  # any draft the target's row allows
    "fly": {"fly_theta": 0.0, "fly_window": 2},
    "fly+mars": {"fly_theta": 0.0, "fly_window": 2, "mars_theta": 0.3},
}


@pytest.fixture
def extra_drafters(monkeypatch):
    monkeypatch.setitem(DRAFTERS, "blind", Blind)
    monkeypatch.setitem(DRAFTERS, "noise", Noise)
    monkeypatch.setitem(DRAFTERS, "blindtree", BlindTree)


@pytest.mark.parametrize("policy", list(LOOSE))
def test_no_loose_rule_commits_a_token_outside_the_grammar(pair, extra_drafters, policy):
    relaxed = 0
    gen = torch.Generator().manual_seed(1)
    for trial in range(12):
        kind = ("regex", "json")[trial % 2]
        drafter = ("blind", "noise", "model")[trial % 3]
        prompt = torch.randint(32, 127, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen).tolist()
        temperature = (0.0, 0.8)[(trial // 2) % 2]
        cfg = make_config(policy=policy, drafter=drafter, k=4, max_new_tokens=30, temperature=temperature,
                          seed=trial, **LOOSE[policy], **({"regex": REGEX} if kind == "regex" else {"json_schema": SCHEMA}))
        out = pair.engine.generate(prompt, cfg)
        check_output(pair.engine, cfg, out.token_ids, out.finish_reason)
        relaxed += sum(out.stats.relaxed.values())
    assert relaxed > 0  # the rules really relaxed, inside the grammar


@pytest.mark.parametrize("policy", ["lossless", *LOOSE])
def test_token_trees_stay_inside_the_grammar(pair, extra_drafters, policy):
    """Trees grown with the grammar (``tree``) and without it (``blindtree``: only the target's
    node-by-node masks stand between a refused branch and the output), at T=0 and T>0."""
    gen, kept = torch.Generator().manual_seed(2), 0
    for trial in range(8):
        kind, drafter = ("regex", "json")[trial % 2], ("tree", "blindtree")[(trial // 2) % 2]
        prompt = torch.randint(32, 127, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen).tolist()
        params = dict(LOOSE.get(policy, {}), tree_nodes=6, tree_width=2)
        cfg = make_config(policy=policy, drafter=drafter, k=3, max_new_tokens=30, temperature=(0.0, 0.8)[trial // 4],
                          seed=trial, **params, **({"regex": REGEX} if kind == "regex" else {"json_schema": SCHEMA}))
        out = pair.engine.generate(prompt, cfg)
        check_output(pair.engine, cfg, out.token_ids, out.finish_reason)
        kept += out.stats.accepted
    assert kept > 0  # tree nodes were really kept


# --------------------------------------------------------------------------- T>0: the masked target's law

CHI_REGEX = r"(a[bc]|b[ab]|c[ac])[abc]"
LETTERS = [97, 98, 99]
FOLLOW = {97: [98, 99], 98: [97, 98], 99: [97, 99]}  # the regex's second letter after each first one


def masked_joint(target, prompt: list[int], params) -> torch.Tensor:
    """``[3, 3, 3]``: the target's law of three letters restricted to CHI_REGEX, by hand."""
    def dist(context, allowed):
        target.reset()
        logits = target.forward(context)[0]
        keep = torch.full_like(logits, float("-inf"))
        keep[allowed] = 0.0
        return probabilities((logits + keep)[None], params)[0][LETTERS]

    p1 = dist(prompt, LETTERS)
    p2 = torch.stack([dist(prompt + [a], FOLLOW[a]) for a in LETTERS])
    p3 = torch.stack([torch.stack([dist(prompt + [a, b], LETTERS) for b in LETTERS]) for a in LETTERS])
    return joint3(p1, p2, p3)


@pytest.mark.slow
@pytest.mark.parametrize("policy,drafter", [("lossless", "model"), ("lossless", "blind"), ("block", "model"),
                                            ("lossless", "model+pld"), ("lossless", "tree"), ("lossless", "blindtree")])
def test_lossless_sampling_follows_the_masked_target_law(extra_drafters, policy, drafter):
    kw = dict(layers=1, hidden=16, initializer_range=0.2)
    target, draft = (memo_lm(CausalLM(tiny_model(seed, **kw))) for seed in (21, 22))  # logits once per context
    engine = Engine(target, draft, eos_ids=[EOS], constraints=Constraints(TOK, target.vocab_limit, [EOS]))
    params = SamplingParams(temperature=0.9, top_p=0.95)
    prompt = list(b"abcab ca")
    n, counts, accepted, grammar = 4000, torch.zeros(3, 3, 3), 0, Constraint("regex", CHI_REGEX)
    for seed in range(n):
        cfg = DecodeConfig(policy=policy, drafter=drafter, k=2, max_new_tokens=3,
                           sampling=dataclasses.replace(params, seed=seed), constraint=grammar)
        out = engine.generate(prompt, cfg)
        counts[tuple(LETTERS.index(t) for t in out.token_ids)] += 1
        accepted += out.stats.accepted
    rate = accepted / (2 * n)
    assert rate < 0.95 and (rate > 0.1 or drafter.startswith("blind"))  # rejections and residual draws happened
    pvalue, outside = chisquare_joint(counts, masked_joint(target, prompt, params))
    assert pvalue > 1e-3 and outside == 0


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, message", [
    ({"regex": "(ab"}, "invalid regex"),
    ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
    ({"json_schema": {"type": "nonsense"}}, "invalid JSON schema"),
    ({"json_schema": [1, 2]}, "must be a JSON object"),
    ({"choice": []}, "empty list"),
    ({"choice": "yes"}, "must be a list of strings"),
    ({"choice": ["a", ""]}, "non-empty string"),
    ({"grammar": "start: (("}, "invalid Lark grammar"),
    ({"regex": "a", "choice": ["b"]}, "at most one"),
    ({"response_format": {"type": "xml"}}, "response_format type must be"),
    ({"response_format": {"type": "json_schema"}}, "needs"),
    ({"regex": "a" * 300_000}, "more than the"),
])
def test_bad_constraints_are_one_line_errors(kwargs, message):
    with pytest.raises(SpecdecError) as err:
        make_config(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_refused_before_any_work(pair, monkeypatch):
    calls = pair.target.forward_calls
    with pytest.raises(SpecdecError, match="admits no token") as err:
        pair.generate("abc", chat=False, regex="()")  # only the empty text
    assert "\n" not in str(err.value)
    with pytest.raises(SpecdecError, match="needs the tokenizer"):
        Engine(pair.target, eos_ids=[EOS]).generate([1, 2], make_config(policy="ar", regex="a+"))
    with pytest.raises(SpecdecError, match="end-of-sequence"):
        Engine(pair.target, constraints=Constraints(TOK, pair.target.vocab_limit, [])).generate([1, 2], make_config(policy="ar", regex="a+"))
    import specdec.core.constrain as constrain

    monkeypatch.setitem(constrain.LIMITS, "max_grammar_size", 5)
    with pytest.raises(SpecdecError) as err:
        make_config(json_schema={"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(30)}})
    assert "\n" not in str(err.value)
    assert pair.target.forward_calls == calls


def test_missing_dependency_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(SpecdecError, match=r"pip install 'specdec-rules\[structured\]'"):
        make_config(regex="a+")
    assert make_config(policy="ar").constraint is None  # unconstrained requests never ask for it


def test_generate_cli_flags(tiny_dirs, tmp_path):
    target, draft = tiny_dirs
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps(SCHEMA))
    base = [sys.executable, "-m", "specdec", "generate", "abc", "--target", str(target), "--draft", str(draft),
            "--dtype", "float32", "--no-calibrate", "--no-chat", "--json", "--max-new-tokens", "40"]
    res = subprocess.run(base + ["--json-schema", str(schema)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    if out["finish_reason"] == "stop":
        assert complete_text_ok("json", out["text"])
    bad = subprocess.run(base + ["--choice", ","], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "empty list" in bad.stderr and "Traceback" not in bad.stderr


# --------------------------------------------------------------------------- llama.cpp


@pytest.mark.parametrize("exact", [False, True])  # exact: width-invariant passes (llamacpp/exact.py)
def test_llama_cpp_backend_respects_the_grammar(tmp_path, exact):
    pytest.importorskip("llama_cpp")
    from specdec.models.backends.llamacpp.model import LlamaCppModel
    from tinymodels import save_tiny_gguf

    kw = dict(layers=1, hidden=16, initializer_range=0.2)
    paths = (save_tiny_gguf(tiny_model(21, **kw), TOK, tmp_path / "t.gguf"),
             save_tiny_gguf(tiny_model(22, **kw), TOK, tmp_path / "d.gguf"))
    target, draft = (LlamaCppModel(p, f"tiny-{i}", n_ctx=256, threads=1, exact=exact and i == 0)
                     for i, p in enumerate(paths))
    engine = Engine(target, draft, eos_ids=[EOS], constraints=Constraints(TOK, target.vocab_limit, [EOS]))
    for kind in ("regex", "json"):
        ar_cfg = DecodeConfig(policy="ar", max_new_tokens=30, constraint=constraint(kind))
        ar = engine.generate(list(b"hello"), ar_cfg)
        check_output(engine, ar_cfg, ar.token_ids, ar.finish_reason)
        for drafter in ("model", "pld", "model+pld", "tree"):
            cfg = DecodeConfig(policy="lossless", drafter=drafter, k=3, max_new_tokens=30, constraint=constraint(kind))
            assert engine.generate(list(b"hello"), cfg).token_ids == ar.token_ids
        loose = DecodeConfig(policy="mars", drafter="model", k=3, max_new_tokens=30, constraint=constraint(kind),
                             policy_params={"theta": 0.3}, sampling=SamplingParams(temperature=0.8, seed=1))
        out = engine.generate(list(b"hello"), loose)
        check_output(engine, loose, out.token_ids, out.finish_reason)
