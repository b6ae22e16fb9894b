"""A measured cost model: what one forward pass of each model costs on *this* machine.

Speculative decoding pays only when ``K`` draft steps plus one target pass over ``K+1`` tokens
cost less than the tokens it yields would cost one at a time. Every term is a property of the
machine: a CPU with native bf16 scores 8 tokens for ~1.07x one token, an AVX2-only CPU for ~6.6x
in bf16 and ~2.6x in float32, a GPU for ~1x. So nothing here assumes a cost; :func:`measure`
times each model's forward pass at widths 1, 2, 4, ... 32 over a short KV cache, in each
candidate dtype, with the threads torch really uses. Tables are cached as JSON under
``$SPECDEC_HOME/costs/`` keyed by a machine fingerprint (CPU model and flags or GPU name, torch
version, threads, device) + model + dtype; a changed fingerprint or an unreadable file means a
new measurement, never a failed load.

A busy machine must not fool it (the timings decide the dtype and every K afterwards): each width
is timed several times in interleaved rounds and the median kept; a width whose samples spread
widely, or that disagrees with its neighbours (a wider pass cheaper than a narrower one by more
than noise, or dearer than proportional to its width by half again), is timed afresh, twice at
most, after which the table is repaired to be monotone and recorded as ``noisy``. A 1-minute load
average above the cores left over for the measurement gets a warning and also makes the table
``noisy``; a noisy table is measured again at a later load that finds the machine quiet. While
decoding, k=auto compares each pass with the table (:class:`specdec.autok.KController`); a large
sustained drift marks the cached table ``stale`` (:func:`mark_stale`), so the next load measures
again.

Pure functions, for the engine and the tests: :func:`expected_tokens` (the lesson seed's formula
generalised to per-position acceptance), :func:`best_k` (the draft length that maximises
expected tokens per second; ``0`` = a plain decoding step) and :func:`choose_dtypes`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

FORMAT = 3  # 2: verify widths timed with logits at every position, a separate prefill pass; 3: kernels
WIDTHS = (1, 2, 4, 8, 16, 32)
#: CPU flags that change which kernels are fast; recorded readably (all flags go into the hash).
KEY_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16")
#: The request a dtype choice is made for: a typical chat prompt and completion.
REFERENCE_PROMPT, REFERENCE_NEW = 256, 256
#: Acceptance assumed per draft position before anything is observed (code drafts ~0.9, text ~0.6).
PRIOR_ACCEPTANCE = 0.75


# ------------------------------------------------------------------------------ the machine
def cpu_flags() -> list[str]:
    """This CPU's feature flags (``/proc/cpuinfo``), sorted; empty where not readable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    return sorted(set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def fingerprint(device: torch.device | str = "cpu", backend: str = "transformers", threads: int | None = None,
                version: str | None = None) -> dict:
    """What a measurement depends on besides the model: the processor, torch, threads, device, and
    for a backend other than transformers its name, version and threads."""
    device = torch.device(device)
    flags = cpu_flags()
    out = {
        "device": device.type, "cpu": cpu_model(), "cpu_flags": [f for f in KEY_FLAGS if f in flags],
        "cpu_flags_sha": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:16],
        "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
    }
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        out["gpu"] = torch.cuda.get_device_name(index)
        out["cuda"] = torch.version.cuda
    if backend != "transformers":  # (transformers fingerprints keep their old shape: cached tables stay valid)
        out.update(backend=backend, backend_version=version or "unknown")
        if threads is not None:
            out["threads"] = int(threads)
    return out


def model_key(name: str, config) -> str:
    """A model's identity for the cache: where it came from and a hash of its transformers config
    (known before any weights load, so a cached table can decide the dtype to load in)."""
    text = config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else json.dumps(config, sort_keys=True)
    drop = ("torch_dtype", "dtype", "transformers_version", "_name_or_path")
    try:
        d = {k: v for k, v in json.loads(text).items() if k not in drop}
        text = json.dumps(d, sort_keys=True, default=str)
    except ValueError:
        pass
    return f"{name}|{hashlib.sha256(text.encode()).hexdigest()[:16]}"


# ------------------------------------------------------------------------------- a table
@dataclass
class CostTable:
    """Seconds for one forward pass of ``widths[i]`` new tokens over a KV cache of ``context``
    tokens, for one model in one dtype (and quantization) on one machine."""

    model: str
    dtype: str  # "float32", "bfloat16", "bfloat16+int8", ...
    widths: list[int]
    seconds: list[float]
    context: int
    fingerprint: dict = field(default_factory=dict)
    measured_at: str = ""
    prefill_seconds: float | None = None  # a prefill pass over ``context`` tokens (logits at the last only)
    #: kernel choices measured with this table and in force when the model runs ("pad1": one-row
    #: half-precision linears run as two rows, :class:`specdec.kernels.RowPaddedLinear`)
    kernels: list[str] = field(default_factory=list)
    format: int = FORMAT
    #: per width, the relative spread of its timings (median absolute deviation / median)
    spread: list[float] = field(default_factory=list)
    #: why the timings are not to be trusted ("" when they are): the machine looked loaded, or
    #: timings stayed noisy or inconsistent after re-measuring. Measured again at a quiet load.
    noisy: str = ""
    #: set on the cached copy when observed passes drifted far from it (:func:`mark_stale`)
    stale: str = ""

    def __post_init__(self) -> None:
        ok = (len(self.widths) == len(self.seconds) >= 1 and self.widths[0] == 1
              and all(b > a for a, b in zip(self.widths, self.widths[1:]))
              and all(isinstance(s, (int, float)) and s > 0 and s == s for s in self.seconds))
        if not ok:
            raise ValueError("a cost table needs increasing widths from 1 and positive seconds")

    def forward(self, width: int) -> float:
        """Seconds for a pass over ``width`` tokens: linear between measured widths, and beyond the
        widest one along the slope of the last two (at least flat)."""
        w, s = self.widths, self.seconds
        if width <= w[0]:
            return s[0]
        for i in range(1, len(w)):
            if width <= w[i]:
                f = (width - w[i - 1]) / (w[i] - w[i - 1])
                return s[i - 1] + f * (s[i] - s[i - 1])
        slope = max(0.0, (s[-1] - s[-2]) / (w[-1] - w[-2])) if len(w) > 1 else s[-1]
        return s[-1] + slope * (width - w[-1])

    def prefill(self, tokens: int) -> float:
        """Seconds to prefill ``tokens``, at the measured prefill pass's cost per token (the widest
        verify pass's when no prefill pass was measured)."""
        if tokens <= 0:
            return 0.0
        per_token = (self.prefill_seconds / self.context if self.prefill_seconds else
                     self.seconds[-1] / self.widths[-1])
        return tokens * per_token

    def ms(self, widths: Sequence[int] = (1, 8, 16)) -> str:
        return " / ".join(f"{self.forward(w) * 1e3:.0f}" for w in widths)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "CostTable":
        if d.get("format") != FORMAT:
            raise ValueError("unknown cost table format")
        return cls(model=str(d["model"]), dtype=str(d["dtype"]), widths=[int(w) for w in d["widths"]],
                   seconds=[float(s) for s in d["seconds"]], context=int(d["context"]),
                   fingerprint=dict(d.get("fingerprint") or {}), measured_at=str(d.get("measured_at", "")),
                   prefill_seconds=None if d.get("prefill_seconds") is None else float(d["prefill_seconds"]),
                   kernels=[str(k) for k in d.get("kernels") or []],
                   spread=[float(x) for x in d.get("spread") or []], noisy=str(d.get("noisy") or ""),
                   stale=str(d.get("stale") or ""))


# -------------------------------------------------------------------------- measuring
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: each width is timed this many times, in interleaved rounds (a slow spell hits every width alike)
REPEATS = 5
#: a width whose median pass takes longer is timed only MIN_REPEATS times (its noise is small against it)
SLOW_PASS = 0.5
MIN_REPEATS = 3
#: a width whose timings spread more than this (median absolute deviation / median) is timed afresh
SPREAD_LIMIT = 0.2
#: a wider pass may be cheaper than a narrower one by this share (noise), no more
MONOTONE_TOLERANCE = 0.15
#: a wider pass may cost at most (its width / the narrower width) x this much more: more is an outlier
PROPORTIONAL_TOLERANCE = 1.5
#: timings and differences under this many seconds are call overhead and jitter, not evidence of load
NOISE_FLOOR = 0.002
#: re-measuring rounds before the table is repaired and recorded as noisy
MAX_REMEASURE = 2


class Measured(tuple):
    """``(widths, seconds, context, prefill_seconds)`` with ``report``: ``spread`` (per width),
    ``remeasured`` (widths timed afresh), ``noisy`` (why the timings are not trusted, or "")."""

    report: dict


def _spread(xs: Sequence[float]) -> float:
    med = statistics.median(xs)
    return statistics.median(abs(x - med) for x in xs) / med if med > 0 and len(xs) > 1 else 0.0


def suspect_widths(widths: Sequence[int], seconds: Sequence[float]) -> set[int]:
    """The widths whose timings contradict a neighbour's: a wider pass cheaper than the narrower
    one by more than ``MONOTONE_TOLERANCE``, or dearer than proportional to the width by more than
    ``PROPORTIONAL_TOLERANCE`` (e.g. one width 6x its neighbours' trend). Both of the pair are
    suspects (which one is off is not known yet); differences under ``NOISE_FLOOR`` are ignored."""
    bad: set[int] = set()
    for (wa, sa), (wb, sb) in zip(zip(widths, seconds), zip(widths[1:], seconds[1:])):
        cheaper = sb < sa * (1 - MONOTONE_TOLERANCE) and sa - sb > NOISE_FLOOR
        dearer = sb > sa * (wb / wa) * PROPORTIONAL_TOLERANCE and sb - sa > NOISE_FLOOR
        if cheaper or dearer:
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


def measure(lm, widths: Sequence[int] = WIDTHS, repeats: int = REPEATS) -> Measured:
    """Time ``lm`` (a :class:`specdec.backends.Model`): a prefill pass of the widest width builds
    a KV cache of that many tokens; each width is then fed on top of it as a verify pass (logits
    at every position) and cropped away again: ``repeats`` interleaved rounds (``MIN_REPEATS`` for
    a width slower than ``SLOW_PASS``), the median kept. Widths that spread widely or contradict a
    neighbour (:func:`suspect_widths`) are timed afresh, ``MAX_REMEASURE`` times at most; then
    the table is :func:`repair`-ed and the report says so. Leaves the cache empty.
    Returns ``(widths, seconds, context, prefill_seconds)`` with a ``report`` (:class:`Measured`)."""
    widths = sorted({int(w) for w in widths if int(w) >= 1} | {1})
    g = torch.Generator().manual_seed(0)
    top = widths[-1]
    ids = torch.randint(0, lm.vocab_limit, (top + top,), generator=g).tolist()
    clock = time.perf_counter
    lm.reset()
    lm.forward(ids[:2])  # warm-up: allocator, kernels, first-call overheads
    lm.reset()
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
        return max(dt, 1e-7)

    samples: dict[int, list[float]] = {w: [] for w in widths}
    for rep in range(max(1, repeats)):
        for w in widths:
            if rep >= MIN_REPEATS and statistics.median(samples[w]) > SLOW_PASS:
                continue
            samples[w].append(timed(w))
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
    lm.reset()
    med = [statistics.median(samples[w]) for w in widths]
    noisy = ""
    if suspects:
        noisy = (f"timings of width(s) {', '.join(map(str, sorted(suspects)))} stayed noisy or inconsistent "
                 f"after {MAX_REMEASURE} re-measurements")
        med = repair(widths, med)
    out = Measured((widths, med, context, max(prefill, 1e-7)))
    out.report = {"spread": [round(_spread(samples[w]), 4) for w in widths], "remeasured": remeasured,
                  "noisy": noisy}
    return out


def time_step(lm, context: int = 32, repeats: int = 5) -> float:
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
    return max(best, 1e-7)


def costs_dir() -> Path:
    from .convert import specdec_home

    return specdec_home() / "costs"


def cache_path(fp: Mapping, model: str, dtype: str) -> Path:
    key = json.dumps({"fingerprint": fp, "model": model, "dtype": dtype}, sort_keys=True)
    return costs_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def read_table(path: Path) -> CostTable | None:
    """The table in ``path``, or None when it is missing or unreadable (corrupt: the caller
    measures again and overwrites it)."""
    try:
        return CostTable.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_cached(fp: Mapping, model: str, dtype: str) -> CostTable | None:
    """The cached table for this machine, model and dtype, or None (missing, corrupt, or made on
    another machine: the fingerprint inside must match too)."""
    table = read_table(cache_path(fp, model, dtype))
    if table is None or table.fingerprint != dict(fp) or table.model != model or table.dtype != dtype:
        return None
    if table.stale:  # observed passes drifted far from it: measure again
        return None
    if table.noisy and machine_load(int(fp.get("threads") or 1)) is None:
        return None  # measured on a busy machine, and this one is quiet now: measure again
    return table


def machine_load(threads: int) -> str | None:
    """Why this machine looks too busy to time on, or None: the 1-minute load average, less the
    ``threads`` a measurement runs (its own load), exceeds the cores left over (``os.cpu_count()``
    less ``threads``; at least half a core). Where the load average is not available, None."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    cores = os.cpu_count() or 1
    threads = max(1, int(threads))
    others = load - threads
    if others > max(0.5, cores - threads):
        return (f"the 1-minute load average is {load:.1f} on {cores} cores and the measurement runs {threads} "
                "thread(s)")
    return None


def mark_stale(table: CostTable, why: str) -> bool:
    """Mark ``table``'s cached copy stale (observed passes drifted far from it), so the next load
    measures again. Only the copy made by the same measurement is marked; True when one was."""
    path = cache_path(table.fingerprint, table.model, table.dtype)
    cached = read_table(path)
    if cached is None or cached.measured_at != table.measured_at or cached.seconds != table.seconds:
        return False
    if cached.stale:
        return True
    cached.stale = why
    try:
        save(cached)
    except OSError:
        return False
    table.stale = why
    return True


def save(table: CostTable) -> None:
    path = cache_path(table.fingerprint, table.model, table.dtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table.to_dict(), indent=1))
    os.replace(tmp, path)


def cached_tables(fp: Mapping | None = None) -> list[CostTable]:
    """Every readable table in the cache (only this machine's when ``fp`` is given)."""
    tables = [read_table(p) for p in (sorted(costs_dir().glob("*.json")) if costs_dir().is_dir() else [])]
    return [t for t in tables if t is not None and (fp is None or t.fingerprint == dict(fp))]


def model_fingerprint(lm) -> dict:
    """The fingerprint a model's measurement is cached under (its backend's, see :func:`fingerprint`)."""
    if getattr(lm, "backend", "transformers") == "transformers":
        return fingerprint(lm.device)
    return fingerprint(lm.device, lm.backend, getattr(lm, "threads", None), getattr(lm, "backend_version", None))


def table_for(lm, model: str, dtype: str, log: Callable[[str], None] | None = None,
              kernels: Sequence[str] = ()) -> CostTable | None:
    """Measure the cost table of ``lm`` now and cache it (the caller looked in the cache first);
    ``kernels`` names the kernel choices already applied to ``lm``'s model.
    A failed measurement warns through ``log`` and returns None: the caller falls back, nothing
    breaks."""
    fp = model_fingerprint(lm)
    try:
        if log:
            log(f"specdec: measuring {model.split('|')[0]} in {dtype} on this machine (once; cached)")
        busy = machine_load(int(fp.get("threads") or 1))
        result = measure(lm)
        widths, seconds, context, prefill = result
        report = getattr(result, "report", {}) or {}
        busy = busy or machine_load(int(fp.get("threads") or 1))
        noisy = "; ".join(x for x in (busy, report.get("noisy")) if x)
        table = CostTable(model, dtype, widths, seconds, context, fp, time.strftime("%Y-%m-%dT%H:%M:%S"),
                          prefill_seconds=prefill, kernels=list(kernels), spread=list(report.get("spread") or []),
                          noisy=noisy)
        if noisy and log:
            log(f"specdec: warning: this machine looks busy ({noisy}); the timings of {model.split('|')[0]} in "
                f"{dtype} may be off, so the choice of dtype and K may be too: they are measured again at a "
                "later load that finds the machine quiet (or run 'specdec calibrate' then)")
    except Exception as exc:  # noqa: BLE001 - a measurement must never break a load
        if log:
            log(f"specdec: warning: could not measure {model.split('|')[0]} in {dtype} ({type(exc).__name__}: "
                f"{exc}); k=auto falls back to k={FALLBACK_K}")
        return None
    try:
        save(table)
    except OSError as exc:
        if log:
            log(f"specdec: warning: could not cache the cost table ({exc})")
    return table


# ------------------------------------------------------------------- deciding from a table
FALLBACK_K = 5  # k=auto without a cost table (a failed measurement)


def expected_tokens(rates: Sequence[float], k: int) -> float:
    """Tokens one round yields with ``k`` drafts: ``1 + sum_j prod_{i<=j} a_i``, where ``a_i`` is
    the chance draft ``i`` is kept given drafts ``1..i-1`` were (the lesson seed's
    ``(1 - a^(K+1)) / (1 - a)`` when every ``a_i = a``). The 1 is the target's own token."""
    total, run = 1.0, 1.0
    for i in range(k):
        run *= float(rates[i]) if i < len(rates) else float(rates[-1]) if len(rates) else 0.0
        total += run
    return total


def tokens_per_second(verify: Callable[[int], float], draft_step: float, rates: Sequence[float], k: int) -> float:
    """Expected tokens per second of rounds drafting ``k``: ``expected_tokens(rates, k) /
    (k * draft_step + verify(k + 1))`` (``k = 0``: one plain decoding step)."""
    return expected_tokens(rates, k) / max(k * draft_step + verify(k + 1), 1e-12)


def best_k(verify: Callable[[int], float], draft_step: float, rates: Sequence[float], k_max: int,
           k_min: int = 1, allow_zero: bool = True) -> int:
    """The draft length ``K`` in ``{0} + k_min..k_max`` with the most expected tokens per second:
    ``expected_tokens(rates, K) / (K * draft_step + verify(K + 1))``. ``verify(w)`` is the target's
    pass over ``w`` tokens; ``K = 0`` is a plain decoding step (``1 / verify(1)``), left out with
    ``allow_zero=False`` (then at least ``k_min``). Ties go to the smaller K."""
    ks = ([0] if allow_zero else []) + list(range(max(1, k_min), max(0, k_max) + 1))
    best, best_rate = None, -1.0
    for k in ks:
        rate = tokens_per_second(verify, draft_step, rates, k)
        if best is None or rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
    return best if best is not None else 0


def seconds_per_token(target: CostTable, draft: CostTable | None, rate: float = PRIOR_ACCEPTANCE,
                      k_max: int = 31) -> tuple[float, int]:
    """Expected decoding seconds per token with the best K under a constant acceptance ``rate``
    (plain decoding when there is no draft table), and that K."""
    if draft is None:
        return target.forward(1), 0
    step = draft.forward(1)
    rates = [rate] * k_max
    k = best_k(target.forward, step, rates, k_max)
    return (k * step + target.forward(k + 1)) / expected_tokens(rates, k), k


@dataclass(frozen=True)
class DtypeChoice:
    target: str
    draft: str | None
    seconds: float  # expected seconds for the reference request
    k: int  # the K the cost model expects to use at the prior acceptance
    table: dict  # (target dtype, draft dtype) -> expected seconds, for the record

    def reason(self) -> str:
        others = sorted((s, key) for key, s in self.table.items() if key != self.key)
        line = (f"expected {self.seconds:.1f}s for a {REFERENCE_PROMPT}-token prompt + {REFERENCE_NEW} new tokens "
                f"(K~{self.k} at acceptance {PRIOR_ACCEPTANCE})")
        if others:
            s, key = others[0]
            line += f"; next best {key}: {s:.1f}s"
        return line

    @property
    def key(self) -> str:
        return self.target if self.draft is None else f"{self.target} + draft {self.draft}"


def choose_dtypes(targets: Mapping[str, CostTable], drafts: Mapping[str, CostTable] | None = None,
                  prompt: int = REFERENCE_PROMPT, new: int = REFERENCE_NEW,
                  rate: float = PRIOR_ACCEPTANCE) -> DtypeChoice:
    """The (target dtype, draft dtype) pair that makes the reference request fastest: both
    prefills plus ``new`` tokens at the best K for each combination (plain decoding without a
    draft). Prefill and decoding are both counted, so a dtype with fast single-token steps but a
    slow wide pass (bf16 on a CPU without bf16 instructions) is judged on both."""
    if not targets:
        raise ValueError("no target cost tables")
    table: dict[str, float] = {}
    best: DtypeChoice | None = None
    for td, tt in targets.items():
        for dd, dt in ((drafts or {}).items() or [(None, None)]):
            per_token, k = seconds_per_token(tt, dt, rate)
            total = tt.prefill(prompt) + (dt.prefill(prompt) if dt is not None else 0.0) + new * per_token
            choice = DtypeChoice(td, dd, total, k, {})
            table[choice.key] = total
            if best is None or total < best.seconds:
                best = choice
    assert best is not None
    return DtypeChoice(best.target, best.draft, best.seconds, best.k, table)
