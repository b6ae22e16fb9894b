"""Whom a request shares what the engine keeps across requests with: :class:`Caller`, declared once.

The engine keeps three things from one request to the next, each per caller side by side (the
prefix cache, the suffix drafters' text, k=auto's state: :mod:`specdec.core.scopes`). A request's
caller (:attr:`specdec.core.request.DecodeConfig.caller`) is one of:

- **the shared caller** (:data:`Caller.SHARED`, the library's default): every request that names
  no caller is it, so they share those caches;
- **a named caller** (:meth:`Caller.named`): the server's ``<key>|salt:<digest>``
  (:func:`specdec.frontends.server.app.cache_scope`), a bench configuration's id; its caches are
  its own;
- **an isolated caller** (:data:`Caller.ISOLATED`): a caller of its own, whom nothing before or
  after it serves: it reads nothing another request left and leaves nothing for another. Two
  isolated requests share nothing either, so the engine asks :attr:`Caller.isolated` before it
  looks anything up by caller.

The library's public surface takes a caller loose, as it always has (``""``: the shared one; any
other string: that named one; ``None``: an isolated one); :func:`as_caller` converts it, once,
where it enters (:meth:`specdec.core.request.DecodeConfig.with_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import SpecdecError


@dataclass(frozen=True)
class Caller:
    """A request's caller (module docstring): ``name`` (``""``: the shared caller) and whether it is
    ``isolated`` (a caller of its own, nameless). Build it with :meth:`named`, or take
    :data:`SHARED` or :data:`ISOLATED`; ``str()`` is its name, for display."""

    name: str = ""
    #: a caller of its own: nothing kept across requests serves it or is kept for it
    isolated: bool = False

    #: the library's default: every request that names no caller
    SHARED: ClassVar[Caller]
    #: a caller of its own (a seeded sample, a server request with no key and no salt under
    #: ``--no-shared-caches``)
    ISOLATED: ClassVar[Caller]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise SpecdecError(f"a caller's name must be a string, got {type(self.name).__name__}")
        if self.isolated and self.name:
            raise SpecdecError(f"an isolated caller has no name, got {self.name!r}")

    @classmethod
    def named(cls, name: str) -> Caller:
        """The caller called ``name`` (``""``: the shared caller)."""
        return cls(name)

    def __str__(self) -> str:
        return "(isolated)" if self.isolated else self.name


Caller.SHARED = Caller()
Caller.ISOLATED = Caller(isolated=True)


def as_caller(value: Any) -> Caller:
    """The caller a loose public value names: a :class:`Caller` as it is; a string, the caller of that
    name (``""``: :data:`Caller.SHARED`); None, :data:`Caller.ISOLATED`. Anything else is a one-line
    :class:`~specdec.errors.SpecdecError`."""
    if isinstance(value, Caller):
        return value
    if value is None:
        return Caller.ISOLATED
    if isinstance(value, str):
        return Caller.named(value)
    raise SpecdecError(f"caller must be a string, None or a Caller, got {type(value).__name__}")
