"""``auto``: a portfolio of draft sources, one chosen per round at the machine's measured costs.

The sources: the draft model (when one is loaded: :class:`~specdec.core.drafters.model.ModelDrafter` in
its window), prompt lookup over the prompt and the answer so far
(:class:`~specdec.core.drafters.lookup.LookupDrafter`) and suffix decoding over this answer and the same
caller's earlier answers (:class:`~specdec.core.drafters.suffix.SuffixDrafter`; not over the prompt,
which prompt lookup covers: indexing a long prompt in a suffix trie costs a fraction of a second). The copy
sources cost nothing to ask, so before each round they are asked what they would draft
(:meth:`AutoDrafter.offers`: an :class:`~specdec.core.drafters.base.Offer` each, with the run of text it
copies); the request's K policy (:class:`specdec.core.autok.PortfolioK`) then picks the source and K
with the most expected tokens per second, or a plain step, and this drafter proposes from it.

Every source proposes tokens only, never decides: the lossless rules keep greedy output exactly
plain decoding's and sampled output the target's distribution, whichever source drafted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ...checks import option, options_of
from ..names import Source
from ..rounds import Plan
from ..sampling import SamplingParams
from .base import Draft, Drafter, Offer
from .lookup import LookupDrafter, LookupOptions
from .model import ModelDrafter, ModelOptions
from .suffix import CacheScope, SuffixDrafter, SuffixOptions

#: the portfolio's sources, in the order they are asked (ties go to the first)
SOURCES = tuple(Source)


@dataclass(frozen=True)
class AutoOptions(SuffixOptions, LookupOptions, ModelOptions):
    """Its sources' options, each passed to the source that declares it (``ngram_max`` to prompt
    lookup, ``suffix_*`` to suffix decoding, ``draft_window``/``min_confidence`` to the draft model).

    ``suffix_factor`` defaults higher than suffix decoding's own 1.0: the portfolio cuts a copy at
    the K its price gives, so the match length need not cut it first (replayed on this machine's
    traces, 4 made the agent loop 1.10x -> 1.12x plain and changed the edits, HumanEval and
    Spec-Bench by at most 0.001; docs/free-drafts.md)."""

    suffix_factor: float = option(4.0, lo=0, lo_open=True, hi=16,
                                  help="suffix: draft at most ceil(factor x match length) tokens (the paper's alpha)")


def copy_sources(stop_ids: frozenset[int] = frozenset(), history: CacheScope | None = None, **options
                 ) -> dict[Source, "LookupDrafter | SuffixDrafter"]:
    """A request's copy sources as the portfolio makes them, by name (fresh: nothing read yet); the
    options its sources declare (:class:`AutoOptions`), the rest at the portfolio's defaults."""
    options = {**{k: default for k, (_, default) in options_of(AutoOptions).items()}, **options}

    def of(source: type[Drafter]) -> dict:
        return {k: v for k, v in options.items() if k in options_of(source.Options)}

    return {Source.PLD: LookupDrafter(**of(LookupDrafter)),
            Source.SUFFIX: SuffixDrafter(stop_ids, history=history, prompts=False, **of(SuffixDrafter))}


class AutoDrafter(Drafter):
    """The portfolio (module docstring). Without a draft model its sources are the copy sources."""

    name = "auto"
    requires_model = False
    drafts_with_model = True
    reads_history = True
    portfolio = True
    Options = AutoOptions

    def __init__(self, lm=None, stop_ids: frozenset[int] = frozenset(), history: CacheScope | None = None,
                 **options):
        options = {**{k: default for k, (_, default) in options_of(AutoOptions).items()}, **options}  # its own defaults
        model = {k: v for k, v in options.items() if k in options_of(ModelDrafter.Options)}
        self.model = ModelDrafter(lm, stop_ids, **model) if lm is not None else None
        self.copies = copy_sources(stop_ids, history, **{k: v for k, v in options.items() if k not in model})
        self._offers: dict[str, Offer] = {}

    @classmethod
    def check(cls, **options) -> None:
        """Constraints across options: prompt lookup's n-gram range must not be empty."""
        LookupDrafter.check(**{k: v for k, v in options.items() if k in options_of(LookupOptions)})

    @classmethod
    def build(cls, lm, stop_ids, history: CacheScope | None = None, **options) -> "AutoDrafter":
        return cls(lm, stop_ids, history, **options)

    def _sources(self) -> list[Drafter]:
        return ([self.model] if self.model is not None else []) + list(self.copies.values())

    def start(self, prompt: Sequence[int]) -> None:
        self._offers = {}
        for d in self._sources():
            d.guide = self.guide
            d.start(prompt)

    def backlog(self, context: Sequence[int]) -> int:
        return self.model.backlog(context) if self.model is not None else 0

    def offers(self, context: Sequence[int], room: int) -> list[Offer]:
        self._offers = {}
        if room <= 0:
            return []
        for name, d in self.copies.items():
            d.guide = self.guide
            offer = d.offer(context, room)
            if offer is not None:
                self._offers[name] = offer
        return list(self._offers.values())

    def draft(self, context: Sequence[int], plan: Plan, params: SamplingParams, generator: torch.Generator | None
              ) -> Draft:
        """From the source the plan names: the model drafts (asking :attr:`more` after each token), a
        copy source's offer of this round is cut to the plan's K."""
        if plan.source == Source.MODEL and self.model is not None:
            self.model.guide, self.model.more, self.model.should_stop = self.guide, self.more, self.should_stop
            return self.model.propose(context, plan.k, params, generator)
        offer = self._offers.get(plan.source) if plan.source is not None else None
        return Draft(list(offer.tokens[:plan.k])) if offer is not None else Draft()

    def propose(self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
                ) -> Draft:
        """``k`` tokens from the draft model (none without one): a plan that names no source."""
        return self.draft(context, Plan(k, Source.MODEL), params, generator)

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        for d in self._sources():
            d.commit(context, drafted, accepted)
