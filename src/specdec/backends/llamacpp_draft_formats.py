"""``draft="auto"`` on llama.cpp: the draft model's weight format that drafts fastest without losing
acceptance.

In the lossless rules the draft's weights never change the output, only how many drafts are kept,
so its format is free speed: a pure 4-bit copy (``@q4_0``, ``@iq4_nl``,
:mod:`specdec.backends.gguf_formats`) can step faster than the shipped Q4_K_M file. The choice,
made once per machine and pair and cached:

1. each candidate (the file as shipped and its copies in :data:`CANDIDATES`) is made and measured
   (its cost table, cached like every table);
2. its *agreement* with the target is measured on a fixed reference text (:data:`REFERENCE`, code
   and prose, teacher-forced: one pass of each model, the fraction of positions where both models'
   most likely next tokens are the same; under greedy lossless decoding that is the chance a draft
   token is kept);
3. among the candidates whose agreement is within :data:`AGREEMENT_SLACK` of the shipped file's, the
   one with the cheapest one-token pass wins (the shipped file on a tie).

Agreements are cached in ``$SPECDEC_HOME/costs/draft-formats.json`` by the two files' identities
and weight formats.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: the formats tried beside the file as shipped (pure 4-bit copies: measured faster one-token passes)
CANDIDATES = ("q4_0", "iq4_nl")
#: a candidate may agree with the target this much less often than the shipped draft and still win
AGREEMENT_SLACK = 0.01
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
    from ..convert import specdec_home

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


def agreement(target, draft, ids: list[int]) -> float:
    """The fraction of positions of ``ids`` (after the first) where ``target`` and ``draft`` (two
    :class:`~specdec.backends.base.Model`) rank the same next token first, one pass each."""
    n = len(ids) - 1
    target.reset()
    draft.reset()
    t = target.forward(ids, num_logits=n).argmax(-1)
    d = draft.forward(ids, num_logits=n).argmax(-1)
    target.reset()
    draft.reset()
    return float((t == d).float().mean())


def choose(target, tokenizer, base: str, load: Callable[[str], object], table: Callable[[object], object],
           log: Callable[[str], None]) -> tuple[DraftChoice, object, object]:
    """The draft for ``draft="auto"``: ``base`` (the bundled draft's name) as shipped or one of its
    :data:`CANDIDATES` copies (module docstring). ``load(source)`` makes a
    :class:`~specdec.backends.llamacpp.LlamaCppModel`, ``table(lm)`` its cost table (None when the
    measurement failed). Returns the choice, the loaded draft and its table; the others are closed."""
    from .llamacpp import file_key

    ids = tokenizer(REFERENCE)["input_ids"]
    cache = _read_cache()
    tkey = file_key(target.path)
    tried = []
    for source in [base] + [f"{base}@{fmt}" for fmt in CANDIDATES]:
        lm = load(source)
        t = table(lm)
        if t is None:
            lm.close()
            continue
        key = f"{tkey}|{target.variant}|{file_key(lm.path)}|{lm.variant}"  # same-size copies share a file key
        if key not in cache:
            cache[key] = round(agreement(target, lm, ids), 4)
            _write_cache(cache)
        tried.append((source, lm, t, cache[key]))
    if not tried:
        raise RuntimeError("no draft candidate could be measured")
    shipped = tried[0][3] if tried[0][0] == base else max(a for *_, a in tried)
    keep = [c for c in tried if c[3] >= shipped - AGREEMENT_SLACK]
    best = min(keep, key=lambda c: (c[2].forward(1), c[0] != base))
    for source, lm, _, _ in tried:
        if lm is not best[1]:
            lm.close()
    parts = ", ".join(f"{s.split('@')[-1] if '@' in s else 'as shipped'} {t.forward(1) * 1e3:.0f} ms / {a:.2f}"
                      for s, _, t, a in tried)
    why = (f"{best[0]}: the fastest one-token pass among the draft's formats that agree with the target as "
           f"often as the shipped file (one-token pass / agreement: {parts})")
    log(f"specdec: draft auto: {why}")
    return DraftChoice(best[0], why), best[1], best[2]
