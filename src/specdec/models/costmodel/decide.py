"""Deciding from cost tables: pure functions, for the engine, k=auto and the tests.

:func:`expected_tokens` (the lesson seed's formula generalised to per-position acceptance),
:func:`tokens_per_second` and :func:`best_k` (the draft length that maximises expected tokens per
second; ``0`` = a plain decoding step), :func:`seconds_per_token`, and :func:`choose_dtypes` (the
target and draft dtypes that make a reference request fastest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Sequence

from ...draftlength import MAX_CHAIN
from .table import CostTable

#: The request a dtype choice is made for: a typical chat prompt and completion.
REFERENCE_PROMPT, REFERENCE_NEW = 256, 256
#: Acceptance assumed per draft position before anything is observed (code drafts ~0.9, text ~0.6).
PRIOR_ACCEPTANCE = 0.75
#: k=auto without a cost table (a failed measurement): a middling K, as long drafts pay only at high acceptance
FALLBACK_K = 5
#: a longer K must beat a shorter one by more than this share (float noise) to be chosen: ties go to the smaller K
TIE_TOLERANCE = 1e-9
#: seconds a round is taken to cost at least: a round of (near) zero cost divides by no zero
MIN_ROUND_SECONDS = 1e-12


def expected_tokens(rates: Sequence[float], k: int) -> float:
    """Tokens one round yields with ``k`` drafts: ``1 + sum_j prod_{i<=j} a_i``, where ``a_i`` is
    the chance draft ``i`` is kept given drafts ``1..i-1`` were (the lesson seed's
    ``(1 - a^(K+1)) / (1 - a)`` when every ``a_i = a``). The 1 is the target's own token."""
    total, run = 1.0, 1.0
    for i in range(k):
        run *= float(rates[i]) if i < len(rates) else float(rates[-1]) if len(rates) else 0.0
        total += run
    return total


def tokens_per_second(verify: Callable[[int], float], draft_step: float, rates: Sequence[float], k: int) -> float:
    """Expected tokens per second of rounds drafting ``k``: ``expected_tokens(rates, k) /
    (k * draft_step + verify(k + 1))`` (``k = 0``: one plain decoding step)."""
    return expected_tokens(rates, k) / max(k * draft_step + verify(k + 1), MIN_ROUND_SECONDS)


def best_k(verify: Callable[[int], float], draft_step: float, rates: Sequence[float], k_max: int,
           k_min: int = 1, allow_zero: bool = True, allowed: Collection[int] | None = None) -> int:
    """:func:`best_k_rate`'s ``K``."""
    return best_k_rate(verify, draft_step, rates, k_max, k_min, allow_zero, allowed)[0]


def best_k_rate(verify: Callable[[int], float], draft_step: float, rates: Sequence[float], k_max: int,
                k_min: int = 1, allow_zero: bool = True, allowed: Collection[int] | None = None) -> tuple[int, float]:
    """The draft length ``K`` in ``{0} + k_min..k_max`` with the most expected tokens per second:
    ``expected_tokens(rates, K) / (K * draft_step + verify(K + 1))``. ``verify(w)`` is the target's
    pass over ``w`` tokens; ``K = 0`` is a plain decoding step (``1 / verify(1)``), left out with
    ``allow_zero=False`` (then at least ``k_min``). ``allowed``: the only K > 0 to consider (those
    whose pass width ``K + 1`` was measured; None: every K). Ties go to the smaller K. One pass:
    ``E(K)`` grows term by term (the same sums :func:`expected_tokens` makes). Returns ``(K, its
    expected tokens per second)``; ``(0, 0.0)`` where no K qualifies."""
    best, best_rate = (0, 1.0 / max(verify(1), MIN_ROUND_SECONDS)) if allow_zero else (None, -1.0)
    total, run = 1.0, 1.0
    for k in range(1, max(0, k_max) + 1):
        run *= float(rates[k - 1]) if k - 1 < len(rates) else float(rates[-1]) if len(rates) else 0.0
        total += run
        if k < max(1, k_min) or (allowed is not None and k not in allowed):
            continue
        rate = total / max(k * draft_step + verify(k + 1), MIN_ROUND_SECONDS)
        if best is None or rate > best_rate * (1 + TIE_TOLERANCE):
            best, best_rate = k, rate
    return (best, best_rate) if best is not None else (0, 0.0)


def seconds_per_token(target: CostTable, draft: CostTable | None, rate: float = PRIOR_ACCEPTANCE,
                      k_max: int = MAX_CHAIN) -> tuple[float, int]:
    """Expected decoding seconds per token with the best K under a constant acceptance ``rate``
    (plain decoding when there is no draft table), and that K (at most ``k_max``: K drafts are
    verified in a pass of K + 1 tokens, and the widest measured is :data:`~specdec.draftlength.MAX_K`)."""
    if draft is None:
        return target.forward(1), 0
    step = draft.forward(1)
    rates = [rate] * k_max
    k = best_k(target.forward, step, rates, k_max)
    return (k * step + target.forward(k + 1)) / expected_tokens(rates, k), k


@dataclass(frozen=True)
class DtypeChoice:
    """The (target, draft) dtypes :func:`choose_dtypes` picked, with the expected seconds of every pair."""

    target: str
    draft: str | None
    seconds: float  # expected seconds for the reference request
    k: int  # the K the cost model expects to use at the prior acceptance
    table: dict  # (target dtype, draft dtype) -> expected seconds, for the record

    def reason(self) -> str:
        others = sorted((s, key) for key, s in self.table.items() if key != self.key)
        line = (f"expected {self.seconds:.1f}s for a {REFERENCE_PROMPT}-token prompt + {REFERENCE_NEW} new tokens "
                f"(K~{self.k} at acceptance {PRIOR_ACCEPTANCE})")
        if others:
            s, key = others[0]
            line += f"; next best {key}: {s:.1f}s"
        return line

    @property
    def key(self) -> str:
        return self.target if self.draft is None else f"{self.target} + draft {self.draft}"


def choose_dtypes(targets: Mapping[str, CostTable], drafts: Mapping[str, CostTable] | None = None,
                  prompt: int = REFERENCE_PROMPT, new: int = REFERENCE_NEW,
                  rate: float = PRIOR_ACCEPTANCE) -> DtypeChoice:
    """The (target dtype, draft dtype) pair that makes the reference request fastest: both
    prefills plus ``new`` tokens at the best K for each combination (plain decoding without a
    draft). Prefill and decoding are both counted, so a dtype with fast single-token steps but a
    slow wide pass (bf16 on a CPU without bf16 instructions) is judged on both."""
    if not targets:
        raise ValueError("no target cost tables")
    table: dict[str, float] = {}
    best: DtypeChoice | None = None
    for td, tt in targets.items():
        for dd, dt in ((drafts or {}).items() or [(None, None)]):
            per_token, k = seconds_per_token(tt, dt, rate)
            total = tt.prefill(prompt) + (dt.prefill(prompt) if dt is not None else 0.0) + new * per_token
            choice = DtypeChoice(td, dd, total, k, {})
            table[choice.key] = total
            if best is None or total < best.seconds:
                best = choice
    assert best is not None
    return DtypeChoice(best.target, best.draft, best.seconds, best.k, table)
