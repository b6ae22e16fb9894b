"""The written contracts hold: a new window-style rule is one class registered in ``RULES``, a new
drafter one :class:`Drafter` subclass registered in ``DRAFTERS``; the engine, k=auto, bench and the
vLLM adapter read only what those declare."""

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from specdec.core.autok import KPolicy
import torch

import specdec
from specdec.bench.running import configs as cfgs
from specdec.checks import option
from specdec.models.costmodel import CostTable
from specdec.core.drafters import DRAFTERS, Draft, Drafter, drafter_class
from specdec.core.engine import DecodeConfig, Engine
from specdec.errors import SpecdecError
from specdec.models.backends.transformers.model import HFModel as CausalLM
from tinymodels import perturbed_copy, tiny_model
from specdec.core.verify import RULES, make_policy
from specdec.core.verify.tree import TreeRound

SRC = Path(specdec.__file__).parent


@dataclasses.dataclass(frozen=True)
class Echo:
    """A toy window rule, as a newcomer would write it in core/verify/echo.py: a mismatch flips when the
    next ``span`` drafts were all accepted."""

    span: int = option(2, lo=1, hi=64, help="drafts after a mismatch that must have been accepted")
    tune_grid = {"span": (2, 3)}
    name = "echo"
    kind = "window"
    needs_hidden = False
    lookahead_remedy = "or a smaller echo span"

    @property
    def lookahead(self) -> int:
        return self.span

    @property
    def lookahead_label(self) -> str:
        return f"echo's span ({self.span})"

    def flips(self, rnd, accept: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(accept)
        for i in range(accept.shape[0] - self.span):
            if not accept[i] and bool(accept[i + 1 : i + 1 + self.span].all()):
                out[i] = True
        return out


@dataclasses.dataclass(frozen=True)
class RepeatOptions:
    times: int = option(1, lo=1, help="repeat: how often each proposal repeats the last token")


class Repeat(Drafter):
    """A toy drafter without a model: proposes the last committed token again."""

    name = "repeat"
    requires_model = False
    Options = RepeatOptions

    def __init__(self, lm=None, stop_ids=frozenset(), times: int = 1):
        self.times = times

    def start(self, prompt):
        pass

    def propose(self, context, k, params, generator):
        return Draft([int(context[-1])] * k)

    def commit(self, context, drafted, accepted):
        pass


@pytest.fixture
def echo(monkeypatch):
    monkeypatch.setitem(RULES, "echo", Echo)


@pytest.fixture
def repeat(monkeypatch):
    monkeypatch.setitem(DRAFTERS, "repeat", Repeat)


def test_a_window_rule_is_one_registered_class(echo):
    policy = make_policy("echo+mars", {"span": 3})
    assert policy.lookahead == 3 and policy.lossy and policy.verifies_trees
    with pytest.raises(SpecdecError, match=r"echo's span \(2\) acts only on draft blocks longer than it, so k=2 "
                                           r".*use k >= 3, k='auto', or a smaller echo span"):
        DecodeConfig(policy="echo", k=2)
    with pytest.raises(SpecdecError, match="at most one"):
        make_policy("echo+fly")
    # a chain: the mismatch at 0 flips since drafts 1-2 were accepted (the target agrees there)
    logits = torch.full((5, 6), -5.0)
    for row, best in enumerate([1, 2, 3, 4, 5]):
        logits[row, best] = 5.0
    drafts = torch.tensor([0, 2, 3, 4])  # 0 is a mismatch, then 2, 3, 4 match
    from specdec.core.sampling import SamplingParams
    from specdec.core.verify import Round

    verdict = make_policy("echo").verify(Round(logits, drafts, None, SamplingParams(), None))
    assert verdict.accepted == 4 and verdict.relaxed == {"echo": 1}
    # a tree whose first-child chain is the same block: the rule runs along it, unchanged
    rnd = TreeRound(target_logits=logits, tokens=drafts, parents=[-1, 0, 1, 2], params=SamplingParams(),
                    generator=None)
    assert make_policy("echo").verify_tree(rnd).path == (0, 1, 2, 3)


def test_the_engine_and_k_auto_read_the_declared_lookahead(echo):
    t = tiny_model(31)
    engine = Engine(CausalLM(t), CausalLM(perturbed_copy(t, 0.2, 32)), eos_ids=[258])
    widths = [1, 2, 4, 8, 16, 32]
    engine.target_costs = CostTable("t|x", "float32", widths, [0.01] * 6, 32)
    engine.draft_costs = CostTable("d|x", "float32", widths, [0.001] * 6, 32)
    out = engine.generate(list(range(40, 60)), DecodeConfig(policy="echo", policy_params={"span": 3}, drafter="model",
                                                            max_new_tokens=40))
    (control,) = engine.caches.controllers.values()
    assert control.window == 3 and control.k_max >= 4 and out.finish_reason in ("length", "stop")
    engine.generate(list(range(40, 60)), DecodeConfig(policy="echo", policy_params={"span": 3}, max_new_tokens=40))
    portfolio = next(c for c in engine.caches.controllers.values() if c is not control)
    assert portfolio.model.window == 3 and portfolio.window == 3  # the portfolio's model and copies alike
    plain = engine.generate(list(range(40, 60)), DecodeConfig(policy="ar", max_new_tokens=40))
    fixed = engine.generate(list(range(40, 60)), DecodeConfig(policy="lossless", k=4, max_new_tokens=40))
    assert fixed.token_ids == plain.token_ids  # the other policies are untouched by the new rule


def test_a_drafter_is_one_registered_class(repeat):
    assert issubclass(drafter_class("repeat"), Drafter)
    t = tiny_model(33)
    engine = Engine(CausalLM(t), None, eos_ids=[258])  # no draft model: the class says it needs none
    prompt = [65, 66, 66, 66, 66, 67]
    plain = engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=20))
    out = engine.generate(prompt, DecodeConfig(policy="lossless", drafter="repeat", k=3, max_new_tokens=20,
                                               drafter_params={"times": 2}))
    assert out.token_ids == plain.token_ids and out.stats.drafted > 0
    with pytest.raises(SpecdecError, match="drafter 'repeat' times must be"):
        DecodeConfig(drafter="repeat", drafter_params={"times": 0})
    # bench asks the class whether a draft model must load, never the name
    assert not cfgs.needs_draft_model(cfgs.Config("lossless", "repeat", 3, {}))
    assert cfgs.needs_draft_model(cfgs.Config("lossless", "tree", 3, {}))


def test_every_registered_drafter_declares_the_contract():
    for name, cls in DRAFTERS.items():
        assert issubclass(cls, Drafter) and cls.name == name
        assert isinstance(cls.requires_model, bool) and isinstance(cls.grows_trees, bool)
        assert dataclasses.is_dataclass(cls.Options)
        if cls.grows_trees:
            assert cls.depth_limit() >= 1
            target, draft = cls.tree_paths(cls.depth_limit())
            assert target >= 1 and draft >= 0 and (draft > 0) == cls.requires_model
        else:
            with pytest.raises(NotImplementedError):
                cls.depth_limit()


def test_requiring_a_draft_model_and_drafting_with_it_are_two_declarations():
    """``requires_model``: cannot draft without a draft model (the engine refuses the request);
    ``drafts_with_model``: its drafts come from the model whenever one is loaded. Every drafter that
    requires one drafts with it; the portfolio drafts with it without requiring it. Before, the two
    were ``needs_model`` and ``uses_model``, which read as one thing; a drafter declaring either old
    name is refused when its class is made."""
    for cls in DRAFTERS.values():
        assert isinstance(cls.drafts_with_model, bool)
        assert cls.drafts_with_model or not cls.requires_model, cls.name
    assert DRAFTERS["auto"].drafts_with_model and not DRAFTERS["auto"].requires_model
    assert [n for n, c in DRAFTERS.items() if c.drafts_with_model and not c.requires_model] == ["auto"]
    for old, new in (("needs_model", "requires_model"), ("uses_model", "drafts_with_model")):
        with pytest.raises(TypeError, match=f"Old.{old} is now called {new}"):
            type("Old", (Drafter,), {old: True})


def _identifiers(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.arg)):
            out.add(getattr(node, "name", None) or node.arg)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name)
    return out


def test_no_code_outside_verify_names_a_rule_or_probes_a_capability():
    """Outside verify/ no identifier names FLy (or any rule): window-style acceptance is the
    policy's declared ``lookahead``; the engine reads declared attributes, never ``getattr``."""
    rules = {"fly", "mars", "dropmatch", "typical"}
    bad = []
    for path in SRC.rglob("*.py"):
        if "verify" in path.relative_to(SRC).parts:
            continue
        for ident in _identifiers(path):
            if any(rule in ident.lower().split("_") or ident.lower() == rule for rule in rules):
                bad.append(f"{path.relative_to(SRC)}: {ident}")
    assert not bad, bad
    engine = (SRC / "core" / "engine.py").read_text()
    assert "getattr(" not in engine and '"pld"' not in engine
    assert "policy is None" not in engine  # plain decoding is a policy too (verify.Plain)


def test_plain_decoding_and_trees_are_declared_not_named():
    """Plain decoding is the policy that declares it drafts nothing (``Policy.drafts``): no code
    outside verify/ and bench/ compares a policy with the name ``ar``; the engine never asks whether
    a draft is a tree (the draft's own type knows)."""
    import re

    compares = re.compile(r"""[=!]=\s*["']ar["']|["']ar["']\s*[=!]=|in\s*\([^)]*["']ar["']""")
    bad = [f"{path.relative_to(SRC)}:{i}" for path in SRC.rglob("*.py")
           if not {"verify", "bench"} & set(path.relative_to(SRC).parts)
           for i, line in enumerate(path.read_text().splitlines(), 1) if compares.search(line)]
    assert not bad, bad
    engine = (SRC / "core" / "engine.py").read_text()
    assert "is_tree" not in engine and "parents" not in engine and "TreeRound" not in engine


class Recording(KPolicy):
    """A K policy that keeps every record it is handed (and drafts a fixed ``k``)."""

    def __init__(self, k: int):
        from specdec.core.autok import Fixed

        self.fixed, self.records, self.declined = Fixed(k), [], 0

    def begin(self, max_new_tokens, prompt_tokens=0, draft_context=None):
        pass

    def budget(self, t, room, backlog):
        return self.fixed.budget(t, room, backlog)

    def observe(self, record):
        self.records.append(record)

    def end(self, tokens, cut=False):
        pass


@pytest.mark.parametrize("drafter,k", [("model", "auto"), ("pld", 3), ("tree", 3)])
def test_a_round_leaves_one_record_and_the_stats_are_its_sums(drafter, k):
    t = tiny_model(41)
    engine = Engine(CausalLM(t), CausalLM(perturbed_copy(t, 0.2, 42)), eos_ids=[258])
    widths = [1, 2, 4, 8, 16, 32]
    engine.target_costs = CostTable("t|x", "float32", widths, [0.01 * w for w in widths], 32)
    policy = Recording(4)
    engine.k_policy = lambda cfg: policy
    prompt = [65, 66, 67, 65, 66, 67, 65, 66]
    s = engine.generate(prompt, DecodeConfig(drafter=drafter, k=k, max_new_tokens=30)).stats
    records = policy.records
    assert len(records) == s.rounds > 1 and max(r.budget for r in records) == 4
    assert sum(r.drafted for r in records) == s.drafted and sum(r.accepted for r in records) == s.accepted
    assert [r.accepted for r in records] == s.accepted_per_round and [r.end for r in records] == s.round_ends
    assert records[-1].tokens == s.new_tokens and records[-1].end == s.total_seconds
    assert s.k_chosen == ([r.k_chosen for r in records] if k == "auto" else [])
    assert [r.depth for r in records if r.depth is not None] == s.tree_depths
    assert bool(s.tree_depths) == (drafter == "tree")
    for name in ("draft_seconds", "verify_seconds", "rule_seconds", "predicted_verify_seconds"):
        assert getattr(s, name) == pytest.approx(sum(getattr(r, name) for r in records)), name
    assert s.predicted_verify_seconds == pytest.approx(sum(0.01 * (r.drafted + 1) for r in records))
    assert s.drafts and not engine.generate(prompt, DecodeConfig(policy="ar", max_new_tokens=5)).stats.drafts


def test_engine_steps_are_short():
    """``Engine.run`` reads as its numbered steps: no function in the engine over 40 lines."""
    tree = ast.parse((SRC / "core" / "engine.py").read_text())
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno + 1 > 40]
    assert not long, long


# ------------------------------------------------------------------------------------ backends
@pytest.fixture
def toy_backend():
    from specdec.models.backends import REGISTRY

    REGISTRY.add("toy", "toybackend:ToyBackend")  # the one registry line
    yield REGISTRY.get("toy")
    REGISTRY.remove("toy")


def test_a_backend_is_one_file_and_one_registry_line(toy_backend, tmp_path, capsys):
    """load, the engine with k=auto (the backend's measured tables), calibrate and bench run a
    backend they never name; refusals name the owner of an option and the choices."""
    from specdec.cli import main

    pair = specdec.load("toy-31", draft="toy-32", backend="toy-backend", progress=False)
    assert pair.backend == "toy" and pair.backend_why == "asked for"
    assert pair.costs.target is not None and pair.costs.target.fingerprint["backend"] == "toy"
    prompt = [65, 66, 67, 68]
    plain = pair.generate(prompt, policy="ar", max_new_tokens=12)
    auto = pair.generate(prompt, policy="lossless", k="auto", max_new_tokens=12)
    assert auto.token_ids == plain.token_ids and pair.engine.caches.controllers  # k=auto ran on the toy's tables
    with pytest.raises(SpecdecError, match=r"dtype=float32: applies to the transformers backend; toy models take"):
        specdec.load("toy-31", draft=None, backend="toy", dtype="float32", progress=False)
    with pytest.raises(SpecdecError, match="choose one of: auto, llama.cpp, transformers, toy"):
        specdec.load("toy-31", backend="toys")
    assert main(["calibrate", "--backend", "toy", "--target", "toy-31", "--draft", "toy-32"]) == 0
    out = capsys.readouterr().out
    assert "backend: toy (asked for)" in out and "target float32" in out
    run = tmp_path / "run"
    assert main(["bench", "--dataset", "fixture", "--limit", "1", "--policies", "ar,lossless", "--backend", "toy",
                 "--target", "toy-31", "--draft", "toy-32", "--max-new-tokens", "4", "--no-warmup", "--no-plots",
                 "--out", str(run), "-q"]) == 0
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert {r["config"] for r in records} >= {"ar"} and len(records) == 2
    assert json.loads((run / "run.json").read_text())["settings"]["backend"] == "toy"


def test_the_draft_s_acceptance_prior_is_measured_above_any_backend(toy_backend, monkeypatch):
    """:func:`specdec.load` measures the draft's acceptance prior on the reference text for any backend
    (here the toy's, which knows nothing of it), from above the backends: the request a backend gets
    carries plain values only (and where progress lines go), no module or function of the layers above it."""
    import inspect
    import types

    import specdec
    from specdec.models.backends import REGISTRY

    seen = []
    load = REGISTRY.load
    monkeypatch.setattr(REGISTRY, "load", lambda name, req: seen.append(req) or load(name, req))
    pair = specdec.load("toy-31", draft="toy-32", backend="toy", progress=False)
    prior = pair.costs.prior
    assert prior is not None and prior.source == "reference text" and 0.0 <= prior.mean <= 1.0
    assert specdec.load("toy-31", draft="toy-32", backend="toy", progress=False, calibrate=False).costs.prior is None
    for name, value in vars(seen[0]).items():
        if name == "log":
            continue
        assert not isinstance(value, types.ModuleType)
        assert not (inspect.isfunction(value) and value.__module__.startswith("specdec.frontends"))


def test_the_toy_model_keeps_the_model_contract():
    """The toy model, written from the Model contract alone: a context fed at once, a token at a
    time, or rolled back and fed again gives the same logits."""
    from toybackend import ToyModel

    lm = ToyModel(31, "toy-31", 259)
    context = list(b"def add(a, b):")
    whole = lm.forward(context, num_logits=len(context))
    lm.reset()
    assert torch.equal(torch.cat([lm.forward([t]) for t in context]), whole)
    lm.truncate(5)
    assert torch.equal(lm.logits_for(context, 3), whole[-3:]) and lm.tokens == context


def test_every_registered_backend_declares_the_contract():
    from specdec.models.backends import REGISTRY, Backend

    assert REGISTRY.names() == ("llama.cpp", "transformers")  # auto's order of preference
    for backend in REGISTRY:
        assert isinstance(backend, Backend) and backend.name and isinstance(backend.options, dict)
        assert backend.package is None or backend.install, backend.name
        for method in ("load", "measure"):
            assert getattr(type(backend), method) is not getattr(Backend, method), (backend.name, method)
        fp = backend.fingerprint("cpu")
        assert fp["device"] == "cpu" and fp["cpu_flags_sha"]
    from specdec.models.backends import Request

    anything = Request("no/such/model", None, torch.device("meta"), {})
    assert REGISTRY.get("transformers").auto_refusal(anything) is None  # the last one is the fallback
