"""Logits -> probabilities, and token draws. The only place that turns logits into a distribution.

Every draw takes an explicit ``torch.Generator`` so that a seed reproduces a generation exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..checks import check_int, check_number

#: Temperatures below this are greedy (as in vLLM, whose ``_SAMPLING_EPS`` is the same 1e-5):
#: dividing logits by a far smaller one overflows float32 (1e-300 gives inf, then NaN), and
#: sampling that sharp is the argmax anyway, up to ties closer than the floor.
TEMPERATURE_FLOOR = 1e-5
#: ``repetition_penalty``'s range: a seen token's logit is divided (or multiplied) by it, so outside
#: it a logit over the temperature floor overflows float32 (1e-40 gave inf, then NaN in the draw)
REPETITION_PENALTY_RANGE = (0.01, 100.0)
#: the seeds a generator takes (``torch.Generator.manual_seed``: a signed or unsigned 64-bit integer)
SEED_RANGE = (-(2**63), 2**64 - 1)


@dataclass(frozen=True)
class SamplingParams:
    """How the target's next-token distribution is shaped. ``temperature == 0`` means greedy; a
    temperature below :data:`TEMPERATURE_FLOOR` (1e-5) is stored as 0, so it is greedy too.
    Any ``top_p`` in (0, 1] keeps at least the most likely token (1e-46, 0 in float32, included)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    #: penalties on the target's logits before anything else (:func:`penalize`): 1.0 and 0.0 = off
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        check_number("temperature", self.temperature, lo=0)
        if self.temperature < TEMPERATURE_FLOOR:
            object.__setattr__(self, "temperature", 0.0)
        check_number("top_p", self.top_p, lo=0, hi=1, lo_open=True)
        check_int("top_k (0 = off)", self.top_k, lo=0)
        if self.seed is not None:
            check_int("seed", self.seed, *SEED_RANGE)
        check_number("repetition_penalty (1 = off)", self.repetition_penalty, *REPETITION_PENALTY_RANGE)
        check_number("presence_penalty", self.presence_penalty, lo=-2, hi=2)  # OpenAI's range
        check_number("frequency_penalty", self.frequency_penalty, lo=-2, hi=2)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty is on."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def penalize(logits: torch.Tensor, params: SamplingParams, prompt: Sequence[int], output: Sequence[int],
             extra: Sequence[Sequence[int]]) -> torch.Tensor:
    """The target's logits ``[n, V]`` with the request's penalties applied, row ``i`` as if
    ``output + extra[i]`` had been written (a verify pass's row ``i`` follows drafts that are not
    committed yet). As vLLM and transformers apply them, before temperature, top-k and top-p:

    - ``repetition_penalty`` (CTRL, Keskar et al. 2019; transformers' ``RepetitionPenaltyLogitsProcessor``,
      vLLM's ``repetition_penalty``): every token in the prompt or the output has its logit divided by
      the penalty when positive, multiplied by it when negative;
    - ``frequency_penalty`` and ``presence_penalty`` (OpenAI's, vLLM's): a token's logit less
      ``frequency_penalty`` times its count in the output and ``presence_penalty`` once if it occurs
      there (the output only, as both do).

    Every rule then verifies against the penalised distribution, so ``lossless`` is exact for it.
    Returns ``logits`` itself when no penalty is on."""
    if not params.penalized:
        return logits
    out = logits.clone()
    seen = set(int(t) for t in prompt) | set(int(t) for t in output) if params.repetition_penalty != 1.0 else set()
    counts: dict[int, int] = {}
    for t in output:
        counts[int(t)] = counts.get(int(t), 0) + 1
    for i in range(out.shape[0]):
        more = [int(t) for t in extra[i]] if i < len(extra) else []
        row = out[i]
        if params.repetition_penalty != 1.0:
            ids = torch.tensor([t for t in sorted(seen.union(more)) if t < row.shape[0]], dtype=torch.long,
                               device=row.device)
            if len(ids):
                got = row[ids]
                row[ids] = torch.where(got < 0, got * params.repetition_penalty, got / params.repetition_penalty)
        if params.presence_penalty or params.frequency_penalty:
            c = dict(counts)
            for t in more:
                c[t] = c.get(t, 0) + 1
            if c:
                kept = [(t, m) for t, m in c.items() if t < row.shape[0]]
                ids = torch.tensor([t for t, _ in kept], dtype=torch.long, device=row.device)
                n = torch.tensor([m for _, m in kept], dtype=row.dtype, device=row.device)
                row[ids] = row[ids] - params.frequency_penalty * n - params.presence_penalty
    return out


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits ``[n, V]`` into the distributions ``[n, V]`` (float32) that sampling draws from.

    Order as in transformers' warpers: temperature, then top-k, then top-p. At temperature 0 the
    result is one-hot at the argmax (first index on ties), so greedy decoding is a special case.
    """
    logits = logits.float()
    if params.greedy:
        out = torch.zeros_like(logits)
        out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return out
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [n, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass strictly before it already reaches top_p (always keeps the top-1)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        drop_sorted[..., 0] = False  # a top_p that rounds to 0 in float32 must not drop the top-1 too
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs [n, V]`` -> ``[n]`` (int64)."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def gumbel(uniform: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise from uniform draws in [0, 1): ``argmax(log q + g)`` is a draw from ``q``."""
    return -torch.log(-torch.log(uniform.clamp_min(torch.finfo(uniform.dtype).tiny)))


def device_chooser(params: SamplingParams):
    """One draft step's choice with no host work (a draft loop captured on the device):
    ``choose(raw [V], noise [V] or None) -> (token, p, p1, q)``: the argmax at T=0, else a
    Gumbel-max draw from :func:`probabilities` (exactly a draw from ``q``); ``p`` the probability
    the token was drawn with (T=0: the softmax at T=1), ``p1`` its softmax at T=1, ``q`` the
    sampling distribution (None at T=0)."""

    def choose(raw: torch.Tensor, noise: torch.Tensor | None):
        soft = torch.softmax(raw, dim=-1)
        if params.greedy:
            token = raw.argmax(-1, keepdim=True)  # [1]: gathered, never indexed (an index reads it on the host)
            p = soft.gather(0, token)[0]
            return token[0], p, p, None
        q = probabilities(raw[None], params)[0]
        assert noise is not None, "a draw at T>0 is given its noise"
        token = (torch.log(q) + gumbel(noise)).argmax(-1, keepdim=True)
        return token[0], q.gather(0, token)[0], soft.gather(0, token)[0], q

    return choose


def next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """The next token from one row of logits ``[V]``: argmax at T=0, else a draw."""
    if params.greedy:
        return int(logits.argmax())
    return int(draw(probabilities(logits[None], params), generator)[0])


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    """A generator on ``device``; seeded from ``seed``, or from fresh entropy when ``seed`` is None."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed))
    return gen
