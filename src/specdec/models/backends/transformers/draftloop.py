"""The draft's K steps on the device: one captured loop per K, read back once a round.

Drafting K tokens one pass at a time from the host costs a blocking read per token (the argmax or
the sample is needed to feed the next pass) and a float32 copy of the vocabulary's logits each
step. :class:`DraftLoop` records the K - 1 one-token passes and the choice of each token in one
graph: each step's token (the argmax at T=0; at T>0 a Gumbel-max draw from the sampling
distribution, noise drawn by the engine's generator into an input buffer before the replay, so
a seed repeats) is written into the next step's input on the device. The host then reads back
the K tokens and their probabilities in one copy; stopping rules (k=auto, ``min_confidence``, an
end-of-sequence token) cut the block after the fact.

The graph is made by the width graphs' capture (a CUDA graph on CUDA, :func:`~.graphs.replay_eagerly`
on a CPU, so the loop is tested there) and dropped with them when the cache grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .graphs import Capture, Captured

Step = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
#: ``choose(raw [V], noise [V] or None) -> (token, p, p1, q or None)``, all device tensors: the
#: drafter's rule for one step's token (:func:`specdec.core.sampling.device_chooser`)
Choose = Callable[[torch.Tensor, torch.Tensor | None], tuple]


@dataclass
class DraftLoop:
    """K draft steps as one graph per ``(K, sampling)``. ``step(inputs [2, 1], keep)`` is the
    model's one-token pass (ids; positions = slots) returning logits ``[1, V']``."""

    step: Step
    device: torch.device
    vocab: int
    capture: Capture
    graphs: dict[tuple, Captured] = field(default_factory=dict)
    pool: object = None
    replays: int = 0

    def clear(self) -> None:
        self.graphs.clear()
        self.pool = None

    def body(self, k: int, choose: Choose, sampled: bool, first: torch.Tensor, position: torch.Tensor,
             noise: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The loop as recorded: ``first`` the logits before the first draft ``[V]``, ``position``
        ``[1]`` where the first drafted token goes. Returns ``(read [k, 3]`` (token, p, p1 as
        float32: one host copy), ``raw [k, V]``, ``q [k, V]`` or an empty tensor)."""
        raw, read, rows = first, [], []
        for i in range(k):
            token, p, p1, q = choose(raw, noise[i] if sampled else None)
            read.append(torch.stack([token.float(), p.float(), p1.float()]))
            rows.append((raw, q))
            if i < k - 1:
                inputs = torch.stack([token.view(1), position + i]).view(2, 1)
                raw = self.step(inputs, 1)[0][0, : self.vocab].float()
        qs = torch.stack([q for _, q in rows]) if sampled else torch.empty(0, device=self.device)
        return torch.stack(read), torch.stack([r for r, _ in rows]), qs

    def run(self, k: int, choose: Choose, key, sampled: bool, first: torch.Tensor, position: int,
            generator: torch.Generator | None) -> tuple[torch.Tensor, ...]:
        """The ``k`` drafts after ``first`` (logits ``[V]`` on the device) with the first fed token
        at ``position``, each chosen by ``choose`` (``key``: what the graph is kept under beside
        ``k``; ``sampled``: it reads uniform noise): the outputs of :meth:`body`, overwritten by
        the next run (copy what is kept)."""
        key = (k, sampled, key)
        graph = self.graphs.get(key)
        if graph is None:
            buffers = (torch.empty_like(first), torch.zeros(1, dtype=torch.long, device=self.device),
                       torch.full((k, self.vocab), 0.5, device=self.device) if sampled else torch.empty(0, device=self.device))
            self.fill(buffers, first, position, sampled, None)  # the capture's run: the engine's generator untouched
            replay, outputs, self.pool = self.capture(lambda: self.body(k, choose, sampled, *buffers), self.pool)
            graph = self.graphs[key] = Captured(buffers, replay, tuple(outputs))
        self.fill(graph.inputs, first, position, sampled, generator)
        graph.replay()
        self.replays += 1
        return graph.outputs

    @staticmethod
    def fill(buffers: tuple, first: torch.Tensor, position: int, sampled: bool,
             generator: torch.Generator | None) -> None:
        """The loop's inputs for this round: the first logits, the position, fresh noise."""
        logits, where, noise = buffers
        logits.copy_(first, non_blocking=True)
        where.fill_(position)
        if sampled:
            if generator is not None and generator.device.type != noise.device.type:
                noise.copy_(torch.rand(noise.shape, generator=generator), non_blocking=True)
            else:
                torch.rand(noise.shape, generator=generator, device=noise.device, out=noise)
