"""Names that the engine, the K policies, replays, the CLI, the server and the bench share, each
declared once (torch-free, so a report reads them without loading the engine)."""

from __future__ import annotations

from enum import Enum

#: plain decoding's policy name (:class:`~specdec.core.verify.base.Plain`), and the bench's id for
#: its plain-decoding configuration
AR = "ar"


class Source(str, Enum):
    """A draft source of the portfolio drafter (``drafter="auto"``), as rounds, traces and stats
    name it; a ``str``, so it compares and serialises as its value."""

    MODEL = "model"  # the draft model
    PLD = "pld"  # prompt lookup
    SUFFIX = "suffix"  # suffix decoding over the caller's earlier answers

    def __str__(self) -> str:
        return self.value
