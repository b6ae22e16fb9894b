"""The target's log-probabilities of tokens: of each token a generation emits (whatever rule
emitted it) and of a prompt's own tokens (``echo``), as vLLM and the OpenAI API return them.

They are the target model's own distribution, the log-softmax of its logits before any penalty,
grammar mask, temperature, top-k or top-p (vLLM's default ``raw_logprobs``), taken from the very
verify pass that judged the token. Under a loose rule a kept draft can be a token the target
itself rated low: its log-probability says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

#: the most alternatives a request may ask for at each position (vLLM's and OpenAI's limit)
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """One position: the token, its log-probability under the target, and the ``top`` most likely
    tokens there with theirs (most likely first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def to_dict(self) -> dict:
        return {"token": self.token, "logprob": self.logprob, "top": [list(t) for t in self.top]}


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """For rows ``logits [n, V]`` and the token each row was followed by, their log-probabilities
    and each row's ``top`` most likely tokens."""
    if not len(tokens):
        return []
    lp = torch.log_softmax(logits[: len(tokens)].float(), dim=-1)
    ids = torch.tensor(list(tokens), dtype=torch.long, device=lp.device)
    chosen = lp.gather(-1, ids[:, None])[:, 0].tolist()
    tops: list[tuple] = [()] * len(tokens)
    if top > 0:
        values, where = torch.topk(lp, min(top, lp.shape[-1]), dim=-1)
        tops = [tuple(zip(w, v)) for w, v in zip(where.tolist(), values.tolist())]
    return [TokenLogprob(int(t), float(c), tp) for t, c, tp in zip(tokens, chosen, tops)]


def check_logprobs(value) -> int | None:
    """None (off) or how many alternatives, 0..MAX_LOGPROBS (one-line error otherwise)."""
    from ..checks import check_int

    return None if value is None else check_int(f"logprobs (alternatives per token, at most {MAX_LOGPROBS})",
                                                value, lo=0, hi=MAX_LOGPROBS)
