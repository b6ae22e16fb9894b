"""How the transformers backend runs a model's passes: on transformers' dynamic KV cache (the
default on a CPU), or on the static cache (:mod:`specdec.models.backends.transformers.static`) with its
short passes captured as CUDA graphs (:mod:`specdec.models.backends.transformers.graphs`; the default on
CUDA), chosen by the load options ``static_cache`` and ``cuda_graphs`` and the device, and said on
the startup line with the reason when a faster path is off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....errors import SpecdecError
from .graphs import MAX_GRAPH_WIDTH, WidthGraphs
from .model import HFModel
from .static import StaticHFModel, static_fingerprint, static_refusal

#: the values of the options ``static_cache`` and ``cuda_graphs``
SWITCHES = ("auto", "on", "off")


def switch(where: str, value) -> str:
    """``auto``, ``on`` or ``off`` (also True/False, ``true``/``false``); else a one-line error."""
    if isinstance(value, bool):
        return "on" if value else "off"
    text = str(value).strip().lower() if isinstance(value, str) else None
    text = {"true": "on", "false": "off"}.get(text or "", text)
    if text not in SWITCHES:
        raise SpecdecError(f"{where} must be one of {', '.join(SWITCHES)}, got {value!r}")
    return text


@dataclass(frozen=True)
class Execution:
    """A model's way of running: ``static`` (the static KV cache), ``graph_width`` (passes of up to
    this many tokens replayed as CUDA graphs; 0: none) and ``why`` (the startup line's words)."""

    static: bool = False
    graph_width: int = 0
    why: str = "dynamic KV cache"
    #: the option was ``on`` (a model the static cache cannot hold is then an error, not a fallback)
    required: bool = False
    #: the fused step compiled (``torch.compile``) inside the graphs (``compile_step=on``)
    compiled: bool = False

    def for_config(self, config) -> "Execution":
        """This plan for a model with ``config``: the dynamic cache, and why, when the static cache
        cannot hold it (an error when ``static_cache=on`` asked for it)."""
        if not self.static:
            return self
        refusal = static_refusal(config)
        if refusal is None:
            return self
        if self.required:
            raise SpecdecError(f"static_cache=on: {refusal}; use static_cache=off")
        return Execution(why=f"dynamic KV cache ({refusal})")

    def step_kind(self) -> str:
        """The step this plan runs where the fused step can: ``fused`` or ``fused+compiled``."""
        return "fused+compiled" if self.compiled else "fused"

    def fingerprint(self) -> dict:
        """What this way of running adds to a cost table's fingerprint (nothing for the dynamic
        cache: its tables keep their old key)."""
        return static_fingerprint(self.graph_width, self.step_kind()) if self.static else {}

    def wrap(self, model: torch.nn.Module, name: str, vocab_limit: int | None = None) -> HFModel:
        """``model`` as a :class:`~specdec.models.backends.base.Model` run this way."""
        if not self.static:
            return HFModel(model, name, vocab_limit=vocab_limit)
        graphs = None
        if self.graph_width:
            def graphs(step, device):
                return WidthGraphs(step, device, max_width=self.graph_width)
        return StaticHFModel(model, name, vocab_limit=vocab_limit, graphs=graphs, compile_step=self.compiled)


def choose_execution(static_cache="auto", cuda_graphs="auto", device: torch.device | str = "cpu",
                     compile_step="auto") -> Execution:
    """The plan for the options on ``device``: ``auto`` is the static cache and CUDA graphs on CUDA
    and the dynamic cache elsewhere; ``on`` asks for it (CUDA graphs need a CUDA device and the static
    cache: asking for them otherwise is a one-line error); ``off`` turns it off. ``compile_step``:
    ``on`` compiles the static cache's fused step (``torch.compile``, about 15-25 s per pass width
    at its first use on an H200); ``auto`` is off (the compile time is paid at every start)."""
    static, graphs = switch("static_cache", static_cache), switch("cuda_graphs", cuda_graphs)
    compiled = switch("compile_step", compile_step) == "on"
    if compiled and static == "off":
        raise SpecdecError("compile_step=on compiles the static KV cache's step, but static_cache=off was given")
    kind = torch.device(device).type
    if graphs == "on" and kind != "cuda":
        raise SpecdecError(f"cuda_graphs=on needs a CUDA device, not {kind}; use static_cache=on for the static cache alone")
    if graphs == "on" and static == "off":
        raise SpecdecError("cuda_graphs=on needs the static KV cache, but static_cache=off was given")
    use_static = static == "on" or (static == "auto" and (kind == "cuda" or graphs == "on"))
    if not use_static and compiled:
        raise SpecdecError(f"compile_step=on needs the static KV cache: on {kind} give static_cache=on too")
    if not use_static:
        why = "static_cache=off" if static == "off" else f"on {kind} the static cache is off unless static_cache=on"
        return Execution(why=f"dynamic KV cache ({why})")
    use_graphs = kind == "cuda" and graphs != "off"
    if use_graphs:
        why = f"static KV cache, CUDA graphs for passes of up to {MAX_GRAPH_WIDTH} tokens"
    else:
        why = "static KV cache, " + ("CUDA graphs off (cuda_graphs=off)" if graphs == "off" else "no CUDA graphs (they need CUDA)")
    why += ", the step compiled" if compiled else ""
    return Execution(True, MAX_GRAPH_WIDTH if use_graphs else 0, why, required=static == "on", compiled=compiled)


def describe(executions: dict[str, Execution | None]) -> str:
    """One phrase for the models' ways of running (one per role when they differ)."""
    whys = {role: e.why for role, e in executions.items() if e is not None}
    if len(set(whys.values())) <= 1:
        return next(iter(whys.values()), "")
    return "; ".join(f"{role}: {why}" for role, why in whys.items())
