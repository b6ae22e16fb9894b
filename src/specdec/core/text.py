"""Between tokens and text: prompt encoding, stop strings and streaming detokenization."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..errors import SpecdecError


def surrogate_at(text: str) -> int | None:
    """Index of the first lone surrogate (U+D800..U+DFFF) in ``text``, or None. JSON's ``"\\ud800"``
    and a command-line argument with bytes that are not UTF-8 both give one; no tokenizer or
    UTF-8 writer takes it."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        return exc.start


def check_text(where: str, text: str) -> str:
    """``text``, or a SpecdecError naming ``where`` when it holds a lone surrogate."""
    at = surrogate_at(text)
    if at is not None:
        raise SpecdecError(f"{where} holds a lone surrogate ({ascii(text[at])}) at character {at}: not valid "
                           "Unicode text; send UTF-8")
    return text


def tokenizer_call(what: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``, a tokenizer or chat-template call, with its errors (a template that
    refuses the messages, text the tokenizer cannot take) as one clear SpecdecError."""
    try:
        return fn(*args, **kwargs)
    except SpecdecError:
        raise
    except Exception as exc:
        if not _input_error(exc):
            raise
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecdecError(f"{what}: {reason}") from None


def _input_error(exc: Exception) -> bool:
    """True for what a tokenizer or template raises on input it refuses: jinja2's template errors
    (``raise_exception`` in chat templates), type and value errors, Unicode errors."""
    if isinstance(exc, (TypeError, ValueError, UnicodeError)):
        return True
    try:
        from jinja2 import TemplateError
    except ImportError:  # pragma: no cover - transformers needs jinja2 for chat templates
        return False
    return isinstance(exc, TemplateError)


def encode_prompt(tokenizer, prompt, chat: bool | None = None, system: str | None = None) -> list[int]:
    """Token ids for a prompt: a string, a list of ``{"role", "content"}`` messages, or token ids.

    As vLLM's ``LLM.generate``, llama-cpp-python's ``create_completion``, transformers and the
    OpenAI API do: a string is text to continue (encoded as it is) and a message list is a chat
    (the chat template applied). ``chat=True`` templates a string as one user message, and so does
    a ``system`` message; ``chat=False`` refuses a message list. A list of ints is used as it is (no
    template; ``chat=True`` is an error), and each id must be in the vocabulary.
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
        if chat is False or (chat is None and not system):  # text to continue
            if system:
                raise SpecdecError("a system message needs the chat template (chat=True)")
            return _encode(tokenizer, check_text("the prompt", prompt), add_special_tokens=True)
        check_text("the prompt", prompt)
        if system:
            check_text("the system message", system)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    elif isinstance(prompt, (list, tuple)) and prompt:
        messages = list(prompt)
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise SpecdecError("each chat message must be a dict with string 'role' and 'content'")
            check_text(f"message {i}'s role", m["role"])
            check_text(f"message {i}'s content", m["content"])
        if chat is False:
            raise SpecdecError("a list of chat messages needs the chat template; drop chat=False")
        if system:
            messages = [{"role": "system", "content": check_text("the system message", system)}, *messages]
    else:
        raise SpecdecError("the prompt must be a non-empty string or a non-empty list of chat messages")
    if getattr(tokenizer, "chat_template", None) is None:
        raise SpecdecError("this tokenizer has no chat template: pass a plain string (text to continue) without "
                           "chat=True or a system message")
    text = tokenizer_call("the chat template refused the messages", tokenizer.apply_chat_template, messages,
                          add_generation_prompt=True, tokenize=False)
    return _encode(tokenizer, text, add_special_tokens=False)


def _encode(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer_call("the tokenizer refused the prompt", tokenizer.encode, text,
                               add_special_tokens=add_special_tokens))


def eos_ids(tokenizer, model_ids=()) -> list[int]:
    """Every id that ends a generation: the tokenizer's EOS and the model's own (``Model.eos_ids``)."""
    ids: set[int] = {int(i) for i in model_ids}
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def prefix_function(s: str) -> list[int]:
    """KMP's border table: ``b[i]`` = length of the longest proper prefix of ``s[:i + 1]`` that is
    also its suffix."""
    b = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = b[k - 1]
        if s[i] == s[k]:
            k += 1
        b[i] = k
    return b


def overlap(text: str, stop: str, borders: Sequence[int]) -> int:
    """Length of the longest proper prefix of ``stop`` that ``text`` ends with, in
    O(len(stop)): the KMP automaton of ``stop`` run over ``text``'s last ``len(stop) - 1`` characters
    (where no whole ``stop`` fits, so the state never reaches ``len(stop)``)."""
    k = 0
    for ch in text[len(text) - min(len(text), len(stop) - 1):]:
        while k and ch != stop[k]:
            k = borders[k - 1]
        if ch == stop[k]:
            k += 1
    return k


class StopStrings:
    """Finds the first token at which a stop string is complete in the decoded output."""

    def __init__(self, tokenizer, stops: Sequence[str] | str | None):
        if isinstance(stops, str):
            stops = [stops]
        stops = list(stops or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise SpecdecError("stop strings must be non-empty strings")
        for i, s in enumerate(stops):
            check_text(f"stop string {i}", s)
        self.tokenizer = tokenizer
        self.stops = stops
        self._borders = [prefix_function(s) for s in stops]

    def holdback(self, text: str) -> int:
        """How many characters at the end of ``text`` could still begin a stop string: the longest
        proper prefix of any stop that ``text`` ends with. Linear: one pass of the KMP automaton
        over the last ``len(stop) - 1`` characters per stop."""
        return max((overlap(text, s, b) for s, b in zip(self.stops, self._borders)), default=0)

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
            safe = len(whole) - self.stops.holdback(whole)  # a tail that may begin a stop string waits
        delta = text[self.sent : safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return delta

    def flush(self, ids: Sequence[int]) -> str:
        """The rest of the final text once generation ended."""
        text = self.stops.final_text(ids)
        delta = text[self.sent :]
        self.sent = len(text)
        return delta
