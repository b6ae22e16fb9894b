"""Structure: imports go down, every rule and drafter option is declared once, optional
dependencies are checked before work, memory figures are the tensors' real bytes."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdec
from specdec.checks import options_of
from specdec.cli import build_parser
from specdec.drafters import ALL_DRAFTER_OPTIONS, DRAFTERS, check_drafter_options
from specdec.errors import SpecdecError
from specdec.verify import RULES, make_policy

SRC = Path(specdec.__file__).parent
#: a module in a layer may import its own layer and the layers below, never one above
LAYERS = [
    {"cli"},  # the command line: imports everything
    {"bench", "server", "vllm"},  # callers of the engine with their own commands; vLLM's plugin
    {"cliargs"},  # the flags the commands share
    {"api", "configfile"},  # load(), Pair, config files
]


def layer_of(module: str) -> int:
    if module in ("__init__", "__main__"):  # the package's public API and its entry point sit on top
        return -1
    top = module.split(".")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return len(LAYERS)  # the core: engine, models, verify, drafters, ...


def imports_of(path: Path) -> set[str]:
    rel = path.relative_to(SRC).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            name = ".".join([*base, *(node.module.split(".") if node.module else [])])
            if name:
                out.add(name)
            else:  # "from . import x"
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdec."):
            out.add(node.module[len("specdec."):])
    return out


def test_no_module_imports_a_module_above_it():
    bad = []
    for path in SRC.rglob("*.py"):
        mine = ".".join(path.relative_to(SRC).with_suffix("").parts)
        for imported in imports_of(path):
            if layer_of(imported) < layer_of(mine):
                bad.append(f"{mine} imports {imported}")
    assert not bad, bad


def test_rule_flags_defaults_and_ranges_come_from_one_declaration():
    parser = build_parser()
    generate = parser._subparsers._group_actions[0].choices["generate"]
    flags = {a.dest: a for a in generate._actions}
    for rule, cls in RULES.items():
        for param, (spec, default) in options_of(cls).items():
            action = flags[f"{rule}_{param}"]
            assert action.type is spec.kind and f"(default: {default})" in action.help
            assert getattr(cls(), param) == default
            assert make_policy(rule, {param: default}).params[f"{rule}_{param}"] == default
            bad = "x" if spec.kind is not str else "nonsense"
            with pytest.raises(SpecdecError, match=f"{rule} {param} must be"):
                make_policy(rule, {param: bad})
            if spec.lo is not None:
                with pytest.raises(SpecdecError, match=f"{rule} {param} must be"):
                    make_policy(rule, {param: spec.lo - 1})
    for name, cls in DRAFTERS.items():
        for option, (spec, default) in options_of(cls.Options).items():
            assert option in ALL_DRAFTER_OPTIONS and option in flags and flags[option].type is spec.kind
            assert check_drafter_options(name, {option: default}) == {option: default}


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": True}, "max_new_tokens must be an integer >= 1, got True"),
    ({"top_p": "high"}, "top_p must be a number, got 'high'"),
    ({"top_p": 1.5}, "top_p must be a number in (0, 1], got 1.5"),
    ({"top_k": 2.5}, "top_k (0 = off) must be an integer >= 0"),
    ({"temperature": float("nan")}, "temperature must be a number"),
    ({"seed": "s"}, "seed must be an integer"),
])
def test_one_validation_for_numbers(kwargs, message):
    from specdec.api import make_config

    with pytest.raises(SpecdecError) as err:
        make_config(**kwargs)
    assert message in str(err.value)


def test_config_parses_the_policy_once():
    from specdec.api import make_config

    cfg = make_config(policy="fly+mars", mars_theta=0.8, k=12)
    assert cfg.parsed.params["mars_theta"] == 0.8 and cfg.parsed.window.window == 6
    assert make_config(policy="ar").parsed is None


def test_bench_checks_optional_dependencies_before_any_work(tmp_path):
    code = ("import importlib.util, sys; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda n, *a: None if n == 'matplotlib' else real(n, *a); "
            "from specdec.cli import main; sys.exit(main(sys.argv[1:]))")
    res = subprocess.run([sys.executable, "-c", code, "bench", "--out", str(tmp_path / "o"), "--limit", "1",
                          "--target", "/no/such/model"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "needs matplotlib" in res.stderr and "pip install 'specdec[bench]'" in res.stderr
    assert not (tmp_path / "o").exists()  # failed before touching anything


def test_memory_is_the_real_bytes_of_the_tensors(tiny_dirs):
    target, draft = tiny_dirs
    pair = specdec.load(str(target), draft=str(draft), dtype="float32", draft_dtype="bfloat16", draft_quant="int8",
                        progress=False)
    model = pair.draft.model
    expected = sum(t.numel() * t.element_size() for t in {id(t): t for t in
                   [*model.parameters(), *model.buffers()]}.values())
    mem = pair.memory()
    assert mem["draft_weights"] == expected
    int8 = [m for m in model.modules() if type(m).__name__ == "Int8Linear"]
    assert int8 and all(m.weight is None for m in int8)  # one int8 copy, no dequantized twin
    assert mem["target_weights"] >= sum(p.numel() * 4 for p in torch.nn.Module.parameters(pair.target.model)) * 0.9


def test_target_without_a_draft_uses_prompt_lookup_by_default(tiny_dirs):
    pair = specdec.load(str(tiny_dirs[0]), draft=None, dtype="float32", progress=False)
    out = pair.generate("abcabcabcabc", chat=False, max_new_tokens=16)
    assert out.stats.drafter == "pld" and pair.default_drafter == "pld"


#: the only modules that import transformers: its backend, the GGUF->folder conversion, the GGUF
#: tokenizer loader of the llama.cpp backend, test helpers, and bench's transformers peers and version record
TRANSFORMERS_IMPORTERS = {"backends/hf.py", "backends/hf_weights.py", "backends/llamacpp.py", "convert.py", "testing.py", "bench/peers.py",
                          "bench/environment.py"}


def test_only_the_backends_import_transformers():
    found = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("vllm/"):
            continue  # vLLM's plugin lives in vLLM's process (its own transformers)
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "transformers" or n.startswith("transformers.") for n in names):
                found.add(rel)
    assert found <= TRANSFORMERS_IMPORTERS, sorted(found - TRANSFORMERS_IMPORTERS)


def test_the_engine_and_drafters_see_models_only_through_the_interface():
    costmodel_files = sorted(p.relative_to(SRC).as_posix() for p in (SRC / "costmodel").glob("*.py"))
    for rel in ("engine.py", "autok.py", *costmodel_files, "drafters/model.py", "drafters/mla.py", "drafters/tree.py",
                "drafters/lookup.py", "api.py"):
        imported = imports_of(SRC / rel)
        assert not any(m.startswith("backends.hf") or m.startswith("backends.llamacpp") for m in imported
                       if rel != "api.py"), rel
        assert "models" not in imported or rel == "api.py", rel


def _costmodel_names_used() -> set[str]:
    """Every name src/ and tests/ import from specdec.costmodel, or read off it as an attribute."""
    names = set()
    for path in [*SRC.rglob("*.py"), *Path(__file__).parent.glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "costmodel":
                names.update(a.name for a in node.names)
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "costmodel"):
                names.add(node.attr)
    return names


def test_costmodel_package_reexports_every_name_in_use():
    """costmodel is a package of modules by concern; every name used from it is importable from the
    package itself, and is the object its defining module holds (one definition, no copies)."""
    from specdec import costmodel

    used = _costmodel_names_used()
    assert {"CostTable", "best_k", "measure", "load_cached", "fingerprint", "choose_dtypes"} <= used
    missing = sorted(n for n in used if not hasattr(costmodel, n))
    assert not missing, missing
    modules = (costmodel.fingerprints, costmodel.table, costmodel.timing, costmodel.cache, costmodel.decide)
    for name in costmodel.__all__:
        holders = [m for m in modules if name in vars(m)]
        assert holders and all(vars(m)[name] is getattr(costmodel, name) for m in holders), name


def test_nothing_is_hung_on_objects_through_their_dict():
    """State belongs to whoever owns it (the bench keeps its extra models in a BenchModels), never
    set on another object through ``obj.__dict__``."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "__dict__":
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found


def test_tau_is_computed_in_one_place():
    """``1 + accepted / rounds`` is written once, in :func:`specdec.stats.tau_of`; everything else calls it."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Constant)
                    and node.left.value == 1 and isinstance(node.right, ast.BinOp)
                    and isinstance(node.right.op, ast.Div) and "accept" in ast.unparse(node.right.left)):
                found.append(f"{path.relative_to(SRC).as_posix()}: {ast.unparse(node)}")
    assert found == ["stats.py: 1.0 + accepted / rounds"], found
