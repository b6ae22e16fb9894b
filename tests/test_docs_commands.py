"""Every ``specdec ...`` command printed in README.md and docs/*.md parses with today's CLI.

The commands are parsed, never run: ``specdec.cli.build_parser()`` is the parser ``specdec`` itself
uses (``bench``, ``tune`` and ``serve`` register their subparsers into it), and parsing loads no
model. A command parses when argparse does not exit with an error (``--help`` exits 0: that passes).
Values are checked only as far as argparse checks them (types, choices). A *fragment* (an inline
`code` span in prose, which shows a flag or two: `specdec bench --dataset spec-bench`; or a command
with a bare ``...`` word) is parsed with no argument required (``--out``, the prompt); every other
check (flag names, types, choices) still applies. A command in a code block must be complete.

Where commands are found:

* fenced code blocks (``` or ~~~), and indented code lines (4+ spaces) that start with ``specdec ``
  (or ``$ specdec ``): a trailing backslash joins the next line; a shell line is cut at ``&&``,
  ``||``, ``|``, ``;`` and ``&`` (outside quotes), and each piece that starts with ``specdec `` is a
  command. A ``# comment`` is dropped, except a command it shows after ``or:``
  (``# or: specdec serve --config tuned.json``);
* inline `code` spans outside code blocks (a span may wrap onto the next line of its paragraph)
  that start with ``specdec `` (also after the wrappers ``/usr/bin/time -v``, ``time``), cut the
  same way.

Placeholder rules, applied before ``shlex.split`` (PLACEHOLDERS below, in order):

* ``<anything>`` written as a placeholder (``<bf16 gguf>``: ``<`` right before a letter) -> ``x``;
* ``$VAR``, ``${VAR}``, ``$(command)`` -> ``x``;
* ``[--flag VALUE]`` optional brackets are dropped (their contents kept) and a bare ``...`` word
  (more flags; a quoted ``"..."`` prompt stays) is dropped;
* a command named without arguments (``specdec bench`` in prose) is checked as ``specdec bench --help``
  (the subcommand exists); ``specdec`` alone and ``specdec = module:function`` (an entry point) are
  not commands;
* upper-case metavariables: ``COMMAND`` -> each subcommand in turn; ``N``, ``K``, ``SEED`` -> ``1``;
  ``P``/``POLICY`` -> ``lossless``; ``PATH``, ``FILE``, ``DIR``, ``KEY``, ``PROMPT``, ``TEXT``,
  ``NAME``, ``R``, ``URL``, ``HOST`` -> ``x``; ``A,B`` -> ``a,b``;
* shell redirections (``< prompt.txt``, ``> out.txt``, ``2>&1``) are dropped;
* a synopsis with alternatives, ``specdec generate PROMPT --a X | --b | --c Y``: each alternative
  (a ``|`` piece starting with ``-``) is checked after the stem (the words before the first
  alternative's flag).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# placeholder -> dummy value; applied to whole words (after the regex rules in substitute())
WORD_PLACEHOLDERS = {
    "N": "1", "K": "1", "SEED": "1",
    "P": "lossless", "POLICY": "lossless",
    "PATH": "x", "FILE": "x", "DIR": "x", "KEY": "x", "PROMPT": "x", "TEXT": "x", "NAME": "x",
    "R": "x", "URL": "x", "HOST": "x",
    "A,B": "a,b",
}
PLACEHOLDERS = [
    (re.compile(r"<[A-Za-z][^<>\n]*>"), "x"),            # <bf16 gguf>, <path>
    (re.compile(r"\$\([^)]*\)"), "x"),                   # $(nproc)
    (re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}"), "x"),  # ${VAR}
    (re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*"), "x"),      # $VAR
]
ELLIPSIS = re.compile(r"(?<!\S)\.\.\.(?!\S)")
WRAPPERS = ("/usr/bin/time -v ", "time ")
SEPARATORS = {"&&", "||", "|", ";", "&"}
REDIRECTS = {"<", ">", ">>", ">&", "<&", "&>", "2>", "2>>", "2>&"}


@dataclass(frozen=True)
class Command:
    where: str              # file:line
    text: str               # as printed (joined, cut at separators)
    inline: bool = False    # an inline `code` span in prose

    @property
    def fragment(self) -> bool:
        """Shows some flags only: an inline span in prose, or a command with a bare ``...`` word."""
        return self.inline or bool(ELLIPSIS.search(self.text))


# ---------------------------------------------------------------------------- extraction
def _shell_pieces(line: str) -> list[list[str]]:
    """A shell line -> its pieces' words (cut at separators outside quotes; redirections dropped)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
    lex.whitespace_split = True
    lex.commenters = ""
    pieces: list[list[str]] = [[]]
    words = list(lex)
    i = 0
    while i < len(words):
        w = words[i]
        if w in SEPARATORS:
            pieces.append([])
        elif w in REDIRECTS or (w.isdigit() and i + 1 < len(words) and words[i + 1] in REDIRECTS):
            i += 1 if w.isdigit() else 2   # the operator's target word goes with it
            continue
        else:
            pieces[-1].append(w)
        i += 1
    return [p for p in pieces if p]


def _strip_comment(line: str) -> tuple[str, str]:
    """Split a shell line at its first ``#`` that starts a word outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:]
    return line, ""


def _commands_in(line: str) -> list[str]:
    """The ``specdec ...`` commands in one (joined) shell line, as text."""
    code, comment = _strip_comment(line)
    found = []
    pieces = _split_top(code)
    for piece in pieces:
        text = piece.strip()
        if text.startswith("$ "):
            text = text[2:]
        for wrapper in WRAPPERS:
            if text.startswith(wrapper):
                text = text[len(wrapper):].lstrip()
        if re.match(r"specdec\s+[A-Za-z-]", text):   # not `specdec` alone, nor `specdec = module:fn`
            found.append(text)
        elif found and text.startswith("-"):   # synopsis alternative: `... --a X | --b`
            found.append("|" + text)
    m = re.search(r"\bor:\s*(specdec\s.*)$", comment)
    if m:
        found.extend(_commands_in(m.group(1)))
    return found


def _split_top(code: str) -> list[str]:
    """Cut shell text at separators outside quotes, keeping each piece's text."""
    out, start, quote, i = [], 0, None, 0
    while i < len(code):
        ch = code[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif code.startswith(("&&", "||"), i):
            out.append(code[start:i])
            start = i = i + 2
            continue
        elif ch in "|;" or (ch == "&" and not code[i - 1:i] in (">", "<") and not code[i + 1:i + 2] == ">"):
            out.append(code[start:i])
            start = i + 1
        i += 1
    out.append(code[start:])
    return out


def extract(path: Path) -> list[Command]:
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = path.relative_to(ROOT).as_posix()
    commands: list[Command] = []
    fence = None
    prose: list[tuple[int, str]] = []   # (line number, text) of the current paragraph outside code

    def flush_prose():
        if not prose:
            return
        text = "\n".join(t for _, t in prose)
        starts = [0]
        for _, t in prose:
            starts.append(starts[-1] + len(t) + 1)
        for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
            span = " ".join(m.group(1).split())
            lineno = prose[max(j for j, s in enumerate(starts) if s <= m.start())][0]
            for cmd in _commands_in(span):
                commands.append(Command(f"{rel}:{lineno}", cmd, inline=True))
        prose.clear()

    i = 0
    while i < len(lines):
        raw = lines[i]
        stripped = raw.strip()
        m = re.match(r"\s*(```+|~~~+)", raw)
        if fence is None and m:
            flush_prose()
            fence = m.group(1)
            i += 1
            continue
        if fence is not None and stripped.startswith(fence[:3]) and set(stripped) <= set(fence[0]):
            fence = None
            i += 1
            continue
        indented_cmd = (fence is None and raw.startswith("    ")
                        and re.match(r"(\$ )?specdec(\s|$)", stripped))
        if fence is not None or indented_cmd:
            if indented_cmd:
                flush_prose()
            start = i
            joined = stripped
            while joined.endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined[:-1] + " " + lines[i].strip()
            for cmd in _commands_in(joined):
                commands.append(Command(f"{rel}:{start + 1}", cmd))
            i += 1
            continue
        if not stripped:
            flush_prose()
        else:
            prose.append((i + 1, raw))
        i += 1
    flush_prose()
    return commands


def all_commands() -> list[Command]:
    return [c for path in DOCS for c in extract(path)]


# ---------------------------------------------------------------------------- argv
def _words(text: str) -> list[str]:
    for pattern, value in PLACEHOLDERS:
        text = pattern.sub(value, text)
    text = re.sub(r"\[(-[^\[\]]*)\]", r"\1", text)       # [--api-key KEY] -> --api-key KEY
    text = ELLIPSIS.sub(" ", text)                         # a bare ... word (not "..." quoted)
    words = []
    for piece in _shell_pieces(text):
        words.extend(piece)
    return [WORD_PLACEHOLDERS.get(w, w) for w in words]


def argvs(command: str, subcommands: list[str]) -> list[list[str]]:
    """The argv lists (after ``specdec``) one printed command stands for."""
    parts = command.split("\n|")
    first = _words(parts[0])[1:]
    out = [first]
    if len(parts) > 1:   # synopsis alternatives: stem + each alternative
        flag_at = max(i for i, w in enumerate(first) if w.startswith("-"))
        stem = first[:flag_at]
        out = [first] + [stem + _words(alt) for alt in parts[1:]]
    if len(first) == 1 and first[0] in subcommands:   # `specdec bench` named in prose: the command exists
        out = [first + ["--help"]]
    expanded = []
    for argv in out:
        if "COMMAND" in argv:
            expanded.extend([subcommand if w == "COMMAND" else w for w in argv] for subcommand in subcommands)
        else:
            expanded.append(argv)
    return expanded


def _group_alternatives(found: list[Command]) -> list[Command]:
    out: list[Command] = []
    for c in found:
        if c.text.startswith("|") and out:
            out[-1] = Command(out[-1].where, out[-1].text + "\n" + c.text, out[-1].inline)
        else:
            out.append(c)
    return out


def relaxed(parser):
    """The parser with no required arguments anywhere (for fragments), every other check kept."""
    for action in parser._actions:
        action.required = False
        for sub in (getattr(action, "choices", None) or {}).values() if isinstance(
                getattr(action, "choices", None), dict) else ():
            relaxed(sub)
    for group in parser._mutually_exclusive_groups:
        group.required = False
    return parser


def parse_error(parser, argv: list[str]) -> str | None:
    """None when argparse accepts argv (``--help`` / ``--version`` included), else its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


# ---------------------------------------------------------------------------- tests
COMMANDS = _group_alternatives(all_commands())


def test_extraction_finds_the_documented_commands():
    texts = [c.text for c in COMMANDS]
    wheres = {c.where.split(":")[0] for c in COMMANDS}
    assert len(COMMANDS) >= 60, len(COMMANDS)
    assert {"README.md", "docs/benchmarks.md", "docs/rules.md", "docs/server.md"} <= wheres
    # a backslash-continued command is one command
    assert any(t.startswith("specdec bench --dataset humaneval --limit 20 --max-new-tokens 128 --backend llama.cpp")
               and "--out" in t for t in texts)
    # after && in a shell line
    install = next(n for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
                   if "pip install" in line and "&& specdec generate" in line)
    assert any(c.where == f"README.md:{install}" and c.text.startswith("specdec generate") for c in COMMANDS)
    # a comment's "or: specdec ..." and an inline span wrapped over two lines
    assert "specdec serve --config tuned.json" in texts
    assert not any(t.startswith(("vllm", "lm_eval", "pip", "python")) for t in texts)


def test_extraction_rules():
    assert _commands_in('a && specdec generate "x | y" | head  # note') == ['specdec generate "x | y"']
    assert _words("specdec serve [--api-key KEY] [--policy lossless ...] < in.txt 2>&1") == \
        ["specdec", "serve", "--api-key", "x", "--policy", "lossless"]
    assert _words("specdec bench --out $OUT --data <bf16 gguf>") == ["specdec", "bench", "--out", "x", "--data", "x"]
    assert argvs("specdec generate PROMPT --a FILE\n|--b", ["generate"]) == \
        [["generate", "x", "--a", "x"], ["generate", "x", "--b"]]
    assert argvs("specdec COMMAND --help", ["generate", "bench"]) == [["generate", "--help"], ["bench", "--help"]]


def test_every_documented_specdec_command_parses():
    from specdec.cli import build_parser

    parser, fragment_parser = build_parser(), relaxed(build_parser())
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    subcommands = list(sub.choices)
    failures, checked = [], 0
    for c in COMMANDS:
        for argv in argvs(c.text, subcommands):
            checked += 1
            error = parse_error(fragment_parser if c.fragment else parser, argv)
            if error:
                failures.append(f"{c.where}: {c.text!r}\n    argv {argv}\n    {error}")
    print(f"{checked} argv lists from {len(COMMANDS)} documented commands")
    assert not failures, f"{len(failures)} documented command(s) do not parse:\n" + "\n".join(failures)


def test_the_check_catches_a_wrong_command():
    from specdec.cli import build_parser

    parser, fragment_parser = build_parser(), relaxed(build_parser())
    assert parse_error(parser, ["bench", "--dataset", "humaneval", "--out", "x", "--no-such-flag"])
    assert parse_error(parser, ["generate", "x", "--max-new-tokens", "many"])        # a type
    assert parse_error(parser, ["generate", "x", "--backend", "no-such-backend"])    # a choice
    assert parse_error(parser, ["bench", "--dataset", "humaneval"])                  # --out is required
    assert parse_error(parser, ["no-such-command"])
    # a fragment may leave out required arguments, nothing else
    assert parse_error(fragment_parser, ["bench", "--dataset", "humaneval"]) is None
    assert parse_error(fragment_parser, ["generate", "--max-new-tokens", "8"]) is None
    assert parse_error(fragment_parser, ["bench", "--no-such-flag"])
    assert parse_error(fragment_parser, ["generate", "--max-new-tokens", "many"])
    assert parse_error(parser, ["generate", "--help"]) is None


def test_the_layer_picture_is_the_codes():
    """docs/architecture.md's picture of the layers is what scripts/architecture_picture.py draws
    from today's imports, and every room sits in a layer no higher than the rooms that import it."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "scripts" / "architecture_picture.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    sys.path.insert(0, str(root / "scripts"))
    try:
        import architecture_picture as pic
    finally:
        sys.path.pop(0)
    layer = {room: i for i, (_, rooms) in enumerate(pic.LAYERS) for room in rooms}
    below = len(pic.LAYERS)
    for room, deps in pic.graph().items():
        for dep in deps if room != "__init__" else ():  # the package's face re-exports from every layer
            assert layer.get(dep, below) >= layer.get(room, below), f"{room} imports {dep}, a layer above it"


# ---------------------------------------------------------------------------- the release's reading
DISTRIBUTION = "specdec-rules"   # pyproject's [project] name: the name `specdec` on PyPI is another project's


def test_the_distribution_name_is_pyprojects():
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert meta["name"] == DISTRIBUTION
    assert meta["scripts"]["specdec"] == "specdec.cli:main"   # the command keeps its name
    assert all(x.startswith(f"{DISTRIBUTION}[") for x in meta["optional-dependencies"]["all"])


def test_no_documented_command_ends_in_an_ellipsis():
    """A printed command is complete: it never trails off in ``...`` (``[... ]`` included)."""
    bad = [f"{c.where}: {c.text}" for c in COMMANDS
           if re.search(r"(?<!\S)\.\.\.\]*$", c.text.split("\n|")[0].rstrip())]
    assert not bad, "commands that end in '...':\n" + "\n".join(bad)


PIP_INSTALL = re.compile(r"pip3?\s+install\s+")
# what a `pip install` line may install besides this project: the CPU torch pin and other projects
# named on purpose (lm-eval in its own environment, llama-cpp-python, openvino-genai and xllamacpp for a peer)
OTHER_PROJECTS = re.compile(r"^(torch==|lm-eval|llama-cpp-python|openvino-genai|xllamacpp)")
OPTIONS_WITH_VALUE = {"-r", "-c", "-w", "-f", "-i", "-t", "--find-links", "--extra-index-url", "--index-url",
                      "--target", "--constraint", "--requirement"}


def pip_install_targets(line: str) -> list[str]:
    """What each ``pip install`` in one line installs (its words that are not options), the
    command cut at a shell separator, a backtick or a comment."""
    out = []
    for m in PIP_INSTALL.finditer(line):
        rest = _split_top(line[m.end():].split("`")[0])[0].rstrip().rstrip("\\")
        try:
            words = shlex.split(rest, comments=True)
        except ValueError:
            words = rest.split()
        skip = False
        for w in words:
            if skip:
                skip = False
            elif w in OPTIONS_WITH_VALUE:
                skip = True
            elif not w.startswith("-"):
                out.append(w)
    return out


def _pip_installs() -> list[tuple[str, str, list[str]]]:
    found = []
    for path in DOCS + [ROOT / "CHANGELOG.md"]:
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if PIP_INSTALL.search(line):
                found.append((f"{rel}:{n}", line.strip(), pip_install_targets(line)))
    return found


def test_pip_install_targets():
    assert pip_install_targets("a && pip install -q -e '.[all]' && python -m pytest -q") == [".[all]"]
    assert pip_install_targets("`pip install 'specdec-rules[llama]'` (built)") == ["specdec-rules[llama]"]
    assert pip_install_targets("pip install --find-links dist 'specdec-rules[x]'  # note") == ["specdec-rules[x]"]
    assert pip_install_targets(".venv/bin/pip install torch==2.13.0 \\") == ["torch==2.13.0"]


def test_every_pip_install_names_the_distribution():
    """Every ``pip install`` in README.md, docs/ and CHANGELOG.md that installs this project names it
    ``specdec-rules[...]`` (what works outside this checkout, from PyPI or a wheel built from it), or
    installs this checkout itself (``-e '.[extras]'``, as the two commands on a fresh machine do); no
    line installs ``specdec`` (another project on PyPI)."""
    lines = _pip_installs()
    assert len(lines) >= 10, lines
    bad = []
    for where, text, targets in lines:
        for w in targets:
            ours = w == DISTRIBUTION or w.startswith(f"{DISTRIBUTION}[") or w == "." or w.startswith(".[") \
                or bool(WHEEL_PATH.match(w))
            if not ours and not OTHER_PROJECTS.match(w):
                bad.append(f"{where}: {text!r} installs {w!r}")
    assert not bad, "\n".join(bad)
    assert any(w.startswith(f"{DISTRIBUTION}[") for _, _, t in lines for w in t)


#: a wheel built from this checkout, installed by its path (``"$(echo dist/specdec_rules-*.whl)[llama]"``)
WHEEL_PATH = re.compile(r"^(\$\(echo )?dist/specdec_rules-[^/\s]*\.whl\)?(\[[\w,-]+\])?$")


def test_a_wheel_built_here_is_installed_by_its_path():
    """Outside the checkout the docs install the wheel built here by its path: installing
    ``specdec-rules`` by name with ``--find-links`` also searches PyPI, where a higher version
    published by anyone would win."""
    lines = _pip_installs()
    by_name = [f"{where}: {text}" for where, text, targets in lines
               if "--find-links" in text and any(w.startswith(DISTRIBUTION) for w in targets)]
    assert by_name == []
    assert any(WHEEL_PATH.match(w) for _, _, targets in lines for w in targets)
    assert WHEEL_PATH.match('$(echo dist/specdec_rules-*.whl)[models,llama]')
    assert not WHEEL_PATH.match("specdec-rules[models]")


def test_the_readme_fits_a_screenful_or_three():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, len(lines)
    top = "\n".join(lines[:60])
    assert "pip install" in top and "pytest" in top   # the two commands near the top


def test_every_benchmark_folder_is_in_the_index():
    """benchmarks/README.md lists every folder under benchmarks/ (and is what
    scripts/benchmarks_index.py writes from the folders' records)."""
    import subprocess
    import sys

    index = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| \[`([^`]+)`\]", index, flags=re.M))
    folders = {p.name for p in (ROOT / "benchmarks").iterdir() if p.is_dir()}
    assert folders - listed == set(), f"folders missing from benchmarks/README.md: {sorted(folders - listed)}"
    assert listed - folders == set(), f"rows for folders that do not exist: {sorted(listed - folders)}"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "benchmarks_index.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_bench_folder_row_names_its_bare_report_command():
    index = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    for p in (ROOT / "benchmarks").iterdir():
        if (p / "run.json").is_file():
            assert f"`specdec bench --report-only --out benchmarks/{p.name}`" in index, p.name


def test_ci_runs_the_readmes_test_command_verbatim():
    """.ci/run runs the README's second command (install and run the tests) as printed, from its
    first ``pip install`` on (the venv it makes itself)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    test_line = next(line for line in readme if "pip install" in line and "python -m pytest" in line)
    command = test_line[test_line.index("pip install"):]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in [line.strip() for line in ci], command
