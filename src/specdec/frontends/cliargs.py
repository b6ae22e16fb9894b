"""The flags every command shares (models, decoding, loose rules) and how they become a loaded
pair and request parameters. ``specdec.cli``, ``specdec.bench.running.command`` and ``specdec.frontends.server.cli``
import from here; this module imports no command (no cycles: every CLI imports down)."""

from __future__ import annotations

import argparse
from typing import Any

from ..models.bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET
from ..checks import options_of
from ..core.drafters import ALL_DRAFTER_OPTIONS, DRAFTERS
from ..models import genconfig
from ..core.request import DEFAULTS, DecodeConfig
from ..core.settings import layer
from ..core.verify import POLICIES, RULES
from ..core.verify.schedule import Schedule

LOW_TAU = 1.3  # below this, speculation rarely pays for the draft's cost

#: flags that vLLM (``vllm serve``) names otherwise: vLLM's name is the flag, specdec's older name an
#: alias that keeps working. The one list: every command adds these flags through :func:`flag_names`.
VLLM_NAMES = {
    "--context-length": "--max-model-len",
    "--allow-origin": "--allowed-origins",
}


def flag_names(name: str) -> tuple[str, ...]:
    """The names a flag is added under: vLLM's first where it has its own (:data:`VLLM_NAMES`), then ours."""
    return (VLLM_NAMES[name], name) if name in VLLM_NAMES else (name,)


def backend_arg(text: str) -> str:
    """``--backend``: a checked backend name (argparse reports a bad one in one line)."""
    from ..models.backends import check_backend
    from ..errors import SpecdecError

    try:
        return check_backend(text)
    except SpecdecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model flags: the sources, the backend, the device, and every backend's load options as
    its entry declares them (``Backend.Options``: the flag, its values and help, the owner named)."""
    from ..models.backends import REGISTRY

    g = p.add_argument_group("models")
    g.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target model: a bundled name ({', '.join(BUNDLED)}), a Hugging Face folder, "
                        f"a .gguf file or a hub id (default: {DEFAULT_TARGET})")
    g.add_argument("--draft", default="auto",
                   help="draft model, same forms as --target; 'none' for no draft model; 'auto' (default) "
                        f"picks {DEFAULT_DRAFT} for the bundled target and none otherwise")
    g.add_argument("--backend", default="auto", type=backend_arg,
                   help="what runs the models: auto (default: llama.cpp for GGUF models on a CPU when "
                        f"llama-cpp-python is installed, else transformers), or one of: {', '.join(REGISTRY.names())}")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    for name, (spec, default) in REGISTRY.options().items():
        shape: dict[str, Any] = {"choices": list(spec.choices)} if spec.choices else {"type": spec.kind, "metavar": "N"}
        if spec.kind is bool:  # --name / --no-name
            shape = {"action": argparse.BooleanOptionalAction}
        g.add_argument(*flag_names(f"--{name.replace('_', '-')}"), dest=name, default=default,
                       help=f"{REGISTRY.owner(name)} backend: {spec.help}", **shape)
    g.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="do not measure the cost model (dtype auto is then bfloat16 and -k auto is k=5); "
                        "measurements are cached per machine, so this only saves the first load")


def shown(value) -> str:
    """A default as help text shows it."""
    return "random" if value is None else str(value)


def add_decode_args(p: argparse.ArgumentParser) -> None:
    """The decoding flags. Their argparse default is None (= not given), so that :func:`decode_kwargs`
    can layer them (:func:`specdec.core.settings.layer`). The help shows the built-in defaults from
    :data:`specdec.core.request.DEFAULTS`."""
    d = DEFAULTS
    g = p.add_argument_group("decoding")
    g.add_argument("--config", default=None, metavar="FILE",
                   help="decoding settings from a JSON file (as 'specdec tune' writes); flags given next to it "
                        "override its values")
    g.add_argument("--policy", default=None,
                   help=f"verification policy: {', '.join(POLICIES)}, or loose rules joined with '+' "
                        f"(default: {d['policy']}); 'ar' is plain decoding, 'lossless' and 'block' are exact")
    g.add_argument("--drafter", default=None,
                   help=f"{' | '.join(DRAFTERS)} (default: {d['drafter']}: per round the draft model, prompt lookup or "
                        "suffix, whichever pays most, or a plain step; model+pld: the draft model sped up by pld)")
    g.add_argument("-k", "--k", default=None, metavar="K",
                   help="draft tokens per round, or 'auto': each round picks the K (0 = a plain decoding step) "
                        "with the most expected tokens per second from the measured cost model and the "
                        f"acceptance seen so far; with a tree drafter, the tree's depth limit, as --tree-depth "
                        f"('auto': the tree's own, e.g. up to --tree-nodes) (default: {d['k']})")
    g.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"generation budget (default: {d['max_new_tokens']})")
    g.add_argument("--generation-config", default=genconfig.AUTO, metavar="auto|specdec|PATH",
                   help="where the sampling defaults come from, as vLLM's flag: auto = the model's own (the "
                        "bundled pair's published settings: temperature 0.7, top-p 0.8, top-k 20, repetition "
                        "penalty 1.05; a Hugging Face folder's generation_config.json; none for a bare GGUF "
                        "file), specdec = greedy with no penalty, or a generation_config.json; the flags below "
                        "and a --config file win over it (default: auto)")
    g.add_argument("--temperature", type=float, default=None,
                   help=f"0 = greedy; below 1e-5 is greedy too (default: the model's, see --generation-config; "
                        f"else {d['temperature']:g})")
    g.add_argument("--top-p", type=float, default=None,
                   help=f"nucleus sampling mass in (0, 1]; the most likely token is always kept (default: the model's, else {d['top_p']}"
                        f"{' = off' if d['top_p'] == 1.0 else ''})")
    g.add_argument("--top-k", type=int, default=None,
                   help=f"keep the k most likely tokens (default: the model's, else {d['top_k']}{' = off' if d['top_k'] == 0 else ''})")
    g.add_argument("--seed", type=int, default=None, help=f"seed for sampling (default: {shown(d['seed'])})")
    g.add_argument("--repetition-penalty", type=float, default=None,
                   help="divide the logits of tokens in the prompt or the answer by this when positive, multiply "
                        f"when negative, as transformers and vLLM do (default: the model's, else {d['repetition_penalty']:g} = off)")
    g.add_argument("--presence-penalty", type=float, default=None,
                   help="subtract this from the logits of tokens the answer holds, in [-2, 2] as OpenAI's "
                        f"(default: {d['presence_penalty']:g} = off)")
    g.add_argument("--frequency-penalty", type=float, default=None,
                   help="subtract this times a token's count in the answer from its logit, in [-2, 2] as "
                        f"OpenAI's (default: {d['frequency_penalty']:g} = off)")
    for name, (spec, owners) in drafter_flags().items():
        defaults = ", ".join(f"{d} for {o}" for o, d in owners if d is not None)  # None: its help says
        g.add_argument(f"--{name.replace('_', '-')}", type=spec.parse if spec.words or spec.kind is bool else spec.kind,
                       default=None, help=f"{spec.help} (default: {defaults})" if defaults else spec.help)
    r = p.add_argument_group(
        "loose rules (lossy: output may differ from the target's; combine with '+', e.g. --policy fly+mars)")
    for param, (spec, default) in options_of(Schedule).items():  # every loose policy's, unprefixed
        r.add_argument(f"--{param.replace('_', '-')}", type=spec.kind, default=None,
                       help=f"{spec.help} (default: {default})")
    for rule, cls in RULES.items():
        for param, (spec, default) in options_of(cls).items():
            extra: dict[str, Any] = {"choices": list(spec.choices)} if spec.choices else {}
            r.add_argument(f"--{rule}-{param}", type=spec.kind, default=None,
                           help=f"{rule}: {spec.help} (default: {default})", **extra)


def drafter_flags() -> dict:
    """``{option: (spec, [(drafter, default), ...])}`` over every drafter's declared options."""
    out: dict = {}
    for drafter, cls in DRAFTERS.items():
        for name, (spec, default) in options_of(cls.Options).items():
            out.setdefault(name, (spec, []))[1].append((drafter, default))
    return out


def decode_kwargs(a: argparse.Namespace, max_new_tokens: int | None = None, more: dict | None = None) -> dict:
    """Request keywords from the flags given (and ``more`` of them: generate's structured-output
    flags), layered by :func:`specdec.core.settings.layer` over ``--config FILE``, the model's sampling
    settings (``--generation-config``, :mod:`specdec.models.genconfig`; generate and serve only) and the
    built-in defaults (``max_new_tokens``: the command's own default budget, else the library's)."""
    model = genconfig.resolve(a.generation_config, a.target)[0] if hasattr(a, "generation_config") else {}
    return layer({**flags_given(a), **(more or {})}, model=model, config_file=getattr(a, "config", None) or None,
                 max_new_tokens=max_new_tokens)


def flags_given(a: argparse.Namespace) -> dict:
    """The decoding flags given (not None): request fields, drafter options, rule parameters."""
    names = [*DEFAULTS, *ALL_DRAFTER_OPTIONS, *options_of(Schedule)]
    names += [f"{rule}_{param}" for rule, cls in RULES.items() for param in options_of(cls)]
    return {name: getattr(a, name) for name in names if getattr(a, name) is not None}


def draft_flag(a: argparse.Namespace) -> str | None:
    """``--draft`` as :func:`specdec.load` takes it (``none``: None)."""
    return None if a.draft == "none" else a.draft


def draft_of(a: argparse.Namespace) -> str | None:
    """The draft model the model flags load (None: none), known before anything loads."""
    from ..models.sources import resolve_draft

    return resolve_draft(a.target, draft_flag(a))


def decode_config(a: argparse.Namespace, kwargs: dict | None = None) -> DecodeConfig:
    """The request the flags describe (``kwargs``: :func:`decode_kwargs`' result, when the caller
    has it), validated once, before any model loads."""
    return DecodeConfig.from_options(**(decode_kwargs(a) if kwargs is None else kwargs))


def load_pair(a: argparse.Namespace, progress: bool = True):
    from .api import load
    from ..models.backends import REGISTRY

    options = {name: getattr(a, name) for name in REGISTRY.options()}
    return load(a.target, draft=draft_flag(a), backend=a.backend, device=a.device, calibrate=a.calibrate, progress=progress,
                recalibrate=getattr(a, "recalibrate", False), **options,
                # bench and tune set every sampling field themselves: only generate and serve take the model's
                generation_config=getattr(a, "generation_config", None) or genconfig.NONE)


def startup_summary(pair) -> str:
    """One line: the backend and why, the models and their variants, memory, and why the dtypes
    were chosen."""
    mem = pair.memory()
    target = f"{pair.target_name} ({pair.target.variant})"
    draft = f"{pair.draft_name} ({pair.draft.variant})" if pair.draft is not None else "none"
    weights = (mem["target_weights"] + mem.get("draft_weights", 0)) / 2**20
    where = f"{pair.backend} ({pair.backend_why})" if pair.backend_why else pair.backend
    line = f"specdec: backend {where}; target {target}, draft {draft} on {pair.target.device}, weights {weights:.0f} MiB"
    if pair.costs.why:
        line += f"; dtype auto: {pair.costs.why}"
    if pair.costs.draft_why:
        line += f"; draft auto: {pair.costs.draft_why}"
    if pair.costs.target is not None:
        line += f"; target pass 1/8/16 tokens {pair.costs.target.ms()} ms"
    if pair.sampling_defaults:
        line += f"; {genconfig.describe(pair.sampling_defaults, pair.sampling_why)}"
    return line
