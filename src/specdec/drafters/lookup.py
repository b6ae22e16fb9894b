"""Prompt lookup decoding (PLD): propose what followed the last n-gram's most recent earlier
occurrence in prompt + generated text. No second model; no probabilities (a one-hot ``q``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..checks import option, options_of
from ..errors import SpecdecError
from ..sampling import SamplingParams
from .base import Draft, Drafter


#: the longest n-gram prompt lookup matches: each n tried compares every window of the context, so
#: a round's lookup costs up to context x ngram_max^2 comparisons where nothing matches
MAX_NGRAM = 64


def lookup(tokens: np.ndarray, k: int, ngram_max: int, ngram_min: int = 1) -> list[int]:
    """Up to ``k`` tokens following the most recent earlier occurrence of the context's last n
    tokens, trying n from ``ngram_max`` down to ``ngram_min``; ``[]`` when nothing matches.

    tokens: ``[L]`` int array. An occurrence must end before the context's last token, so that at
    least one token follows it; the suffix itself never counts as an occurrence.
    """
    n_tokens = len(tokens)
    for n in range(min(ngram_max, n_tokens - 1), ngram_min - 1, -1):
        pattern = tokens[n_tokens - n :]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: n_tokens - 1], n)  # [L-n, n]
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []


@dataclass(frozen=True)
class LookupOptions:
    ngram_max: int = option(3, lo=1, hi=MAX_NGRAM, help="prompt lookup: longest n-gram to match")
    ngram_min: int = option(1, lo=1, hi=MAX_NGRAM, help="prompt lookup: shortest n-gram to match")


class LookupDrafter(Drafter):
    """Prompt lookup (Saxena 2023; transformers' ``PromptLookupCandidateGenerator``; vLLM's n-gram
    proposer). Deviation: we take the *most recent* match, not transformers' leftmost one, since
    recent text predicts the continuation better in code and chat."""

    name = "pld"
    needs_model = False
    Options = LookupOptions

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1):
        self.check(ngram_max=ngram_max, ngram_min=ngram_min)
        self.ngram_max, self.ngram_min = ngram_max, ngram_min

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

    def start(self, prompt: Sequence[int]) -> None:
        pass

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        tokens = lookup(np.asarray(context, dtype=np.int64), k, self.ngram_max, self.ngram_min)
        if self.guide is not None:  # structured output: cut at the first token the grammar refuses
            tokens = tokens[: self.guide.valid_prefix(tokens)]
        return Draft(tokens)

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        pass
