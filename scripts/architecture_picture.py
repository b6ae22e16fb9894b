"""Draw the picture of specdec's layers in docs/architecture.md from the code's own imports.

Each line is one top-level module or package of ``src/specdec``, in its layer, and the others it
imports (at module level or inside functions). The picture sits in docs/architecture.md between
the two marker lines; tests/test_docs_commands.py checks it is the one the code gives today.

    python scripts/architecture_picture.py           # rewrite the picture in docs/architecture.md
    python scripts/architecture_picture.py --check   # exit 1 when it is out of date
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "specdec"
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- layers: drawn by scripts/architecture_picture.py -->"
END = "<!-- end of layers -->"

#: top to bottom: a room may import its own layer and those below it, never one above (tested)
LAYERS = [
    ("commands", ["cli", "__main__"]),
    ("callers of the engine", ["bench", "server", "vllm"]),
    ("shared flags", ["cliargs"]),
    ("the library's face", ["api", "configfile", "genconfig", "settings"]),
    ("the loop", ["engine", "scopes", "autok", "request", "drafters", "verify", "constrain", "logprobs", "text", "stats"]),
    ("what runs models", ["draft_formats", "backends", "costmodel", "acceptance", "replay", "trace", "trace_checks", "sources", "bundled",
                          "cache"]),
]


def room_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0] if parts[0] != "__init__" else "__init__"


def imported_rooms(path: Path) -> set[str]:
    """The top-level specdec modules and packages ``path`` imports, anywhere in the file."""
    rel = path.relative_to(SRC).with_suffix("").parts
    package = list(rel[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            dotted = [*base, *(node.module.split(".") if node.module else [])]
            names = [dotted[0]] if dotted else [a.name for a in node.names]
            out.update(names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("specdec."):
            out.add(node.module.split(".")[1])
    return out


def graph() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        room = room_of(path)
        rooms.setdefault(room, set()).update(imported_rooms(path))
    known = set(rooms)
    return {room: {d for d in deps if d in known and d != room} for room, deps in rooms.items()}


def picture() -> str:
    g = graph()
    placed = {room for _, rooms in LAYERS for room in rooms}
    rest = sorted(r for r in g if r not in placed and r != "__init__")
    lines = []
    for title, rooms in [*LAYERS, ("the rest (errors, checks, sampling, ...)", rest)]:
        lines.append(f"{title}:")
        for room in rooms:
            if room in g:
                deps = ", ".join(sorted(g[room])) or "-"
                lines.append(f"  {room:<14s} -> {deps}")
    return "\n".join(lines)


def block() -> str:
    return f"{BEGIN}\n```\n{picture()}\n```\n{END}"


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        print(f"{DOC}: no picture markers ({BEGIN} ... {END})", file=sys.stderr)
        return 2
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    new = head + block() + tail
    if "--check" in argv:
        if new != text:
            print("docs/architecture.md: the layer picture is out of date; run python scripts/architecture_picture.py",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
