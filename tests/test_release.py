"""The release's files: the wheel built from this checkout installs as ``specdec-rules`` with the
version, extras, licence, command and package data the docs promise, and every
``specdec-rules[EXTRA]`` the docs and the code's install hints name is an extra of that wheel.

The wheel is built from a copy of the distribution's files (pyproject.toml, README.md, LICENSE,
src/), so building writes nothing into the checkout. Without build isolation when this environment's
setuptools is new enough (as pyproject asks), else with it (pip fetches setuptools)."""

from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "specdec-rules"
EXTRAS = {"models", "llama", "bench", "server", "structured", "test", "peers", "vllm", "vllm-cuda", "all"}


def _setuptools_recent() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:1]) >= (68,)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("dist-src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    if _setuptools_recent():
        cmd.insert(4, "--no-build-isolation")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.message_from_string(z.read(name).decode("utf-8"))


def test_the_wheel_is_specdec_rules_at_the_package_version(wheel):
    import specdec

    meta = _metadata(wheel)
    assert wheel.name.startswith("specdec_rules-")
    assert meta["Name"] == DISTRIBUTION
    pyproject = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"), flags=re.M)
    assert meta["Version"] == specdec.__version__ == pyproject.group(1)
    assert "Apache-2.0" in (meta.get("License-Expression") or meta.get("License") or "")
    assert set(meta.get_all("Provides-Extra")) == EXTRAS
    requires = meta.get_all("Requires-Dist")
    # `all` pulls the other extras through the distribution's own name
    assert any(r.startswith(f"{DISTRIBUTION}[") and 'extra == "all"' in r for r in requires), requires
    assert any(r.startswith("llama-cpp-python==") and 'extra == "llama"' in r for r in requires)


def test_the_wheel_carries_the_command_the_licence_and_the_data(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "specdec = specdec.cli:main" in entry                  # the command keeps its name
    assert "specdec = specdec.frontends.vllm.plugin:register" in entry  # vLLM's plugin entry point
    assert any(re.search(r"\.dist-info/(licenses/)?LICENSE$", n) for n in names), names
    for data in ("specdec/bench/tasks/data/spec_bench/question.jsonl", "specdec/bench/tasks/data/spec_bench/LICENSE",
                 "specdec/bench/tasks/data/json_extraction.json",
                 "specdec/bench/scoring/sandbox_child.py"):  # run by path inside the sandbox
        assert data in names
    assert "specdec/cli.py" in names and not any(n.startswith(("tests/", "benchmarks/")) for n in names)


def test_every_named_extra_exists():
    """`specdec-rules[EXTRA]` in README.md, docs/ and the install hints in src/ names an extra."""
    named = {}
    for path in [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md"),
                 *(ROOT / "src").rglob("*.py")]:
        for m in re.finditer(rf"{DISTRIBUTION}\[([^\]]+)\]", path.read_text(encoding="utf-8")):
            for extra in m.group(1).split(","):
                named.setdefault(extra.strip(), path.relative_to(ROOT).as_posix())
    assert named, "no install line names the distribution"
    unknown = {e: where for e, where in named.items() if e not in EXTRAS and e != "EXTRA"}
    assert not unknown, unknown


def test_no_install_hint_names_the_other_project():
    """`pip install specdec` / `specdec[...]` installs an unrelated project from PyPI."""
    from test_docs_commands import pip_install_targets

    bad = []
    paths = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "src").rglob("*.py")]
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for w in pip_install_targets(line):
                if re.match(r"^specdec(\[[^\]]*\])?$", w.strip("'\"()")):
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def test_the_changelog_opens_with_this_version():
    """Its first section is this version's, or an "Unreleased" one (changes since) right before it; a
    development version (``X.Y.Z.devN``, what a checkout past a release carries) opens with
    "Unreleased", and its release is newer than the last one listed."""
    import specdec

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (\S+)", text, flags=re.M)
    released = sections[1:] if sections[:1] == ["Unreleased"] else sections
    assert "Unreleased" not in released
    if ".dev" in specdec.__version__:
        def parts(v):
            return tuple(int(x) for x in v.split(".dev")[0].split("."))
        assert sections[:1] == ["Unreleased"], sections[:2]
        assert released and parts(specdec.__version__) > parts(released[0]), (specdec.__version__, released[0])
    else:
        assert released and released[0] == specdec.__version__, sections[:2]
