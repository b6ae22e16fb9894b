"""The drafter interface: propose K tokens, learn what was kept, roll back.

A drafter produces token ids (and, when it has them, the distributions they were drawn from);
it never decides acceptance. Rolling back is implied by :meth:`Drafter.commit`, which hands the
drafter the committed context after every round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Sequence

import torch

from ...models.backends.base import Model, Scores
from ...checks import check_int, option
from ...draftlength import MAX_K
from ..rounds import Plan
from ..sampling import SamplingParams
from ..verify import Policy, Round, Verdict
from ..verify.tree import TreeRound, tree_depth


@dataclass
class Draft:
    """A chain of proposed tokens ``[k']`` (``k' <= k``), the distributions ``[k', V]`` they were
    drawn from (None at T=0 and for drafters without probabilities, which count as one-hot), the
    draft model's raw logits ``[k', V]`` (None for drafters without a model), and how many context
    tokens the draft model was fed before drafting (so its cost per draft token can be told apart
    from a prefill). A token tree is a :class:`TreeDraft`. What differs between the two (how the
    target scores them, how the grammar masks its rows, which round the policy judges, how the
    target's cache is rolled back, which tokens a verdict keeps) is theirs: the engine asks the
    draft and never which kind it is."""

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    fed: int = 0  # context tokens the drafter had to feed its model first (1-2 normally; a prefill or catch-up more)
    parents = None  # a chain has no tree shape (TreeDraft.parents)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int | None:
        """A token tree's depth; None for a chain."""
        return None

    def score(self, target: Model, context: Sequence[int], hidden: bool = False) -> Scores:
        """The target's one pass over ``[last, d_1..d_K]``: ``[K+1, V]`` logits (and hidden states)."""
        return target.score([*context, *self.tokens], len(self) + 1, hidden=hidden)

    def restrict(self, guide, logits: torch.Tensor) -> torch.Tensor:
        """Structured output: row 0 masked from the committed state, row ``i`` after drafts ``1..i``
        (:meth:`specdec.core.constrain.Guide.restrict`)."""
        return guide.restrict(logits, self.tokens)

    def round(self, **shared) -> Round:
        """What the policy judges (the pass's rows and the request's settings in ``shared``)."""
        return Round(draft_tokens=torch.tensor(self.tokens, device=shared["target_logits"].device),
                     draft_probs=self.probs, draft_logits=self.logits, **shared)

    @staticmethod
    def judge(policy: Policy, rnd: Round) -> Verdict:
        return policy.verify(rnd)

    def roll_back(self, target: Model, verdict: Verdict, length: int) -> None:
        """The target's cache back to the committed text's first ``length`` tokens."""
        target.truncate(length)

    def row_paths(self) -> list[list[int]]:
        """For each row of the verify pass over this draft, the draft tokens it follows: row ``i``
        follows drafts ``1..i``."""
        return [self.tokens[:i] for i in range(len(self.tokens) + 1)]

    def kept(self, verdict: Verdict) -> list[int]:
        """The draft tokens a verdict keeps: the first ``accepted``."""
        return self.tokens[:verdict.accepted]

    def judged_rows(self, verdict: Verdict) -> list[int]:
        """The verify pass's row each token a verdict commits was judged on (the kept drafts, then
        the verdict's own token): the i-th on row i."""
        return list(range(verdict.accepted + 1))


@dataclass
class TreeDraft(Draft):
    """A token tree of at least one node: node ``i`` is ``tokens[i]`` under node ``parents[i]``
    (-1: the context), parents first; scored in one tree pass, judged by the policy's
    ``verify_tree`` (:mod:`specdec.core.verify.tree`)."""

    # a field here, Draft's class attribute None there (a chain has no tree shape)
    parents: list[int] = field(default_factory=list)  # type: ignore[assignment]

    @property
    def depth(self) -> int:
        return tree_depth(self.parents)

    def score(self, target: Model, context: Sequence[int], hidden: bool = False) -> Scores:
        """``[last]`` and the tree's nodes in one pass with a tree attention mask: ``[1 + N, V]``."""
        return target.score_tree(context, self.tokens, self.parents, hidden=hidden)

    def restrict(self, guide, logits: torch.Tensor) -> torch.Tensor:
        """Row 0 from the committed state, row ``i + 1`` after node ``i``'s path
        (:meth:`specdec.core.constrain.Guide.restrict_tree`)."""
        return guide.restrict_tree(logits, self.tokens, self.parents)

    # each kind of draft makes its own round and judges it (round() and judge() go in pairs)
    def round(self, **shared) -> TreeRound:  # type: ignore[override]
        """Each node judged against its parent's row; the policy walks the tree."""
        return TreeRound(tokens=torch.tensor(self.tokens, device=shared["target_logits"].device),
                         parents=self.parents, draft_logits=self.logits, **shared)

    @staticmethod
    def judge(policy: Policy, rnd: TreeRound) -> Verdict:  # type: ignore[override]
        return policy.verify_tree(rnd)

    def roll_back(self, target: Model, verdict: Verdict, length: int) -> None:
        """Close the scored tree keeping the verdict's path, then cut to ``length``."""
        target.keep_path(verdict.path or ())
        target.truncate(length)

    def row_paths(self) -> list[list[int]]:
        """Row ``j + 1`` follows node ``j``'s path."""
        paths: list[list[int]] = [[]]
        for j, parent in enumerate(self.parents):
            paths.append((paths[parent + 1] if parent >= 0 else []) + [self.tokens[j]])
        return paths

    def kept(self, verdict: Verdict) -> list[int]:
        """The nodes of the verdict's ``path``."""
        return [self.tokens[i] for i in verdict.path or ()]

    def judged_rows(self, verdict: Verdict) -> list[int]:
        """The first on row 0, each next one on the row after the node kept before it."""
        return [0] + [p + 1 for p in verdict.path or ()]


#: how many tokens of a copy's match that lie in the prompt count towards its run: a match that runs
#: back through the prompt shows that the prompt repeats itself (a chat template's pre-filled answer
#: repeats the question's code right up to where the question's copy ends), not that the answer copies
PROMPT_CREDIT = 4


def answer_run(run: int, context: int, prompt: int) -> int:
    """A copy's run as its offer states it: the matched tokens the answer wrote (the context's last
    ``context - prompt``), and at most :data:`PROMPT_CREDIT` of the prompt's."""
    return min(int(run), max(0, context - prompt) + PROMPT_CREDIT)


@dataclass(frozen=True)
class Offer:
    """A draft a copy source (prompt lookup, suffix) would propose this round, known before the
    round's choice at no cost: its ``tokens`` and its ``run``, how many tokens of the context the
    copy matched before them (:class:`specdec.core.acceptance.RunRates` prices a copy by it)."""

    source: str
    tokens: tuple[int, ...]
    run: int

    def outcome(self, committed: Sequence[int]) -> tuple[int, int]:
        """``(reached, kept)``: how many of its tokens the round's ``committed`` tokens judged (up to
        and including the first that differs) and how many of those matched."""
        kept = 0
        for mine, theirs in zip(self.tokens, committed):
            if mine != theirs:
                return kept + 1, kept
            kept += 1
        return kept, kept


def tree_draft(tokens: list[int], parents: list[int], **fields) -> Draft:
    """A tree drafter's proposal: a :class:`TreeDraft`, or without a node an empty chain (a plain
    step: no tree is scored)."""
    return TreeDraft(tokens, parents=parents, **fields) if tokens else Draft(**fields)


def depth_option():
    """``tree_depth``, every tree drafter's option: the tree's depth limit each round, which a fixed
    ``k`` also sets for a tree drafter (:meth:`specdec.core.request.DecodeConfig` takes either; None: k's)."""
    return option(None, kind=int, check=lambda where, v: v if v is None else check_int(where, v, 1, MAX_K),
                  help="tree drafters: the tree's depth limit each round, as -k N is for them (default: k's: k=N "
                       "grows trees to depth N, k=auto as deep as the tree's own limit)")


#: the contract's declarations renamed, old name -> new: a drafter declaring an old one is refused
#: when its class is made (``needs_model`` read as "requires" and ``uses_model`` as "drafts with")
RENAMED = {"needs_model": "requires_model", "uses_model": "drafts_with_model"}


class Drafter(ABC):
    """The drafter contract: everything the registry, the engine, bench and the server use of a
    drafter. A new drafter is one file with a subclass of this, and one entry in
    :data:`specdec.core.drafters.DRAFTERS`.

    Declared on the class (read as declared, never probed):

    - ``name``: the registry name (``model``, ``pld``, ...);
    - ``requires_model``: it cannot draft without a draft model: the engine refuses its request
      when none is loaded (so ``load`` and ``specdec serve`` need ``draft=``), and ``specdec bench``
      and ``tune`` load one for it. Such a drafter also declares ``drafts_with_model``;
    - ``grows_trees``: its drafts are token trees (:class:`TreeDraft`), verified in one tree pass by
      policies that verify trees; its ``Options`` declare ``tree_depth`` (:func:`depth_option`), the
      tree's depth limit, which a fixed ``k`` also sets (the request holds it as its K), and
      ``k="auto"`` leaves the depth to the tree's own pruning up to :meth:`depth_limit`;
    - ``reads_history``: it also drafts from earlier requests' text: :meth:`build` gets
      ``history``, the request's view of the engine's cross-request cache, scoped to its caller
      (:class:`specdec.core.drafters.suffix.CacheScope`);
    - ``drafts_with_model``: its drafts come from the draft model whenever one is loaded (the
      ``requires_model`` drafters, and the portfolio, ``auto``, which runs without one too): ``k="auto"``
      prices its draft tokens at the draft model's pass, where those of a drafter without one cost ~0;
    - ``portfolio``: it drafts from several sources, one per round, which its K policy
      (:class:`specdec.core.autok.PortfolioK`) chooses from :meth:`offers` and the draft model's plan;
    - ``observes_target``: after every round it drafted, the engine hands :meth:`observe` the
      target's argmax after every row of the verify pass (lookahead's Jacobi window learns from
      it); off by default;
    - ``Options``: a frozen dataclass whose fields, declared with :func:`specdec.checks.option`,
      are the drafter's options (default, range, help): validation, CLI flags and the server's
      option names all come from there.

    Class methods: :meth:`check` (constraints across options), :meth:`build` (an instance over the
    draft model), :meth:`depth_limit` and :meth:`tree_paths` (tree drafters). Instance methods:
    :meth:`start`, :meth:`propose`, :meth:`observe`, :meth:`commit`, :meth:`backlog`.

    Structured output: ``guide`` is set by the engine before every :meth:`start`: None, or the
    grammar's state after the committed text (:class:`specdec.core.constrain.Guide`). A drafter should
    propose only tokens it allows (mask its logits with ``guide.restrict``, advancing the guide
    along its own drafts inside ``with guide.trial():``, or cut a proposal at
    ``guide.valid_prefix``) and must leave the guide as it found it. A drafter that ignores it
    stays correct, only slower: the engine masks the target along the drafts, so every rule
    rejects a draft the grammar refuses.
    """

    name: ClassVar[str]
    requires_model: ClassVar[bool]
    grows_trees: ClassVar[bool] = False
    reads_history: ClassVar[bool] = False
    drafts_with_model: ClassVar[bool] = False
    portfolio: ClassVar[bool] = False
    observes_target: ClassVar[bool] = False
    Options: ClassVar[type]
    #: structured output: the grammar's state, set by the engine before :meth:`start` (None: none)
    guide: Any = None  # a specdec.core.constrain.Guide (not imported here: constrain is the engine's)
    #: ``more(i, p)``: after its i-th draft token (1-based), of draft probability ``p``, whether to
    #: propose another (the request's K policy, :meth:`specdec.core.autok.KPolicy.more`, set by the engine
    #: before :meth:`start`). Drafters with a model ask it after every token; others may ignore it.
    more = staticmethod(lambda i, p: True)
    #: set by the engine for each generation: whether to stop now (the client went away). A
    #: drafter that runs a model asks :meth:`stopping` between its passes and ends its proposal
    #: there, so that a round's drafting is cut short; None: never
    should_stop: "Callable[[], bool] | None" = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for old, new in RENAMED.items():
            if old in vars(cls):
                raise TypeError(f"{cls.__name__}.{old} is now called {new} (docs/extending.md)")

    def stopping(self) -> bool:
        """Whether the generation is being stopped (:attr:`should_stop`)."""
        return self.should_stop is not None and bool(self.should_stop())

    @classmethod
    def check(cls, **options) -> None:
        """Constraints across options (each option's own range is declared on ``Options``); raise
        :class:`~specdec.errors.SpecdecError` for a bad combination. None by default."""

    @classmethod
    def build(cls, lm, stop_ids: frozenset[int], **options) -> "Drafter":
        """The drafter over the draft model ``lm`` (None when none is loaded, never for a
        ``requires_model`` drafter) that stops at ``stop_ids``, with ``options`` already checked."""
        return cls(lm, stop_ids, **options)  # type: ignore[call-arg]  # every registered drafter's __init__ takes these

    @classmethod
    def depth_limit(cls, **options) -> int:
        """Tree drafters: the deepest tree ``k="auto"`` grows with these options. Chain drafters
        have no such limit (``k="auto"`` asks the cost model), so asking one is a programming error."""
        raise NotImplementedError(f"drafter {cls.name!r} drafts chains; only tree drafters have a depth limit")

    @classmethod
    def tree_paths(cls, depth: int, **options) -> tuple[int, int]:
        """Tree drafters: the most root-to-leaf paths of (the tree the target scores, the tree the
        draft model feeds at once) with these options and depth limit, checked against a backend's
        ``max_tree_leaves`` before any work (0: that model scores no tree)."""
        raise NotImplementedError(f"drafter {cls.name!r} drafts chains; only tree drafters have paths")

    @classmethod
    def tree_size(cls, **options) -> int:
        """Tree drafters: the most nodes one tree holds with these options (the target scores them
        after the context, so they must fit the context's room)."""
        raise NotImplementedError(f"drafter {cls.name!r} drafts chains; only tree drafters have a tree size")

    @abstractmethod
    def start(self, prompt: Sequence[int]) -> None:
        """A new generation begins with ``prompt`` (prefill caches here, or lazily at the first
        proposal)."""

    @abstractmethod
    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        """Up to ``k`` tokens that might follow ``context`` (a tree drafter: nodes up to depth ``k``)."""

    def draft(self, context: Sequence[int], plan: Plan, params: SamplingParams, generator: torch.Generator | None
              ) -> Draft:
        """This round's draft by its K policy's ``plan``: :meth:`propose` of ``plan.k`` tokens (a
        portfolio drafts from the plan's source)."""
        return self.propose(context, plan.k, params, generator)

    def backlog(self, context: Sequence[int]) -> int:
        """Context tokens the drafter must feed its model before its next draft token (a prefill,
        or a catch-up after rounds that did not draft): what k=auto weighs against drafting. 0 for
        drafters without a model."""
        return 0

    def offers(self, context: Sequence[int], room: int) -> list[Offer]:
        """A portfolio's free drafts for this round (up to ``room`` tokens each), asked before the K
        policy chooses: the copy sources' :class:`Offer`. ``[]`` for a drafter of one source."""
        return []

    def observe(self, draft: Draft, argmax: Sequence[int]) -> None:
        """Drafters with ``observes_target``: after the verify pass over ``draft`` (proposed this
        round), before :meth:`commit`, the target's argmax (raw logits, no penalty or grammar) after
        each row: ``argmax[0]`` after the context, then after each draft token (a tree: after node
        ``i`` at ``argmax[i + 1]``). Not called after a round that drafted nothing (k=0)."""

    @abstractmethod
    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        """The round kept ``accepted`` of ``drafted`` tokens; ``context`` is what is now committed.
        Drop any state beyond it (roll back) and learn from the outcome."""
