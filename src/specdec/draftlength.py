"""A request's draft length ``k``, parsed once where the request is built, and its one limit.

:class:`K` is a fixed number of draft tokens a round (``K(5)``) or :data:`AUTO` (each round's K
chosen from the cost model, :mod:`specdec.core.autok`). Flags, config files, keywords and JSON spell
auto as the word ``"auto"`` (:data:`AUTO_WORD`); :meth:`K.parse` turns a loose value into a
:class:`K` once (:class:`~specdec.core.request.DecodeConfig` does it), and everything after reads
``k.auto`` and ``k.fixed``, never the word. A K compares equal to its loose value (``K(5) == 5``,
``AUTO == "auto"``), so code written against the loose values keeps working.

:data:`MAX_K` is the one draft-length limit: the most draft tokens a request may ask for (``k``, a
tree's depth) and the widest verify pass the cost tables measure (:data:`specdec.models.costmodel.WIDTHS`
ends at it). A chain of K drafts is verified in one pass of K + 1 tokens, so the planners (k=auto,
the replay's oracle, the dtype choice) plan chains of at most :data:`MAX_CHAIN` drafts (``MAX_K - 1``):
the passes the tables measured.
"""

from __future__ import annotations

from typing import Any

from .errors import SpecdecError

#: the longest draft a request may ask for (``k``, and a tree's depth) and the widest verify pass the
#: cost tables measure; a round's work, which a client that leaves waits out, grows with K. 32 (not
#: 31) also because benchmark folders made with chains of K=32 and trees of depth 32 must re-report
MAX_K = 32
#: the longest chain the planners plan (k=auto, the replay's oracle, the dtype choice): its verify
#: pass of ``MAX_CHAIN + 1`` tokens is the widest the short-context cost tables measured
MAX_CHAIN = MAX_K - 1
#: how flags, config files, keywords and JSON write k=auto
AUTO_WORD = "auto"


class K:
    """A draft length: ``fixed`` draft tokens a round (an int in [1, :data:`MAX_K`]), or auto
    (``fixed`` None: chosen each round from the cost model). Build one with :meth:`parse`."""

    __slots__ = ("fixed",)
    fixed: int | None

    def __init__(self, fixed: int | None = None):
        object.__setattr__(self, "fixed", fixed)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a K is immutable")

    @property
    def auto(self) -> bool:
        """Whether each round chooses its own K."""
        return self.fixed is None

    @property
    def value(self) -> int | str:
        """The loose value, as flags, files and JSON write it: the integer, or ``"auto"``."""
        return AUTO_WORD if self.fixed is None else self.fixed

    @classmethod
    def parse(cls, k: Any) -> K:
        """A :class:`K` from ``"auto"`` (any case) or an integer in [1, :data:`MAX_K`] (an integer
        given as text is accepted, e.g. from a flag); a one-line error otherwise."""
        if isinstance(k, K):
            return k
        if isinstance(k, str):
            text = k.strip().lower()
            if text == AUTO_WORD:
                return AUTO
            if text.isdigit():
                k = int(text)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise SpecdecError(f"k (draft length) must be 'auto' or an integer in [1, {MAX_K}], got {k!r}")
        return cls(k)

    @staticmethod
    def is_json(k: Any) -> bool:
        """Whether ``k`` has a JSON request's shape of k: an integer, or exactly the word ``"auto"``
        (its range is checked by :meth:`parse`)."""
        return k == AUTO_WORD or (isinstance(k, int) and not isinstance(k, bool))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, K):
            return self.fixed == other.fixed
        if isinstance(other, (int, str)) and not isinstance(other, bool):
            return self.value == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return f"K({self.fixed})"

    def __reduce__(self):
        return (K, (self.fixed,))


#: k=auto
AUTO = K(None)

__all__ = ["AUTO", "AUTO_WORD", "K", "MAX_K"]
