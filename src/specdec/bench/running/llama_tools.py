"""llama.cpp's own command-line tools as benchmark peers: ``llama-speculative-simple`` (draft-model
speculative decoding inside llama.cpp), built by ``scripts/build_llama_tools.sh``.

Independent of the rest of specdec (only :class:`specdec.errors.SpecdecError`): give it GGUF paths
and the prompt *text*, get back the generated text, the tool's own counters and timings.

Same prompt token ids as our engine: the tool takes text only and tokenizes it with
``common_tokenize(ctx, prompt, add_special=true, parse_special=true)``. Pass the prompt already
chat-templated (the exact string our engine's tokenizer encodes with ``add_special_tokens=False``):
the bundled Qwen2.5 GGUFs have ``tokenizer.ggml.add_bos_token = false``, so no BOS is added, and
``<|im_start|>``-style markers are parsed as the special tokens, as in Hugging Face tokenizers. Two
things would otherwise change the text, and this module prevents both: ``-f`` drops one trailing
newline of the file (we write the prompt plus one extra ``\\n``), and escape processing (on by
default, also for ``-f``) would turn a literal backslash-n into a newline (we pass ``--no-escape``).
:func:`llama_token_ids` tokenizes with the same llama.cpp code through llama-cpp-python, to check
(``prompt_ids=`` in :func:`run_speculative_simple` does it before every run). One known difference
remains: llama.cpp marks ``</s>`` (id 128247 in these GGUFs) as a control token and parses it in the
text, Hugging Face does not; prompts holding a literal ``</s>`` cannot be given identical ids.

What the tool does not do: stop strings (it stops at ``-n`` or an end-of-generation token only),
so cap ``n_predict`` and cut the text (``stops=``), counting the time over everything it generated.
It also overshoots ``-n``: without EOS it generates at least ``n_predict + 1`` tokens, and up to
``draft_max`` more when the last draft is accepted (its loop ends once ``n_predict`` is exceeded, and
a draft is not truncated when the remaining budget is 0). ``n_predict`` in the result is the
tool's own count (accepted tokens + one per target step, EOS included).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...errors import SpecdecError

TOOLS_ENV = "SPECDEC_LLAMA_TOOLS"
BUILD_SCRIPT = "scripts/build_llama_tools.sh"
SPECULATIVE_SIMPLE = "llama-speculative-simple"


def tools_dir() -> Path:
    """Where scripts/build_llama_tools.sh puts the binaries by default."""
    home = os.environ.get("SPECDEC_HOME") or str(Path.home() / ".cache" / "specdec")
    return Path(home).expanduser() / "llama-tools"


def find_tool(name: str) -> Path | None:
    """The executable ``name``: in ``$SPECDEC_LLAMA_TOOLS`` (a folder, or several joined by
    ``os.pathsep``), then ``${SPECDEC_HOME:-~/.cache/specdec}/llama-tools``, then ``PATH``."""
    folders = [Path(p).expanduser() for p in os.environ.get(TOOLS_ENV, "").split(os.pathsep) if p]
    folders.append(tools_dir())
    for folder in folders:
        cand = folder / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    found = shutil.which(name)
    return Path(found) if found else None


def require_tool(name: str) -> Path:
    path = find_tool(name)
    if path is None:
        raise SpecdecError(
            f"{name} not found (looked in ${TOOLS_ENV}, {tools_dir()}, PATH): build it with {BUILD_SCRIPT}"
        )
    return path


def speculative_simple_args(
    target_gguf, draft_gguf, prompt_file, *, n_predict: int, draft_max: int, draft_min: int = 0,
    draft_p_min: float = 0.0, threads: int, threads_draft: int | None = None, ctx: int = 4096,
    batch: int | None = None, seed: int = 0, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
    min_p: float = 0.0,
) -> list[str]:
    """The command-line arguments (without the binary) for one run.

    Greedy (``temperature <= 0``) is ``--temp 0 --top-k 1``. Sampled runs use plain temperature
    sampling unless ``top_k``/``top_p``/``min_p`` are given (llama.cpp's own defaults, top-k 40,
    top-p 0.95, min-p 0.05, are switched off). The draft proposes its top-1 token; ``draft_p_min=0``
    drafts exactly ``draft_max`` tokens every step (no confidence cut-off)."""
    td = threads if threads_draft is None else threads_draft
    args = [
        "-m", str(target_gguf), "-md", str(draft_gguf), "--spec-type", "draft-simple",
        "--spec-draft-n-max", str(draft_max), "--spec-draft-n-min", str(draft_min),
        "--spec-draft-p-min", str(draft_p_min),
        "-f", str(prompt_file), "--no-escape", "-n", str(n_predict),
        "-c", str(ctx), "-b", str(batch or ctx),
        "-t", str(threads), "-tb", str(threads), "-td", str(td), "-tbd", str(td),
        "--seed", str(seed), "--color", "off",
    ]
    if temperature <= 0:
        args += ["--temp", "0", "--top-k", "1"]
    else:
        args += ["--temp", str(temperature), "--top-k", str(top_k), "--top-p", str(top_p), "--min-p", str(min_p),
                 "--repeat-penalty", "1.0"]
    return args


_NUM = r"([-+]?(?:\d+(?:\.\d*)?|\.\d+|nan|inf)(?:[eE][-+]?\d+)?)"
_SPEED = re.compile(r"\b(encoded|decoded)\s+(\d+) tokens in\s+" + _NUM + r" seconds, speed:\s+" + _NUM + r" t/s")
# lines carry a log prefix ("0.35.967.755 I ") by default: match anywhere after whitespace
_COUNTER = re.compile(r"(?:^|\s)(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(-?\d+)\s*$", re.M)
_ACCEPT = re.compile(r"(?:^|\s)accept\s*=\s*" + _NUM + r"\s*%", re.M | re.I)
_PERF = re.compile(r"(?:common_perf_print|llama_perf_context_print):\s+"
                   r"(load time|prompt eval time|eval time|total time)\s*=\s*" + _NUM
                   + r" ms(?:\s*/\s*(\d+) (?:tokens|runs))?")
_STATS = re.compile(r"statistics\s+draft-simple:.*?#gen tokens =\s*(\d+), #acc tokens =\s*(\d+)"
                    r"(?:.*?#mean acc len =\s*" + _NUM + ")?")


def _float(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return float("nan")


def generated_text(stdout: str, prompt_text: str | None) -> tuple[str, bool]:
    """The generated text from the tool's stdout, which is ``"\\n\\n" + prompt pieces + generated
    pieces + "\\n\\n\\n\\n"``; and whether the echoed prompt equalled ``prompt_text``."""
    out = stdout[2:] if stdout.startswith("\n\n") else stdout
    if out.endswith("\n\n\n\n"):
        out = out[:-4]
    if prompt_text is None:
        return out, False
    if out.startswith(prompt_text):
        return out[len(prompt_text):], True
    return out, False


def parse_speculative_simple(stdout: str, stderr: str, prompt_text: str | None = None) -> dict[str, Any]:
    """The tool's report: generated text, its counters (``n_predict``, ``n_drafted``, ``n_accept``,
    ``n_draft`` = draft max) and its timings (``decode_seconds`` and ``tokens_per_second`` from its
    ``decoded ... t/s`` line: drafting + verification, after the prompt; ``encode_*`` the prompt)."""
    m: re.Match[str] | None  # each pattern's match in turn
    text, echo_ok = generated_text(stdout, prompt_text)
    res: dict[str, Any] = {"text": text, "prompt_echo_matches": echo_ok}
    for m in _SPEED.finditer(stderr):
        kind = "encode" if m.group(1) == "encoded" else "decode"
        res[f"{kind}_tokens"] = int(m.group(2))
        res[f"{kind}_seconds"] = _float(m.group(3))
        res[f"{kind}_tokens_per_second"] = _float(m.group(4))
    for m in _COUNTER.finditer(stderr):
        res[m.group(1)] = int(m.group(2))
    m = _ACCEPT.search(stderr)
    if m:
        res["accept_percent"] = _float(m.group(1))
    if "decode_tokens_per_second" in res:
        res["tokens_per_second"] = res["decode_tokens_per_second"]
    if "encode_tokens" in res:
        res["n_prompt"] = res["encode_tokens"]
    perf = {}
    for m in _PERF.finditer(stderr):
        key = m.group(1).replace(" ", "_")
        perf[f"{key}_ms"] = _float(m.group(2))
        if m.group(3) is not None:
            perf[f"{key}_n"] = int(m.group(3))
    if perf:
        res["target_perf"] = perf
    m = _STATS.search(stderr)
    if m:
        res["draft_stats"] = {"gen_tokens": int(m.group(1)), "acc_tokens": int(m.group(2))}
        if m.group(3) is not None:
            res["draft_stats"]["mean_acc_len"] = _float(m.group(3))
    missing = [k for k in ("n_predict", "n_drafted", "n_accept", "decode_seconds") if k not in res]
    if missing:
        raise SpecdecError(f"{SPECULATIVE_SIMPLE} printed no {', '.join(missing)}; unrecognised output: "
                           + _last_line(stderr))
    return res


def _last_line(s: str) -> str:
    lines = [ln.strip() for ln in s.splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def cut_at_stops(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest stop string (as specdec's StopStrings.final_text)."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def run_speculative_simple(
    target_gguf, draft_gguf, prompt_text: str, *, n_predict: int, draft_max: int, draft_min: int = 0,
    threads: int, ctx: int = 4096, seed: int = 0, temperature: float = 0.0, draft_p_min: float = 0.0,
    threads_draft: int | None = None, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
    stops: Sequence[str] = (), prompt_ids: Sequence[int] | None = None, timeout: float | None = None,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Run llama-speculative-simple once and parse its report.

    ``prompt_text`` goes in verbatim (see the module docstring: pass the chat-templated text).
    Returns ``text`` (generated, cut before the first of ``stops``; ``raw_text`` uncut),
    ``n_predict``/``n_drafted``/``n_accept`` (the tool's counters), ``seconds`` (wall time of the
    whole subprocess: model loading, warm-up, prompt and generation), ``decode_seconds`` and
    ``tokens_per_second`` (the tool's own decode timing and speed), ``encode_seconds`` (its prompt
    evaluation), ``generate_seconds`` (encode + decode: prompt evaluation and generation, without
    model loading), ``n_prompt``, ``stopped_at_eos`` and ``command``.

    ``prompt_ids``: our engine's prompt token ids. When given, the ids llama.cpp will use are
    compared with them first (exactly, through llama-cpp-python when installed; otherwise by count,
    after the run) and a mismatch raises SpecdecError, so the two never run different prompts."""
    binary = require_tool(SPECULATIVE_SIMPLE)
    for label, path in (("target", target_gguf), ("draft", draft_gguf)):
        if not Path(path).is_file():
            raise SpecdecError(f"{label} GGUF not found: {path}")
    ids_check = None if prompt_ids is None else _check_ids_first(target_gguf, prompt_text, prompt_ids)
    with tempfile.TemporaryDirectory(prefix="specdec-llama-") as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        # -f drops one trailing newline: add one so the prompt arrives byte for byte
        prompt_file.write_bytes(prompt_text.encode("utf-8") + b"\n")
        cmd = [str(binary), *speculative_simple_args(
            target_gguf, draft_gguf, prompt_file, n_predict=n_predict, draft_max=draft_max, draft_min=draft_min,
            draft_p_min=draft_p_min, threads=threads, threads_draft=threads_draft, ctx=ctx, seed=seed,
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p), *extra_args]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise SpecdecError(f"{SPECULATIVE_SIMPLE} ran past {timeout} s") from e
        seconds = time.perf_counter() - start
    stdout = proc.stdout.decode("utf-8", errors="replace")
    stderr = proc.stderr.decode("utf-8", errors="replace")
    if proc.returncode != 0:
        raise SpecdecError(f"{SPECULATIVE_SIMPLE} exited with status {proc.returncode}: {_last_line(stderr)}")
    res = parse_speculative_simple(stdout, stderr, prompt_text)
    if ids_check == "count" and prompt_ids is not None and res.get("n_prompt") != len(prompt_ids):
        raise SpecdecError(
            f"llama.cpp tokenized the prompt into {res.get('n_prompt')} tokens, ours into {len(prompt_ids)}"
        )
    raw = res["text"]
    text, stopped = cut_at_stops(raw, stops)
    res.update(
        text=text, raw_text=raw, stopped_at_stop=stopped, seconds=seconds, prompt_ids_check=ids_check,
        generate_seconds=res.get("encode_seconds", 0.0) + res["decode_seconds"],
        # the loop only ends early at an end-of-generation token; otherwise it passes n_predict
        stopped_at_eos=res["n_predict"] <= n_predict, requested_n_predict=n_predict, command=cmd,
    )
    return res


def _check_ids_first(target_gguf, prompt_text: str, prompt_ids: Sequence[int]) -> str:
    """Compare llama.cpp's prompt ids with ours before the run, exactly when llama-cpp-python is
    installed (``"exact"``); else only their count, after the run (``"count"``)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "count"
    check_prompt_ids(target_gguf, prompt_text, prompt_ids)
    return "exact"


@functools.lru_cache(maxsize=4)
def _vocab(gguf: str):
    try:
        from llama_cpp import Llama
    except ImportError as e:
        raise SpecdecError(
            "checking llama.cpp's prompt token ids needs llama-cpp-python (pip install llama-cpp-python)"
        ) from e
    try:
        return Llama(model_path=gguf, vocab_only=True, verbose=False)
    except ValueError as e:
        raise SpecdecError(f"llama.cpp cannot read the vocabulary of {gguf}: {e}") from e


def llama_token_ids(gguf, text: str) -> list[int]:
    """The prompt token ids llama-speculative-simple will use for ``text``: the same llama.cpp
    tokenizer call (``add_special=True, parse_special=True``) through llama-cpp-python."""
    return list(_vocab(str(gguf)).tokenize(text.encode("utf-8"), add_bos=True, special=True))


def check_prompt_ids(gguf, text: str, prompt_ids: Sequence[int]) -> None:
    """Raise SpecdecError unless llama.cpp tokenizes ``text`` into exactly ``prompt_ids``. They differ
    when the text holds a literal of a token that llama.cpp treats as special and Hugging Face as
    plain text: in the bundled Qwen2.5 GGUFs, ``</s>`` (id 128247, which llama.cpp marks as control)."""
    ours = [int(t) for t in prompt_ids]
    theirs = llama_token_ids(gguf, text)
    if theirs != ours:
        i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise SpecdecError(
            f"llama.cpp tokenizes the prompt differently ({len(theirs)} tokens vs our {len(ours)}, first difference "
            f"at token {i}: {theirs[i:i + 3]} vs {ours[i:i + 3]}); {SPECULATIVE_SIMPLE} takes text only"
        )
