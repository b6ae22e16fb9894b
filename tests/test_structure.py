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
from specdec.core.drafters import ALL_DRAFTER_OPTIONS, DRAFTERS, check_drafter_options
from specdec.errors import SpecdecError
from specdec.core.verify import RULES, make_policy

SRC = Path(specdec.__file__).parent
#: a module in a layer may import its own layer and the layers below, never one above
LAYERS = [
    {"cli"},  # the command line: imports everything
    {"bench", "server", "vllm"},  # callers of the engine with their own commands; vLLM's plugin
    {"cliargs"},  # the flags the commands share
    {"api", "configfile", "settings"},  # load(), Pair, config files, a request's settings layered
]


#: the folders that group specdec's modules by concern (a module's room is its name inside one)
FOLDERS = ("core", "models", "traces", "frontends")


def room_of(module: str) -> str:
    """The top-level module or package ``module`` belongs to, its folder left out: ``core.engine``
    and ``models.backends.base`` are in the rooms ``engine`` and ``backends``."""
    parts = module.split(".")
    return parts[1] if parts[0] in FOLDERS and len(parts) > 1 else parts[0]


def layer_of(module: str) -> int:
    top = room_of(module)
    if top in ("__init__", "__main__"):  # the package's public API and its entry point sit on top
        return -1
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    return len(LAYERS)  # the core: engine, models, verify, drafters, ...


def is_module(dotted: str) -> bool:
    """Whether ``dotted`` (relative to the package) names a module or a subpackage of specdec."""
    path = SRC.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def top_level(body: list) -> list:
    """The statements that run when a module is imported: its body, and the bodies of the ``if``,
    ``try``, ``with`` and ``class`` statements in it, but not of its functions."""
    out = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        out.append(node)
        for name in ("body", "orelse", "finalbody"):
            out += top_level(getattr(node, name, []))
        for handler in getattr(node, "handlers", []):
            out += top_level(handler.body)
    return out


def imports_of(path: Path, module_level: bool = False) -> set[str]:
    """The specdec modules ``path`` imports (dotted, relative to the package: ``bench.running.configs``);
    ``module_level``: only the imports that run when it is imported (not those inside functions).
    ``from . import x`` names the submodule ``x`` when there is one, else the package; absolute
    imports (``from specdec.x import y``, ``from specdec import x``, ``import specdec.x``) count too."""
    rel = path.relative_to(SRC).with_suffix("")
    package = list(rel.parts[:-1])
    out = set()
    tree = ast.parse(path.read_text())
    for node in (top_level(tree.body) if module_level else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            name = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for alias in node.names:
                sub = f"{name}.{alias.name}" if name else alias.name
                out.add(sub if is_module(sub) else name or alias.name)  # "from .. import __version__": as written
        elif isinstance(node, ast.ImportFrom) and node.module == "specdec":
            for alias in node.names:
                out.add(alias.name if is_module(alias.name) else "__init__")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdec."):
            name = node.module[len("specdec."):]
            out.update(f"{name}.{a.name}" if is_module(f"{name}.{a.name}") else name for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name[len("specdec."):] for a in node.names if a.name.startswith("specdec."))
    return out


def import_graph(module_level: bool) -> dict[str, set[str]]:
    """``{module: the specdec modules importing it runs}``, packages named without ``__init__``.
    Importing ``a.b`` runs package ``a`` first, so that counts as importing ``a`` too (unless the
    importer is inside ``a``: a package runs before its modules anyway)."""
    def name_of(path: Path) -> str:
        parts = path.relative_to(SRC).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"

    graph = {}
    for path in sorted(SRC.rglob("*.py")):
        mine = name_of(path)
        deps = set()
        for imported in imports_of(path, module_level):
            parts = imported.split(".")
            for i in range(1, len(parts) + 1):
                dep = ".".join(parts[:i])
                if dep != mine and not mine.startswith(dep + "."):
                    deps.add(dep)
        graph[mine] = deps
    return {m: deps & set(graph) for m, deps in graph.items()}


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles of ``graph``: its strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_a_module_above_it():
    bad = []
    for path in SRC.rglob("*.py"):
        mine = ".".join(path.relative_to(SRC).with_suffix("").parts)
        for imported in imports_of(path):
            if layer_of(imported) < layer_of(mine):
                bad.append(f"{mine} imports {imported}")
    assert not bad, bad


def test_no_import_circles():
    """No import circle among specdec's modules, through the imports that run when a module is
    imported (module level, incl. ``if``/``try`` blocks and class bodies) or those inside functions
    (run on first call): none is allowed by exception."""
    assert not circles(import_graph(module_level=True))
    graph = import_graph(module_level=False)
    assert not circles(graph), circles(graph)
    assert "frontends.api" not in graph["core.configfile"]


def test_the_circle_check_sees_a_circle(tmp_path, monkeypatch):
    """The graph and circle helpers above find a circle, including one through ``from . import``."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "c.py").write_text("from . import d\n")
    (tmp_path / "pkg" / "d.py").write_text("try:\n    from .c import z\nexcept ImportError:\n    pass\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    assert circles(import_graph(module_level=True)) == [{"pkg.c", "pkg.d"}]
    assert sorted(map(sorted, circles(import_graph(module_level=False)))) == [["a", "b"], ["pkg.c", "pkg.d"]]


#: the foundation: modules at the package's top that every folder may import (and only each other)
FOUNDATION = {"errors", "checks", "draftlength"}
#: what each folder of src/specdec may import of specdec besides itself (its README.md says the same);
#: "package" is specdec/__init__.py (bench reads its __version__); cli.py and __main__.py import anything
FOLDER_RULES = {
    "foundation": set(),
    "models": {"foundation"},
    "core": {"foundation", "models"},
    "traces": {"foundation", "models", "core"},
    "frontends": {"foundation", "models", "core", "traces"},
    "bench": {"foundation", "models", "core", "traces", "frontends", "package"},
}


def folder_of(module: str) -> str:
    """The folder a module (dotted, relative to the package) is in: one of :data:`FOLDER_RULES`,
    ``commands`` (cli, __main__), ``package`` (specdec/__init__.py and the names it holds) or
    ``loose`` (a module at the top that is not in the foundation)."""
    top = module.split(".")[0]
    if top in ("cli", "__main__"):
        return "commands"
    if top == "__init__" or not is_module(top):
        return "package"
    if top in FOUNDATION:
        return "foundation"
    return top if top in FOLDER_RULES else "loose"


def folder_breaks() -> list[str]:
    """Every import (module level or inside a function) of a module of another folder than the
    rules allow, and every module outside the folders and the foundation."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        mine = ".".join(path.relative_to(SRC).with_suffix("").parts)
        here = folder_of(mine)
        if here in ("commands", "package"):
            continue
        if here == "loose":
            bad.append(f"{mine} is in no folder")
            continue
        for imported in sorted(imports_of(path)):
            there = folder_of(imported)
            if there != here and there not in FOLDER_RULES[here]:
                bad.append(f"{mine} ({here}) imports {imported} ({there})")
    return bad


def test_every_folder_imports_only_the_folders_below_it():
    """The folders show the architecture: the foundation (errors, checks, draftlength) imports only
    itself; models/ the foundation; core/ models and the foundation; traces/ the core too; frontends/
    traces too; bench/ everything but the command line, which (cli.py, __main__.py) imports anything.
    Imports inside functions count."""
    assert not folder_breaks(), folder_breaks()


def test_the_folder_check_sees_a_break(tmp_path, monkeypatch):
    """The check above finds an import of a folder above, inside a function or at module level,
    relative or absolute (``import specdec.x``, ``from specdec import x``), and a module in no folder."""
    for folder in ("core", "models", "traces", "frontends", "bench"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    for name in ("__init__.py", "cli.py", "__main__.py"):
        (tmp_path / name).write_text("from .frontends import api\n")
    (tmp_path / "checks.py").write_text("")
    (tmp_path / "errors.py").write_text("from .checks import x\ndef f():\n    from .core import engine\n")
    (tmp_path / "stray.py").write_text("")
    (tmp_path / "models" / "cache.py").write_text("from ..errors import E\nfrom specdec.core import engine\n")
    (tmp_path / "core" / "engine.py").write_text("from ..models import cache\nfrom .stats import s\n"
                                                 "def f():\n    from ..traces.trace import t\n")
    (tmp_path / "core" / "stats.py").write_text("from .. import errors\n")
    (tmp_path / "traces" / "trace.py").write_text("from ..core import engine\nimport specdec.frontends.api\n")
    (tmp_path / "frontends" / "api.py").write_text("from ..traces import trace\nfrom ..core.engine import e\n")
    (tmp_path / "bench" / "run.py").write_text("from .. import __version__\nfrom ..frontends.api import load\n"
                                               "def main():\n    from ..cli import main\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    assert sorted(folder_breaks()) == [
        "bench.run (bench) imports cli (commands)",
        "core.engine (core) imports traces.trace (traces)",
        "errors (foundation) imports core.engine (core)",
        "models.cache (models) imports core.engine (core)",
        "stray is in no folder",
        "traces.trace (traces) imports frontends.api (frontends)",
    ]


#: the folders split into sub-folders, and which sibling sub-folders each sub-folder may import besides
#: itself (its README.md says the same): bench/'s, each only those below it; tune/ and replay/, the two
#: commands over bench folders besides bench's own, not each other
SUBFOLDER_RULES = {
    "bench": {
        "tasks": set(),
        "scoring": {"tasks"},
        "outputs": {"tasks", "scoring"},
        "running": {"tasks", "scoring", "outputs"},
        "tune": {"tasks", "scoring", "outputs", "running"},
        "replay": {"tasks", "scoring", "outputs", "running"},
    },
}


def subfolder_breaks() -> list[str]:
    """Every import (module level or inside a function) of a sibling sub-folder the rules do not allow
    (the folder's own ``__init__.py`` counts as a sibling no sub-folder may import), and every module of
    such a folder outside its sub-folders (its ``__init__.py`` aside)."""
    bad = []
    for folder, rules in SUBFOLDER_RULES.items():
        for path in sorted((SRC / folder).rglob("*.py")):
            mine = ".".join(path.relative_to(SRC).with_suffix("").parts)
            parts = mine.split(".")
            if len(parts) == 2:
                if parts[1] != "__init__":
                    bad.append(f"{mine} is in no sub-folder of {folder}/")
                continue
            here = parts[1]
            if here not in rules:
                bad.append(f"{mine} is in {folder}/{here}/, which has no rule")
                continue
            for imported in sorted(imports_of(path)):
                names = imported.split(".")
                if names[0] != folder:
                    continue
                there = names[1] if len(names) > 1 else "__init__"
                if there != here and there not in rules[here]:
                    bad.append(f"{mine} ({folder}/{here}) imports {imported} ({folder}/{there})")
    return bad


def test_every_sub_folder_imports_only_the_sub_folders_below_it():
    """bench/'s sub-folders show its architecture: tasks/ (the benchmarks and their prompts) imports none
    of the others; scoring/ tasks/; outputs/ (a folder's records and what is made of them) scoring/ too;
    running/ (bench's command and loop) outputs/ too; tune/ and replay/ anything below but each other.
    Imports inside functions count."""
    assert not subfolder_breaks(), subfolder_breaks()


def test_the_sub_folder_check_sees_a_break(tmp_path, monkeypatch):
    """The check above finds an import of a sub-folder above or beside, inside a function or at module
    level, relative or absolute, one of the folder's own package, and a module outside the sub-folders."""
    for sub in ("tasks", "scoring", "outputs", "running", "tune", "replay", "stray"):
        (tmp_path / "bench" / sub).mkdir(parents=True)
        (tmp_path / "bench" / sub / "__init__.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "errors.py").write_text("")
    (tmp_path / "bench" / "__init__.py").write_text("from .running import runner\n")
    (tmp_path / "bench" / "loose.py").write_text("")
    (tmp_path / "bench" / "stray" / "x.py").write_text("")
    (tmp_path / "bench" / "tasks" / "datasets.py").write_text("from ...errors import E\ndef f():\n"
                                                               "    from ..scoring.quality import q\n")
    (tmp_path / "bench" / "scoring" / "quality.py").write_text("from ..tasks import datasets\nfrom .. import x\n")
    (tmp_path / "bench" / "outputs" / "summary.py").write_text("import specdec.bench.running.runner\n")
    (tmp_path / "bench" / "running" / "runner.py").write_text("from ..outputs.summary import s\n"
                                                              "from ..tasks.datasets import d\n")
    (tmp_path / "bench" / "tune" / "command.py").write_text("from ..running.runner import run\n"
                                                            "from specdec.bench.replay import command\n")
    (tmp_path / "bench" / "replay" / "command.py").write_text("from ..running import runner\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    assert sorted(subfolder_breaks()) == [
        "bench.loose is in no sub-folder of bench/",
        "bench.outputs.summary (bench/outputs) imports bench.running.runner (bench/running)",
        "bench.scoring.quality (bench/scoring) imports bench (bench/__init__)",
        "bench.stray.__init__ is in bench/stray/, which has no rule",
        "bench.stray.x is in bench/stray/, which has no rule",
        "bench.tasks.datasets (bench/tasks) imports bench.scoring.quality (bench/scoring)",
        "bench.tune.command (bench/tune) imports bench.replay.command (bench/replay)",
    ]


#: the folders whose README.md names each module and package in them (the sub-folders too)
README_FOLDERS = ("core", "models", "traces", "frontends", "bench",
                  *(f"{folder}/{sub}" for folder, rules in SUBFOLDER_RULES.items() for sub in rules))


def test_every_folder_has_a_readme_naming_its_modules():
    """Each folder has a README.md: one line per module (``name.py``) and package (``name/``) in it,
    and what the folder may import."""
    missing = []
    for folder in README_FOLDERS:
        readme = SRC / folder / "README.md"
        assert readme.is_file(), f"no {readme.relative_to(SRC)}"
        text = readme.read_text()
        assert "May import" in text, f"{folder}/README.md does not say what the folder may import"
        for child in sorted((SRC / folder).iterdir()):
            if child.suffix == ".py" and child.name != "__init__.py":
                name = child.name
            elif (child / "__init__.py").is_file():
                name = child.name + "/"
            else:
                continue
            if f"`{name}`" not in text:
                missing.append(f"{folder}/README.md: {name}")
    assert not missing, missing


def test_every_sub_folder_readme_names_the_sub_folders_it_may_import():
    """A sub-folder's README.md says what it may import as :data:`SUBFOLDER_RULES` does: each sibling
    it may import named (``tasks/``) after "May import", and no other."""
    wrong = []
    for folder, rules in SUBFOLDER_RULES.items():
        for sub, allowed in rules.items():
            rule = (SRC / folder / sub / "README.md").read_text().partition("May import")[2]
            named = {other for other in rules if other != sub and f"`{other}/`" in rule}
            if named != allowed:
                wrong.append(f"{folder}/{sub}/README.md names {sorted(named)}, the rule is {sorted(allowed)}")
    assert not wrong, wrong


def test_k_policies_are_in_one_module_with_one_protocol():
    """Every K policy of the engine is defined in autok.py, which imports no drafter; any class
    elsewhere that answers ``budget`` is a ``KPolicy`` (not a copy of its shape)."""
    from specdec.core.autok import Fixed, KPolicy, PassGate, k_policy
    from specdec.models.costmodel import CostTable
    from specdec.draftlength import AUTO

    assert not {m for m in imports_of(SRC / "core" / "autok.py") if m.startswith("core.drafters")}
    policies = [Fixed(3), k_policy(AUTO, CostTable("t", "float32", [1, 2, 4], [0.01, 0.02, 0.04], 32), None,
                                   drafts_with_model=False, trees=True, depth_limit=5, window=0, fallback_k=4)]
    assert isinstance(policies[1], PassGate)
    assert all(isinstance(p, KPolicy) and type(p).__module__ == "specdec.core.autok" for p in policies)
    copies = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(isinstance(f, ast.FunctionDef) and f.name == "budget"
                                                      for f in node.body):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if path.name != "autok.py" and "KPolicy" not in bases:
                    copies.append(f"{path.relative_to(SRC)}: {node.name}")
    assert not copies, copies


def test_bench_and_tune_share_options_without_importing_each_other():
    """``specdec tune`` takes the flags it shares with ``specdec bench`` from bench/running/options.py,
    not from bench's command module (and bench's command does not import tune's)."""
    tune_command, bench_command = SRC / "bench" / "tune" / "command.py", SRC / "bench" / "running" / "command.py"
    assert not any("bench.running.command" in imports_of(p) for p in (SRC / "bench" / "tune").glob("*.py"))
    assert not any(m.startswith("bench.tune") for m in imports_of(bench_command))
    assert "bench.running.options" in imports_of(tune_command) & imports_of(bench_command)


def _command(parser, name: str):
    return parser._subparsers._group_actions[0].choices[name]


def test_every_entry_point_takes_its_defaults_from_request_defaults():
    """The request fields' defaults are declared once (specdec.core.request.DEFAULTS): the request type,
    make_config, the CLI's flags and help, bench's and tune's flags and settings all show them."""
    import inspect
    from dataclasses import asdict

    from specdec.bench.running.options import parse_settings
    from specdec.bench.running.runner import Settings
    from specdec.models import genconfig
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.frontends.cliargs import decode_kwargs
    from specdec.core.request import BENCH_SEED, DEFAULTS, DecodeConfig

    cfg = DecodeConfig()
    assert {**{f: getattr(cfg, f) for f in ("policy", "drafter", "k", "max_new_tokens")}, **asdict(cfg.sampling)} \
        == dict(DEFAULTS)
    assert specdec.make_config == DecodeConfig.from_options == specdec.frontends.api.make_config
    signature = inspect.signature(DecodeConfig.from_options).parameters
    # structured output, stop token ids and logprobs: none by default
    constraints = ("response_format", "json_schema", "regex", "choice", "grammar", "stop_token_ids", "logprobs")
    assert {n: p.default for n, p in signature.items() if p.kind is p.KEYWORD_ONLY and n not in constraints} \
        == dict(DEFAULTS)
    assert all(signature[n].default is None for n in constraints) and DecodeConfig().constraint is None
    parser = build_parser()
    for argv in (["generate", "x"], ["serve"]):
        # the built-in defaults under the bundled target's published sampling settings (--generation-config auto)
        model = genconfig.resolve("auto", DEFAULT_TARGET)[0]
        assert decode_kwargs(parser.parse_args(argv)) == {**DEFAULTS, **model}
        assert decode_kwargs(parser.parse_args([*argv, "--generation-config", "specdec"])) == dict(DEFAULTS)
        helps = {a.dest: a.help for a in _command(parser, argv[0])._actions}
        for name in ("policy", "drafter", "k", "max_new_tokens"):
            assert f"(default: {DEFAULTS[name]}" in helps[name], (argv[0], name)
    bench_argv = {"bench": ["bench", "--out", "o"], "tune": ["tune", "--policy", "mars", "--out", "o"]}
    for command, argv in bench_argv.items():
        flags = {a.dest: a for a in _command(parser, command)._actions}
        assert flags["max_new_tokens"].default == str(DEFAULTS["max_new_tokens"]), command
        assert f"(default: {DEFAULTS['max_new_tokens']})" in flags["max_new_tokens"].help, command
        assert flags["drafter"].default == DEFAULTS["drafter"] and flags["seed"].default == str(BENCH_SEED)
        settings = parse_settings(parser.parse_args(argv))
        assert (settings.max_new_tokens, settings.sampling()) == (Settings().max_new_tokens, Settings().sampling())
    assert _command(parser, "bench")._option_string_actions["--k"].default == DEFAULTS["k"]
    assert Settings().max_new_tokens == DEFAULTS["max_new_tokens"]
    assert Settings().sampling() == {**{k: DEFAULTS[k] for k in ("temperature", "top_p", "top_k")}, "seed": BENCH_SEED}


def test_the_server_names_the_caller_and_reaches_no_cache_state():
    """Cache state across requests is the engine's (specdec.core.scopes.Caches): the server names a
    request's caller and sets the Pair's prefix-caching switch, and touches no cache itself."""
    for path in (SRC / "frontends" / "server").rglob("*.py"):
        text = path.read_text()
        for reach in ("caches.", "engine.target", "engine.draft", ".reset()"):
            assert reach not in text, f"{path.relative_to(SRC)} reaches into the engine's caches ({reach})"


def _is_caller(node) -> bool:
    """Whether ``node`` reads a caller: a name or attribute called ``caller``, ``...caller`` or ``...holder``."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name.lower().endswith(("caller", "holder"))


def caller_sentinels(source: str) -> list[int]:
    """The lines of ``source`` that tell callers apart by a sentinel value rather than by
    :class:`specdec.core.caller.Caller`: a caller compared with ``""`` or None, its truth taken
    (``caller or ...``, ``not caller``, ``if caller:``), or its type asked (``isinstance(caller, str)``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(map(_is_caller, sides)) and any(isinstance(s, ast.Constant) and s.value in ("", None) for s in sides):
                lines.append(node.lineno)
        elif isinstance(node, ast.BoolOp) and any(map(_is_caller, node.values)):
            lines.append(node.lineno)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and _is_caller(node.operand):
            lines.append(node.lineno)
        elif isinstance(node, (ast.If, ast.IfExp, ast.While)) and _is_caller(node.test):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and node.args
              and _is_caller(node.args[0])):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_callers_are_told_apart_by_their_type_not_by_sentinel_values():
    """A request's caller is a :class:`specdec.core.caller.Caller` everywhere in the package (the shared
    one, a named one, an isolated one: ``caller.isolated``); the loose public values (``""``, a name,
    None) are converted once, by ``as_caller``. Before, ``""`` meant shared and None isolated, and each
    store tested for them (``caller is None``, ``isinstance(self._holder, str)``)."""
    assert caller_sentinels("if caller is None:\n    pass\nx = cfg.caller or ''\nok = not self._holder\n"
                            "y = isinstance(self._holder, str)\nz = caller == ''\n") == [1, 3, 4, 5, 6]
    assert caller_sentinels("if caller.isolated:\n    pass\nsame = caller == holder\nn = caller_cache_bytes is None\n") == []
    bad = [f"{path.relative_to(SRC)}:{line}" for path in sorted(SRC.rglob("*.py"))
           for line in caller_sentinels(path.read_text())]
    assert not bad, bad


def test_server_defaults_come_from_request_defaults():
    pytest.importorskip("fastapi")
    from types import SimpleNamespace

    from specdec.core.request import DEFAULTS
    from specdec.frontends.server.app import _checked_settings
    from specdec.frontends.server.params import Limits
    from specdec.frontends.server.schemas import CompletionRequest

    # no max_tokens: to the context's end, within the server's limit (as vLLM and OpenAI)
    pair = SimpleNamespace(sampling_defaults={"temperature": 0.5})
    assert _checked_settings(pair, None, None, Limits(max_tokens=77))[0] == {**DEFAULTS, "temperature": 0.5,
                                                                              "max_new_tokens": 77}
    assert _checked_settings(pair, {"drafter": "pld", "max_new_tokens": None}, None, Limits(max_tokens=77))[0] == \
        {**DEFAULTS, "temperature": 0.5, "drafter": "pld", "max_new_tokens": 77}
    described = CompletionRequest.model_fields["max_tokens"].description
    assert "context's end" in described
    assert f"built in: {DEFAULTS['top_p']}" in CompletionRequest.model_fields["top_p"].description


def _calls(name: str) -> set[str]:
    """The src modules (paths relative to the package) that call a function named ``name``."""
    found = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) == name:
                    found.add(path.relative_to(SRC).as_posix())
    return found


def test_one_function_layers_a_requests_settings():
    """A request's settings (built-in defaults, the model's sampling settings, a config file or the
    server's defaults, the caller's values) are layered in one function, specdec.core.settings.layer,
    which the Python API, the CLI and the server all call: no other module overlays options, reads
    a config file to layer it, or fills in DEFAULTS (a bench item read from a config file is no
    layering; vLLM's plugin overlays its engine default under a request's keys, its own knobs)."""
    import inspect

    pytest.importorskip("pydantic")
    from specdec.core import settings
    from specdec.frontends import api, cliargs
    from specdec.frontends.server import app, params

    assert _calls("overlay") == {"core/settings.py", "frontends/vllm/config.py"}
    assert _calls("read_config") == {"core/settings.py", "bench/running/configs.py"}
    filled = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            unpacked = isinstance(node, ast.Dict) and any(
                k is None and isinstance(v, ast.Name) and v.id == "DEFAULTS" for k, v in zip(node.keys, node.values))
            items = (isinstance(node, ast.Attribute) and node.attr == "items" and isinstance(node.value, ast.Name)
                     and node.value.id == "DEFAULTS")
            if unpacked or items:
                filled.add(path.relative_to(SRC).as_posix())
    assert filled == {"core/settings.py"}, filled
    for caller in (api.Pair.stream, cliargs.decode_kwargs, params.build, app._checked_settings):
        assert "layer(" in inspect.getsource(caller), caller.__qualname__


def test_one_rule_where_two_layers_meet(tmp_path):
    """Naming another policy drops the lower layer's policy parameters, another drafter its drafter
    options (specdec.core.request.overlay, which layer() applies between a config file or the server's
    defaults and the caller's values); the built-in defaults and the model's settings fill the rest."""
    from specdec.core import request
    from specdec.core.configfile import write_config
    from specdec.core.settings import layer
    from specdec.frontends.vllm import config as vllm_config

    base = {"policy": "mars", "mars_theta": 0.8, "drafter": "pld", "ngram_max": 4, "k": 5, "max_new_tokens": 9}
    other_policy = {"policy": "lossless", "drafter": "pld", "ngram_max": 4, "k": 5, "max_new_tokens": 9}
    assert request.overlay(base, {"policy": "lossless"}) == other_policy
    assert request.overlay(base, {"policy": "mars", "k": 3}) == {**base, "k": 3}
    without_options = {k: v for k, v in base.items() if k != "ngram_max"}
    assert request.overlay(base, {"drafter": "model"}) == {**without_options, "drafter": "model"}
    defaults = dict(request.DEFAULTS)
    assert layer() == defaults
    assert layer({"policy": "lossless"}, base=base) == {**defaults, **other_policy}
    path = write_config(tmp_path / "c.json", base)
    assert layer({"drafter": "model"}, config_file=path, model={"temperature": 0.7, "max_new_tokens": 3}) == \
        {**defaults, "temperature": 0.7, **without_options, "drafter": "model"}
    assert layer({}, max_new_tokens=50)["max_new_tokens"] == 50 and layer({}, base=base, max_new_tokens=50) == \
        {**defaults, **base}
    with pytest.raises(ValueError):
        layer({}, base=base, config_file=path)
    default = vllm_config.selection("mars", {"mars_theta": 0.7})
    assert vllm_config.request_selection({"specdec_policy": "typical"}, default).params == ()
    assert vllm_config.request_selection({"specdec_mars_theta": 0.9}, default).params == (("mars_theta", 0.9),)


def test_one_draft_length_limit_and_no_auto_sentinel():
    """The draft-length limit is declared once (specdec.draftlength.MAX_K: the most draft tokens a
    request asks, the widest pass the cost tables measure); k is parsed once into a K (a fixed K or
    auto), which the engine, the K policies, the stats and the server read instead of the word."""
    import dataclasses
    import re

    from specdec import draftlength
    from specdec.core import request
    from specdec.models import costmodel
    from specdec.draftlength import AUTO, MAX_K, K
    from specdec.core.stats import Stats
    from specdec.core.verify.fly import Fly

    declared = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            declared += [f"{path.relative_to(SRC).as_posix()}:{t.id}" for t in targets
                         if isinstance(t, ast.Name) and re.search(r"K_MAX|MAX_K", t.id)]
    assert declared == ["draftlength.py:MAX_K"], declared
    assert request.MAX_K is draftlength.MAX_K and costmodel.WIDTHS[-1] == MAX_K
    assert options_of(Fly)["window"][0].hi == MAX_K - 1  # a fixed k must exceed the window
    for rel in ("core/autok.py", "core/stats.py", "core/engine.py", "core/request.py", "frontends/server/params.py"):
        for node in ast.walk(ast.parse((SRC / rel).read_text())):
            if isinstance(node, ast.Compare):
                words = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                assert "auto" not in words, f"{rel}:{node.lineno} compares with the word 'auto'"
    cfg = request.make_config(k="auto")
    assert isinstance(cfg.k, K) and cfg.k.auto and cfg.k is AUTO and cfg.k == "auto"
    fixed = request.make_config(k="7").k
    assert isinstance(fixed, K) and (fixed.fixed, fixed.value, str(fixed)) == (7, 7, "7") and fixed == 7 == fixed
    assert K.parse(fixed) is fixed and request.make_config(k=fixed).k == K(7) and hash(K(7)) == hash(7)
    for bad in (0, MAX_K + 1, True, 2.0, "fast"):
        with pytest.raises(SpecdecError, match=rf"k \(draft length\) must be 'auto' or an integer in \[1, {MAX_K}\]"):
            K.parse(bad)
    assert [K.is_json(v) for v in (3, "auto", "AUTO", "3", True, 3.0)] == [True, True, False, False, False, False]
    assert dataclasses.fields(Stats)[0].name == "policy" and dataclasses.fields(Stats)[0].default is dataclasses.MISSING
    assert Stats(policy="ar").to_dict()["k"] == 0 and Stats(policy="lossless", drafter="pld", k="auto").to_dict()["k"] == "auto"
    assert Stats(policy="lossless", drafter="pld", k=5).k == K(5) and Stats(policy="lossless", drafter="pld", k=5).k_label == "5"


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": True}, "max_new_tokens must be an integer >= 1, got True"),
    ({"top_p": "high"}, "top_p must be a number, got 'high'"),
    ({"top_p": 1.5}, "top_p must be a number in (0, 1], got 1.5"),
    ({"top_k": 2.5}, "top_k (0 = off) must be an integer >= 0"),
    ({"temperature": float("nan")}, "temperature must be a number"),
    ({"seed": "s"}, "seed must be an integer"),
])
def test_one_validation_for_numbers(kwargs, message):
    from specdec.frontends.api import make_config

    with pytest.raises(SpecdecError) as err:
        make_config(**kwargs)
    assert message in str(err.value)


def test_config_parses_the_policy_once():
    from specdec.frontends.api import make_config

    cfg = make_config(policy="fly+mars", mars_theta=0.8, k=12)
    assert cfg.parsed.params["mars_theta"] == 0.8 and cfg.parsed.window.window == 6
    assert not make_config(policy="ar").parsed.drafts  # plain decoding: a policy that drafts nothing


def test_bench_checks_optional_dependencies_before_any_work(tmp_path):
    code = ("import importlib.util, sys; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda n, *a: None if n == 'matplotlib' else real(n, *a); "
            "from specdec.cli import main; sys.exit(main(sys.argv[1:]))")
    res = subprocess.run([sys.executable, "-c", code, "bench", "--out", str(tmp_path / "o"), "--limit", "1",
                          "--target", "/no/such/model"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "needs matplotlib" in res.stderr and "pip install 'specdec-rules[bench]'" in res.stderr
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


def test_target_without_a_draft_uses_the_copy_sources_by_default(tiny_dirs):
    pair = specdec.load(str(tiny_dirs[0]), draft=None, dtype="float32", progress=False)
    out = pair.generate("abcabcabcabc", chat=False, max_new_tokens=16)
    assert out.stats.drafter == "auto"
    assert set(out.stats.sources) <= {"pld", "suffix"}


#: the only modules that import transformers: its backend, the GGUF->folder conversion, the GGUF
#: tokenizer loader of the llama.cpp backend, and bench's transformers peers and version record
TRANSFORMERS_IMPORTERS = {*(f"models/backends/transformers/{name}.py" for name in
                            ("model", "load", "weights", "convert", "static")),
                          "models/backends/llamacpp/model.py", "bench/running/peers.py",
                          "bench/running/environment.py"}


def test_only_the_backends_import_transformers():
    found = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("frontends/vllm/"):
            continue  # vLLM's plugin lives in vLLM's process (its own transformers)
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "transformers" or n.startswith("transformers.") for n in names):
                found.add(rel)
    assert found <= TRANSFORMERS_IMPORTERS, sorted(found - TRANSFORMERS_IMPORTERS)


#: what a module outside a backend's package may import of ``backends``: the registry is the door
BACKEND_DOORS = {"models.backends", "models.backends.registry", "models.backends.base"}
#: the modules above the backends (they use replay, traces, acceptance models, or call a backend)
ABOVE_BACKENDS = ("replay", "trace", "acceptance", "draft_formats", "bench", "server", "vllm", "cli", "cliargs", "api")


def backend_leaks() -> list[str]:
    """Imports that reach a backend's package from outside it (anything of ``models.backends`` but
    :data:`BACKEND_DOORS`), and imports from ``models/backends/`` of a module above the backends."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        mine = ".".join(path.relative_to(SRC).with_suffix("").parts)
        for imported in imports_of(path):
            parts = imported.split(".")
            if (imported.startswith("models.backends") and imported not in BACKEND_DOORS
                    and not mine.startswith(".".join(parts[:3]) + ".")):
                bad.append(f"{mine} imports {imported}")
            if mine.startswith("models.backends.") and room_of(imported) in ABOVE_BACKENDS:
                bad.append(f"{mine} imports {imported}")
    return bad


def test_backends_are_reached_only_through_the_registry():
    """No module outside ``models/backends/<name>/`` imports ``models.backends.<name>`` (only
    ``models.backends``, ``models.backends.registry`` and ``models.backends.base``): the CLI, the vLLM plug-in and the bench's peers ask
    a registry entry's hooks. Nothing in ``models/backends/`` imports replay, trace, acceptance,
    draft_formats or a front end (:func:`specdec.load` measures the draft above them, through the
    backend's hooks: ``Backend.identity``, ``draft_variants``, ``load_draft``)."""
    assert not backend_leaks(), backend_leaks()


def test_the_backend_leak_check_sees_a_leak(tmp_path, monkeypatch):
    """The check above finds an import of a backend's package from outside it, from another backend's
    package, and an import of a layer above from inside ``models/backends/``; a backend's own modules pass."""
    for folder in ("models/backends/one", "models/backends/two", "traces", "bench"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("__init__.py", "models/__init__.py", "traces/__init__.py", "traces/trace.py",
                 "models/backends/__init__.py", "models/backends/registry.py", "models/backends/one/__init__.py",
                 "models/backends/two/__init__.py", "bench/__init__.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "models/backends/one/model.py").write_text("from ..registry import Backend\nfrom .load import x\n")
    (tmp_path / "models/backends/one/load.py").write_text("def f():\n    from ....traces.trace import y\n")
    (tmp_path / "models/backends/two/backend.py").write_text("from ..one.model import m\n")
    (tmp_path / "bench/peers.py").write_text("from ..models.backends import REGISTRY\n"
                                             "from ..models.backends.one import load\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    assert backend_leaks() == ["bench.peers imports models.backends.one.load",
                               "models.backends.one.load imports traces.trace",
                               "models.backends.two.backend imports models.backends.one.model"]


def _costmodel_names_used() -> set[str]:
    """Every name src/ and tests/ import from specdec.models.costmodel, or read off it as an attribute."""
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
    from specdec.models import costmodel

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
    """``1 + accepted / rounds`` is written once, in :func:`specdec.core.stats.tau_of`; everything else calls it."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Constant)
                    and node.left.value == 1 and isinstance(node.right, ast.BinOp)
                    and isinstance(node.right.op, ast.Div) and "accept" in ast.unparse(node.right.left)):
                found.append(f"{path.relative_to(SRC).as_posix()}: {ast.unparse(node)}")
    assert found == ["core/stats.py: 1.0 + accepted / rounds"], found


#: the longest a function may be, in lines (decorators excluded, docstring included)
MAX_FUNCTION_LINES = 60
#: ``path:function`` allowed to be longer (none today); an entry needs a reason beside it
LONG_FUNCTIONS_ALLOWED: set[str] = set()


def test_no_function_is_longer_than_the_limit():
    """No function or method in the package runs over ``MAX_FUNCTION_LINES`` lines: a longer one
    is split into named helpers (except those in ``LONG_FUNCTIONS_ALLOWED``)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in LONG_FUNCTIONS_ALLOWED:
                    found.append(f"{rel}:{node.name} ({length} lines, line {node.lineno})")
    assert not found, found


def test_drafter_options_and_rule_parameters_never_share_a_name():
    """Request options are one flat namespace: a name a drafter declares goes to the drafter, every
    other to the policy (specdec.core.request.split_options). A drafter option named like a rule's
    parameter (``theta``, ``mars_theta``, ...) would silently take it, so none may be."""
    from specdec.core.drafters import ALL_DRAFTER_OPTIONS
    from specdec.core.verify import RULES, rule_params

    rule_names = {n for rule in RULES for p in rule_params(rule) for n in (p, f"{rule}_{p}")}
    assert not set(ALL_DRAFTER_OPTIONS) & rule_names, sorted(set(ALL_DRAFTER_OPTIONS) & rule_names)
    request_fields = {"policy", "drafter", "k", "max_new_tokens", "max_tokens", "temperature", "top_p", "top_k",
                      "seed", "repetition_penalty", "presence_penalty", "frequency_penalty", "stop_token_ids",
                      "logprobs", "response_format", "json_schema", "regex", "choice", "grammar"}
    assert not (set(ALL_DRAFTER_OPTIONS) | rule_names) & request_fields


def test_test_helpers_are_not_in_the_installed_package():
    """The tiny models, GGUF writer and chi-square harness live with the tests (tests/tinymodels.py):
    they import scipy, which the package does not declare outside its test extra."""
    assert not (SRC / "testing.py").exists()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n.split(".")[0] == "scipy" for n in names), path


def test_each_name_and_limit_is_declared_once_and_compared_by_its_name():
    """Plain decoding's name (``specdec.core.names.AR``), the portfolio's sources
    (``specdec.core.names.Source``), the draft window's words (``specdec.core.window``) and the longest
    chain the planners plan (``specdec.draftlength.MAX_CHAIN``) are each declared once; code compares
    with the name, never the literal, and never derives the limit again."""
    from specdec.core.drafters.auto import SOURCES
    from specdec.core.names import AR, Source
    from specdec.core.verify import Plain
    from specdec.draftlength import MAX_CHAIN, MAX_K

    assert Plain().name == AR and MAX_CHAIN == MAX_K - 1 and SOURCES == tuple(Source)
    assert [str(s) for s in Source] == ["model", "pld", "suffix"] and Source.MODEL == "model"
    bad = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                items = sides + [e for s in sides if isinstance(s, (ast.Tuple, ast.List, ast.Set)) for e in s.elts]
                words = {c.value for c in items if isinstance(c, ast.Constant)} & {"ar", "model", "pld", "suffix"}
                bad += [f"{rel}:{node.lineno} compares with {w!r}" for w in sorted(words)]
            if isinstance(node, ast.Tuple) and rel != "core/window.py":
                if {c.value for c in node.elts if isinstance(c, ast.Constant)} >= {"auto", "all"}:
                    bad.append(f"{rel}:{node.lineno} spells the draft window's words")
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and rel != "draftlength.py"
                    and getattr(node.left, "id", None) == "MAX_K" and getattr(node.right, "value", None) == 1):
                bad.append(f"{rel}:{node.lineno} derives MAX_CHAIN again")
    assert not bad, bad


def test_a_round_s_plan_is_one_value_the_engine_hands_on():
    """The K policy answers each round with one :class:`~specdec.core.rounds.Plan` (K, a portfolio's
    source, why it is plain) and the drafter drafts from it: the engine sets no attribute on the
    policy or the drafter to carry the choice, and a replay asks the same ``plan``."""
    from specdec.core.autok import KPolicy
    from specdec.core.drafters.base import Drafter

    assert not hasattr(KPolicy, "source") and not hasattr(Drafter, "source")
    for rel in ("core/engine.py", "traces/replay.py"):
        tree = ast.parse((SRC / rel).read_text())
        sets = [f"{rel}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute)
                and t.value.attr in ("kpolicy", "drafter") and t.attr not in ("more", "guide", "should_stop")]
        assert not sets, sets
        calls = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
        assert "plan" in calls and "budget" not in calls, rel


def patched_library_names(tree: ast.AST) -> list[str]:
    """Assignments (``x.y = ...``, ``setattr``) to an attribute of a name the module imported from specdec:
    a patch of the library, which a refactor would break silently."""
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec"):
            imported |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            imported |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("specdec")}

    def root(expr) -> str | None:
        while isinstance(expr, ast.Attribute):
            expr = expr.value
        return expr.id if isinstance(expr, ast.Name) else None

    bad = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        bad += [f"{node.lineno} patches {ast.unparse(t) if not isinstance(node, ast.Call) else ast.unparse(node.args[0])}"
                for t in targets if isinstance(t, ast.Attribute) and root(t) in imported]
    return bad


def test_the_patch_check_sees_a_patch():
    tree = ast.parse("from specdec.traces import replay as r\nimport specdec.core.autok\nfrom specdec.x import C\n"
                     "r.LookupSource.propose = f\nspecdec.core.autok.X = 1\nsetattr(C, 'm', g)\nmine = object()\n"
                     "mine.a = 1\n")
    assert [line.split()[0] for line in patched_library_names(tree)] == ["4", "5", "6"]


def test_scripts_use_the_library_s_public_names():
    """The scripts import no underscore name of specdec, override no underscore method and patch
    nothing of the library, so a refactor of the library breaks them loudly (the replay library lives
    in ``specdec.traces.runs``)."""
    bad = []
    for path in (SRC.parent.parent / "scripts").glob("*.py"):
        tree = ast.parse(path.read_text())
        bad += [f"{path.name}:{line}" for line in patched_library_names(tree)]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec"):
                bad += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names if a.name.startswith("_")]
            if isinstance(node, ast.ClassDef):
                bad += [f"{path.name}:{f.lineno} overrides {f.name}" for f in node.body
                        if isinstance(f, ast.FunctionDef) and f.name.startswith("_") and not f.name.startswith("__")]
    assert not bad, bad


def test_the_linter_is_clean_on_the_package():
    """``ruff check src`` (its rules in pyproject.toml: pyflakes' and syntax errors) finds nothing; ruff
    comes with the ``test`` extra."""
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    done = subprocess.run([str(ruff), "check", str(SRC)], capture_output=True, text=True, cwd=SRC.parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_type_checker_is_clean_on_the_package():
    """``mypy`` (its settings in pyproject.toml: src/specdec at mypy's default level, the modules
    without types or of extras not installed as Any) finds nothing; mypy comes with the ``test``
    extra, pinned. Its cache is the checkout's .mypy_cache, so a second run takes seconds."""
    mypy = Path(sys.executable).with_name("mypy")
    if not mypy.exists():
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    done = subprocess.run([str(mypy)], capture_output=True, text=True, cwd=SRC.parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr
