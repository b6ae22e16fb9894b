"""Backends: what runs a model. One interface (:class:`Model`, :mod:`specdec.backends.base`) and its
implementations: ``transformers`` (:mod:`specdec.backends.hf`) and ``llama.cpp``
(:mod:`specdec.backends.llamacpp`). Importing this package imports neither library."""

from __future__ import annotations

from ..errors import SpecdecError
from .base import Capabilities, Model, Scores, TreeState, common_prefix

#: the backends ``specdec.load(backend=...)`` accepts, besides ``auto``
BACKENDS = ("transformers", "llama.cpp")
AUTO = "auto"
#: the optional dependency each backend needs beyond specdec's own, and the extra that installs it
NEEDS = {"llama.cpp": ("llama_cpp", "pip install 'specdec[llama]'")}


def check_backend(name) -> str:
    """``auto``, ``transformers`` or ``llama.cpp`` (``llama-cpp``/``llamacpp`` accepted); else a one-line error."""
    if isinstance(name, str):
        text = name.strip().lower()
        text = {"llama-cpp": "llama.cpp", "llamacpp": "llama.cpp", "hf": "transformers"}.get(text, text)
        if text in (AUTO, *BACKENDS):
            return text
    raise SpecdecError(f"unknown backend {name!r}; choose one of: {AUTO}, {', '.join(BACKENDS)}")


def available(backend: str) -> bool:
    """Whether ``backend``'s library can be imported here (without importing it)."""
    import importlib.util

    need = NEEDS.get(backend)
    return need is None or importlib.util.find_spec(need[0]) is not None


def require(backend: str) -> None:
    """A one-line error naming the extra to install when ``backend``'s library is missing."""
    if not available(backend):
        module, hint = NEEDS[backend]
        raise SpecdecError(f"backend {backend!r} needs the Python package {module!r}, which is not installed: {hint} "
                           "(it builds llama.cpp from source, ~8 minutes on 2 cores)")


__all__ = ["AUTO", "BACKENDS", "Capabilities", "Model", "Scores", "TreeState", "available", "check_backend", "common_prefix",
           "require"]
