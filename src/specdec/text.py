"""Between tokens and text: prompt encoding, stop strings and streaming detokenization."""

from __future__ import annotations

from typing import Sequence

from .errors import SpecdecError


def encode_prompt(tokenizer, prompt, chat: bool | None = None, system: str | None = None) -> list[int]:
    """Token ids for a prompt: a string, a list of ``{"role", "content"}`` messages, or token ids.

    ``chat=None`` applies the tokenizer's chat template when it has one (instruct models), and
    always for a message list; ``chat=False`` encodes a string as raw text. A list of ints is used
    as it is (no template; ``chat=True`` is an error), and each id must be in the vocabulary.
    """
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if chat or system:
            raise SpecdecError("token-id prompts are used as they are: no chat template or system message")
        bad = [t for t in prompt if not 0 <= t < len(tokenizer)]
        if bad:
            raise SpecdecError(f"prompt token id {bad[0]} is outside the vocabulary (0..{len(tokenizer) - 1})")
        return list(prompt)
    if isinstance(prompt, str):
        if not prompt:
            raise SpecdecError("the prompt is empty")
        if chat is False:
            if system:
                raise SpecdecError("a system message needs the chat template (chat=True)")
            return list(tokenizer.encode(prompt, add_special_tokens=True))
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)) and prompt:
        messages = list(prompt)
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise SpecdecError("each chat message must be a dict with string 'role' and 'content'")
        if chat is False:
            raise SpecdecError("a list of chat messages needs the chat template; drop chat=False")
        if system:
            messages = [{"role": "system", "content": system}, *messages]
    else:
        raise SpecdecError("the prompt must be a non-empty string or a non-empty list of chat messages")
    if getattr(tokenizer, "chat_template", None) is None:
        if chat is None and isinstance(prompt, str):
            return list(tokenizer.encode(prompt, add_special_tokens=True))
        raise SpecdecError("this tokenizer has no chat template; pass a plain string with chat=False")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def eos_ids(tokenizer, model_ids=()) -> list[int]:
    """Every id that ends a generation: the tokenizer's EOS and the model's own (``Model.eos_ids``)."""
    ids: set[int] = {int(i) for i in model_ids}
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


class StopStrings:
    """Finds the first token at which a stop string is complete in the decoded output."""

    def __init__(self, tokenizer, stops: Sequence[str]):
        if isinstance(stops, str):
            stops = [stops]
        stops = list(stops or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise SpecdecError("stop strings must be non-empty strings")
        self.tokenizer = tokenizer
        self.stops = stops

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def find(self, text: str) -> int | None:
        """Start of the earliest stop string in ``text``, or None."""
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def __call__(self, ids: Sequence[int], n_new: int) -> int | None:
        """Tokens to keep when a stop string completes within the last ``n_new`` ids, else None."""
        if not self.stops or self.find(self.decode(ids)) is None:
            return None
        for keep in range(len(ids) - n_new + 1, len(ids) + 1):
            if self.find(self.decode(ids[:keep])) is not None:
                return keep
        return len(ids)

    def final_text(self, ids: Sequence[int]) -> str:
        """The decoded output, cut before the first stop string."""
        text = self.decode(ids)
        cut = self.find(text)
        return text if cut is None else text[:cut]


class TextStream:
    """Turns growing token ids into text deltas that never have to be taken back: holds back an
    incomplete UTF-8 character and any tail that could still become a stop string."""

    def __init__(self, stops: StopStrings):
        self.stops = stops
        self.sent = 0

    def push(self, ids: Sequence[int]) -> str:
        text = self.stops.decode(ids)
        cut = self.stops.find(text)
        if cut is not None:
            safe = cut
        else:
            whole = text.rstrip("\ufffd")  # an incomplete UTF-8 character decodes as U+FFFD
            safe = len(whole)
            for s in self.stops.stops:  # hold back the longest tail that begins a stop string
                for j in range(min(len(s) - 1, len(whole)), 0, -1):
                    if whole.endswith(s[:j]):
                        safe = min(safe, len(whole) - j)
                        break
        delta = text[self.sent : safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return delta

    def flush(self, ids: Sequence[int]) -> str:
        """The rest of the final text once generation ended."""
        text = self.stops.final_text(ids)
        delta = text[self.sent :]
        self.sent = len(text)
        return delta
