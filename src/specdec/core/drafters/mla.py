"""FLy's multi-level acceleration: the draft model's continuation, produced faster by prompt lookup.

Speculative decoding one level down: prompt lookup proposes up to ``lookup_tokens`` tokens, the
draft model scores them in one forward pass, and the lossless rule keeps a prefix plus one token.
The tokens that come out are distributed exactly as the draft model's own greedy or sampled
continuation (so the target's lossless rules stay exact); only the draft's cost drops when the
text repeats itself. Deviation from FLy's code: at T>0 the inner verification is speculative
sampling against the draft's distribution, so sampled drafts keep their distribution ``q``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ...checks import check_options, option, options_of
from ...models.backends.base import Model
from ..sampling import SamplingParams, next_token, probabilities
from ..window import WINDOW_AUTO
from ..verify.base import Lossless, Round
from .base import Draft
from .lookup import MAX_NGRAM, LookupDrafter, lookup
from .model import ModelDrafter, min_confidence_option, window_option


@dataclass(frozen=True)
class LookupModelOptions:
    ngram_max: int = option(4, lo=1, hi=MAX_NGRAM, help="prompt lookup: longest n-gram to match")
    ngram_min: int = option(1, lo=1, hi=MAX_NGRAM, help="prompt lookup: shortest n-gram to match")
    lookup_tokens: int = option(6, lo=1, help="model+pld: tokens prompt lookup proposes per draft-model pass")
    min_confidence: float = min_confidence_option()
    draft_window: int = window_option()


class LookupModelDrafter(ModelDrafter):
    """``model+pld``: the draft model, accelerated by prompt lookup (n-gram ``ngram_max..ngram_min``,
    up to ``lookup_tokens`` proposed tokens per draft-model pass). Prefill and rollback are the
    plain draft model's."""

    name = "model+pld"
    Options = LookupModelOptions

    def __init__(self, lm: Model, stop_ids: frozenset[int] = frozenset(), ngram_max: int = 4,
                 ngram_min: int = 1, lookup_tokens: int = 6, min_confidence: float = 0.0,
                 draft_window: int | str = WINDOW_AUTO):
        check_options(f"drafter {self.name!r}", LookupModelOptions, {"lookup_tokens": lookup_tokens})
        self.check(ngram_max=ngram_max, ngram_min=ngram_min)
        super().__init__(lm, stop_ids, min_confidence, draft_window)
        self.ngram_max, self.ngram_min, self.lookup_tokens = ngram_max, ngram_min, lookup_tokens
        self.inner = Lossless()
        self.lookups = 0  # draft-model passes that verified a lookup proposal
        self.lookup_hits = 0  # proposed tokens the draft model agreed with

    @classmethod
    def check(cls, **options) -> None:
        """Constraints across options: the n-gram range must not be empty."""
        defaults = {k: d for k, (_, d) in options_of(cls.Options).items()}
        LookupDrafter.check(ngram_max=options.get("ngram_max", defaults["ngram_max"]),
                            ngram_min=options.get("ngram_min", defaults["ngram_min"]))

    def _propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        """With a grammar (``guide``; :meth:`ModelDrafter.propose` rolls it back after): the lookup
        proposal is cut at the first token it refuses, and the draft's rows are masked along it, so
        the tokens kept are the masked draft model's own continuation."""
        tokens: list[int] = []
        raw: list[torch.Tensor] = []  # [V] per token: the draft's logits it was chosen from
        fed = self.backlog(context)
        seen = self.view(context)  # what the draft model reads; prompt lookup searches the whole context
        while len(tokens) < k:
            ctx = list(context) + tokens
            want = k - len(tokens)
            guess = lookup(np.asarray(ctx, dtype=np.int64), min(self.lookup_tokens, want - 1), self.ngram_max,
                           self.ngram_min) if want > 1 else []
            if self.guide is not None:
                guess = guess[: self.guide.valid_prefix(guess)]
            logits = self.lm.logits_for(seen + tokens + guess, len(guess) + 1)  # [g+1, V]
            if self.guide is not None:
                logits = self.guide.restrict(logits, guess)
            if guess:
                rnd = Round(logits, torch.tensor(guess, device=logits.device), None, params, generator,
                            target_probs=None if params.greedy else probabilities(logits, params))
                verdict = self.inner.verify(rnd)
                kept, token = verdict.accepted, verdict.token
                self.lookups += 1
                self.lookup_hits += kept
            else:
                kept, token = 0, next_token(logits[0], params, generator)
            new = guess[:kept] + [token]
            for i, t in enumerate(new):
                tokens.append(t)
                raw.append(logits[i])
                q = None if params.greedy else probabilities(logits[i][None], params)[0]
                if self.stop_after(len(tokens), logits[i], t, q) or t in self.stop_ids:
                    k = len(tokens)  # stop drafting after this token (the K policy, EOS, or the draft is unsure)
                    break
            if self.stopping():
                break
            if self.guide is not None and len(tokens) < k:
                self.guide.advance(new)
        tokens, raw = tokens[:k], raw[:k]
        logits = torch.stack(raw)  # [k', V]
        probs = None if params.greedy else probabilities(logits, params)
        return Draft(tokens, probs, logits, fed=fed)
