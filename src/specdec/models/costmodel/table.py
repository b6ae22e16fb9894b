"""A cost table: measured seconds per forward pass at a few widths, and the costs between them.

:class:`CostTable` holds one model's timings in one dtype on one machine (:mod:`.timing` makes
them, :mod:`.cache` keeps them) and interpolates: the seconds of a pass over any width, and of a
prefill over any number of tokens. Its dictionary form is what the JSON cache stores.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence, TypeGuard

#: bumped when tables change meaning, so older ones are measured again (2: logits everywhere + prefill; 3: kernels;
#: 4: every width 1..17, as k=auto now picks only measured widths; 5: wide passes at a long context)
FORMAT = 5
#: the formats a stored table may be read in (a committed benchmark folder's); the cache measures again below FORMAT
READABLE = (4, 5)


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
    #: half-precision linears run as two rows, :class:`specdec.models.backends.transformers.kernels.RowPaddedLinear`)
    kernels: list[str] = field(default_factory=list)
    format: int = FORMAT
    #: per width, the relative spread of its timings (median absolute deviation / median)
    spread: list[float] = field(default_factory=list)
    #: why the timings are not to be trusted ("" when they are): the machine looked loaded, or
    #: timings stayed noisy or inconsistent after re-measuring. Measured again at a quiet load.
    noisy: str = ""
    #: a pass's extra seconds per token of context beyond ``context``, as a share of its seconds
    #: (``specdec calibrate --export`` measures it; 0: not measured)
    context_slope: float = 0.0
    #: on an accelerator, ``[tokens, seconds]`` of a long prefill pass
    #: (:data:`specdec.models.costmodel.timing.LONG_READ`): a read is then priced on the line from a one-token pass to it (None: in proportion to
    #: ``prefill_seconds``, as on a CPU)
    long_read: list[float] | None = None
    #: passes over ``wide_widths`` tokens after a KV cache of ``wide_context`` tokens (``wide_seconds``):
    #: what a pass costs at the contexts answers run at, and how wide a copy may be drafted
    #: (:meth:`at_context`); 0 / empty: not measured
    wide_context: int = 0
    wide_widths: list[int] = field(default_factory=list)
    wide_seconds: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        ok = _curve(self.widths, self.seconds) and (
            not self.wide_widths or (_curve(self.wide_widths, self.wide_seconds) and self.wide_context > self.context))
        if not ok:
            raise ValueError("a cost table needs increasing widths from 1 and positive seconds")

    @property
    def widest(self) -> int:
        """The widest pass measured (at either context)."""
        return max(self.widths[-1], self.wide_widths[-1] if self.wide_widths else 0)

    def at_context(self, context: int) -> "CostTable":
        """This table's passes after a KV cache of ``context`` tokens, every measured width of either
        context: each width's seconds on the line through its short-context price (``context``) and
        its long-context one (``wide_context``), beyond them along it; a width measured at the long
        context only is priced at the short one by the long curve's shape from the widest width both
        measured. Without wide passes measured: this table."""
        if not self.wide_widths:
            return self
        lo, hi = self.context, self.wide_context
        f = max(0.0, (int(context) - lo) / (hi - lo))
        short, long = self.forward, self._wide
        top = self.widths[-1]
        widths = sorted(set(self.widths) | {w for w in self.wide_widths if w > top})

        def at_short(w: int) -> float:
            return short(w) if w <= top else short(top) * long(w) / long(top)

        seconds = [max(at_short(w) + f * (long(w) - at_short(w)), 1e-9) for w in widths]
        seconds = [max(seconds[: i + 1]) for i in range(len(seconds))]  # a wider pass never costs less
        import dataclasses

        return dataclasses.replace(self, widths=widths, seconds=seconds, context=max(int(context), lo),
                                   wide_context=0, wide_widths=[], wide_seconds=[])

    def step_at(self, context: int) -> float:
        """A one-token pass after a KV cache of ``context`` tokens: on the line through the one-token
        pass at ``context`` (the table's) and at ``wide_context`` where wide passes were measured
        (a small draft model's step grew 22 -> 44 ms from an empty cache to 1,024 tokens on a 2-core
        Xeon), else scaled by ``context_slope``."""
        one = self.forward(1)
        if self.wide_widths and self.wide_widths[0] == 1:
            f = max(0.0, (int(context) - self.context) / (self.wide_context - self.context))
            return max(one + f * (self._wide(1) - one), 1e-9)
        return one * self.slope_scale(context)

    def slope_scale(self, context: int) -> float:
        """A pass's seconds after ``context`` tokens as a multiple of this table's (at its own
        context), by the measured ``context_slope`` (1 where none was measured)."""
        return 1.0 + self.context_slope * max(0, int(context) - self.context)

    def _wide(self, width: int) -> float:
        return _interpolate(self.wide_widths, self.wide_seconds, width)

    def forward(self, width: int) -> float:
        """Seconds for a pass over ``width`` tokens: linear between measured widths, and beyond the
        widest one along the slope of the last two (at least flat)."""
        return _interpolate(self.widths, self.seconds, width)

    def prefill(self, tokens: int) -> float:
        """Seconds to prefill ``tokens``, at the measured prefill pass's cost per token (the widest
        verify pass's when no prefill pass was measured)."""
        if tokens <= 0:
            return 0.0
        per_token = (self.prefill_seconds / self.context if self.prefill_seconds else
                     self.seconds[-1] / self.widths[-1])
        return tokens * per_token

    def read(self, tokens: int) -> float:
        """Seconds for one pass that reads ``tokens`` and needs logits after the last only (a prefill,
        or a draft model catching up): a one-token pass for one token, the measured prefill pass's
        seconds per token from its width on, and linear between the two."""
        if tokens <= 1:
            return self.seconds[0] if tokens == 1 else 0.0
        if self.long_read:
            n, sec = self.long_read
            return self.seconds[0] + max(0.0, (tokens - 1) / (n - 1) * (sec - self.seconds[0]))
        full = self.prefill(self.context)
        if tokens >= self.context or self.context <= 1:
            return self.prefill(tokens)
        return self.seconds[0] + (tokens - 1) / (self.context - 1) * (full - self.seconds[0])

    def ms(self, widths: Sequence[int] = (1, 8, 16)) -> str:
        """Milliseconds of a pass at a few widths, for people: ``"12 / 30 / 55"``."""
        return " / ".join(f"{self.forward(w) * 1e3:.0f}" for w in widths)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "CostTable":
        """A table as stored (the cache, ``specdec calibrate --export``, a file anyone may send):
        its shape, types and ranges checked (:func:`check_stored`), ValueError naming the field.
        A table of an older :data:`READABLE` format reads as it was (without wide passes)."""
        if not isinstance(d, Mapping) or d.get("format") not in READABLE:
            raise ValueError("unknown cost table format")
        check_stored(d)
        return cls(model=str(d["model"]), dtype=str(d["dtype"]), widths=[int(w) for w in d["widths"]],
                   seconds=[float(s) for s in d["seconds"]], context=int(d["context"]),
                   fingerprint=dict(d.get("fingerprint") or {}), measured_at=str(d.get("measured_at", "")),
                   prefill_seconds=None if d.get("prefill_seconds") is None else float(d["prefill_seconds"]),
                   kernels=[str(k) for k in d.get("kernels") or []],
                   spread=[float(x) for x in d.get("spread") or []], noisy=str(d.get("noisy") or ""),
                   context_slope=float(d.get("context_slope") or 0.0),
                   long_read=_long_read(d.get("long_read")), format=int(d["format"]),
                   wide_context=int(d.get("wide_context") or 0),
                   wide_widths=[int(w) for w in d.get("wide_widths") or []],
                   wide_seconds=[float(x) for x in d.get("wide_seconds") or []])


def _curve(widths: Sequence[int], seconds: Sequence[float]) -> bool:
    """Increasing widths from 1 with one positive number of seconds each."""
    return (len(widths) == len(seconds) >= 1 and widths[0] == 1 and all(b > a for a, b in zip(widths, widths[1:]))
            and all(isinstance(s, (int, float)) and s > 0 and s == s for s in seconds))


def _interpolate(w: Sequence[int], s: Sequence[float], width: int) -> float:
    """Seconds at ``width`` on a measured curve: linear between widths, beyond the widest along the
    slope of the last two (at least flat)."""
    if width <= w[0]:
        return s[0]
    for i in range(1, len(w)):
        if width <= w[i]:
            f = (width - w[i - 1]) / (w[i] - w[i - 1])
            return s[i - 1] + f * (s[i] - s[i - 1])
    slope = max(0.0, (s[-1] - s[-2]) / (w[-1] - w[-2])) if len(w) > 1 else s[-1]
    return s[-1] + slope * (width - w[-1])


def _long_read(value) -> list[float] | None:
    """A table's ``long_read`` as stored, checked: ``[tokens > 1, seconds > 0]`` or None."""
    if not value:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and float(value[0]) > 1 and float(value[1]) > 0):
        raise ValueError(f"long_read must be [tokens > 1, seconds > 0], got {value!r}")
    return [int(value[0]), float(value[1])]


#: what a stored table may hold: widths and contexts in tokens, seconds of one pass
MAX_WIDTH = 1 << 12
MAX_CONTEXT = 1 << 24
MAX_PASS_SECONDS = 1e4


def _real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _whole(v) -> TypeGuard[int]:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _positive(v, hi: float) -> bool:
    return _real(v) and 0 < v <= hi


def check_stored(d: Mapping) -> None:
    """ValueError naming the first field of a stored table that is not what it must be: strings for
    ``model``/``dtype``; ``widths`` increasing integers from 1 (at most :data:`MAX_WIDTH`) with one
    finite positive ``seconds`` each; ``context`` and ``long_read``'s tokens integers from 1;
    ``prefill_seconds`` finite and positive; ``context_slope`` finite, in [0, 1]."""
    if not isinstance(d.get("model"), str) or not isinstance(d.get("dtype"), str):
        raise ValueError("'model' and 'dtype' must be strings")
    widths, seconds = d.get("widths"), d.get("seconds")
    if not (isinstance(widths, list) and 1 <= len(widths) <= MAX_WIDTH
            and all(_whole(w) and 1 <= w <= MAX_WIDTH for w in widths)):
        raise ValueError(f"'widths' must be a list of integers in [1, {MAX_WIDTH}]")
    if not (isinstance(seconds, list) and len(seconds) == len(widths)
            and all(_positive(x, MAX_PASS_SECONDS) for x in seconds)):
        raise ValueError(f"'seconds' must hold one number in (0, {MAX_PASS_SECONDS:g}] per width")
    context = d.get("context")
    if not _whole(context) or not 1 <= context <= MAX_CONTEXT:
        raise ValueError(f"'context' must be an integer in [1, {MAX_CONTEXT}]")
    prefill = d.get("prefill_seconds")
    if prefill is not None and not _positive(prefill, MAX_PASS_SECONDS):
        raise ValueError(f"'prefill_seconds' must be a number in (0, {MAX_PASS_SECONDS:g}]")
    slope = d.get("context_slope") or 0.0
    if not _real(slope) or not 0.0 <= slope <= 1.0:
        raise ValueError("'context_slope' must be a number in [0, 1]")
    spread = d.get("spread") or []
    if not (isinstance(spread, list) and all(_real(x) and x >= 0 for x in spread)):
        raise ValueError("'spread' must be a list of numbers >= 0")
    if not isinstance(d.get("fingerprint") or {}, dict) or not isinstance(d.get("kernels") or [], list):
        raise ValueError("'fingerprint' must be an object and 'kernels' a list")
    wide = d.get("wide_widths") or []
    if wide and not (isinstance(wide, list) and all(_whole(w) and 1 <= w <= MAX_WIDTH for w in wide)
                     and isinstance(d.get("wide_seconds"), list) and len(d["wide_seconds"]) == len(wide)
                     and all(_positive(x, MAX_PASS_SECONDS) for x in d["wide_seconds"])
                     and _whole(d.get("wide_context")) and context < d["wide_context"] <= MAX_CONTEXT):
        raise ValueError("'wide_widths', 'wide_seconds' and 'wide_context' must be widths in [1, "
                         f"{MAX_WIDTH}], one number of seconds each, and a context above 'context'")
    long_read = d.get("long_read")
    if long_read and not (isinstance(long_read, (list, tuple)) and len(long_read) == 2 and _whole(long_read[0])
                          and 1 < long_read[0] <= MAX_CONTEXT and _positive(long_read[1], MAX_PASS_SECONDS)):
        raise ValueError(f"'long_read' must be [tokens in (1, {MAX_CONTEXT}], seconds > 0]")
