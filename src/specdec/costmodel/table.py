"""A cost table: measured seconds per forward pass at a few widths, and the costs between them.

:class:`CostTable` holds one model's timings in one dtype on one machine (:mod:`.timing` makes
them, :mod:`.cache` keeps them) and interpolates: the seconds of a pass over any width, and of a
prefill over any number of tokens. Its dictionary form is what the JSON cache stores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

#: bumped when tables change meaning, so older ones are measured again (2: logits everywhere + prefill; 3: kernels;
#: 4: every width 1..17, as k=auto now picks only measured widths)
FORMAT = 4


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
    #: half-precision linears run as two rows, :class:`specdec.backends.transformers.kernels.RowPaddedLinear`)
    kernels: list[str] = field(default_factory=list)
    format: int = FORMAT
    #: per width, the relative spread of its timings (median absolute deviation / median)
    spread: list[float] = field(default_factory=list)
    #: why the timings are not to be trusted ("" when they are): the machine looked loaded, or
    #: timings stayed noisy or inconsistent after re-measuring. Measured again at a quiet load.
    noisy: str = ""
    #: set on the cached copy when observed passes drifted far from it (:func:`specdec.costmodel.mark_stale`)
    stale: str = ""
    #: a pass's extra seconds per token of context beyond ``context``, as a share of its seconds
    #: (``specdec calibrate --export`` measures it; 0: not measured)
    context_slope: float = 0.0
    #: on an accelerator, ``[tokens, seconds]`` of a long prefill pass (:data:`specdec.costmodel.timing.LONG_READ`):
    #: a read is then priced on the line from a one-token pass to it (None: in proportion to
    #: ``prefill_seconds``, as on a CPU)
    long_read: list[float] | None = None

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
        if d.get("format") != FORMAT:
            raise ValueError("unknown cost table format")
        return cls(model=str(d["model"]), dtype=str(d["dtype"]), widths=[int(w) for w in d["widths"]],
                   seconds=[float(s) for s in d["seconds"]], context=int(d["context"]),
                   fingerprint=dict(d.get("fingerprint") or {}), measured_at=str(d.get("measured_at", "")),
                   prefill_seconds=None if d.get("prefill_seconds") is None else float(d["prefill_seconds"]),
                   kernels=[str(k) for k in d.get("kernels") or []],
                   spread=[float(x) for x in d.get("spread") or []], noisy=str(d.get("noisy") or ""),
                   stale=str(d.get("stale") or ""), context_slope=float(d.get("context_slope") or 0.0),
                   long_read=_long_read(d.get("long_read")))


def _long_read(value) -> list[float] | None:
    """A table's ``long_read`` as stored, checked: ``[tokens > 1, seconds > 0]`` or None."""
    if not value:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and float(value[0]) > 1 and float(value[1]) > 0):
        raise ValueError(f"long_read must be [tokens > 1, seconds > 0], got {value!r}")
    return [int(value[0]), float(value[1])]
