"""Backends: what runs a model. One model interface (:class:`Model`, :mod:`specdec.models.backends.base`),
one backend contract and table (:class:`Backend`, :data:`REGISTRY`, :mod:`specdec.models.backends.registry`)
and its entries, each a package holding all of its backend: ``llama.cpp``
(:mod:`specdec.models.backends.llamacpp`) and ``transformers`` (:mod:`specdec.models.backends.transformers`).
Importing this package imports neither library."""

from __future__ import annotations

from .base import Capabilities, Model, Scores, TreeState, common_prefix
from .registry import (AUTO, REGISTRY, Backend, Costs, Loaded, Request, check_same_vocabulary, resolve_device,
                       stderr_log)


def check_backend(name) -> str:
    """``auto`` or a registered backend's name (aliases such as ``llama-cpp`` and ``hf`` accepted);
    else a one-line error listing the choices."""
    return REGISTRY.canonical(name)


__all__ = ["AUTO", "Backend", "Capabilities", "Costs", "Loaded", "Model", "REGISTRY", "Request", "Scores", "TreeState",
           "check_backend", "check_same_vocabulary", "common_prefix", "resolve_device", "stderr_log"]
