"""Prompt lookup decoding (PLD): propose what followed the last n-gram's most recent earlier
occurrence in prompt + generated text. No second model; no probabilities (a one-hot ``q``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ...checks import option, options_of
from ...errors import SpecdecError
from ..sampling import SamplingParams
from .base import Draft, Drafter, Offer, answer_run


#: the longest n-gram prompt lookup matches: each n tried compares every window of the context, so
#: a round's lookup costs up to context x ngram_max^2 comparisons where nothing matches
MAX_NGRAM = 64


#: the longest run a copy's offer measures (tokens of the context its match extends back over)
RUN_MAX = 256


def _find(tokens: np.ndarray, ngram_max: int, ngram_min: int) -> tuple[int, int]:
    """``(start, n)``: where the continuation of the most recent earlier occurrence of the context's
    last ``n`` tokens starts, trying n from ``ngram_max`` down to ``ngram_min``; ``(-1, 0)`` when
    nothing matches."""
    n_tokens = len(tokens)
    for n in range(min(ngram_max, n_tokens - 1), ngram_min - 1, -1):
        pattern = tokens[n_tokens - n :]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: n_tokens - 1], n)  # [L-n, n]
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            return int(hits[-1]) + n, n
    return -1, 0


def lookup(tokens: np.ndarray, k: int, ngram_max: int, ngram_min: int = 1) -> list[int]:
    """Up to ``k`` tokens following the most recent earlier occurrence of the context's last n
    tokens, trying n from ``ngram_max`` down to ``ngram_min``; ``[]`` when nothing matches.

    tokens: ``[L]`` int array. An occurrence must end before the context's last token, so that at
    least one token follows it; the suffix itself never counts as an occurrence.
    """
    start, _ = _find(tokens, ngram_max, ngram_min)
    return [] if start < 0 else tokens[start : start + k].tolist()


def lookup_run(tokens: np.ndarray, k: int, ngram_max: int, ngram_min: int = 1,
               run_max: int = RUN_MAX) -> tuple[list[int], int]:
    """:func:`lookup`'s draft and its *run*: how many tokens before the continuation match the
    context's last ones (the n-gram, extended back as far as the two stretches agree, at most
    ``run_max``): a long run means the answer is copying that stretch."""
    start, n = _find(tokens, ngram_max, ngram_min)
    if start < 0:
        return [], 0
    end, here = start - n, len(tokens) - n  # the occurrence's and the suffix's first matched token
    run = n
    while run < run_max and end > 0 and tokens[end - 1] == tokens[here - 1]:
        end, here, run = end - 1, here - 1, run + 1
    return tokens[start : start + k].tolist(), run


class TokenIndex:
    """Where each token occurs in a growing text, so that prompt lookup costs time in proportion to
    the last token's occurrences, not to the text's length (:func:`lookup` compares every window).
    :meth:`sync` keeps it in step with the context, indexing only what was appended (a context that
    does not extend the indexed text is indexed anew)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.where: dict[int, list[int]] = {}

    def sync(self, context: Sequence[int]) -> None:
        n = len(self.tokens)
        if len(context) < n or (n and int(context[n - 1]) != self.tokens[-1]) or (n > 1 and int(context[0]) != self.tokens[0]):
            self.tokens, self.where, n = [], {}, 0
        for i in range(n, len(context)):
            t = int(context[i])
            self.tokens.append(t)
            self.where.setdefault(t, []).append(i)

    def find(self, ngram_max: int, ngram_min: int) -> tuple[int, int]:
        """``(start, n)`` exactly as :func:`_find` gives it for the indexed text."""
        toks, size = self.tokens, len(self.tokens)
        top = min(ngram_max, size - 1)
        if top < ngram_min:
            return -1, 0
        best = [-1] * (top + 1)  # best[n]: the last position of the most recent occurrence of the last n tokens
        for p in reversed(self.where.get(toks[-1], ())):
            if p >= size - 1:
                continue
            m = 1
            while m < top and p - m >= 0 and toks[p - m] == toks[size - 1 - m]:
                m += 1
            for n in range(ngram_min, m + 1):
                if best[n] < 0:
                    best[n] = p
            if m >= top:
                break
        for n in range(top, ngram_min - 1, -1):
            if best[n] >= 0:
                return best[n] + 1, n
        return -1, 0

    def draft(self, k: int, ngram_max: int, ngram_min: int, run_max: int = RUN_MAX) -> tuple[list[int], int]:
        """:func:`lookup_run` of the indexed text."""
        start, n = self.find(ngram_max, ngram_min)
        if start < 0:
            return [], 0
        toks = self.tokens
        end, here, run = start - n, len(toks) - n, n
        while run < run_max and end > 0 and toks[end - 1] == toks[here - 1]:
            end, here, run = end - 1, here - 1, run + 1
        return toks[start : start + k], run


@dataclass(frozen=True)
class LookupOptions:
    ngram_max: int = option(3, lo=1, hi=MAX_NGRAM, help="prompt lookup: longest n-gram to match")
    ngram_min: int = option(1, lo=1, hi=MAX_NGRAM, help="prompt lookup: shortest n-gram to match")


class LookupDrafter(Drafter):
    """Prompt lookup (Saxena 2023; transformers' ``PromptLookupCandidateGenerator``; vLLM's n-gram
    proposer). Deviation: we take the *most recent* match, not transformers' leftmost one, since
    recent text predicts the continuation better in code and chat."""

    name = "pld"
    requires_model = False
    Options = LookupOptions

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1):
        self.check(ngram_max=ngram_max, ngram_min=ngram_min)
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.index = TokenIndex()

    @classmethod
    def check(cls, **options) -> None:
        """Constraints across options: the n-gram range must not be empty."""
        defaults = {k: d for k, (_, d) in options_of(cls.Options).items()}
        lo, hi = options.get("ngram_min", defaults["ngram_min"]), options.get("ngram_max", defaults["ngram_max"])
        if not (isinstance(lo, int) and isinstance(hi, int) and not isinstance(lo, bool)
                and not isinstance(hi, bool) and 1 <= lo <= hi):
            raise SpecdecError(f"n-gram range must satisfy 1 <= min <= max, got min={lo}, max={hi}")

    @classmethod
    def build(cls, lm, stop_ids, **options) -> "LookupDrafter":
        return cls(**options)

    prompt_len = 0

    def start(self, prompt: Sequence[int]) -> None:
        self.prompt_len = len(prompt)
        self.index.sync(prompt)

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        self.index.sync(context)
        tokens = self.index.draft(k, self.ngram_max, self.ngram_min)[0]
        if self.guide is not None:  # structured output: cut at the first token the grammar refuses
            tokens = tokens[: self.guide.valid_prefix(tokens)]
        return Draft(tokens)

    def offer(self, context: Sequence[int], k: int) -> Offer | None:
        """What :meth:`propose` would draft (up to ``k``), with its run (:func:`lookup_run`, counted
        as :func:`~specdec.core.drafters.base.answer_run` counts it); None when nothing matches."""
        self.index.sync(context)
        tokens, run = self.index.draft(k, self.ngram_max, self.ngram_min)
        if self.guide is not None:
            tokens = tokens[: self.guide.valid_prefix(tokens)]
        return Offer(self.name, tuple(tokens), answer_run(run, len(context), self.prompt_len)) if tokens else None

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        pass
