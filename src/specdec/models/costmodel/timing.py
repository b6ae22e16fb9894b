"""Timing a model's forward passes on this machine, so that a busy machine cannot fool it.

:func:`measure` times each width several times in interleaved rounds and keeps the median; a
width whose samples spread widely, or that disagrees with its neighbours (:func:`suspect_widths`),
is timed afresh, ``MAX_REMEASURE`` times at most, after which the timings are :func:`repair`-ed to
be monotone and reported ``noisy``. :func:`machine_load` says when the machine looks too busy to
time on. :func:`time_step` times one plain decoding step.

The clock is ``time.perf_counter`` read through this module's ``time`` (tests replace it here).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Sequence

import torch

from ...draftlength import MAX_K

#: verify passes of K + 1 tokens: every width up to 17 (k=auto picks only measured widths, and CPU
#: curves are jagged: llama.cpp's 4-bit kernels take rows in fours), then 24 and 32 (MAX_K, the one
#: draft-length limit: :mod:`specdec.draftlength`) for long blocks
WIDTHS = tuple(range(1, 18)) + (24, MAX_K)
#: wide passes (:func:`_wide`): after a KV cache of WIDE_CONTEXT tokens (the contexts answers and
#: agent turns run at: a wide pass's attention there costs more than over the tables' 32 tokens) over
#: these widths, up to the widest copy a round may draft (a copy of 127 tokens is verified in 128)
WIDE_CONTEXT = 1024
WIDE_WIDTHS = (1, 16, 32, 64, 128)
#: timings per width, in interleaved rounds (a slow spell hits every width alike): two slow ones leave the median
REPEATS = 5
#: seconds: a width slower than this is timed MIN_REPEATS times only (noise is small against it; rounds cost seconds)
SLOW_PASS = 0.5
#: the fewest timings of a width (and of a width timed afresh): one slow sample of three does not move the median
MIN_REPEATS = 3
#: a width whose timings spread more than this (median absolute deviation / median) is timed afresh: jitter stays under
SPREAD_LIMIT = 0.2
#: a wider pass may be cheaper than a narrower one by this share (noise), no more: it does no less work
MONOTONE_TOLERANCE = 0.15
#: a wider pass may cost at most (its width / the narrower width) x this: work grows with width, plus half for noise
PROPORTIONAL_TOLERANCE = 1.5
#: seconds: timings and differences under this are call overhead and jitter (milliseconds), not evidence of load
NOISE_FLOOR = 0.002
#: re-measuring rounds before the table is repaired and recorded noisy: a busy machine is not timed on and on
MAX_REMEASURE = 2
#: the least seconds a pass is recorded as: a table needs positive seconds, and a coarse clock can read 0
MIN_SECONDS = 1e-7
#: tokens of the untimed warm-up pass (allocator, kernels, first-call overheads): a multi-token pass, cheap
WARMUP_TOKENS = 2
#: on an accelerator, a pass is bound by kernel launches up to hundreds of tokens, so a prefill of
#: the tables' width says nothing of a long prompt's: a prefill this long is timed too (it costs
#: about one pass there; on a CPU, where a pass costs in proportion to its tokens, it is not needed)
LONG_READ = 512
#: :func:`time_step`'s KV cache: a short context, as the tables' (their context is the widest width, 32)
STEP_CONTEXT = 32
#: :func:`time_step` keeps the best of this many steps: the step's cost without the machine's hiccups
STEP_REPEATS = 5
#: others' load allowed when the measurement uses every core: a little background work is no reason to distrust it
MIN_SPARE_CORES = 0.5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Measured(tuple):
    """``(widths, seconds, context, prefill_seconds)`` with ``report``: ``spread`` (per width),
    ``remeasured`` (widths timed afresh), ``noisy`` (why the timings are not trusted, or "")."""

    report: dict


def _spread(xs: Sequence[float]) -> float:
    med = statistics.median(xs)
    return statistics.median(abs(x - med) for x in xs) / med if med > 0 and len(xs) > 1 else 0.0


def suspect_widths(widths: Sequence[int], seconds: Sequence[float]) -> set[int]:
    """The widths whose timings contradict a neighbour's: a pass dearer than the next narrower one
    by more than proportional to the width times ``PROPORTIONAL_TOLERANCE`` (e.g. one width 6x its
    neighbours' trend), or cheaper by more than ``MONOTONE_TOLERANCE`` than a pass of at most half
    its width (the widest such). Neighbours closer than that may legitimately be cheaper: on a CPU
    kernels take rows in groups (8 tokens can cost less than 7). Both of the pair are suspects
    (which one is off is not known yet); differences under ``NOISE_FLOOR`` are ignored."""
    bad: set[int] = set()
    for (wa, sa), (wb, sb) in zip(zip(widths, seconds), zip(widths[1:], seconds[1:])):
        if sb > sa * (wb / wa) * PROPORTIONAL_TOLERANCE and sb - sa > NOISE_FLOOR:
            bad |= {wa, wb}
    for j, (wb, sb) in enumerate(zip(widths, seconds)):
        halves = [i for i in range(j) if widths[i] * 2 <= wb]
        if halves:
            wa, sa = widths[halves[-1]], seconds[halves[-1]]
            if sb < sa * (1 - MONOTONE_TOLERANCE) and sa - sb > NOISE_FLOOR:
                bad |= {wa, wb}
    return bad


def repair(widths: Sequence[int], seconds: Sequence[float]) -> list[float]:
    """A sane table from inconsistent timings: each width at most proportional to the one before
    (an outlier comes down to its neighbours' trend), then non-decreasing (a narrower pass never
    costs more than a wider one: an inflated narrow width comes down)."""
    out = list(seconds)
    for i in range(1, len(out)):
        out[i] = min(out[i], out[i - 1] * widths[i] / widths[i - 1] * PROPORTIONAL_TOLERANCE)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


def measure(lm, widths: Sequence[int] | None = None, repeats: int = REPEATS) -> Measured:
    """Time ``lm`` (a :class:`specdec.models.backends.Model`): a prefill pass of the widest width builds
    a KV cache of that many tokens; each width is then fed on top of it as a verify pass (logits
    at every position) and cropped away again: ``repeats`` interleaved rounds (``MIN_REPEATS`` for
    a width slower than ``SLOW_PASS``), the median kept. Widths that spread widely or contradict a
    neighbour (:func:`suspect_widths`) are timed afresh, ``MAX_REMEASURE`` times at most; then
    the table is :func:`repair`-ed and the report says so. Leaves the cache empty.
    Returns ``(widths, seconds, context, prefill_seconds)`` with a ``report`` (:class:`Measured`)."""
    if widths is None:  # the model's backend may declare its own (Model.calibration_widths)
        widths = getattr(lm, "calibration_widths", None) or WIDTHS
    widths = sorted({int(w) for w in widths if int(w) >= 1} | {1})
    g = torch.Generator().manual_seed(0)
    top = widths[-1]
    ids = torch.randint(0, lm.vocab_limit, (top + top,), generator=g).tolist()
    clock = time.perf_counter
    lm.reset()
    lm.forward(ids[:WARMUP_TOKENS])  # warm-up: allocator, kernels, first-call overheads
    lm.reset()
    long_read = _long_read(lm) if lm.device.type != "cpu" else None
    t0 = clock()
    lm.forward(ids[:top])  # a prefill pass: logits for the last position only
    _sync(lm.device)
    prefill = clock() - t0
    context = top

    def timed(w: int) -> float:  # a verify pass: logits for every position, as the engine asks
        t0 = clock()
        lm.forward(ids[context:context + w], num_logits=w)
        _sync(lm.device)
        dt = clock() - t0
        lm.truncate(context)
        return max(dt, MIN_SECONDS)

    samples = _timed_rounds(widths, repeats, timed)
    remeasured, suspects = _remeasure_suspects(widths, samples, timed)
    lm.reset()
    out = _measured(widths, samples, suspects, remeasured, context, prefill)
    out.report["long_read"] = long_read
    out.report["wide"] = _wide(lm, context)
    return out


def _wide(lm, short_context: int, context: int = WIDE_CONTEXT, widths: Sequence[int] = WIDE_WIDTHS) -> dict | None:
    """The wide passes (:data:`WIDE_WIDTHS`, logits at every position) after a KV cache of
    ``context`` tokens, ``MIN_REPEATS`` interleaved rounds, medians made non-decreasing, as the
    table's ``wide_*`` fields; None when the model's context is too short for them (or no longer
    than the tables' own). Leaves the cache empty."""
    limit = getattr(lm, "max_length", None)
    if context <= short_context or (limit is not None and context + max(widths) > limit):
        return None
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, lm.vocab_limit, (context + max(widths),), generator=g).tolist()
    lm.reset()
    lm.forward(ids[:context])

    def timed(w: int) -> float:
        t0 = time.perf_counter()
        lm.forward(ids[context:context + w], num_logits=w)
        _sync(lm.device)
        dt = time.perf_counter() - t0
        lm.truncate(context)
        return max(dt, MIN_SECONDS)

    samples = _timed_rounds(list(widths), MIN_REPEATS, timed)
    lm.reset()
    med = [statistics.median(samples[w]) for w in widths]
    return {"wide_context": context, "wide_widths": list(widths),
            "wide_seconds": [max(med[: i + 1]) for i in range(len(med))]}


def _long_read(lm, tokens: int = LONG_READ) -> list[float] | None:
    """``[tokens, seconds]`` of a prefill pass over ``tokens`` (the best of two after a warm-up of
    that shape), or None when the model's context is shorter. Leaves the cache empty."""
    limit = getattr(lm, "max_context", None)
    if limit is not None and tokens > limit:
        return None
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, lm.vocab_limit, (tokens,), generator=g).tolist()
    best = float("inf")
    for i in range(3):
        lm.reset()
        t0 = time.perf_counter()
        lm.forward(ids)
        _sync(lm.device)
        if i:
            best = min(best, time.perf_counter() - t0)
    lm.reset()
    return [tokens, max(best, MIN_SECONDS)]


def _timed_rounds(widths: list[int], repeats: int, timed) -> dict[int, list[float]]:
    """``repeats`` interleaved rounds of ``timed(width)`` over ``widths`` (after ``MIN_REPEATS``
    rounds, a width whose median is over ``SLOW_PASS`` is skipped): the timings per width."""
    samples: dict[int, list[float]] = {w: [] for w in widths}
    for rep in range(max(1, repeats)):
        for w in widths:
            if rep >= MIN_REPEATS and statistics.median(samples[w]) > SLOW_PASS:
                continue
            samples[w].append(timed(w))
    return samples


def _remeasure_suspects(widths: list[int], samples: dict[int, list[float]], timed) -> tuple[list[int], set[int]]:
    """Times afresh (``MIN_REPEATS`` rounds, replacing their ``samples``) the widths that spread
    widely or contradict a neighbour, ``MAX_REMEASURE`` times at most. Returns the widths timed
    afresh (in order, repeats included) and those still suspect at the end (empty when all is well)."""
    remeasured: list[int] = []
    suspects: set[int] = set()
    for attempt in range(MAX_REMEASURE + 1):
        med = [statistics.median(samples[w]) for w in widths]
        suspects = suspect_widths(widths, med) | {
            w for w, m in zip(widths, med) if _spread(samples[w]) > SPREAD_LIMIT and m > NOISE_FLOOR}
        if not suspects or attempt == MAX_REMEASURE:
            break
        fresh: dict[int, list[float]] = {w: [] for w in suspects}
        for _ in range(MIN_REPEATS):
            for w in sorted(suspects):
                fresh[w].append(timed(w))
        samples.update(fresh)  # the earlier samples of a suspect are not trusted
        remeasured += sorted(suspects)
    return remeasured, suspects


def _measured(widths: list[int], samples: dict[int, list[float]], suspects: set[int], remeasured: list[int],
              context: int, prefill: float) -> Measured:
    """The :class:`Measured` result: the median per width (:func:`repair`-ed and reported
    ``noisy`` when ``suspects`` remain) with its report."""
    med = [statistics.median(samples[w]) for w in widths]
    noisy = ""
    if suspects:
        noisy = (f"timings of width(s) {', '.join(map(str, sorted(suspects)))} stayed noisy or inconsistent "
                 f"after {MAX_REMEASURE} re-measurements")
        med = repair(widths, med)
    out = Measured((widths, med, context, max(prefill, MIN_SECONDS)))
    out.report = {"spread": [round(_spread(samples[w]), 4) for w in widths], "remeasured": remeasured,
                  "noisy": noisy}
    return out


def time_step(lm, context: int = STEP_CONTEXT, repeats: int = STEP_REPEATS) -> float:
    """Best-of-``repeats`` seconds of a one-token pass (a plain decoding step) over a KV cache of
    ``context`` tokens. Leaves the cache empty."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, lm.vocab_limit, (context + 1,), generator=g).tolist()
    lm.reset()
    lm.forward(ids[:context])
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        lm.forward(ids[context:])
        _sync(lm.device)
        best = min(best, time.perf_counter() - t0)
        lm.truncate(context)
    lm.reset()
    return max(best, MIN_SECONDS)


def machine_load(threads: int) -> str | None:
    """Why this machine looks too busy to time on, or None: the 1-minute load average, less the
    ``threads`` a measurement runs (its own load), exceeds the cores left over (``os.cpu_count()``
    less ``threads``; at least ``MIN_SPARE_CORES``). Where the load average is not available, None."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    cores = os.cpu_count() or 1
    threads = max(1, int(threads))
    others = load - threads
    if others > max(MIN_SPARE_CORES, cores - threads):
        return (f"the 1-minute load average is {load:.1f} on {cores} cores and the measurement runs {threads} "
                "thread(s)")
    return None


#: :func:`context_slope` times a step over a cache this long beside one of ``STEP_CONTEXT`` tokens
SLOPE_CONTEXT = 512


def context_slope(lm, context: int = SLOPE_CONTEXT) -> float:
    """How much dearer a pass gets per token of context: ``(step at context / step at STEP_CONTEXT
    - 1) / (context - STEP_CONTEXT)``, from best-of timings of one-token steps (at least 0)."""
    short, long = time_step(lm, STEP_CONTEXT), time_step(lm, context)
    return max(0.0, (long / short - 1.0) / (context - STEP_CONTEXT))
