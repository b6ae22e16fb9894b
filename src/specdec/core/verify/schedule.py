"""Where in an answer a loose policy may relax: its relaxation schedule ``eta(t)``, the chance that
the loose rules apply to the draft at generated position ``t`` (0 = the answer's first token).

Source: "Secure Speculative Decoding for Large Language Models" (IEEE S&P 2027; code
YichiCS/Secure-Speculative-Decoding, ``securesd/verifier/eta.py``): relaxed verifiers weaken a
target's safety alignment, and an answer's opening decides whether it refuses, so the opening is
judged by the exact rule. Their step schedule (``eta = 0`` for the first ``L`` tokens, 1 after; their
default ``L = 2``) is ``exact_prefix``; their linear and power schedules ramp ``eta`` up from the
first token instead.

Ours: ``eta(t) = 0`` for ``t < N`` (``N = exact_prefix``: those drafts are judged by the lossless
rule alone), then a linear ramp over ``M = relax_ramp`` tokens, ``eta = (t - N + 1) / (M + 1)`` for
``N <= t < N + M``, then 1. Deviations: the ramp starts after the exact prefix (theirs start at the
first token, ``eta = min(1, t / L)`` over 1-based positions) and puts its ``M`` tokens strictly
between 0 and 1; there is no power ramp. Where ``0 < eta < 1`` a uniform draw from the request's
generator decides, per draft, whether the rules may relax it (a seed makes a ramped T=0 answer
reproducible). The reference mixes acceptance probabilities, ``alpha_sd + eta (alpha_rule -
alpha_sd)``, which for a rule that only adds acceptances is the same chance of keeping the draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...checks import option


def relax_chance(positions: torch.Tensor, exact_prefix: int, ramp: int) -> torch.Tensor:
    """``[K]`` float ``eta(t)`` for the answer positions ``t`` ``[K]`` (module docstring)."""
    t = positions.to(torch.float32)
    rising = (t - exact_prefix + 1) / (ramp + 1)
    return torch.where(t < exact_prefix, torch.zeros_like(t), rising.clamp(max=1.0))


@dataclass(frozen=True)
class Schedule:
    """A loose policy's relaxation schedule (module docstring): parameters every loose policy and
    composition takes, unprefixed (``exact_prefix=2``, ``--exact-prefix 2``)."""

    exact_prefix: int = option(2, lo=0, help="the answer's first N tokens are judged by the lossless rule alone (a "
                                             "loose policy's guardrail; 0 = relax from the first token)")
    relax_ramp: int = option(0, lo=0, help="after the exact prefix the loose rules apply with a chance rising "
                                           "linearly over this many tokens (0 = fully at once)")

    def relaxable(self, positions: torch.Tensor | None, generator: torch.Generator | None) -> torch.Tensor | None:
        """``[K]`` bool: the drafts at answer positions ``positions`` the loose rules may relax this
        round; None when the positions are unknown (a round built without them: no schedule)."""
        if positions is None:
            return None
        eta = relax_chance(positions, self.exact_prefix, self.relax_ramp)
        partial = (eta > 0) & (eta < 1)
        if not bool(partial.any()):
            return eta >= 1
        draws = torch.rand(eta.shape, generator=generator, device=generator.device if generator is not None else None)
        return draws.to(eta.device) < eta
