"""Traces of greedy generations: what a replay needs to redo every round exactly.

Under greedy lossless decoding a generation is the target's greedy answer ``y``, whatever drafts
are proposed; what differs between K schedules is how many rounds it takes and what they cost.
A round that drafts from position ``t`` (``t`` answer tokens committed) with a draft model that
reads its window of the prompt and ``y[:t]`` proposes the draft's argmax at ``t``, which is
``y[t]`` exactly when the two models agree there, and then (fed its own token, that is ``y[t]``)
its argmax at ``t + 1``, and so on: the round keeps ``min(K, run of agreements from t)`` drafts.
So two sequences along ``y``, from one teacher-forced pass of each model, determine every round of
every K schedule: ``agree[t]`` (the draft's argmax at ``t`` is ``y[t]``) and ``top1[t]`` (the
draft's probability of its own argmax there, softmax at temperature 1: what k=auto reads to decide
whether to draft one more token).

What happens after a rejected draft (how many more drafts k=auto lets the draft propose on text
it got wrong) depends on the draft's probabilities *off* ``y``: at each position where the draft
disagrees, a trace may also hold that chain (:attr:`DraftTrace.chains`: the draft fed its own
wrong token, then its own argmaxes, until the chance that all of them are kept drops below
``CHAIN_FLOOR`` or ``chain_max`` steps). Without it a replay knows the kept drafts and every round
exactly, and the number of wasted drafts after a rejection approximately
(:func:`specdec.traces.replay.replay`).

A trace file is JSON lines: a header (``kind: "specdec-trace"``, the format, the target and the
tokenizer's fingerprint), then one :class:`Trace` per prompt. :func:`read_traces` refuses a file
that is not one, is cut short, or was made for another target or tokenizer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import torch

from ..errors import SpecdecError
from ..core.window import WINDOW_WORDS, window_start

FORMAT = 1
KIND = "specdec-trace"
#: an off-answer chain stops once the chance that every draft in it is kept falls below this
CHAIN_FLOOR = 0.02
#: the longest off-answer chain recorded (k=auto's rounds rarely go on this long past a rejection)
CHAIN_MAX = 16
#: the most bytes a trace file may have (read_traces)
FILE_LIMIT = 1 << 30


@dataclass
class DraftTrace:
    """One draft (model and window) along one answer."""

    window: int | str  # draft_window: the prompt's last N tokens, or "all"
    view: int  # prompt tokens the draft reads (min(window, prompt))
    agree: list[bool]  # per answer position t: the draft's argmax after view + y[:t] is y[t]
    top1: list[float]  # its probability of that argmax (softmax at T=1)
    stops: list[bool] = field(default_factory=list)  # that argmax is a stop id (the drafter stops after it)
    #: at a position t where it disagrees: the top-1 probabilities (and stop flags) of the draft's own
    #: continuation after its wrong token (None: chains not recorded for this draft)
    chains: dict[int, list[tuple[float, bool]]] | None = None

    def to_dict(self) -> dict:
        d: dict[str, object] = {"window": self.window, "view": self.view, "agree": "".join("1" if a else "0" for a in self.agree),
             "top1": [round(p, 5) for p in self.top1], "stops": [i for i, s in enumerate(self.stops) if s]}
        if self.chains is not None:
            d["chains"] = {str(t): [[round(p, 5), int(s)] for p, s in c] for t, c in self.chains.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict, n: int) -> "DraftTrace":
        agree = [c == "1" for c in d["agree"]]
        top1 = [float(p) for p in d["top1"]]
        if len(agree) != n or len(top1) != n:
            raise ValueError(f"a draft trace of {len(agree)} positions for an answer of {n} tokens")
        stops = [False] * n
        for i in d.get("stops", []):
            stops[int(i)] = True
        chains = None
        if d.get("chains") is not None:
            chains = {int(t): [(float(p), bool(s)) for p, s in c] for t, c in d["chains"].items()}
        window = d["window"] if d["window"] in WINDOW_WORDS else int(d["window"])
        return cls(window, int(d["view"]), agree, top1, stops, chains)


@dataclass
class Trace:
    """One prompt's greedy answer and, per draft, its agreement along it."""

    sample_id: str
    prompt_tokens: int
    answer: list[int]  # the target's greedy answer (as committed: cut at a stop, EOS included)
    finish_reason: str  # "stop" | "length"
    max_new_tokens: int
    drafts: dict[str, DraftTrace]  # by draft name: "<draft source>|w<window>"
    category: str = ""
    #: the share of answer positions where the target's own teacher-forced argmax is the answer's
    #: token (1.0 when the answer is its greedy output; less where batched passes break near-ties)
    target_agree: float = 1.0
    #: the prompt's token ids: drafters without a model (prompt lookup, suffix) are replayed by
    #: running them on the prompt and the answer (None in traces made before they were recorded)
    prompt: list[int] | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["drafts"] = {k: v.to_dict() for k, v in self.drafts.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        answer = [int(t) for t in d["answer"]]
        drafts = {k: DraftTrace.from_dict(v, len(answer)) for k, v in d["drafts"].items()}
        prompt = None if d.get("prompt") is None else [int(t) for t in d["prompt"]]
        if prompt is not None and len(prompt) != int(d["prompt_tokens"]):
            raise ValueError(f"a prompt of {len(prompt)} ids for {d['prompt_tokens']} prompt tokens")
        return cls(str(d["sample_id"]), int(d["prompt_tokens"]), answer, str(d["finish_reason"]),
                   int(d["max_new_tokens"]), drafts, str(d.get("category", "")), float(d.get("target_agree", 1.0)),
                   prompt)


def draft_name(source: str, window: int | str) -> str:
    return f"{source}|w{window}"


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary (two tokenizers that give other ids differ)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def _rows(lm, ids: Sequence[int], n: int) -> torch.Tensor:
    """The model's logits after each of the last ``n`` positions of ``ids``, from an empty cache."""
    lm.reset()
    return lm.forward(list(ids), num_logits=n).float()


def trace_draft(draft, prompt: Sequence[int], answer: Sequence[int], window: int | str, stop_ids: frozenset[int],
                chain_max: int = CHAIN_MAX) -> DraftTrace:
    """``draft`` (a :class:`~specdec.models.backends.base.Model`) teacher-forced along ``answer`` reading
    the prompt's last ``window`` tokens, as :class:`~specdec.core.drafters.ModelDrafter` reads them;
    with ``chain_max > 0`` also its continuation after each wrong token (module docstring)."""
    view = list(prompt[window_start(len(prompt), window):])
    n = len(answer)
    rows = _rows(draft, view + list(answer), n + 1)[:n]  # row t: after view + answer[:t]
    probs = torch.softmax(rows, dim=-1)
    top1, arg = probs.max(dim=-1)
    agree = [int(a) == int(y) for a, y in zip(arg.tolist(), answer)]
    stops = [int(a) in stop_ids for a in arg.tolist()]
    chains: dict[int, list[tuple[float, bool]]] | None = {} if chain_max > 0 else None
    if chains is not None:
        for t in range(n):
            if agree[t] or stops[t]:
                continue
            draft.truncate(len(view) + t)
            chain: list[tuple[float, bool]] = []
            token, kept = int(arg[t]), float(top1[t])
            while len(chain) < chain_max and kept >= CHAIN_FLOOR:
                p = torch.softmax(draft.forward([token])[0].float(), dim=-1)
                q, tok = p.max(dim=-1)
                token = int(tok)
                chain.append((float(q), token in stop_ids))
                kept *= float(q)
                if token in stop_ids:
                    break
            chains[t] = chain
    draft.reset()
    return DraftTrace(window, len(view), agree, [float(p) for p in top1.tolist()], stops, chains)


def target_agreement(target, prompt: Sequence[int], answer: Sequence[int]) -> float:
    """The share of ``answer``'s tokens that are the target's teacher-forced argmax."""
    if not answer:
        return 1.0
    rows = _rows(target, list(prompt) + list(answer), len(answer) + 1)[: len(answer)]
    target.reset()
    return float((rows.argmax(-1) == torch.tensor(list(answer))).float().mean())


def trace_answer(target, drafts: dict[str, tuple[object, int | str, int]], prompt: Sequence[int],
                 answer: Sequence[int], finish_reason: str, max_new_tokens: int, stop_ids: frozenset[int],
                 sample_id: str = "", category: str = "", check_target: bool = True) -> Trace:
    """The trace of one answer: ``drafts`` maps a draft name to ``(model, window, chain_max)``."""
    if not prompt:
        raise SpecdecError(f"{sample_id or 'a prompt'}: the prompt is empty")
    out = {name: trace_draft(lm, prompt, answer, window, stop_ids, chain_max)
           for name, (lm, window, chain_max) in drafts.items()}
    agree = target_agreement(target, prompt, answer) if check_target else 1.0
    return Trace(sample_id, len(prompt), list(answer), finish_reason, max_new_tokens, out, category, agree,
                 list(prompt))


def measure_prior(target, draft, ids: Sequence[int], source: str = "reference text"):
    """The acceptance prior (:class:`specdec.core.autok.AcceptancePrior`) of ``draft`` against ``target``
    on ``ids``: one teacher-forced pass of each, the draft's top-1 probability at each position and
    whether its argmax is the target's."""
    from ..core.acceptance import AcceptancePrior

    n = len(ids) - 1
    t = _rows(target, ids, n).argmax(-1)
    probs = torch.softmax(_rows(draft, ids, n), dim=-1)
    top1, arg = probs.max(dim=-1)
    target.reset()
    draft.reset()
    return AcceptancePrior.measured(top1.tolist(), (arg == t).tolist(), source)


# ---------------------------------------------------------------------------------------- files
def header(target: str, tokenizer_fp: str, **extra) -> dict:
    return {"kind": KIND, "format": FORMAT, "target": target, "tokenizer": tokenizer_fp, **extra}


def write_traces(path: Path, head: dict, traces: Iterable[Trace]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(head) + "\n")
        for tr in traces:
            f.write(json.dumps(tr.to_dict()) + "\n")
    tmp.replace(path)


def read_traces(path: str | Path, target: str | None = None, tokenizer_fp: str | None = None) -> tuple[dict, list[Trace]]:
    """The header and traces of a trace file; one-line errors for a file that is not one, is cut
    short or broken, or was made for another target (its name before any ``|``) or tokenizer."""
    from ..models.files import read_regular
    from .trace_checks import check_header, check_header_drafts, check_trace, unlike

    path = Path(path)
    try:
        lines = read_regular(path, FILE_LIMIT, "trace file").decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise SpecdecError(f"{path}: cannot read the trace file ({exc.__class__.__name__}: {exc})") from None
    try:
        head = json.loads(lines[0]) if lines else None
    except (ValueError, RecursionError):
        head = None
    if not isinstance(head, dict) or head.get("kind") != KIND:
        raise SpecdecError(f"{path}: not a specdec trace file (make one with 'specdec trace')")
    if head.get("format") != FORMAT:
        raise SpecdecError(f"{path}: trace format {head.get('format')!r}; this specdec reads format {FORMAT}")
    if target is not None and str(head.get("target", "")).split("|")[0] != target.split("|")[0]:
        raise SpecdecError(f"{path}: traced on target {head.get('target')!r}, not {target!r}")
    if tokenizer_fp is not None and head.get("tokenizer") != tokenizer_fp:
        raise SpecdecError(f"{path}: made with another tokenizer ({head.get('tokenizer')} != {tokenizer_fp})")
    try:
        check_header(head)
    except ValueError as exc:
        raise SpecdecError(f"{path}: line 1 is not a trace header this specdec reads ({exc})") from None
    traces, first = [], None
    for i, line in enumerate(lines[1:], 2):
        try:
            d = json.loads(line)
            check_trace(d)
            traces.append(Trace.from_dict(d))
        except RecursionError:
            raise SpecdecError(f"{path}: line {i} is nested too deeply to be a trace") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise SpecdecError(f"{path}: line {i} is not a complete trace ({exc.__class__.__name__}: {exc}); "
                               "the file is cut short or broken: make it again") from None
        first = first or d
        problem = unlike(first, d)
        if problem:
            raise SpecdecError(f"{path}: line {i} {problem}")
    if first is not None:
        try:
            check_header_drafts(head, first)
        except ValueError as exc:
            raise SpecdecError(f"{path}: line 1 is not a trace header this specdec reads ({exc})") from None
    if head.get("count") is not None and head["count"] != len(traces):
        raise SpecdecError(f"{path}: holds {len(traces)} traces of the {head['count']} its header announces; "
                           "the file is cut short: make it again")
    return head, traces
