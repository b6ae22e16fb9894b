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

Pure functions, for the engine and the tests: :func:`expected_tokens` (the lesson seed's formula
generalised to per-position acceptance), :func:`best_k` (the draft length that maximises
expected tokens per second; ``0`` = a plain decoding step) and :func:`choose_dtypes`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
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
                   kernels=[str(k) for k in d.get("kernels") or []])


# -------------------------------------------------------------------------- measuring
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(lm, widths: Sequence[int] = WIDTHS, repeats: int = 2) -> tuple[list[int], list[float], int, float]:
    """Time ``lm`` (a :class:`specdec.backends.Model`): a prefill pass of the widest width builds
    a KV cache of that many tokens; each width is then fed on top of it as a verify pass (logits
    at every position) and cropped away again, best of ``repeats`` (passes over 1 s once). Leaves the cache empty.
    Returns ``(widths, seconds, context, prefill_seconds)``."""
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
    best: dict[int, float] = {}
    for rep in range(max(1, repeats)):
        for w in widths:  # verify passes: logits for every position, as the engine asks
            if rep and best[w] > 1.0:
                continue  # a slow pass is measured once: its noise is small against it
            t0 = clock()
            lm.forward(ids[context:context + w], num_logits=w)
            _sync(lm.device)
            dt = clock() - t0
            lm.truncate(context)
            best[w] = min(best.get(w, dt), dt)
    lm.reset()
    return widths, [max(best[w], 1e-7) for w in widths], context, max(prefill, 1e-7)


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
    return table


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
        widths, seconds, context, prefill = measure(lm)
        table = CostTable(model, dtype, widths, seconds, context, fp, time.strftime("%Y-%m-%dT%H:%M:%S"),
                          prefill_seconds=prefill, kernels=list(kernels))
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
