"""One way to validate a number, and one way to declare an option: its range and help live on
the dataclass field that holds it (``option(0.9, lo=0, hi=1, help=...)``), and validation, CLI
flags and documentation are generated from that one declaration."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from .errors import SpecdecError


def check_number(where: str, value: Any, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False, hi_open: bool = False) -> float:
    """A finite int or float (never a bool) in the range; returned as float, else SpecdecError.
    An int is checked for size before any float arithmetic (JSON's ``1`` followed by 400 zeros is
    an int that no float holds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecdecError(f"{where} must be a number, got {shown(value)}")
    if isinstance(value, int) and value.bit_length() > FLOAT_BITS:
        raise SpecdecError(f"{where} must be a finite number{'' if lo is None and hi is None else ' ' + span(lo, hi, lo_open, hi_open)}, "
                           f"got {shown(value)}")
    if not math.isfinite(value):
        raise SpecdecError(f"{where} must be a number, got {value!r}")
    below = lo is not None and (value < lo or (lo_open and value == lo))
    above = hi is not None and (value > hi or (hi_open and value == hi))
    if below or above:
        raise SpecdecError(f"{where} must be a number {span(lo, hi, lo_open, hi_open)}, got {shown(value)}")
    return float(value)


#: an int of more bits than this is beyond every float (``float(2**1024)`` overflows)
FLOAT_BITS = 1024
#: the largest integer an option takes where its range names no bound (an int64, what a tensor holds)
INT_LIMIT = 2**63 - 1


def shown(value: Any) -> str:
    """``value`` for a one-line error: an int too long to print as its size, anything else cut short."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def span(lo, hi, lo_open: bool = False, hi_open: bool = False) -> str:
    """``>= 0``, ``> 0``, ``<= 1`` or ``in [0, 1)``."""
    if hi is None:
        return f"{'>' if lo_open else '>='} {lo}"
    if lo is None:
        return f"{'<' if hi_open else '<='} {hi}"
    return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"


def check_bool(where: str, value: Any) -> bool:
    """True or False; from text (a flag, a bench item), ``true``/``false`` in any case."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise SpecdecError(f"{where} must be true or false, got {value!r}")
    return value


def check_int(where: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    """An int (never a bool) in ``[lo, hi]``, else SpecdecError; a bound not given is
    :data:`INT_LIMIT` in size."""
    if isinstance(value, bool) or not isinstance(value, int) or (lo is not None and value < lo) or (
            hi is not None and value > hi):
        raise SpecdecError(f"{where} must be an integer {span(lo, hi)}, got {shown(value)}")
    if (hi is None and value > INT_LIMIT) or (lo is None and value < -INT_LIMIT):
        raise SpecdecError(f"{where} must be an integer of at most {INT_LIMIT} in size, got {shown(value)}")
    return value


@dataclass(frozen=True)
class Spec:
    """What values an option takes, and its one-line help."""

    kind: type  # int, float, str or bool
    help: str = ""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[str, ...] | None = None
    #: words a numeric option also takes (e.g. ``"auto"``), beside its range
    words: tuple[str, ...] = ()
    #: a check of its own (``(where, value) -> value``), for values no range or list describes
    #: (a backend's ``dtype`` also takes a ``torch.dtype``); ``choices`` then only list them for people
    own_check: Callable[[str, Any], Any] | None = None

    def check(self, where: str, value: Any) -> Any:
        if self.own_check is not None:
            return self.own_check(where, value)
        if self.words and isinstance(value, str):
            if value in self.words:
                return value
            raise SpecdecError(f"{where} must be {' or '.join(map(repr, self.words))} or a number {span(self.lo, self.hi)}, "
                               f"got {value!r}")
        if self.kind is bool:
            return check_bool(where, value)
        if self.choices is not None:
            if value not in self.choices:
                raise SpecdecError(f"{where} must be one of {', '.join(self.choices)}, got {value!r}")
            return value
        if self.kind is int:
            return check_int(where, value, None if self.lo is None else int(self.lo),
                             None if self.hi is None else int(self.hi))
        return check_number(where, value, self.lo, self.hi, self.lo_open, self.hi_open)

    def parse(self, text: str) -> Any:
        """A command-line value: one of ``words`` as is, ``true``/``false`` for a bool option, else
        the option's kind (argparse's ``type``)."""
        if self.kind is bool:
            return check_bool("the value", text)
        return text if text in self.words else self.kind(text)


def option(default: Any, *, help: str, kind: type | None = None, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, hi_open: bool = False, choices: tuple[str, ...] | None = None,
           words: tuple[str, ...] = (), check: Callable[[str, Any], Any] | None = None) -> Any:
    """A dataclass field declaring an option: default, range or choices, words it takes beside a
    number (``words``), a check of its own (``check``), help. Typed ``Any``, as ``dataclasses.field``
    is, so that it stands where the annotation's value goes (``k: int = option(...)``)."""
    spec = Spec(kind or type(default), help, lo, hi, lo_open, hi_open, choices, tuple(words), check)
    return field(default=default, metadata={"spec": spec})


def options_of(cls) -> dict[str, tuple[Spec, Any]]:
    """``{name: (spec, default)}`` for every declared option of a dataclass."""
    return {f.name: (f.metadata["spec"], f.default) for f in fields(cls) if "spec" in f.metadata}


def check_options(owner: str, cls, values: dict[str, Any]) -> dict[str, Any]:
    """Validate ``values`` against ``cls``'s declared options: unknown names and bad values are
    SpecdecErrors naming ``owner``; returns the normalized values."""
    declared = options_of(cls)
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise SpecdecError(f"{owner} takes {', '.join(declared) or 'no options'}, got {unknown}")
    return {k: declared[k][0].check(f"{owner} {k}", v) for k, v in values.items()}


def number_arg(kind: type = float, lo: float | None = None, hi: float | None = None, lo_open: bool = False,
               hi_open: bool = False) -> Callable[[str], Any]:
    """An argparse ``type`` for a numeric flag, checked as every other number here: an int or a
    finite float in the range, else argparse's one-line usage error (status 2), the value cut short
    (``--clock-premium nan`` ran on to a traceback, ``1e308`` to figures of 0.000x)."""
    import argparse

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:  # int() also refuses a text of more than 4300 digits
            word = "an integer" if kind is int else "a number"
            bounds = "" if lo is None and hi is None else " " + span(lo, hi, lo_open, hi_open)
            raise argparse.ArgumentTypeError(f"the value must be {word}{bounds}, got {shown(text)}") from None
        try:
            if kind is int:
                return check_int("the value", value, None if lo is None else int(lo), None if hi is None else int(hi))
            return check_number("the value", value, lo, hi, lo_open, hi_open)
        except SpecdecError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse
