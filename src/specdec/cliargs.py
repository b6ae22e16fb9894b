"""The flags every command shares (models, decoding, loose rules) and how they become a loaded
pair and request parameters. ``specdec.cli``, ``specdec.bench.cli`` and ``specdec.server.cli``
import from here; this module imports no command (no cycles: every CLI imports down)."""

from __future__ import annotations

import argparse
import sys

from .bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET
from .drafters import DRAFTERS
from .verify import POLICIES
from .verify.dropmatch import CRITERIA

LOW_TAU = 1.3  # below this, speculation rarely pays for the draft's cost

#: --flag -> (rule, parameter, type, help). Defaults come from the rule classes themselves.
RULE_FLAGS = {
    "--mars-theta": ("mars", "theta", float, "mars: accept a top-2 draft when z2/z1 exceeds this"),
    "--dropmatch-paths": ("dropmatch", "paths", int, "dropmatch: MC-dropout paths on the LM head"),
    "--dropmatch-p": ("dropmatch", "p", float, "dropmatch: dropout probability"),
    "--dropmatch-criterion": ("dropmatch", "criterion", str,
                              "dropmatch: naive | js | majority | paper (= js or majority)"),
    "--typical-epsilon": ("typical", "epsilon", float, "typical: p(d) > min(epsilon, delta*exp(-H))"),
    "--typical-delta": ("typical", "delta", float, "typical: see --typical-epsilon"),
    "--fly-theta": ("fly", "theta", float, "fly: top-3 entropy gate; lower mismatches are rejected"),
    "--fly-window": ("fly", "window", int, "fly: a mismatch needs window-1 later agreements in the block"),
}


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", default=DEFAULT_TARGET,
                   help=f"target model: a bundled name ({', '.join(BUNDLED)}), a Hugging Face folder, "
                        f"a .gguf file or a hub id (default: {DEFAULT_TARGET})")
    g.add_argument("--draft", default="auto",
                   help="draft model, same forms as --target; 'none' for no draft model; 'auto' (default) "
                        f"picks {DEFAULT_DRAFT} for the bundled target and none otherwise")
    g.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="target dtype (default: auto = measured on this machine: on a CPU the faster of float32 "
                        "and bfloat16, prefill and decoding counted; bfloat16 on a GPU)")
    g.add_argument("--draft-dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                   help="draft dtype; the draft only proposes, so lossless output is unchanged (default: auto = "
                        "measured with --dtype auto, else the same as --dtype)")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    g.add_argument("--draft-quant", default="auto", choices=["auto", "int8", "none"],
                   help="quantize the draft's weights; the draft only proposes, so lossless output is "
                        "unchanged (default: auto = int8 for bfloat16 on CPU, none otherwise)")
    g.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="do not measure the cost model (dtype auto is then bfloat16 and -k auto is k=5); "
                        "measurements are cached per machine, so this only saves the first load")


def add_decode_args(p: argparse.ArgumentParser, k_default: str = "auto") -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--policy", default="lossless",
                   help=f"verification policy: {', '.join(POLICIES)}, or loose rules joined with '+' "
                        "(default: lossless); 'ar' is plain decoding, 'lossless' is exact")
    g.add_argument("--drafter", default="model",
                   help=f"{' | '.join(DRAFTERS)} (default: model); model+pld is the draft model sped up by "
                        "prompt lookup, with the same tokens")
    g.add_argument("-k", "--k", default=k_default, metavar="K",
                   help="draft tokens per round, or 'auto': each round picks the K (0 = a plain decoding step) "
                        "with the most expected tokens per second from the measured cost model and the "
                        f"acceptance seen so far (default: {k_default})")
    g.add_argument("--max-new-tokens", type=int, default=128, help="generation budget (default: 128)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0 = off)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default: 0 = off)")
    g.add_argument("--seed", type=int, default=None, help="seed for sampling (default: random)")
    g.add_argument("--ngram-max", type=int, default=None,
                   help="prompt lookup: longest n-gram to match (default: 3 for pld, 4 for model+pld)")
    g.add_argument("--ngram-min", type=int, default=None, help="prompt lookup: shortest n-gram to match (default: 1)")
    g.add_argument("--lookup-tokens", type=int, default=None,
                   help="model+pld: tokens prompt lookup proposes per draft-model pass (default: 6)")
    g.add_argument("--min-confidence", type=float, default=None,
                   help="model, model+pld: stop a draft after a token the draft gave less than this "
                        "probability, so a large -k costs little (default: 0 = off)")
    r = p.add_argument_group(
        "loose rules (lossy: output may differ from the target's; combine with '+', e.g. --policy fly+mars)")
    for flag, (rule, param, kind, text) in RULE_FLAGS.items():
        extra = {"choices": list(CRITERIA)} if param == "criterion" else {}
        r.add_argument(flag, type=kind, default=None, help=f"{text} (default: {rule_default(rule, param)})", **extra)


def rule_default(rule: str, param: str):
    from .verify import RULES

    return getattr(RULES[rule](), param)


def decode_kwargs(a: argparse.Namespace) -> dict:
    kw = dict(policy=a.policy, drafter=a.drafter, k=a.k, max_new_tokens=a.max_new_tokens,
              temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, seed=a.seed)
    for name in ("ngram_max", "ngram_min", "lookup_tokens", "min_confidence"):
        if getattr(a, name) is not None:
            kw[name] = getattr(a, name)
    for rule, param, _, _ in RULE_FLAGS.values():
        value = getattr(a, f"{rule}_{param}")
        if value is not None:
            kw[f"{rule}_{param}"] = value
    return kw


def make_config(**kwargs):
    from .api import make_config as build

    return build(**kwargs)


def load_pair(a: argparse.Namespace, progress: bool = True):
    from .api import load

    draft = None if a.draft == "none" else a.draft
    return load(a.target, draft=draft, dtype=a.dtype, draft_dtype=a.draft_dtype, device=a.device,
                draft_quant=a.draft_quant, calibrate=a.calibrate, progress=progress,
                recalibrate=getattr(a, "recalibrate", False))


def dtype_label(lm, quant: str = "none") -> str:
    name = str(lm.dtype).replace("torch.", "")
    return name if quant == "none" else f"{name}+{quant}"


def startup_summary(pair) -> str:
    """One line: the models, their dtypes, memory, and why the dtypes were chosen."""
    mem = pair.memory()
    target = f"{pair.target_name} ({dtype_label(pair.target)})"
    draft = f"{pair.draft_name} ({dtype_label(pair.draft, pair.draft_quant)})" if pair.draft is not None else "none"
    weights = (mem["target_weights"] + mem.get("draft_weights", 0)) / 2**20
    line = f"specdec: target {target}, draft {draft} on {pair.target.device}, weights {weights:.0f} MiB"
    if pair.costs.why:
        line += f"; dtype auto: {pair.costs.why}"
    if pair.costs.target is not None:
        line += f"; target pass 1/8/16 tokens {pair.costs.target.ms()} ms"
    return line
