"""Passes captured once per width and replayed: CUDA graphs for the transformers backend's static
cache (:mod:`specdec.models.backends.transformers.static`).

A one-token pass of a small model in eager PyTorch on a GPU costs the launches of hundreds of
kernels and the Python between them, not the GPU's work; replaying a captured CUDA graph launches
them all at once. :class:`WidthGraphs` keeps, per pass width (a verify pass of K + 1 tokens, a draft
step of one, a catch-up of a few), a static input buffer, the graph that reads it and the outputs
the graph writes. A width's first pass runs eagerly (kernels chosen, memory settled: the warm-up),
its second is captured and replayed, and every later one is only replayed: the host copies the
ids and positions into the buffer (asynchronously, from pinned memory) and launches the graph; it
never waits on the device. A width that cannot be captured runs eagerly from then on, with the
reason kept in :attr:`WidthGraphs.failed`.

The capture itself (:func:`capture_cuda_graph`) is the only CUDA-only part; :func:`replay_eagerly`
keeps the same protocol on any device (outputs written in place into the first run's tensors), so
the buffers and widths are tested on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

#: the widest pass captured by default: verify passes of K + 1 tokens for the K that pay on a GPU,
#: draft steps and catch-ups; wider passes (a prefill) run eagerly
MAX_GRAPH_WIDTH = 16
#: eager runs on a side stream before a capture (cuBLAS workspaces, lazy initializations)
CAPTURE_WARMUP = 2

Step = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
#: ``capture(run, pool) -> (replay, outputs, pool)``: ``run()`` recorded once; ``replay()`` redoes it in place
Capture = Callable[[Callable[[], tuple], object], tuple[Callable[[], None], tuple, object]]


def capture_cuda_graph(run: Callable[[], tuple], pool=None) -> tuple[Callable[[], None], tuple, object]:
    """``run()`` captured as a CUDA graph, after :data:`CAPTURE_WARMUP` eager runs on a side
    stream; ``pool``: the memory pool of the model's other widths (they replay one at a time)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(CAPTURE_WARMUP):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    return graph.replay, outputs, graph.pool()


def replay_eagerly(run: Callable[[], tuple], pool=None) -> tuple[Callable[[], None], tuple, object]:
    """The capture protocol without a GPU: each replay runs ``run()`` again and copies its outputs
    into the first run's (static outputs, as a graph's), so the buffer logic runs on a CPU."""
    outputs = run()

    def replay() -> None:
        for static, fresh in zip(outputs, run()):
            static.copy_(fresh)

    return replay, outputs, pool


@dataclass
class Captured:
    """One width's graph: the input buffer it reads, how to replay it, the outputs it writes."""

    inputs: Any  # its input buffer (the draft loop's: a tuple of them)
    replay: Callable[[], None]
    outputs: tuple


@dataclass
class WidthGraphs:
    """``step(inputs)`` (a pass over a ``[rows, w]`` device tensor) captured per width ``w`` up to
    ``max_width`` and replayed on static buffers (see the module's docstring)."""

    step: Step
    device: torch.device
    max_width: int = MAX_GRAPH_WIDTH
    capture: Capture = capture_cuda_graph
    graphs: dict[int, Captured] = field(default_factory=dict)
    #: widths run once eagerly (captured at their next pass)
    seen: set[int] = field(default_factory=set)
    #: widths that could not be captured, and why (they run eagerly)
    failed: dict[int, str] = field(default_factory=dict)
    #: passes replayed, and captures made (for the record)
    replays: int = 0
    captures: int = 0
    pool: object = None

    def takes(self, width: int) -> bool:
        """Whether a pass of ``width`` tokens runs here (else eagerly, by the caller)."""
        return 1 <= width <= self.max_width and width not in self.failed

    def clear(self) -> None:
        """Drop every graph (the cache they read was replaced); they are captured again as used."""
        self.graphs.clear()
        self.seen.clear()
        self.pool = None

    def run(self, host: torch.Tensor) -> tuple:
        """The pass over ``host`` (a CPU tensor ``[rows, w]``): eagerly the first time at this width,
        then captured and replayed. Returns the step's outputs; a graph's are overwritten by its
        next replay, so the caller copies what it keeps."""
        width = host.shape[-1]
        graph = self.graphs.get(width)
        if graph is None:
            inputs = torch.empty(host.shape, dtype=host.dtype, device=self.device)
            inputs.copy_(host, non_blocking=True)
            if width not in self.seen:
                self.seen.add(width)
                return self.step(inputs)
            try:
                replay, outputs, self.pool = self.capture(lambda: self.step(inputs), self.pool)
            except Exception as exc:  # noqa: BLE001 - an uncapturable pass still runs, eagerly
                self.failed[width] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                return self.step(inputs)
            graph = self.graphs[width] = Captured(inputs, replay, tuple(outputs))
            self.captures += 1
        graph.inputs.copy_(host, non_blocking=True)
        graph.replay()
        self.replays += 1
        return graph.outputs

    def describe(self) -> str:
        """The widths captured, and those that failed with why (for a report)."""
        text = f"graphs for widths {sorted(self.graphs)}" if self.graphs else "no graph captured yet"
        if self.failed:
            text += "; not captured: " + "; ".join(f"{w}: {why}" for w, why in sorted(self.failed.items()))
        return text
