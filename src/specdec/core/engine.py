"""The one decoding loop. It knows nothing about text: token ids in, token ids out.

Each round: (0) the request's K policy says how many drafts; (1) the drafter proposes up to K
tokens; (2) the target scores ``[last, d_1..d_K]`` in one forward pass; (3) the policy keeps a
prefix of the drafts and picks one more token; (4) the round's tokens are committed, cut at the
first stop; (5) both KV caches roll back to the committed text and the drafter is told what was
kept; (6) the round leaves one record (:class:`~specdec.core.rounds.RoundRecord`: what it drafted and
kept, its seconds by part), which the stats add up and the K policy learns from. A chain and a
token tree differ only inside the draft's own type (:class:`~specdec.core.drafters.base.Draft`,
:class:`~specdec.core.drafters.base.TreeDraft`). Plain decoding (``policy="ar"``) is a policy like the
others (:class:`~specdec.core.verify.Plain`) that declares it drafts nothing: the same loop through the
same model wrapper, so speed comparisons are fair.

Structured output (a request's ``constraint``, :mod:`specdec.core.constrain`): before step (3) the
target's rows are masked by the grammar (row 0 from the committed state, row ``i`` after drafts
``1..i``), so every rule reads the masked target; the drafter gets the grammar's state as
``Drafter.guide``; after step (4) the state advances by the committed tokens.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterator, Sequence

import torch

from .caller import Caller
from .constrain import Constraints, Guide
from .drafters import Draft, Drafter, make_drafter
from .acceptance import AcceptancePrior
from .autok import KPolicy, k_policy
from ..models.costmodel import FALLBACK_K, CostTable
from ..errors import SpecdecError
from ..models.backends.base import Model, Scores
from .logprobs import TokenLogprob, token_logprobs
from .request import DecodeConfig, check_tree_fits, lookahead_of  # noqa: F401 (DecodeConfig re-exported: the request type lives in request.py)
from .sampling import make_generator, next_token, penalize, probabilities
from .rounds import SECONDS, Plan, RoundRecord
from .scopes import Caches
from .stats import Stats, peak_rss_mb
from .verify import Policy, Verdict

#: ``stop_check(generated_ids, n_new) -> keep``: how many generated tokens to keep when a stop
#: sequence ends inside the last ``n_new`` tokens, else None.
StopCheck = Callable[[Sequence[int], int], "int | None"]

#: a generation of at least DRIFT_ROUNDS rounds whose target passes took outside DRIFT_LOW..DRIFT_HIGH
#: times the table's seconds says so in its stats (``cost_drift``): the table may be stale ('specdec calibrate')
DRIFT_LOW, DRIFT_HIGH, DRIFT_ROUNDS = 0.5, 4.0, 32


@dataclass
class Generation:
    """The state of one generation; complete once its iterator is exhausted."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (EOS or a stop sequence) | "length" | "cancelled"
    #: the request's counters, made by :meth:`Engine.run` as the generation starts (None before)
    stats: Stats | None = None
    #: with ``DecodeConfig.logprobs``: the target's log-probability of each token in ``token_ids``
    logprobs: list[TokenLogprob] | None = None


@dataclass
class _Run:
    """One generation's working state, shared by :meth:`Engine.run`'s steps."""

    cfg: DecodeConfig
    out: Generation
    policy: Policy  # plain decoding: verify.Plain, which drafts nothing
    drafter: Drafter | None
    kpolicy: KPolicy | None  # how many drafts each round (None: plain decoding)
    generator: torch.Generator | None
    context: list[int]  # the prompt and every committed token
    limit: int  # the model's context length
    t_start: float
    guide: Guide | None = None  # structured output: the grammar's state after the committed text
    tree_size: int = 0  # a tree drafter's most nodes in one tree (0: chains): a round that drafts needs that room
    offers: list = field(default_factory=list)  # this round's free drafts (a portfolio's copy sources)


class _Clock:
    """A round's seconds by part (named as in :data:`specdec.core.rounds.SECONDS`): ``with
    clock("draft_seconds", grammar="draft_mask_seconds"):`` adds the block's seconds to the first
    and the grammar's own inside it (:attr:`Guide.seconds`, its own clock) to the second."""

    def __init__(self, guide: Guide | None):
        self.guide = guide
        self.seconds = dict.fromkeys(SECONDS, 0.0)

    @contextmanager
    def __call__(self, part: str | None = None, grammar: str | None = None) -> Iterator[None]:
        t = time.perf_counter()
        spent = self.guide.seconds if self.guide is not None else 0.0
        try:
            yield
        finally:
            if part is not None:
                self.seconds[part] += time.perf_counter() - t
            if grammar is not None and self.guide is not None:
                self.seconds[grammar] += self.guide.seconds - spent


class Engine:
    """Speculative and plain decoding over a target (and optionally a draft)
    :class:`~specdec.models.backends.base.Model`."""

    def __init__(self, target: Model, draft: Model | None = None, eos_ids: Sequence[int] = (),
                 target_costs: CostTable | None = None, draft_costs: CostTable | None = None,
                 constraints: Constraints | None = None, prior: AcceptancePrior | None = None):
        self.target = target
        #: structured output: what makes a request's constraint a generation's grammar state
        #: (:class:`specdec.core.constrain.Constraints`, made for the tokenizer outside; None: no constraints)
        self.constraints = constraints
        self.draft = draft
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.target_costs = target_costs
        self.draft_costs = draft_costs
        #: how often the draft's tokens are kept by its own probability of them, measured at calibration
        #: (None: the draft's probabilities taken as calibrated)
        self.prior = prior
        #: what outlives a request, per caller: the prefix cache, the suffix cache, k=auto's state
        #: (:class:`specdec.core.scopes.Caches`; ``caches.prefix_caching`` turns prefix caching on)
        self.caches = Caches()

    @staticmethod
    def _kind(cfg: DecodeConfig) -> tuple:
        """What k=auto keeps apart besides the caller: policy, drafter, their parameters, sampling
        mode, and whether a grammar constrains the text (it changes what drafts survive)."""
        return (cfg.policy, tuple(sorted(cfg.policy_params.items())), cfg.drafter,
                tuple(sorted(cfg.drafter_params.items())), cfg.sampling.greedy, cfg.constraint is not None)

    def k_policy(self, cfg: DecodeConfig) -> KPolicy:
        """The request's K policy (:func:`specdec.core.autok.k_policy`): ``k=N`` a fixed one; ``k="auto"``
        the one its caller's requests of this kind (:meth:`_kind`) left
        (:meth:`specdec.core.scopes.Caches.k_policy`)."""
        cls = cfg.drafter_type
        assert cls is not None, "a K policy is made for a policy that drafts"

        def make() -> KPolicy:
            trees = cls.grows_trees
            return k_policy(cfg.k, self.target_costs, self.draft_costs, drafts_with_model=cls.drafts_with_model,
                            trees=trees, depth_limit=cls.depth_limit(**cfg.drafter_params) if trees else 0,
                            window=lookahead_of(cfg.parsed),
                            fallback_k=max(FALLBACK_K, lookahead_of(cfg.parsed) + 1), prior=self.prior,
                            portfolio=cls.portfolio, has_model=self.draft is not None)

        if not cfg.k.auto:
            return make()
        tables = (self.target_costs, self.draft_costs, self.prior)  # a policy made for other tables is made again
        return self.caches.k_policy(cfg.caller, self._kind(cfg), make, tables)

    def make_drafter(self, cfg: DecodeConfig) -> Drafter:
        """The request's drafter, from the registry (:func:`specdec.core.drafters.make_drafter`); one that
        reads earlier requests' text sees its caller's only, and none under a loose rule."""
        assert cfg.drafter_type is not None, "a drafter is made for a policy that drafts"
        return make_drafter(cfg.drafter_type, self.draft, self.eos_ids, dict(cfg.drafter_params),
                            history=self.caches.history(cfg.caller, read=not cfg.parsed.lossy))

    def check_config(self, cfg: DecodeConfig) -> None:
        """Refuse, before any work, a request the loaded models cannot serve: a token-tree drafter
        on a backend that cannot score trees (or not trees that wide), a rule that needs hidden
        states from a backend that has none, a draft-model drafter without a draft model; and a
        constraint that does not compile for this tokenizer."""
        self.guide_for(cfg)
        policy = cfg.parsed
        if not policy.drafts:
            return
        cls = cfg.drafter_type
        assert cls is not None  # the policy drafts
        if cls.requires_model and self.draft is None:
            raise SpecdecError(f"drafter {cfg.drafter!r} needs a draft model; load one (draft=...) or use drafter='pld'")
        if cls.grows_trees:
            depth = cls.depth_limit(**cfg.drafter_params) if cfg.k.fixed is None else cfg.k.fixed
            # the most root-to-leaf paths of the tree the target scores and of the one the draft feeds
            paths = cls.tree_paths(depth, **cfg.drafter_params)
            for role, lm, leaves in (("target", self.target, paths[0]), ("draft", self.draft, paths[1])):
                if lm is None or leaves == 0:
                    continue
                caps = lm.capabilities
                if not caps.trees:
                    raise SpecdecError(f"drafter {cfg.drafter!r} grows token trees, which the {lm.backend} backend "
                                       f"({role} model) cannot score; use a chain drafter (model, pld, model+pld)")
                if caps.max_tree_leaves is not None and leaves > caps.max_tree_leaves:
                    raise SpecdecError(
                        f"drafter {cfg.drafter!r}: a tree of up to {leaves} paths ({role} model) exceeds the "
                        f"{lm.backend} backend's limit of {caps.max_tree_leaves}; lower its options or k")
        if policy.needs_hidden:
            for lm in (self.target,):
                if not lm.capabilities.hidden:
                    raise SpecdecError(f"policy {cfg.policy!r} needs the target's hidden states, which the "
                                       f"{lm.backend} backend cannot give")

    def guide_for(self, cfg: DecodeConfig) -> Guide | None:
        """A new generation's grammar state (None without a constraint). A constraint compiles once
        (cached), so :meth:`check_config` calls this too: a constraint that cannot serve is a
        one-line error before any work."""
        if cfg.constraint is None:
            return None
        if self.constraints is None:
            raise SpecdecError("structured output needs the tokenizer; this engine was made without it "
                               "(constraints=specdec.core.constrain.Constraints(tokenizer, ...))")
        return self.constraints.guide(cfg.constraint)

    def admit(self, cfg: DecodeConfig, prompt_ids: Sequence[int]) -> None:
        """The one check that a request fits the loaded models, before any work, in two halves: its
        settings (:meth:`check_config`, which needs no prompt: a caller may run it alone first, so
        that a bad request fails before its prompt is encoded) and its prompt (:meth:`admit_prompt`)."""
        self.check_config(cfg)
        self.admit_prompt(cfg, prompt_ids)

    def admit_prompt(self, cfg: DecodeConfig, prompt_ids: Sequence[int]) -> None:
        """:meth:`admit`'s second half, for a request whose settings passed :meth:`check_config`: its
        prompt (:meth:`check_prompt`) and, for a token-tree drafter, a whole tree after the prompt
        (:func:`~specdec.core.request.check_tree_fits`)."""
        self.check_prompt(prompt_ids)
        check_tree_fits(cfg, len(prompt_ids), self.target.max_length)

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """The prompt is not empty and leaves room in the target's context."""
        if len(prompt_ids) == 0:
            raise SpecdecError("the prompt is empty")
        limit = self.target.max_length
        if limit is not None and len(prompt_ids) >= limit:
            raise SpecdecError(
                f"the prompt has {len(prompt_ids)} tokens, but the model's context holds {limit}; shorten it"
            )

    def run(
        self, prompt_ids: Sequence[int], cfg: DecodeConfig, out: Generation | None = None,
        stop_check: StopCheck | None = None, should_stop: Callable[[], bool] | None = None, check: bool = True,
    ) -> Generator[Generation, None, None]:
        """Generate; yields ``out`` (a :class:`Generation`) after every round that committed
        tokens: the one channel, holding the ids so far (a stop string may cut tokens of earlier
        rounds, so read ``out.token_ids``, not differences), then the stats and finish reason.
        ``should_stop`` is asked before every round and between a round's drafting and verifying (e.g.
        a client that went away), and the drafter asks it between its model passes
        (:meth:`~specdec.core.drafters.base.Drafter.stopping`); yes ends it with finish reason ``cancelled``.
        ``check=False`` skips the request and prompt checks (the caller did them).

        The steps of the module docstring: prefill once, then each round (0) choose K, (1) propose,
        (2) score, (3) verify, (4) commit, (5) roll back, (6) learn from the round's record."""
        if check:
            self.admit(cfg, prompt_ids)
        run = self._start(prompt_ids, cfg, out)
        if run.drafter is not None:
            run.drafter.should_stop = should_stop
        while not self._cancelled(run, should_stop):
            clock = _Clock(run.guide)
            plan, backlog = self._plan(run)  # 0.
            with clock("draft_seconds", grammar="draft_mask_seconds"):
                draft = run.drafter.draft(run.context, plan, cfg.sampling, run.generator) if plan.k and run.drafter else Draft()  # 1.
            if self._cancelled(run, should_stop):  # the client left while the drafter ran
                break
            with clock("verify_seconds"):
                scores = draft.score(self.target, run.context, hidden=run.policy.needs_hidden)  # 2.
                verdict = self._verify(run, draft, scores, clock)  # 3.
            new = self._commit(run, draft, verdict, stop_check, scores.logits, clock)  # 4.
            self._roll_back(run, plan.k, draft, verdict, scores)  # 5.
            self._learn(run, self._record(run, plan, backlog, draft, verdict, clock, new))  # 6.
            if new:
                yield run.out
            if run.out.finish_reason is not None:
                break
        self._finish(run)
        self.caches.leave(self.target)  # the caller's prefix, parked for its next request

    @staticmethod
    def _cancelled(run: "_Run", should_stop: Callable[[], bool] | None) -> bool:
        """Whether the caller stopped the generation; it then ends with finish reason ``cancelled``."""
        if should_stop is not None and should_stop():
            run.out.finish_reason = "cancelled"
            return True
        return False

    def _finish(self, run: "_Run") -> None:
        """The generation ended: the K policy learns how long answers run; the memory peak and how far
        the target's passes drifted from its cost table are recorded."""
        if run.kpolicy is not None and run.out.finish_reason in ("stop", "length"):
            run.kpolicy.end(len(run.out.token_ids), cut=run.out.finish_reason == "length")
        stats = run.out.stats
        assert stats is not None  # set by _start
        stats.peak_rss_mb = peak_rss_mb()
        if stats.predicted_verify_seconds > 0 and stats.rounds >= DRIFT_ROUNDS:
            ratio = stats.verify_seconds / stats.predicted_verify_seconds
            if not DRIFT_LOW <= ratio <= DRIFT_HIGH:
                stats.cost_drift = ratio

    def _start(self, prompt_ids: Sequence[int], cfg: DecodeConfig, out: Generation | None) -> "_Run":
        """The generation's state, and the prefill: every cache holds the prompt but its last
        token, which each round feeds again."""
        policy, cls = cfg.parsed, cfg.drafter_type  # resolved once, where the request was made
        # the models' caches keep only this caller's text (a seeded sample's too: its prefix cache is its caller's)
        self.caches.enter(cfg.caller, (self.target, self.draft))
        if cfg.sampling.seed is not None and not cfg.sampling.greedy:
            # a seeded sample is a caller of its own: no earlier request's text or k=auto state
            # changes its drafts, so its seed gives the same answer whatever ran before
            cfg = cfg.with_settings(caller=Caller.ISOLATED)
        out = out if out is not None else Generation(list(prompt_ids))
        drafter = self.make_drafter(cfg) if policy.drafts else None  # plain decoding runs none
        kpolicy = self.k_policy(cfg) if policy.drafts else None
        out.stats = Stats(
            policy=cfg.policy, drafter=cfg.drafter if policy.drafts else None, k=cfg.k if policy.drafts else None,
            lossy=policy.lossy, prompt_tokens=len(prompt_ids), params={**policy.params, **cfg.drafter_params},
        )
        guide = self.guide_for(cfg)
        run = _Run(cfg=cfg, out=out, policy=policy, drafter=drafter, guide=guide, kpolicy=kpolicy,
                   generator=make_generator(cfg.sampling.seed, self.target.device),
                   context=list(prompt_ids), limit=self.target.max_length or 1 << 62, t_start=time.perf_counter(),
                   tree_size=cls.tree_size(**cfg.drafter_params) if drafter is not None and cls is not None and cls.grows_trees else 0)
        self._prefill(run.context[:-1], out.stats)
        if drafter is not None:
            assert kpolicy is not None  # made with the drafter
            drafter.guide = guide
            drafter.more = kpolicy.more
            drafter.start(run.context)
            # what the draft model reads of the prompt (its window): its steps are priced at that context
            kpolicy.begin(cfg.max_new_tokens, prompt_tokens=len(prompt_ids), draft_context=drafter.backlog(run.context))
        out.stats.prefill_seconds = time.perf_counter() - run.t_start
        return run

    def _prefill(self, ids: list[int], stats: Stats) -> None:
        """The target's cache holds ``ids`` (the prompt but its last token) after this: read whole
        from an empty cache, or with prefix caching only past the prefix it already holds (:meth:`Caches.kept`)."""
        keep = self.caches.kept(self.target, ids)
        if keep:
            self.target.truncate(keep)
        else:
            self.target.reset()
        stats.cached_prompt_tokens = keep
        if len(ids) > keep:
            self.target.forward(ids[keep:])

    def _plan(self, run: "_Run") -> tuple[Plan, int]:
        """This round's plan by the request's K policy (its most drafts, a tree drafter's depth limit;
        a portfolio's source), within the room left, and the drafter's backlog (what its model must
        read before its next draft)."""
        if run.drafter is None:
            return Plan(), 0
        room = min(run.cfg.max_new_tokens - len(run.out.token_ids), run.limit - len(run.context))
        assert run.kpolicy is not None  # made with the drafter
        backlog = run.drafter.backlog(run.context)
        run.offers = run.drafter.offers(run.context, room - 1)  # a portfolio's free drafts, priced by the policy
        plan = run.kpolicy.plan(len(run.out.token_ids), room - 1, backlog, run.offers)
        k = max(0, min(plan.k, room - 1))
        if k and len(run.context) + run.tree_size > run.limit:
            k = 0  # no room left in the context for a whole tree: a plain step
        return (plan if k == plan.k else Plan(k, plan.source if k else None, plan.declined and not k)), backlog

    def _verify(self, run: "_Run", draft: Draft, scores: Scores, clock: _Clock) -> Verdict:
        """The policy's decision on the round the draft makes of the pass (no drafts: the target's
        next token). Structured output first masks every token the grammar forbids, along the
        drafts (:meth:`Draft.restrict`), so every rule reads the masked target."""
        params, logits = run.cfg.sampling, scores.logits
        if run.guide is not None:
            with clock(grammar="mask_seconds"):
                logits = draft.restrict(run.guide, logits)
        penalize_rows = None
        if params.penalized:
            prompt, written, paths = run.context[:len(run.context) - len(run.out.token_ids)], run.out.token_ids, draft.row_paths()
            logits = penalize(logits, params, prompt, written, paths)

            def penalize_rows(rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
                at = [paths[int(i)] for i in idx]
                flat = rows.reshape(-1, rows.shape[-2], rows.shape[-1])
                return torch.stack([penalize(x, params, prompt, written, at) for x in flat]).reshape(rows.shape)
        if not len(draft):
            return Verdict(0, next_token(logits[0], params, run.generator))
        rnd = draft.round(target_logits=logits, params=params, generator=run.generator, target_hidden=scores.hidden,
                          lm_head=self.target.head_logits, penalize_rows=penalize_rows,
                          target_probs=None if params.greedy else probabilities(logits, params),
                          position=len(run.out.token_ids))  # where the drafts sit in the answer (a loose policy's schedule)
        with clock("rule_seconds"):
            return draft.judge(run.policy, rnd)

    def _commit(self, run: "_Run", draft: Draft, verdict: Verdict, stop_check: StopCheck | None,
                rows: torch.Tensor, clock: _Clock) -> list[int]:
        """Append the round's tokens, cut at the first end-of-sequence id or stop sequence; sets the
        finish reason. Returns what this round added (a stop may also cut earlier rounds' tokens).
        ``rows``: the verify pass's raw logits, for the tokens' log-probabilities when asked; the
        grammar's advance is booked on ``clock``."""
        out, context = run.out, run.context
        new = draft.kept(verdict) + [verdict.token]
        for i, t in enumerate(new):
            if t in self.eos_ids or t in run.cfg.stop_token_ids:
                new, out.finish_reason = new[: i + 1], "stop"
                break
        if run.cfg.logprobs is not None:
            at = draft.judged_rows(verdict)
            if out.logprobs is None:
                out.logprobs = []
            out.logprobs += token_logprobs(rows[at[: len(new)]], new, run.cfg.logprobs)
        out.token_ids += new
        context += new
        if run.guide is not None:
            with clock(grammar="mask_seconds"):
                run.guide.advance(new)  # up to an end-of-sequence id; a stop string below ends the run anyway
        if stop_check is not None:
            keep = stop_check(out.token_ids, len(new))
            if keep is not None:
                cut = len(out.token_ids) - keep
                del out.token_ids[keep:]
                if out.logprobs is not None:
                    del out.logprobs[keep:]
                del context[len(context) - cut :]
                new = new[: max(0, len(new) - cut)]
                out.finish_reason = "stop"
        if out.finish_reason is None and (len(out.token_ids) >= run.cfg.max_new_tokens or len(context) >= run.limit):
            out.finish_reason = "length"
        return new

    def _roll_back(self, run: "_Run", k: int, draft: Draft, verdict: Verdict, scores: Scores) -> None:
        """Both caches back to the committed text (:meth:`Draft.roll_back`: a tree keeps its path
        first); the drafter learns what was kept. A drafter that observes the target (lookahead's
        Jacobi window) first gets its argmax after every row of a pass it drafted for
        (:meth:`~specdec.core.drafters.base.Drafter.observe`)."""
        draft.roll_back(self.target, verdict, len(run.context) - 1)
        if run.drafter is not None:
            if k and run.drafter.observes_target:
                run.drafter.observe(draft, scores.logits.argmax(dim=-1).tolist())
            run.drafter.commit(run.context, len(draft), verdict.accepted)

    def _record(self, run: "_Run", plan: Plan, backlog: int, draft: Draft, verdict: Verdict,
                clock: _Clock, new: list[int]) -> RoundRecord:
        """The round's one record: what it drafted and kept, its seconds by part (and what the target's
        cost table predicted for its pass), the answer's length and the time at its end; a portfolio's
        source and its copy offers scored against the ``new`` tokens the round committed."""
        seconds = dict(clock.seconds)
        if self.target_costs is not None:  # for the stats' drift
            seconds["predicted_verify_seconds"] = self.target_costs.forward(len(draft) + 1)
        offers = tuple((o.source, o.run, *o.outcome(new)) for o in run.offers)
        return RoundRecord(budget=plan.k, drafted=len(draft), accepted=verdict.accepted, depth=draft.depth,
                           relaxed=dict(verdict.relaxed), declined_backlog=backlog if plan.declined else None,
                           tokens=len(run.out.token_ids), end=time.perf_counter() - run.t_start,
                           source=plan.source if len(draft) else None, offers=offers, **seconds)

    def _learn(self, run: "_Run", record: RoundRecord) -> None:
        """The round's record, to the one observer: the stats add it up, the K policy learns from it."""
        assert run.out.stats is not None  # set by _start
        run.out.stats.add(record)
        if run.kpolicy is not None:
            run.kpolicy.observe(record)

    def generate(self, prompt_ids: Sequence[int], cfg: DecodeConfig, stop_check: StopCheck | None = None) -> Generation:
        out = Generation(list(prompt_ids))
        for _ in self.run(prompt_ids, cfg, out, stop_check):
            pass
        return out
