"""The model's own sampling settings (its ``generation_config``) as the defaults of a request.

transformers' ``generate``, vLLM (``--generation-config auto``, its default) and OpenAI-compatible
servers built on them sample with the settings a model ships in ``generation_config.json``
(temperature, top_p, top_k, repetition_penalty) when a request names none. specdec does the same in
``Pair.generate``/``Pair.stream``/``Pair.chat``, ``specdec generate`` and ``specdec serve``. Layers,
lowest first (:func:`specdec.core.settings.layer`): specdec's built-in defaults
(:data:`specdec.core.request.DEFAULTS`: greedy), the model's settings, a ``--config`` file, then what the
call or request gives. ``specdec bench`` and ``tune``
keep their own defaults (greedy, seeded) so that runs compare and repeat.

Where the settings come from (:func:`resolve`): ``"auto"``: a bundled model's published settings
(:attr:`specdec.models.bundled.Bundled.generation`), else the ``generation_config.json`` of a Hugging Face
model folder; a GGUF file carries none. ``"specdec"``: none (greedy, as before; vLLM calls this
``--generation-config vllm``). A path: that ``generation_config.json`` (or the folder holding it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from ..errors import SpecdecError

#: the request fields a model's generation_config may set
KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")
AUTO, NONE = "auto", "specdec"
CHOICES = (AUTO, NONE)


def from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling defaults a ``generation_config.json``'s content sets: only the keys it holds
    (transformers' class defaults are not the model's choice). ``do_sample: false`` means greedy,
    whatever temperature it also names; a repetition penalty applies either way, as in transformers."""
    out: dict[str, Any] = {}
    sample = data.get("do_sample")
    if sample is False:
        out["temperature"] = 0.0
    elif "temperature" in data and data["temperature"] is not None:
        out["temperature"] = float(data["temperature"])
    if sample is not False:
        if data.get("top_p") is not None:
            out["top_p"] = float(data["top_p"])
        if data.get("top_k") is not None:
            out["top_k"] = int(data["top_k"])
    if data.get("repetition_penalty") is not None and float(data["repetition_penalty"]) != 1.0:
        out["repetition_penalty"] = float(data["repetition_penalty"])
    return out


def from_file(path: str | Path) -> dict[str, Any]:
    """:func:`from_json` of a ``generation_config.json`` file, or of the one in a folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "generation_config.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecdecError(f"generation config {str(p)!r} does not exist; give 'auto', 'specdec' or a "
                           "generation_config.json (or the folder holding one)") from None
    except (OSError, ValueError) as exc:
        raise SpecdecError(f"generation config {str(p)!r} is unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise SpecdecError(f"generation config {str(p)!r} is not a JSON object")
    return from_json(data)


def of_model(source: str | None) -> tuple[dict[str, Any], str]:
    """``(settings, where from)`` for a model source (a bundled name, a folder, a GGUF file), read
    without loading the model: nothing for a source that ships none."""
    from .bundled import BUNDLED
    from .sources import split_format

    if source is None:
        return {}, "none"
    name = split_format(str(source))[0]
    if name in BUNDLED and BUNDLED[name].generation:
        return dict(BUNDLED[name].generation), f"{name}'s published generation_config"
    folder = Path(str(name)).expanduser()
    if folder.is_dir() and (folder / "generation_config.json").is_file():
        return from_file(folder), f"{folder / 'generation_config.json'}"
    return {}, "the model ships no sampling settings"


def resolve(choice: str | os.PathLike | None, target: str | None) -> tuple[dict[str, Any], str]:
    """``(settings, why)`` for ``generation_config=choice`` (``auto``, ``specdec`` or a path) and
    the target model's source."""
    if choice is None or choice == AUTO:
        return of_model(target)
    if choice in (NONE, "vllm", "none"):
        return {}, "specdec's defaults (asked)"
    if not isinstance(choice, (str, Path)):
        raise SpecdecError(f"generation_config must be 'auto', 'specdec' or a path, got {choice!r}")
    return from_file(choice), str(choice)


def describe(settings: Mapping[str, Any], why: str) -> str:
    """One line for a startup message."""
    if not settings:
        return f"sampling defaults: greedy ({why})"
    shown = ", ".join(f"{k} {settings[k]:g}" for k in KEYS if k in settings)
    return f"sampling defaults: {shown} ({why}; a request's own values win)"


__all__ = ["AUTO", "CHOICES", "KEYS", "NONE", "describe", "from_file", "from_json", "of_model", "resolve"]
