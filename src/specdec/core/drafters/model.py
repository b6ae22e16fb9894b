"""Drafting with a smaller model that shares the target's tokenizer, with its own KV cache."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch

from ...checks import check_options, option
from ...models.backends.base import Model, common_prefix
from ..sampling import SamplingParams, device_chooser, draw, probabilities
from ..window import AUTO_WINDOW, WINDOW_AUTO, WINDOW_WORDS, window_start  # noqa: F401 (window_start re-exported for the drafters)
from .base import Draft, Drafter


def guided(guide):
    """``guide.trial()`` (the guide is rolled back on leaving), or nothing without a grammar."""
    return contextlib.nullcontext() if guide is None else guide.trial()


def window_option():
    return option(WINDOW_AUTO, kind=int, lo=1, words=WINDOW_WORDS,
                  help="model, model+pld, tree: the draft model sees only the prompt's last N tokens (and all "
                       f"generated text), so it never prefills a long prompt; auto: N={AUTO_WINDOW}, all: the "
                       "whole prompt")


class Windowed:
    """A drafter whose model reads a window of the context (``draft_window``): everything from
    :attr:`offset` on, set by :meth:`start` from the prompt's length. Positions before it are
    never fed to the draft model, so a long prompt costs the draft only the window's prefill."""

    lm: Model
    draft_window: int | str = WINDOW_AUTO
    offset = 0

    def start(self, prompt: Sequence[int]) -> None:
        """Forget the last generation and place the window. The draft model is prefilled lazily, by
        the first proposal: a generation that never drafts (k=auto at K=0) never pays it."""
        self.lm.reset()
        self.offset = window_start(len(prompt), self.draft_window)

    def view(self, context: Sequence[int]) -> list[int]:
        """The part of ``context`` the draft model reads."""
        return list(context[self.offset:])

    def backlog(self, context: Sequence[int]) -> int:
        """Tokens of the window the draft model has not read yet (a prefill, or a catch-up after
        rounds that did not draft), fed before its next draft token."""
        view = self.view(context)
        return len(view) - min(common_prefix(self.lm.linear_tokens, view), len(view) - 1)


def min_confidence_option():
    return option(0.0, lo=0, hi=1, hi_open=True,
                  help="model, model+pld: stop a draft after a token the draft gave less than this probability, "
                       "so a large -k costs little")


@dataclass(frozen=True)
class ModelOptions:
    min_confidence: float = min_confidence_option()
    draft_window: int = window_option()


class ModelDrafter(Windowed, Drafter):
    """Runs the draft model autoregressively for up to ``k`` tokens (greedy at T=0, else sampled
    with the same temperature/top-k/top-p, keeping each step's distribution as ``q``).

    Stops early at an end-of-sequence token (nothing after it could be used), and, with
    ``min_confidence > 0``, after a token the draft itself gave less than that probability
    (softmax at temperature 1): later drafts are unlikely to survive, so the round verifies now.
    This is transformers' ``assistant_confidence_threshold`` idea; it lets ``k`` be large.

    The draft model reads a window (``draft_window``, :class:`Windowed`): the prompt's last tokens
    and everything generated. Which tokens it proposes never changes what the lossless rules output.
    """

    name = "model"
    requires_model = True
    drafts_with_model = True
    Options: ClassVar[type] = ModelOptions

    def __init__(self, lm: Model, stop_ids: frozenset[int] = frozenset(), min_confidence: float = 0.0,
                 draft_window: int | str = WINDOW_AUTO):
        check_options(f"drafter {self.name!r}", ModelOptions,
                      {"min_confidence": min_confidence, "draft_window": draft_window})
        self.lm = lm
        self.stop_ids = stop_ids
        self.min_confidence = float(min_confidence)
        self.draft_window = draft_window

    def stop_after(self, i: int, logits: torch.Tensor, token: int, q: torch.Tensor | None = None) -> bool:
        """After draft ``i`` (1-based), ``token`` drawn from ``logits`` (``q``: the distribution it was
        sampled from; None at T=0): stop here when the draft gave it less than ``min_confidence``
        (softmax at T=1; off at 0) or the K policy wants no more (:attr:`Drafter.more`, always asked,
        so it sees every draft's probability: ``q[token]``, else the softmax at T=1)."""
        p = float(q[token]) if q is not None else float(torch.softmax(logits.float(), dim=-1)[token])
        more = self.more(i, p)
        if self.min_confidence > 0 and float(torch.softmax(logits.float(), dim=-1)[token]) < self.min_confidence:
            return True
        return not more

    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        """With a grammar (``guide``), each step's logits are masked by it first, so ``q`` is the
        masked draft distribution; the guide advances along the drafts and is rolled back after."""
        with guided(self.guide):
            return self._propose(context, k, params, generator)

    def _propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Draft:
        fed = self.backlog(context)
        logits = self.lm.logits_for(self.view(context), 1)[0]  # [V]
        if self.guide is None and k > 1:
            draft = self.on_device(logits, k, params, generator, fed)
            if draft is not None:
                return draft
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        raw: list[torch.Tensor] = []
        for i in range(k):
            if self.guide is not None:
                logits = self.guide.restrict(logits)
            raw.append(logits)
            q = None
            if params.greedy:
                token = int(logits.argmax())
            else:
                q = probabilities(logits[None], params)[0]  # [V]
                token = int(draw(q[None], generator)[0])
                rows.append(q)
            tokens.append(token)
            if (self.stop_after(i + 1, logits, token, q) or i == k - 1 or token in self.stop_ids
                    or self.stopping()):
                break
            if self.guide is not None:
                self.guide.advance([token])
            logits = self.lm.forward([token])[0]
        return Draft(tokens, torch.stack(rows) if rows else None, torch.stack(raw), fed=fed)

    #: the draft loop's first block: the last round's draft length (at least 2), 4 at first
    block = 4

    def on_device(self, logits: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None,
                  fed: int) -> Draft | None:
        """The K steps as blocks run on the device (``lm.draft_block``; None where the model has no
        such loop), each read back once and cut where the host loop would have stopped; a block
        that ran out before a stop is followed by the next, from its last token's logits. A
        block's size is the last round's draft length, so k=auto (whose K is the most it could
        want) rarely runs steps past its stop."""
        sampled, key = not params.greedy, (params.temperature, params.top_k, params.top_p)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        raws: list[torch.Tensor] = []
        size = min(k, max(2, self.block))
        while True:
            block = self.lm.draft_block(logits, size, device_chooser(params), key, sampled, generator)
            if block is None:
                return None
            n, stop = self.cut(block, len(tokens))
            tokens += block[0][:n]
            raws.append(block[3][:n])
            if sampled:  # at T=0 the block has no probabilities
                probs.append(block[4][:n])
            if stop or len(tokens) >= k:
                break
            logits = self.lm.forward([tokens[-1]])[0]
            size = min(size, k - len(tokens))
        self.block = len(tokens)
        return Draft(tokens, torch.cat(probs) if sampled else None, torch.cat(raws), fed=fed)

    def cut(self, block, before: int) -> tuple[int, bool]:
        """How many of a device block's drafts to keep (``before``: drafts kept from earlier blocks)
        and whether drafting stops there: after a token the rules above stop at (each draft's
        probability shown to the K policy up to there), an end-of-sequence token, or a stop
        request. The tokens fed past the cut leave the draft model's cache (an index move)."""
        tokens, p, p1 = block[:3]
        n, stop = len(tokens), False
        for i, token in enumerate(tokens):
            more = self.more(before + i + 1, p[i])
            if (not more or (self.min_confidence > 0 and p1[i] < self.min_confidence) or token in self.stop_ids
                    or self.stopping()):
                n, stop = i + 1, True
                break
        self.lm.truncate(len(self.lm.tokens) - (len(tokens) - n))
        return n, stop

    def commit(self, context: Sequence[int], drafted: int, accepted: int) -> None:
        view = self.view(context)
        self.lm.truncate(min(common_prefix(self.lm.linear_tokens, view), len(view) - 1))
