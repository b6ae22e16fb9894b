"""vLLM's flattened, ragged speculative batch -> one :class:`~specdec.core.verify.Round` per request.

Pure tensors, no vLLM import: this is the whole adapter between vLLM's layout and specdec's rules,
so it is tested without vLLM installed. Nothing here decides anything; every decision is
``policy.verify(round)``, the same call specdec's own engine makes.

vLLM's layout (``vllm/v1/sample/rejection_sampler.py``, ``SpecDecodeMetadata``), for a batch of
``B`` requests where request ``i`` has ``K_i`` drafts (``K_i`` may be 0) and ``N = sum K_i``:

- ``draft_token_ids [N]``: the drafts, request after request; ``-1`` marks a padded draft, which
  vLLM always rejects (here the request's drafts end before the first ``-1``);
- ``num_draft_tokens``: ``[K_0, .., K_{B-1}]``;
- target rows ``[N, V]``: row ``j`` of request ``i`` is the target's distribution for the token
  after that request's first ``j`` drafts; the bonus row (after all ``K_i``) is sampled by vLLM's
  own sampler, which gives one ``bonus token [B]`` per request;
- output ``[B, max(K_i) + 1]`` int: the accepted drafts, then one recovered or bonus token, then
  ``PLACEHOLDER`` (-1).

The round handed to the rule has ``K_i + 1`` rows like specdec's engine rounds. Its last row is
vLLM's bonus token as a point mass (one-hot logits and probabilities): no rule reads that row, and
:func:`specdec.core.verify.finish` then emits exactly vLLM's bonus token when every draft passes, so
vLLM's bonus sampling (penalties, logits processors, seeds) is kept as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

from ...core.sampling import SamplingParams
from ...core.verify import Policy, Round, Verdict

#: vLLM's marker for "no token" in the rejection sampler's output (``PLACEHOLDER_TOKEN_ID``)
PLACEHOLDER = -1


def _sampled(probs: torch.Tensor | None) -> torch.Tensor:
    """The target's probabilities, which a batch with a sampled row carries."""
    assert probs is not None, "a batch with a sampled row carries the target's probabilities"
    return probs


@dataclass
class RaggedBatch:
    """One verification step of a vLLM batch, in vLLM's layout (module docstring).

    ``target_logits`` are the target's logits after vLLM's structured-output mask (-inf where the
    grammar refuses a token; the model runner applies it to every row before the sampler) and its
    logits processors (penalties, bad words, allowed tokens), before temperature/top-k/top-p: what
    specdec's rules call raw logits. ``target_probs`` are the sampling distributions after temperature/top-k/top-p
    (rows of greedy requests are not read; None when every request is greedy). ``hidden`` and
    ``lm_head`` are the target's final hidden states at the draft positions ``[N, H]`` and its
    LM head, for rules that ask for them (DropMatch). ``positions``: how many tokens each request
    has generated before this step's drafts (a loose policy's relaxation schedule,
    :mod:`specdec.core.verify.schedule`); None: unknown, no schedule."""

    draft_token_ids: torch.Tensor  # [N] int
    num_draft_tokens: Sequence[int]  # [B]
    target_logits: torch.Tensor  # [N, V] float32
    bonus_token_ids: torch.Tensor  # [B] or [B, 1] int
    params: Sequence[SamplingParams]  # [B]
    target_probs: torch.Tensor | None = None  # [N, V] float32
    draft_probs: torch.Tensor | None = None  # [N, V]; None = one-hot at the drafts
    generators: Mapping[int, torch.Generator] | None = None  # batch index -> the request's generator
    hidden: torch.Tensor | None = None  # [N, H]
    lm_head: Callable[[torch.Tensor], torch.Tensor] | None = None  # [..., H] -> [..., V] float32
    positions: Sequence[int] | None = None  # [B]

    def __post_init__(self) -> None:
        n = int(self.draft_token_ids.shape[0])
        if sum(self.num_draft_tokens) != n:
            raise ValueError(f"num_draft_tokens sums to {sum(self.num_draft_tokens)}, draft_token_ids has {n}")
        if len(self.params) != len(self.num_draft_tokens):
            raise ValueError(f"{len(self.params)} sampling params for {len(self.num_draft_tokens)} requests")
        if self.target_logits.shape[0] != n:
            raise ValueError(f"target_logits has {self.target_logits.shape[0]} rows for {n} drafts")

    @property
    def starts(self) -> list[int]:
        out, at = [], 0
        for k in self.num_draft_tokens:
            out.append(at)
            at += int(k)
        return out

    def bonus(self, i: int) -> int:
        return int(self.bonus_token_ids.reshape(-1)[i])

    def round(self, i: int) -> Round | None:
        """Request ``i``'s :class:`Round` (None when it has no usable draft: its output is vLLM's
        bonus token, or the target's token at a padded first draft, and no rule has a say)."""
        s, k_i = self.starts[i], int(self.num_draft_tokens[i])
        drafts = self.draft_token_ids[s : s + k_i].to(torch.int64)
        padded = (drafts < 0).nonzero()
        k = int(padded[0]) if padded.numel() else k_i  # drafts end before the first padded one
        if k == 0:
            return None
        params = self.params[i]
        vocab = self.target_logits.shape[-1]
        device = self.target_logits.device
        if k < k_i:  # the row after the last real draft is the target's own (vLLM's recovered row)
            logits = self.target_logits[s : s + k + 1].float()
            probs = None if params.greedy else _sampled(self.target_probs)[s : s + k + 1].float()
        else:  # the row after all drafts: vLLM's bonus token as a point mass
            point = torch.zeros(1, vocab, device=device)
            point[0, self.bonus(i)] = 1.0
            logits = torch.cat([self.target_logits[s : s + k].float(), point])
            probs = None if params.greedy else torch.cat([_sampled(self.target_probs)[s : s + k].float(), point])
        hidden = None
        if self.hidden is not None:  # rows past the drafts are never read by a rule
            hidden = torch.cat([self.hidden[s : s + k], self.hidden[s + k - 1 : s + k]])
        return Round(
            target_logits=logits,
            draft_tokens=drafts[:k],
            draft_probs=None if self.draft_probs is None else self.draft_probs[s : s + k].float(),
            params=params,
            generator=(self.generators or {}).get(i),
            target_probs=probs,
            target_hidden=hidden,
            lm_head=self.lm_head,
            # the draft's distributions as logits, so rules that read the draft's softmax at T=0 see them
            draft_logits=None if self.draft_probs is None else self.draft_probs[s : s + k].float().log(),
            position=None if self.positions is None else int(self.positions[i]),
        )


def verify_ragged(batch: RaggedBatch, policies: Sequence[Policy | None],
                  out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[Verdict | None]]:
    """Run each request's policy on its round; write the requests that have a policy into ``out``.

    policies: ``[B]``, None for a request that another sampler (vLLM's own) decides; its row of
    ``out`` is left as it is. ``out``: ``[B, max K_i + 1]`` int32, created filled with
    ``PLACEHOLDER`` when None. Returns ``(out, verdicts)``; a verdict is None for a request without
    a policy, and ``Verdict(0, bonus)`` for one without drafts.
    """
    b = len(batch.num_draft_tokens)
    if len(policies) != b:
        raise ValueError(f"{len(policies)} policies for {b} requests")
    width = max((int(k) for k in batch.num_draft_tokens), default=0) + 1
    if out is None:
        out = torch.full((b, width), PLACEHOLDER, dtype=torch.int32, device=batch.target_logits.device)
    verdicts: list[Verdict | None] = []
    for i, policy in enumerate(policies):
        if policy is None:
            verdicts.append(None)
            continue
        rnd = batch.round(i)
        if rnd is None:
            k_i = int(batch.num_draft_tokens[i])
            if k_i == 0:
                token = batch.bonus(i)
            else:  # padded first draft: the target's own token at that row, as vLLM's rule gives
                token = _target_token(batch, i)
            verdict = Verdict(0, token)
        else:
            verdict = policy.verify(rnd)
        row = [int(t) for t in (rnd.draft_tokens[: verdict.accepted].tolist() if rnd is not None else [])]
        row.append(int(verdict.token))
        out[i].fill_(PLACEHOLDER)
        out[i, : len(row)] = torch.tensor(row, dtype=out.dtype, device=out.device)
        verdicts.append(verdict)
    return out, verdicts


def _target_token(batch: RaggedBatch, i: int) -> int:
    """The target's token at request ``i``'s first row (argmax at T=0, else a draw)."""
    from ...core.sampling import draw

    s = batch.starts[i]
    if batch.params[i].greedy:
        return int(batch.target_logits[s].argmax())
    return int(draw(_sampled(batch.target_probs)[s : s + 1].float(), (batch.generators or {}).get(i))[0])
