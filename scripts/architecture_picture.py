"""Draw the picture of specdec's folders in docs/architecture.md from the code's own imports.

Each line is one top-level module or package of ``src/specdec`` (or of one of its folders: core/,
models/, traces/, frontends/), under its folder, and the others it imports (at module level or inside
functions). The picture sits in docs/architecture.md between the two marker lines;
tests/test_docs_commands.py checks it is the one the code gives today.

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

#: the folders that group modules (a room in one is named without it: core/engine.py is ``engine``)
FOLDERS = ("core", "models", "traces", "frontends")
#: the modules at the top that every folder may import
FOUNDATION = ["errors", "checks", "draftlength"]
#: top to bottom: a folder may import itself and the folders below it (and the foundation), never one
#: above (tested: tests/test_structure.py); a folder's name: its own modules and packages
SECTIONS = [
    ("commands (import anything)", ["cli", "__main__"]),
    ("bench/ (imports all but the commands)", ["bench"]),
    ("frontends/ (imports traces/, core/, models/, the foundation)", "frontends"),
    ("traces/ (imports core/, models/, the foundation)", "traces"),
    ("core/ (imports models/, the foundation)", "core"),
    ("models/ (imports the foundation)", "models"),
    ("the foundation (imports only itself)", FOUNDATION),
]


def room_of(parts: list[str] | tuple[str, ...]) -> str | None:
    """The room of a module's dotted parts (relative to the package): its top-level name, or inside a
    folder its name there; ``None`` for a folder itself."""
    if parts and parts[0] in FOLDERS:
        return parts[1] if len(parts) > 1 else None
    return parts[0] if parts else None


def folder_rooms(folder: str) -> list[str]:
    """The modules and packages in one of :data:`FOLDERS`, sorted."""
    return sorted(p.stem if p.suffix == ".py" else p.name for p in (SRC / folder).iterdir()
                  if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file())


#: the sections of the picture, top to bottom, each with its rooms
LAYERS = [(title, folder_rooms(rooms) if isinstance(rooms, str) else rooms) for title, rooms in SECTIONS]


def imported_rooms(path: Path) -> set[str]:
    """The rooms ``path`` imports, anywhere in the file."""
    rel = path.relative_to(SRC).with_suffix("").parts
    package = list(rel[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            dotted = [*base, *(node.module.split(".") if node.module else [])]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "specdec":
            dotted = node.module.split(".")[1:]
        elif isinstance(node, ast.Import):
            out.update(room_of(a.name.split(".")[1:]) or "" for a in node.names if a.name.startswith("specdec."))
            continue
        else:
            continue
        if not dotted or (len(dotted) == 1 and dotted[0] in FOLDERS):  # from .. import x, from ..core import x
            out.update(a.name for a in node.names)
        else:
            out.add(room_of(dotted))
    return out


def graph() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        room = room_of(path.relative_to(SRC).with_suffix("").parts)
        if room is None or room == "__init__":
            continue
        rooms.setdefault(room, set()).update(imported_rooms(path))
    known = set(rooms)
    return {room: {d for d in deps if d in known and d != room} for room, deps in rooms.items()}


def picture() -> str:
    g = graph()
    placed = {room for _, rooms in LAYERS for room in rooms}
    rest = sorted(r for r in g if r not in placed)
    lines = []
    for title, rooms in [*LAYERS, *([("in no folder", rest)] if rest else [])]:
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
