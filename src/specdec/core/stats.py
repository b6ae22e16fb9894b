"""Per-generation counters and the figures derived from them.

Names follow vLLM's speculative-decoding metrics where one exists: verify passes (``rounds``),
draft tokens, accepted tokens, accepted per position. ``tau`` (mean acceptance length) is
``1 + accepted / rounds``: tokens emitted per target verify pass, bonus included; plain decoding
has tau = 1. :func:`tau_of` is that formula, for :class:`Stats` and for the bench's totals alike.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass, field

from ..draftlength import K
from .rounds import SECONDS, RoundRecord


def tau_of(accepted: int, rounds: int) -> float | None:
    """tau, the mean acceptance length: ``1 + accepted / rounds`` (tokens per target verify pass,
    the target's own token included), or None without a round. The one place it is computed:
    :class:`Stats`, the bench's summary and its progress line all call it."""
    return 1.0 + accepted / rounds if rounds else None


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / (1024 if sys.platform == "darwin" else 1)


@dataclass
class Stats:
    policy: str  # the request's policy, as named (``ar``: plain decoding)
    drafter: str | None = None  # None: the policy drafts nothing
    #: the draft length (:class:`~specdec.draftlength.K`, given loose or as one; auto: k_chosen holds each
    #: round's K); None: the policy drafts nothing (``to_dict`` writes 0 then, the integer or "auto" else)
    k: K | None = None
    lossy: bool = False
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt positions the target's cache kept from the request before (prefix caching)
    new_tokens: int = 0
    rounds: int = 0  # target verify passes (plain decoding: one per token)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the rule kept
    zero_accept_rounds: int = 0  # rounds that drafted something and kept nothing
    drafted_at: list[int] = field(default_factory=list)  # [k] rounds that drafted position (tree: depth) i
    accepted_at: list[int] = field(default_factory=list)  # [k] rounds that kept position (tree: depth) i
    tree_depths: list[int] = field(default_factory=list)  # token trees: each round's tree depth
    relaxed: dict[str, int] = field(default_factory=dict)  # loose rule -> drafts it added
    #: k=auto: each round's drafts (a chain: those proposed; a tree: its depth limit; 0 = plain step)
    k_chosen: list[int] = field(default_factory=list)
    #: k=auto: rounds that took a plain step although drafting would pay at the measured pass costs,
    #: because the draft model would first read more tokens (its backlog: the prompt's window, or
    #: text written since it last drafted) than drafting was expected to save on what is left of the
    #: answer (:meth:`specdec.core.autok.AutoK.start`); and the last such backlog. (Records made before
    #: 2026-11-29 call the count `backlog_declined`.)
    declined_rounds: int = 0
    declined_backlog: int = 0
    accepted_per_round: list[int] = field(default_factory=list)  # drafts kept in each round
    #: a portfolio (drafter ``auto``): per source that drafted, [rounds, drafts, drafts kept]
    sources: dict[str, list[int]] = field(default_factory=dict)
    round_ends: list[float] = field(default_factory=list)  # seconds from the start to each round's commit
    #: the target's verify passes took this many times the seconds its cost table predicts, when that
    #: is far from 1 over a long generation (the table may be stale: 'specdec calibrate'), else None
    cost_drift: float | None = None
    predicted_verify_seconds: float = 0.0  # the cost table's seconds for this generation's verify passes
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # target forward + verification rule
    rule_seconds: float = 0.0  # of which: the verification rule itself (e.g. DropMatch's paths)
    #: structured output: the engine's grammar work (masking the target's rows for each verify pass,
    #: advancing on commit) and the drafter's (masking its own proposals); 0.0 without a constraint
    mask_seconds: float = 0.0
    draft_mask_seconds: float = 0.0
    total_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    params: dict = field(default_factory=dict)  # policy/drafter parameters, for the record

    def __post_init__(self) -> None:
        if self.k is not None:
            self.k = K.parse(self.k)

    @property
    def drafts(self) -> bool:
        """Whether the generation's policy drafts (its ``drafts`` declaration): plain decoding runs no
        drafter, so its stats name none."""
        return self.drafter is not None

    def add(self, r: RoundRecord) -> None:
        """Count one round from its record: the rounds, drafts and kept drafts (a token tree's
        per-position counts are per depth; a chain's depth is its length), k=auto's choice, and
        its seconds by part; the answer's length and the time so far are the round's."""
        if r.depth is not None:
            self.tree_depths.append(r.depth)
        depth = r.drafted if r.depth is None else r.depth
        self.rounds += 1
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.accepted_per_round.append(r.accepted)
        if r.drafted and not r.accepted:
            self.zero_accept_rounds += 1
        if depth > len(self.drafted_at):
            grow = depth - len(self.drafted_at)
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(depth):
            self.drafted_at[i] += 1
        for i in range(r.accepted):
            self.accepted_at[i] += 1
        for name, n in r.relaxed.items():
            self.relaxed[name] = self.relaxed.get(name, 0) + n
        if self.k is not None and self.k.auto:
            self.k_chosen.append(r.k_chosen)
        if r.source is not None:
            counts = self.sources.setdefault(r.source, [0, 0, 0])
            counts[0], counts[1], counts[2] = counts[0] + 1, counts[1] + r.drafted, counts[2] + r.accepted
        if r.declined_backlog is not None:
            self.declined_rounds += 1
            self.declined_backlog = r.declined_backlog
        for name in SECONDS:
            setattr(self, name, getattr(self, name) + getattr(r, name))
        self.new_tokens = r.tokens
        self.total_seconds = r.end
        self.round_ends.append(r.end)

    @property
    def mean_acceptance_length(self) -> float:
        """tau = 1 + accepted / verify passes (AR = 1; 0 before any round), :func:`tau_of`."""
        tau = tau_of(self.accepted, self.rounds)
        return 0.0 if tau is None else tau

    tau = mean_acceptance_length

    @property
    def drafting_rounds(self) -> int:
        """Rounds that drafted at least one token (k=auto's plain steps, K=0, are not among them)."""
        return self.drafted_at[0] if self.drafted_at else 0

    @property
    def drafting_tau(self) -> float:
        """tau over the rounds that drafted: 1 + drafts kept per drafting round (0 without one);
        low only when drafts were rejected, whatever k=auto's plain steps did."""
        tau = tau_of(self.accepted, self.drafting_rounds)
        return 0.0 if tau is None else tau

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """For each draft position i, the share of rounds drafting it that kept it."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def zero_accept_share(self) -> float:
        """Share of drafting rounds that kept no draft token."""
        drafting = self.drafted_at[0] if self.drafted_at else 0  # rounds that drafted at least one
        return self.zero_accept_rounds / drafting if drafting else 0.0

    @property
    def mean_tree_nodes(self) -> float:
        """Token trees: nodes per drafting round (0 for chains)."""
        return self.drafted / len(self.tree_depths) if self.tree_depths else 0.0

    @property
    def mean_tree_depth(self) -> float:
        """Token trees: mean depth of the trees (0 for chains)."""
        return sum(self.tree_depths) / len(self.tree_depths) if self.tree_depths else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def k_label(self) -> str:
        """``5``, or for k=auto ``auto (mean 6.2, K=0 in 10% of rounds)``."""
        if self.k is None or not self.k.auto or not self.k_chosen:
            return str(self.k or 0)
        n = len(self.k_chosen)
        zero = sum(1 for k in self.k_chosen if k == 0) / n
        return f"auto (mean {sum(self.k_chosen) / n:.1f}, K=0 in {zero:.0%} of rounds)"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            k=0 if self.k is None else self.k.value,
            mean_acceptance_length=self.mean_acceptance_length,
            acceptance_rate=self.acceptance_rate,
            per_position_acceptance=self.per_position_acceptance,
            mean_tree_nodes=self.mean_tree_nodes,
            mean_tree_depth=self.mean_tree_depth,
            zero_accept_share=self.zero_accept_share,
            tokens_per_second=self.tokens_per_second,
        )
        return d

    def summary(self) -> str:
        """One line for people."""
        line = (
            f"{self.new_tokens} tokens in {self.total_seconds:.2f}s ({self.tokens_per_second:.2f} tok/s), "
            f"policy={self.policy}"
        )
        if self.drafts:
            line += (
                f" drafter={self.drafter} k={self.k_label}: tau={self.mean_acceptance_length:.2f}, "
                f"accepted {self.accepted}/{self.drafted} drafts, "
                f"{self.zero_accept_share:.0%} rounds kept none, "
                f"draft {self.draft_seconds:.2f}s / verify {self.verify_seconds:.2f}s"
            )
            if self.sources:
                line += ", drafted by " + ", ".join(f"{name} in {n} rounds (tau {tau_of(kept, n):.2f})"
                                                    for name, (n, _, kept) in sorted(self.sources.items()))
            if self.tree_depths:
                line += f", trees of {self.mean_tree_nodes:.1f} nodes, depth {self.mean_tree_depth:.1f}"
            if self.lossy:
                kept = ", ".join(f"{rule} {n}" for rule, n in sorted(self.relaxed.items())) or "none"
                line += f", LOSSY rule (kept drafts the lossless rule would reject: {kept})"
        return line + f", peak RSS {self.peak_rss_mb:.0f} MiB"
