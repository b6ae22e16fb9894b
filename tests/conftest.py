"""Shared fixtures: tiny random models saved as real Hugging Face folders (no downloads)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import specdec
from tinymodels import save_tiny_pair

torch.set_num_threads(1)  # tiny models: threads only add overhead and noise


def pytest_sessionstart(session):
    """Under SPECDEC_REQUIRE_LLAMA=1 (CI) the llama.cpp backend's tests must run, not skip."""
    import importlib.util
    import os

    if os.environ.get("SPECDEC_REQUIRE_LLAMA") == "1" and importlib.util.find_spec("llama_cpp") is None:
        raise pytest.UsageError("SPECDEC_REQUIRE_LLAMA=1, but llama-cpp-python is not installed: "
                                "pip install 'specdec-rules[llama]'")


def pytest_collection_modifyitems(session, config, items):
    """The order pytest-xdist hands the files to its workers under ``-n 2 --dist loadfile
    --no-loadscope-reorder``: the longest first, so that no long file starts when the rest is done.
    The end-to-end tests (on a fresh machine they assemble, convert and measure the real pair), then
    the files with statistical or long tests (``slow``), most of those first, then the others; each
    file's tests keep their order."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: (item.get_closest_marker("e2e") is None, -slow[item.path]))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """(target_dir, draft_dir): a tiny random Qwen2 and a perturbed copy, with a byte tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    return save_tiny_pair(root)


@pytest.fixture(scope="session")
def tiny_pair(tiny_dirs):
    target, draft = tiny_dirs
    return specdec.load(str(target), draft=str(draft), dtype="float32", device="cpu", progress=False)


@pytest.fixture(autouse=True)
def _isolated_home(request, tmp_path, monkeypatch):
    """Each test gets its own $SPECDEC_HOME, except e2e tests, which use the real model cache."""
    if request.node.get_closest_marker("e2e") is None:
        monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "specdec_home"))
