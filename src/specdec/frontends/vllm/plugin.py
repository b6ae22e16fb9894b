"""The ``vllm.general_plugins`` entry point (``specdec = specdec.frontends.vllm.plugin:register`` in
pyproject.toml). vLLM calls it in every process it starts (the caller's, the engine core, each
worker), possibly more than once; it installs :mod:`specdec.frontends.vllm.patch` once per process."""

from __future__ import annotations


def register() -> None:
    from .patch import install

    install()
