"""The draft model's window: the prompt's last tokens it reads (``draft_window``), for the drafters
that run it and for traces and replays that redo what they read."""

from __future__ import annotations


#: ``draft_window="auto"``: the draft model sees this many of the prompt's last tokens. Measured:
#: the bundled draft's greedy agreement with the bundled target on HumanEval and Spec-Bench against
#: the window (docs/speculation-on-cpus.md, "The draft's window")
AUTO_WINDOW = 256
#: the words ``draft_window`` takes besides a number: the default window, and the whole prompt
WINDOW_AUTO, WINDOW_ALL = "auto", "all"
WINDOW_WORDS = (WINDOW_AUTO, WINDOW_ALL)


def window_start(prompt_tokens: int, window: int | str) -> int:
    """The first prompt position the draft model sees with ``draft_window=window``: the last
    ``window`` tokens of a ``prompt_tokens``-token prompt (``"all"``: from 0; ``"auto"``:
    ``AUTO_WINDOW``). The draft numbers its positions from there, as if its text began there."""
    if window == WINDOW_ALL:
        return 0
    size = AUTO_WINDOW if window == WINDOW_AUTO else int(window)
    return max(0, int(prompt_tokens) - size)
