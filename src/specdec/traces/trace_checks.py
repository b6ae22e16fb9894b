"""What a trace file (:mod:`specdec.traces.trace`) must hold, checked before it is read: a trace file may
come from anyone, and a replay of a malformed one must stop in one line, not loop or print
nonsense. Each check raises ValueError naming the field and what it must be.

Lengths are bounded (:data:`MAX_TOKENS` answer tokens, ``max_new_tokens`` and draft views;
:data:`MAX_PROMPT` prompt tokens), so that a replay's work and the oracle's table stay small;
probabilities lie in [0, 1], token ids and counts are integers, and every index names a position
of its answer.
"""

from __future__ import annotations

from typing import Any

from ..core.window import WINDOW_WORDS

#: the longest answer, ``max_new_tokens`` and draft view a trace may have (the oracle's table is
#: answer x (view + answer) numbers)
MAX_TOKENS = 1 << 13
#: the longest prompt (priced by the cost tables only; its ids, where recorded, are read by drafters)
MAX_PROMPT = 1 << 20
#: the largest token id
MAX_ID = (1 << 31) - 1
FINISH_REASONS = ("stop", "length")
#: the longest draft model name a header may give
MAX_NAME = 1024


def _int(where: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"{where} must be an integer in [{lo}, {hi}], got {_short(v)}")
    return v


def _prob(v: Any) -> bool:
    return type(v) in (int, float) and 0.0 <= v <= 1.0  # NaN fails both comparisons


def _short(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return "an integer too large"
    text = repr(v) if not isinstance(v, (list, dict)) else f"a {type(v).__name__} of {len(v)}"
    return text if len(text) <= 60 else text[:57] + "..."


def _obj(where: str, v: Any) -> dict:
    if not isinstance(v, dict):
        raise ValueError(f"{where} must be an object, got {type(v).__name__}")
    return v


def _ids(where: str, v: Any, limit: int) -> list:
    if not isinstance(v, list) or len(v) > limit:
        raise ValueError(f"{where} must be a list of at most {limit} token ids, got {_short(v)}")
    if not all(type(t) is int and 0 <= t <= MAX_ID for t in v):
        raise ValueError(f"{where} must hold token ids (integers in [0, {MAX_ID}])")
    return v


def check_header(head: dict) -> None:
    """The header's fields a replay reads: ``target``, ``count``, ``stop_ids``, ``priors``, ``drafts``."""
    from ..core.acceptance import AcceptancePrior

    if not isinstance(head.get("target"), str):
        raise ValueError("the header's 'target' must be a string")
    if head.get("count") is not None:
        _int("the header's 'count'", head["count"], 0, 1 << 31)
    if head.get("stop_ids") is not None:
        _ids("the header's 'stop_ids'", head["stop_ids"], 1 << 16)
    for name in ("priors", "drafts"):
        if head.get(name) is not None:
            _obj(f"the header's {name!r}", head[name])
    for name, entry in (head.get("drafts") or {}).items():
        _check_header_draft(name, entry)
    for source, prior in (head.get("priors") or {}).items():
        try:
            AcceptancePrior.from_dict(_obj(f"the header's prior of {source!r}", prior))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the header's prior of {str(source)[:60]!r}: {exc}") from None
        if not _prob(prior.get("mean", 0.5)):
            raise ValueError(f"the header's prior of {str(source)[:60]!r}: 'mean' must be in [0, 1]")


def _check_header_draft(name: Any, entry: Any) -> None:
    """One entry of the header's ``drafts``: ``{"source": <draft model>, "window": <window>}`` under
    the name ``"<source>|w<window>"`` (:func:`specdec.traces.trace.draft_name`)."""
    where = f"the header's draft {_short(name)}"
    entry = _obj(where, entry)
    source, window = entry.get("source"), entry.get("window")
    if not isinstance(source, str) or not source or len(source) > MAX_NAME:
        raise ValueError(f"{where}: 'source' must be a draft model's name (a string of 1 to {MAX_NAME} characters), "
                         f"got {_short(source)}")
    if window not in WINDOW_WORDS:
        _int(f"{where}: 'window' (or all, auto)", window, 1, MAX_PROMPT)
    if name != f"{source}|w{window}":
        raise ValueError(f"{where} names another source or window than its 'source' and 'window' "
                         f"({_short(f'{source}|w{window}')})")


def unlike(first: dict, d: dict, first_line: int = 2) -> str | None:
    """What a trace line ``d`` lacks or holds beyond the file's first trace (line ``first_line``),
    else None: every trace of a file holds the same drafts, and its prompt's ids on every line or on
    none (a replay of the drafters without a model, pld and suffix, and of the portfolio reads them:
    one line without them dropped those parts of the report)."""
    if (first.get("prompt") is None) != (d.get("prompt") is None):
        has, other = ("has no", "has") if d.get("prompt") is None else ("has a", "has none")
        return (f"{has} 'prompt' (its prompt's token ids) where line {first_line} {other}: a file holds them on every "
                "line or on none; make the traces again with 'specdec trace'")
    if set(d["drafts"]) != set(first["drafts"]):
        return (f"holds the drafts {_names(d['drafts'])} where line {first_line} holds {_names(first['drafts'])}: "
                "every trace of a file holds the same drafts")
    return None


def check_header_drafts(head: dict, first: dict) -> None:
    """The header's ``drafts``, where it lists them, are the drafts its traces hold."""
    if head.get("drafts") is not None and set(head["drafts"]) != set(first["drafts"]):
        raise ValueError(f"the header names the drafts {_names(head['drafts'])}, its traces hold "
                         f"{_names(first['drafts'])}")


def _names(names: Any) -> str:
    text = ", ".join(sorted(repr(str(n)[:60]) for n in names)) or "none"
    return text if len(text) <= 200 else text[:197] + "..."


def check_trace(d: Any) -> None:
    """One trace line (:meth:`specdec.traces.trace.Trace.to_dict`'s form), before ``Trace.from_dict``."""
    d = _obj("a trace", d)
    for name in ("sample_id", "answer", "prompt_tokens", "finish_reason", "max_new_tokens", "drafts"):
        if name not in d:
            raise ValueError(f"no {name!r}")
    if not isinstance(d["sample_id"], str) or not isinstance(d.get("category", ""), str):
        raise ValueError("'sample_id' and 'category' must be strings")
    answer = _ids("'answer'", d["answer"], MAX_TOKENS)
    n = len(answer)
    _int("'max_new_tokens'", d["max_new_tokens"], max(1, n), MAX_TOKENS)
    prompt_tokens = _int("'prompt_tokens'", d["prompt_tokens"], 1, MAX_PROMPT)
    if d["finish_reason"] not in FINISH_REASONS:
        raise ValueError(f"'finish_reason' must be one of {', '.join(FINISH_REASONS)}, got {_short(d['finish_reason'])}")
    if not _prob(d.get("target_agree", 1.0)):
        raise ValueError("'target_agree' must be a number in [0, 1]")
    if d.get("prompt") is not None and len(_ids("'prompt'", d["prompt"], MAX_PROMPT)) != prompt_tokens:
        raise ValueError(f"'prompt' holds {len(d['prompt'])} ids for {prompt_tokens} prompt tokens")
    for name, dt in _obj("'drafts'", d["drafts"]).items():
        check_draft(f"draft {str(name)[:60]!r}", dt, n, prompt_tokens)


def check_draft(where: str, d: Any, n: int, prompt_tokens: int) -> None:
    """One draft of a trace (:meth:`specdec.traces.trace.DraftTrace.to_dict`'s form) along an answer of ``n`` tokens."""
    d = _obj(where, d)
    for name in ("window", "view", "agree", "top1"):
        if name not in d:
            raise ValueError(f"{where}: no {name!r}")
    window = d["window"]
    if window not in WINDOW_WORDS:
        _int(f"{where}: 'window' (or all, auto)", window, 1, MAX_PROMPT)
    _int(f"{where}: 'view'", d["view"], 0, min(MAX_TOKENS, prompt_tokens))
    agree = d["agree"]
    if not isinstance(agree, str) or len(agree) != n or agree.strip("01"):
        raise ValueError(f"{where}: 'agree' must be a string of {n} 0s and 1s")
    top1 = d["top1"]
    if not isinstance(top1, list) or len(top1) != n or not all(_prob(p) for p in top1):
        raise ValueError(f"{where}: 'top1' must be a list of {n} probabilities")
    stops = d.get("stops", [])
    if not isinstance(stops, list) or not all(type(i) is int and 0 <= i < n for i in stops):
        raise ValueError(f"{where}: 'stops' must be a list of answer positions (integers in [0, {n}))")
    chains = d.get("chains")
    if chains is None:
        return
    for t, chain in _obj(f"{where}: 'chains'", chains).items():
        if not (isinstance(t, str) and t.isdigit() and int(t) < n):
            raise ValueError(f"{where}: 'chains' is keyed by answer positions, got {_short(t)}")
        if not isinstance(chain, list) or len(chain) > MAX_TOKENS or not all(
                isinstance(c, list) and len(c) == 2 and _prob(c[0]) and c[1] in (0, 1) for c in chain):
            raise ValueError(f"{where}: 'chains' at {t} must be a list of [probability, 0 or 1]")

