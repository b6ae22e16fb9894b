"""What :func:`specdec.load` measures above the backends once a pair is loaded (when calibrating): the
acceptance prior of the draft against the target, on any backend, and with ``draft="auto"`` the
draft's weight format among those its backend offers (``Backend.draft_variants``: on llama.cpp pure
4-bit copies of the shipped file) that drafts fastest without losing acceptance.

A backend gives it its models, how to load a variant and measure it (``Backend.load_draft``) and
what identifies a model's weights (``Backend.identity``); it replays traces and builds acceptance
models, which no backend imports.

In the lossless rules the draft's weights never change the output, only how many drafts are kept,
so its format is free speed: a pure 4-bit copy can step faster than the shipped file. The choice,
made once per machine and pair and cached:

1. each candidate (the draft as shipped and its backend's variants) is made and measured (its cost
   table, cached like every table);
2. its *agreement* with the target is measured on a fixed reference text (:data:`REFERENCE`, code
   and prose, teacher-forced: one pass of each model, the fraction of positions where both models'
   most likely next tokens are the same; under greedy lossless decoding that is the chance a draft
   token is kept);
3. the candidate with the least end-to-end time of the best K schedule replayed (the oracle of
   :mod:`specdec.traces.replay`) on a reference request (a 256-token prompt and the reference text as its answer, the candidate's
   agreement along it) on the two cost tables wins (the shipped file on a tie): a faster draft
   that agrees less often, or reads the prompt more slowly, is weighed by what it costs end to end.

The chosen candidate's agreement also gives k=auto its acceptance prior
(:class:`specdec.core.autok.AcceptancePrior`). Both are cached in ``$SPECDEC_HOME/costs/draft-formats.json``
by the two models' identities (``Backend.identity``: for llama.cpp a file's key and weight format).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

#: a model's identity for the cache of measurements: its weights (file and format), as a string
Identity = Callable[[Any], str]

#: code and prose, the two kinds of text the bundled pair is used for (~300 tokens)
REFERENCE = '''\
def merge_sorted(a: list[int], b: list[int]) -> list[int]:
    """Merge two sorted lists into one sorted list."""
    out = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    out.extend(a[i:])
    out.extend(b[j:])
    return out


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return False
    return True

Speculative decoding lets a small draft model propose several tokens, which the large target
model then checks in a single forward pass. When the draft guesses well, the target accepts many
tokens at once, and the answer is written sooner; when it guesses badly, little is lost, because
the target always contributes one token of its own. The method is exact: with the right
acceptance rule, the output follows the target's distribution.
'''


@dataclass(frozen=True)
class DraftChoice:
    source: str  # the model source loaded (``name`` or ``name@format``)
    why: str  # one line for people


def cache_file() -> Path:
    from ..models.cache import specdec_home

    return specdec_home() / "costs" / "draft-formats.json"


def _read_cache() -> dict:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(data: dict) -> None:
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def along(target, draft, ids: list[int]) -> dict:
    """One teacher-forced pass of each model over ``ids``: at each position after the first, whether
    the draft's most likely next token is the target's (``agree``, a string of 0/1) and the draft's
    probability of it (``top1``); ``agreement`` is the share that agree (under greedy lossless
    decoding, the chance a draft token is kept)."""
    import torch

    n = len(ids) - 1
    target.reset()
    draft.reset()
    t = target.forward(ids, num_logits=n).argmax(-1)
    top1, d = torch.softmax(draft.forward(ids, num_logits=n).float(), dim=-1).max(dim=-1)
    target.reset()
    draft.reset()
    agree = (t == d).tolist()
    return {"agreement": round(sum(agree) / max(1, n), 4), "agree": "".join("1" if a else "0" for a in agree),
            "top1": [round(float(p), 4) for p in top1.tolist()]}


def replayed_seconds(entry: dict, target_table, draft_table) -> float:
    """The least end-to-end seconds of a reference request (a ``REFERENCE_PROMPT``-token prompt, the
    reference text as its answer, the draft's agreement along it) over every K schedule, replayed on
    the two tables (the oracle of :mod:`specdec.traces.replay`): what the draft's steps, its reading and its
    agreement allow at best."""
    from ..models.costmodel import REFERENCE_PROMPT
    from ..traces.replay import Clock, oracle
    from ..traces.trace import DraftTrace, Trace
    from ..core.window import AUTO_WINDOW

    agree = [c == "1" for c in entry["agree"]]
    n = len(agree)
    dt = DraftTrace("auto", min(AUTO_WINDOW, REFERENCE_PROMPT), agree, list(entry["top1"]), [False] * n, None)
    trace = Trace("reference", REFERENCE_PROMPT, [0] * n, "length", n, {"d": dt})
    return oracle(trace, "d", Clock(target_table, draft_table))


def prior_of(entry: dict):
    """The acceptance prior (:class:`specdec.core.autok.AcceptancePrior`) of a measured entry of :func:`along`."""
    from ..core.acceptance import AcceptancePrior

    return AcceptancePrior.measured(entry["top1"], [c == "1" for c in entry["agree"]], "reference text")


def measured(target, draft, tokenizer, identity: Identity) -> dict:
    """:func:`along` for this pair of models (``identity``: each one's weights, as a string), cached in
    :func:`cache_file`."""
    key = f"{identity(target)}|{identity(draft)}"
    cache = _read_cache()
    entry = cache.get(key)
    if not isinstance(entry, dict) or "agree" not in entry:
        ids = tokenizer(REFERENCE)["input_ids"]
        limits = [m.max_length for m in (target, draft) if m.max_length]
        entry = along(target, draft, ids[:min(limits)] if limits else ids)
        cache[key] = entry
        _write_cache(cache)
    return entry


def prior(target, draft, tokenizer, identity: Identity):
    """The acceptance prior of ``draft`` against ``target`` on the reference text (:func:`measured`)."""
    return prior_of(measured(target, draft, tokenizer, identity))


def choose(target, tokenizer, sources: Sequence[str], load: Callable[[str], tuple[Any, Any]],
           log: Callable[[str], None], identity: Identity, target_table=None) -> tuple[DraftChoice, Any, Any, Any]:
    """The draft for ``draft="auto"`` among ``sources`` (the draft as shipped first, then its variants;
    module docstring). ``load(source)`` gives the backend's model and its cost table (None when the
    measurement failed), ``identity(lm)`` names its weights for the cache. Returns the choice, the
    loaded draft, its table and its acceptance prior; the others are closed."""
    from ..models.sources import split_format

    base = sources[0]
    tried = []
    for source in sources:
        lm, t = load(source)
        if t is None:
            lm.close()
            continue
        entry = measured(target, lm, tokenizer, identity)
        seconds = replayed_seconds(entry, target_table, t) if target_table is not None else t.forward(1)
        tried.append((source, lm, t, entry, seconds))
    if not tried:
        raise RuntimeError("no draft candidate could be measured")
    best = min(tried, key=lambda c: (c[4], c[0] != base))
    for source, lm, *_ in tried:
        if lm is not best[1]:
            lm.close()
    parts = ", ".join(f"{split_format(s)[1] or 'as shipped'} {t.forward(1) * 1e3:.0f} ms / "
                      f"{e['agreement']:.2f} / {sec:.1f} s" for s, _, t, e, sec in tried)
    why = (f"{best[0]}: the least time replayed on the reference text (the best K schedule) among the draft's formats "
           f"(one-token pass / agreement with the target / replayed seconds: {parts})")
    log(f"specdec: draft auto: {why}")
    return DraftChoice(best[0], why), best[1], best[2], prior_of(best[3])


def settle(loaded, backend, req) -> None:
    """Complete a pair a backend loaded, when calibrating: with ``draft="auto"`` and variants on its
    backend, the draft chosen among them (:func:`choose`; ``loaded``'s draft, names and costs
    replaced); else the acceptance prior of the draft it loaded (:func:`prior`). Any backend."""
    if loaded.draft is None or not (req.calibrate or req.recalibrate):
        return
    variants = backend.draft_variants(req.draft) if req.draft_auto else ()
    if not variants:
        loaded.costs.prior = prior(loaded.target, loaded.draft, loaded.tokenizer, backend.identity)
        return
    shipped = (loaded.draft, loaded.costs.draft)

    def load(source: str):
        return shipped if source == req.draft else backend.load_draft(source, req, loaded)

    choice, d, table, p = choose(loaded.target, loaded.tokenizer, (req.draft, *variants), load, req.log,
                                 backend.identity, target_table=loaded.costs.target)
    loaded.draft, loaded.names = d, (loaded.names[0], choice.source)
    loaded.costs.draft, loaded.costs.candidates["draft"] = table, {d.variant: table}
    loaded.costs.draft_why, loaded.costs.prior = choice.why, p
