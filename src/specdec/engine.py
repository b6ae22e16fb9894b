"""The one decoding loop. It knows nothing about text: token ids in, token ids out.

Each round: (1) the drafter proposes up to K tokens; (2) the target scores ``[last, d_1..d_K]``
in one forward pass; (3) the policy keeps a prefix of the drafts and picks one more token;
(4) the round's tokens are committed, cut at the first stop; (5) both KV caches roll back to the
committed text and the drafter is told what was kept. Plain decoding (``policy="ar"``) is the
same loop with no drafts, through the same model wrapper, so speed comparisons are fair.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from .drafters import Draft, Drafter, drafter_class, make_drafter
from .autok import KController, draft_step_estimate
from .costmodel import FALLBACK_K, CostTable
from .errors import SpecdecError
from .backends.base import Model
from .request import AUTO_K, DecodeConfig, check_k, window_of  # noqa: F401 (re-exported: the request type lives in request.py)
from .sampling import make_generator, next_token, probabilities
from .stats import Stats, peak_rss_mb
from .verify import Round
from .verify.tree import TreeRound, tree_depth

#: ``stop_check(generated_ids, n_new) -> keep``: how many generated tokens to keep when a stop
#: sequence ends inside the last ``n_new`` tokens, else None.
StopCheck = Callable[[Sequence[int], int], "int | None"]

#: k=auto controllers kept per engine, one per distinct (policy, parameters, drafter, sampling mode);
#: the least recently used goes first (a server sees any number of distinct request parameters)
MAX_CONTROLLERS = 64


@dataclass
class Generation:
    """The state of one generation; complete once its iterator is exhausted."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (EOS or a stop sequence) | "length" | "cancelled"
    stats: Stats = field(default_factory=Stats)


class Engine:
    """Speculative and plain decoding over a target (and optionally a draft) :class:`~specdec.backends.base.Model`."""

    def __init__(self, target: Model, draft: Model | None = None, eos_ids: Sequence[int] = (),
                 target_costs: CostTable | None = None, draft_costs: CostTable | None = None):
        self.target = target
        self.draft = draft
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.target_costs = target_costs
        self.draft_costs = draft_costs
        #: k=auto state, warm across requests; at most MAX_CONTROLLERS, least recently used evicted
        self.controllers: OrderedDict[tuple, KController] = OrderedDict()

    def controller(self, cfg: DecodeConfig) -> KController | None:
        """The k=auto controller for this policy, drafter and sampling mode (None without a
        target cost table: then k=auto drafts a fixed FALLBACK_K)."""
        if self.target_costs is None:
            return None
        key = (cfg.policy, tuple(sorted(cfg.policy_params.items())), cfg.drafter,
               tuple(sorted(cfg.drafter_params.items())), cfg.sampling.greedy)
        if key in self.controllers:
            self.controllers.move_to_end(key)
        else:
            while len(self.controllers) >= MAX_CONTROLLERS:
                self.controllers.popitem(last=False)
            step = draft_step_estimate(cfg.drafter, self.target_costs, self.draft_costs)
            k_max = max(1, self.target_costs.widths[-1] - 1)
            window = window_of(cfg.parsed)  # FLy: short blocks leave the window inert, long ones let it act
            self.controllers[key] = KController(self.target_costs, step, k_max=max(k_max, window + 1), window=window)
        return self.controllers[key]

    def make_drafter(self, cfg: DecodeConfig) -> Drafter:
        """The request's drafter, from the registry (:func:`specdec.drafters.make_drafter`)."""
        return make_drafter(cfg.drafter, self.draft, self.eos_ids, dict(cfg.drafter_params))

    def check_config(self, cfg: DecodeConfig) -> None:
        """Refuse, before any work, a request the loaded models cannot serve: a token-tree drafter
        on a backend that cannot score trees (or not trees that wide), a rule that needs hidden
        states from a backend that has none, a draft-model drafter without a draft model."""
        policy = cfg.parsed
        if policy is None:
            return
        cls = drafter_class(cfg.drafter)
        if cls.needs_model and self.draft is None:
            raise SpecdecError(f"drafter {cfg.drafter!r} needs a draft model; load one (draft=...) or use drafter='pld'")
        if getattr(cls, "grows_trees", False):
            nodes = int(cfg.drafter_params.get("tree_nodes", cls.Options.tree_nodes))
            width = int(cfg.drafter_params.get("tree_width", cls.Options.tree_width))
            depth = cls.depth_limit(**cfg.drafter_params) if cfg.k == AUTO_K else int(cfg.k)
            # leaves: the target scores at most tree_nodes nodes; the draft feeds at most tree_width per depth
            for role, lm, leaves in (("target", self.target, nodes), ("draft", self.draft, width * depth + 1)):
                if lm is None:
                    continue
                caps = lm.capabilities
                if not caps.trees:
                    raise SpecdecError(f"drafter {cfg.drafter!r} grows token trees, which the {lm.backend} backend "
                                       f"({role} model) cannot score; use a chain drafter (model, pld, model+pld)")
                if caps.max_tree_leaves is not None and leaves > caps.max_tree_leaves:
                    raise SpecdecError(
                        f"drafter {cfg.drafter!r}: a tree of up to {leaves} paths ({role} model) exceeds the "
                        f"{lm.backend} backend's limit of {caps.max_tree_leaves}; lower tree_nodes, tree_width or k")
        if policy.needs_hidden:
            for lm in (self.target,):
                if not lm.capabilities.hidden:
                    raise SpecdecError(f"policy {cfg.policy!r} needs the target's hidden states, which the "
                                       f"{lm.backend} backend cannot give")

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
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
    ) -> Iterator[Generation]:
        """Generate; yields ``out`` (a :class:`Generation`) after every round that committed
        tokens: the one channel, holding the ids so far (a stop string may cut tokens of earlier
        rounds, so read ``out.token_ids``, not differences), then the stats and finish reason. ``should_stop`` is asked before every round (from any thread's
        point of view, e.g. a client that went away); when it says yes, the generation ends with
        finish reason ``cancelled``. ``check=False`` skips the prompt check (the caller did it)."""
        if check:
            self.check_config(cfg)
            self.check_prompt(prompt_ids)
        out = out if out is not None else Generation(list(prompt_ids))
        policy = cfg.parsed
        drafter = None if policy is None else self.make_drafter(cfg)
        auto = policy is not None and cfg.k == AUTO_K
        grows_trees = getattr(drafter, "grows_trees", False)
        control = self.controller(cfg) if auto and not grows_trees else None
        stats = out.stats = Stats(
            policy=cfg.policy, drafter=None if policy is None else cfg.drafter, k=0 if policy is None else cfg.k,
            lossy=bool(policy and policy.lossy), prompt_tokens=len(prompt_ids),
            params={**(policy.params if policy else {}), **cfg.drafter_params},
        )
        params = cfg.sampling
        generator = make_generator(params.seed, self.target.device)
        limit = self.target.max_length or 1 << 62
        context = list(prompt_ids)
        clock = time.perf_counter
        t_start = clock()

        # prefill: every cache holds the prompt but its last token, which each round feeds again
        self.target.reset()
        if len(context) > 1:
            self.target.forward(context[:-1])
        if drafter is not None:
            drafter.start(context)
        stats.prefill_seconds = clock() - t_start

        while True:
            if should_stop is not None and should_stop():
                out.finish_reason = "cancelled"
                break
            room = min(cfg.max_new_tokens - len(out.token_ids), limit - len(context))
            if drafter is None:
                k = 0
            elif grows_trees:  # k is the tree's depth limit; k=auto leaves the depth to the tree's own pruning
                k = max(0, min(drafter.max_depth if auto else cfg.k, room - 1))
            elif control is not None:
                k = control.choose(room - 1)
            else:
                k = max(0, min(max(FALLBACK_K, window_of(policy) + 1) if auto else cfg.k, room - 1))
            # 1. draft
            t0 = clock()
            draft = drafter.propose(context, k, params, generator) if k else Draft()
            t1 = clock()
            # 2. one target pass over [last, d_1..d_K]
            n = len(draft)
            tree = draft.parents is not None and n > 0
            want_hidden = bool(policy and policy.needs_hidden)
            if tree:  # one pass over [last] + the tree's nodes, with a tree attention mask
                scored = self.target.tree_logits(context, draft.tokens, draft.parents, hidden=want_hidden)
            else:
                scored = self.target.logits_for(context + draft.tokens, n + 1, hidden=want_hidden)
            logits, hidden = scored if isinstance(scored, tuple) else (scored, None)  # [n+1, V], [n+1, H]
            # 3. verify
            path: tuple[int, ...] = ()
            inner = None  # a window policy: the drafts kept without its window
            if n == 0:
                accepted, token, relaxed = 0, next_token(logits[0], params, generator), {}
            else:
                drafts = torch.tensor(draft.tokens, device=logits.device)
                shared = dict(target_logits=logits, params=params, generator=generator, target_hidden=hidden,
                              lm_head=self.target.head_logits, draft_logits=draft.logits,
                              target_probs=None if params.greedy else probabilities(logits, params))
                if tree:  # each node judged against its parent's row; the policy walks the tree
                    rnd, verify = TreeRound(tokens=drafts, parents=draft.parents, **shared), policy.verify_tree
                else:
                    rnd, verify = Round(draft_tokens=drafts, draft_probs=draft.probs, **shared), policy.verify
                t_rule = clock()
                verdict = verify(rnd)
                stats.rule_seconds += clock() - t_rule
                accepted, token, relaxed, path = verdict.accepted, verdict.token, dict(verdict.relaxed), verdict.path or ()
                inner = verdict.inner
            t2 = clock()
            stats.draft_seconds += t1 - t0
            stats.verify_seconds += t2 - t1
            stats.record(n, accepted, relaxed, depth=tree_depth(draft.parents) if tree else None)
            if auto:
                stats.k_chosen.append(k)
            if control is not None:
                control.observe(n, accepted, t1 - t0 if draft.fed <= 2 else None, t2 - t1, inner=inner)
                if control.drift is not None:  # the cost table drifted far from the observed passes
                    stats.cost_drift = control.drift
            # 4. commit, cut at the first stop
            new = ([draft.tokens[i] for i in path] if tree else draft.tokens[:accepted]) + [token]
            for i, t in enumerate(new):
                if t in self.eos_ids:
                    new, out.finish_reason = new[: i + 1], "stop"
                    break
            out.token_ids += new
            context += new
            if stop_check is not None:
                keep = stop_check(out.token_ids, len(new))
                if keep is not None:
                    cut = len(out.token_ids) - keep
                    del out.token_ids[keep:]
                    del context[len(context) - cut :]
                    new = new[: max(0, len(new) - cut)]
                    out.finish_reason = "stop"
            if out.finish_reason is None and (len(out.token_ids) >= cfg.max_new_tokens or len(context) >= limit):
                out.finish_reason = "length"
            # 5. roll back to the committed text (after a tree: gather the kept path first); tell the drafter
            if tree:
                self.target.keep_path(path)
            self.target.truncate(len(context) - 1)
            if drafter is not None:
                drafter.commit(context, n, accepted)
            stats.new_tokens = len(out.token_ids)
            stats.total_seconds = clock() - t_start
            stats.round_ends.append(stats.total_seconds)
            if new:
                yield out
            if out.finish_reason is not None:
                break
        stats.peak_rss_mb = peak_rss_mb()

    def generate(self, prompt_ids: Sequence[int], cfg: DecodeConfig, stop_check: StopCheck | None = None) -> Generation:
        out = Generation(list(prompt_ids))
        for _ in self.run(prompt_ids, cfg, out, stop_check):
            pass
        return out
