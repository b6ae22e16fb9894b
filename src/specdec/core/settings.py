"""A request's settings, layered in one place: :func:`layer`, called by the Python API
(``Pair.generate``/``Pair.stream``), the CLI (``specdec generate``/``serve``'s flags) and the
server (its defaults, and each request over them) alike.

The layers, lowest first:

1. the built-in defaults (:data:`specdec.core.request.DEFAULTS`, or a front end's own where it has one:
   the server's budget is its ``max_tokens`` limit). The default drafter is the portfolio
   (``auto``) whether or not a draft model is loaded: the draft model is one of its sources when
   it is, so no default depends on the loaded pair;
2. the model's sampling settings (its generation config, :mod:`specdec.models.genconfig`);
3. a config file (:mod:`specdec.core.configfile`, as ``specdec tune`` writes), or the server's own
   defaults under a request (``base``);
4. the caller's values: keywords, flags given, a request's fields.

Layers 3 and 4 meet by :func:`specdec.core.request.overlay` (naming another policy drops the lower
layer's policy parameters, another drafter its drafter options); layers 1 and 2 fill what neither
names. The result is loose options: :meth:`specdec.core.request.DecodeConfig.from_options` validates
them once, where the request is built.
"""

from __future__ import annotations

import os
from types import MappingProxyType
from typing import Any, Mapping

from .configfile import read_config
from .request import DEFAULTS, overlay

#: no options (a default that nothing can change)
NONE: Mapping[str, Any] = MappingProxyType({})


def layer(given: Mapping[str, Any] = NONE, *, model: Mapping[str, Any] = NONE,
          config_file: str | os.PathLike | None = None, base: Mapping[str, Any] | None = None,
          max_new_tokens: int | None = None) -> dict[str, Any]:
    """The loose request options of the caller's values ``given`` over a config file's
    (``config_file``, read here) or the server's defaults (``base``), over the model's sampling
    settings (``model``), over the built-in defaults (module docstring); ``max_new_tokens``: a
    front end's own default budget (the server's: its ``max_tokens`` limit), else DEFAULTS'."""
    if base is not None and config_file is not None:
        raise ValueError("layer() takes a config file or a base, not both")
    lower = read_config(config_file) if config_file is not None else dict(base or NONE)
    out = overlay(lower, given)
    defaults = dict(DEFAULTS) if max_new_tokens is None else {**DEFAULTS, "max_new_tokens": max_new_tokens}
    for key, value in {**defaults, **model}.items():
        out.setdefault(key, value)
    return out


__all__ = ["layer"]
