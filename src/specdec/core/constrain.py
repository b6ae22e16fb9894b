"""Structured output: JSON schema, JSON object, regex, choice and Lark grammar constraints that every
verification rule, drafter and backend respects.

Design
------

- :class:`Constraint` is a request's value (``kind`` in :data:`KINDS` and its ``text``), parsed from
  user input by :func:`constraint_from` (OpenAI's ``response_format`` or one of ``json_schema``,
  ``regex``, ``choice``, ``grammar``) and checked on creation, before any work: invalid JSON, an
  invalid schema or regex, an empty choice list, a Lark grammar that does not parse, or text past
  :data:`MAX_TEXT` are one-line :class:`~specdec.errors.SpecdecError`\\ s. The optional dependency
  (llguidance, ``pip install 'specdec-rules[structured]'``) is checked first, by :func:`require`.
- :func:`compile_constraint` compiles a constraint against a tokenizer once: llguidance's
  ``LLMatcher`` in its initial state, kept in an LRU cache keyed by (tokenizer, constraint)
  (:data:`MAX_COMPILED` entries; the tokenizer's llguidance view is cached too). Compiling is bounded
  by :data:`LIMITS` (llguidance's lexer fuel, grammar size and lexer states: a schema past them is a
  one-line error, not a hang); a grammar that admits no token with this tokenizer is an error too.
- :class:`Guide` is one generation's state over a copy of that matcher: :meth:`Guide.mask` gives the
  ``[V]`` bool mask of the next token (rows past the tokenizer's table are False; the engine's
  end-of-sequence ids are allowed exactly when the grammar may stop here), :meth:`Guide.advance`,
  :meth:`Guide.rollback`, :meth:`Guide.valid_prefix` and :attr:`Guide.done`. End-of-sequence ids are
  never fed to the matcher: nothing follows them. :meth:`Guide.restrict` masks a block of logit
  rows scored over ``[last, t_1..t_n]``: row 0 with the current state, row ``i`` with the state after
  ``t_1..t_i``; it stops at the first token the grammar refuses (later rows are unreachable and are
  left as they are) and leaves the guide where it found it.

How the engine uses it (:mod:`specdec.core.engine`): the target's logits are restricted along the drafts
*before* the verification round is built, so the sampling distribution, the lossless rule, block
verification and every loose rule read the grammar-masked target; ``in_support``
(:mod:`specdec.core.verify.policy`) also refuses, at T=0, a draft whose masked logit is ``-inf``, so no
loose rule can keep a token the grammar forbids (at T>0 such a draft has probability 0 and is refused
already). After the commit the guide advances by the committed tokens. Plain decoding (``ar``) goes
through the same masks. Lossless speculation is then exact: its output law is the target's
restricted to the grammar and renormalised (temperature/top-k/top-p applied after the mask), i.e.
plain constrained decoding. When the grammar is complete only end-of-sequence ids are allowed, so
the model ends the generation with one (a constraint needs an engine with end-of-sequence ids).

Drafters see the guide as ``Drafter.guide`` (set by the engine before ``start``; see
:class:`specdec.core.drafters.base.Drafter`): the draft model masks each step's logits (so its ``q`` is
the masked draft distribution), prompt lookup cuts its proposal at the first refused token, and
``model+pld`` does both; the tree drafter masks each expanded node's row with the state after its
path (:meth:`Guide.walk`), so its children are allowed tokens and disallowed branches never grow. A
drafter that ignores the guide stays correct (its refused drafts are rejected by every rule), only
slower. Token trees are restricted node by node (:meth:`Guide.tree_masks`: row ``i+1`` with the
state after node ``i``'s path; a node refused under its parent is a pruned branch, unreachable
for every rule).
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from ..errors import SpecdecError

#: the constraint kinds
KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
#: the longest constraint text accepted (characters): a bound on what a request may ask to compile
MAX_TEXT = 256 * 1024
#: the most choices a ``choice`` constraint may list
MAX_CHOICES = 4096
#: compiled constraints kept (LRU), and tokenizers' llguidance views kept
MAX_COMPILED = 64
MAX_VOCABS = 4
#: llguidance's parser limits, the bound on a compile (time: lexer fuel, ~50k units per ms; size:
#: grammar symbols and lexer states). A constraint past them is refused with a one-line error.
LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, max_grammar_size=500_000,
              max_lexer_states=250_000)
INSTALL = "pip install 'specdec-rules[structured]'"


def require():
    """The llguidance module, or a one-line error naming the extra that installs it."""
    try:
        import llguidance
        import llguidance.hf  # noqa: F401 - the tokenizer bridge, used by compile_constraint
    except ImportError:
        raise SpecdecError(f"structured output needs llguidance, which is not installed: {INSTALL}") from None
    return llguidance


def _limits(llg):
    return llg.LLParserLimits(**LIMITS)


#: the longest error detail kept from llguidance (characters)
MAX_DETAIL = 300


def _first_line(message: object) -> str:
    """llguidance's message on one line: its lines joined (a regex error's detail, e.g. "unclosed
    group", is on the last one), cut at :data:`MAX_DETAIL` characters."""
    lines = [line.strip() for line in str(message).strip().splitlines() if line.strip()]
    text = " ".join(lines) if lines else "unknown error"
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."


def escape_regex(text: str) -> str:
    """``text`` as a regex matching exactly it: ASCII letters and digits as they are, other ASCII
    characters as ``\\x{HH}`` escapes, anything else literally."""
    out = []
    for ch in text:
        if ch.isascii() and not ch.isalnum():
            out.append(f"\\x{{{ord(ch):02X}}}")
        else:
            out.append(ch)
    return "".join(out)


@dataclass(frozen=True)
class Constraint:
    """What the generated text must match: ``kind`` (:data:`KINDS`) and its ``text``: the JSON schema
    as JSON text, a regex, the choices as a JSON list of strings, or a Lark grammar (``json_object``:
    empty). Checked on creation (module docstring); hashable, so it keys the compile cache."""

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecdecError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.text, str):
            raise SpecdecError(f"{self.kind}: the constraint's text must be a string, got {type(self.text).__name__}")
        if len(self.text) > MAX_TEXT:
            raise SpecdecError(f"{self.kind}: {len(self.text)} characters, more than the {MAX_TEXT} accepted")
        llg = require()
        grammar = self.grammar
        message = llg.LLMatcher.validate_grammar(grammar, limits=_limits(llg))
        if message and not message.startswith("WARNING"):
            raise SpecdecError(f"invalid {self.label}: {_first_line(message)}")

    @property
    def label(self) -> str:
        return {"json_schema": "JSON schema", "json_object": "JSON object constraint", "regex": "regex",
                "choice": "choice list", "grammar": "Lark grammar"}[self.kind]

    @property
    def choices(self) -> list[str]:
        return json.loads(self.text) if self.kind == "choice" else []

    @property
    def grammar(self) -> str:
        """The llguidance grammar this constraint compiles to (llguidance's own checks come later,
        in :meth:`__post_init__` and :func:`compile_constraint`)."""
        matcher = require().LLMatcher
        if self.kind == "regex":
            return matcher.grammar_from_regex(self.text)
        if self.kind == "choice":
            return matcher.grammar_from_regex("(" + "|".join(escape_regex(c) for c in self.choices) + ")")
        if self.kind == "grammar":
            return matcher.grammar_from_lark(self.text)
        schema = self.text if self.kind == "json_schema" else '{"type": "object"}'
        try:
            return matcher.grammar_from_json_schema(schema)
        except (ValueError, TypeError) as exc:
            raise SpecdecError(f"invalid {self.label}: {_first_line(exc)}") from None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "text": self.text}


def _schema_text(schema: Any, what: str) -> str:
    """A JSON schema (a dict, or its JSON text) as compact JSON text; property order is kept (it is
    the order the output writes them in)."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SpecdecError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise SpecdecError(f"{what} must be a JSON object (a schema), got {type(schema).__name__}")
    try:
        return json.dumps(schema, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SpecdecError(f"{what} cannot be written as JSON: {exc}") from None


def _from_response_format(rf: Any) -> Constraint | None:
    """OpenAI's ``response_format``: ``{"type": "text"}``, ``{"type": "json_object"}`` or
    ``{"type": "json_schema", "json_schema": {"schema": {...}, ...}}``."""
    if not isinstance(rf, dict) or "type" not in rf:
        raise SpecdecError('response_format must be an object with a "type": text, json_object or json_schema')
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind == "json_schema":
        inner = rf.get("json_schema")
        if not isinstance(inner, dict) or "schema" not in inner:
            raise SpecdecError('response_format json_schema needs "json_schema": {"schema": {...}}')
        return Constraint("json_schema", _schema_text(inner["schema"], "response_format's schema"))
    raise SpecdecError(f"response_format type must be text, json_object or json_schema, got {kind!r}")


def _choice_text(choice: Any) -> str:
    if isinstance(choice, str) or not isinstance(choice, (list, tuple)):
        raise SpecdecError(f"choice must be a list of strings, got {type(choice).__name__}")
    if not choice:
        raise SpecdecError("choice is an empty list; give at least one string")
    if len(choice) > MAX_CHOICES:
        raise SpecdecError(f"choice lists {len(choice)} strings, more than the {MAX_CHOICES} accepted")
    for c in choice:
        if not isinstance(c, str) or not c:
            raise SpecdecError(f"every choice must be a non-empty string, got {c!r}")
    return json.dumps(list(choice), ensure_ascii=False)


def constraint_from(response_format: Any = None, json_schema: Any = None, regex: Any = None, choice: Any = None,
                    grammar: Any = None) -> Constraint | None:
    """The request's constraint from its keywords (at most one given; None: unconstrained)."""
    given = {k: v for k, v in dict(response_format=response_format, json_schema=json_schema, regex=regex,
                                   choice=choice, grammar=grammar).items() if v is not None}
    if len(given) > 1:
        raise SpecdecError(f"give at most one structured-output constraint, got {', '.join(given)}")
    if not given:
        return None
    require()
    (key, value), = given.items()
    if key == "response_format":
        return _from_response_format(value)
    if key == "json_schema":
        return Constraint("json_schema", _schema_text(value, "json_schema"))
    if key == "choice":
        return Constraint("choice", _choice_text(value))
    if not isinstance(value, str) or not value:
        raise SpecdecError(f"{key} must be a non-empty string, got {value!r}")
    return Constraint(key, value)


# --------------------------------------------------------------------------- compiling


class _Cache:
    """A small thread-safe LRU dictionary."""

    def __init__(self, size: int):
        self.size, self.lock = size, threading.Lock()
        self.items: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key, make):
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = make()
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


_VOCABS = _Cache(MAX_VOCABS)
_COMPILED = _Cache(MAX_COMPILED)


@dataclass(frozen=True)
class Compiled:
    """A constraint compiled for one tokenizer: the matcher in its initial state (copied per
    generation), the tokenizer's llguidance view and its size, and llguidance's EOS id."""

    constraint: Constraint
    matcher: Any
    tokenizer: Any  # kept so the cache key's id() stays this tokenizer's
    n_vocab: int
    eos: int


def llg_tokenizer(tokenizer):
    """llguidance's view of a Hugging Face fast tokenizer (about a second for a large vocabulary,
    so cached per tokenizer object)."""
    llg = require()

    def make():
        try:
            return tokenizer, llg.hf.from_tokenizer(tokenizer)
        except Exception as exc:  # noqa: BLE001 - any failure is this tokenizer's
            raise SpecdecError(f"structured output: llguidance cannot read this tokenizer "
                               f"({type(exc).__name__}: {_first_line(exc)})") from None

    return _VOCABS.get(id(tokenizer), make)[1]


def compile_constraint(tokenizer, constraint: Constraint) -> Compiled:
    """The constraint compiled for ``tokenizer`` (cached; module docstring)."""
    llg = require()
    vocab = llg_tokenizer(tokenizer)

    def make() -> Compiled:
        matcher = llg.LLMatcher(vocab, constraint.grammar, log_level=0, limits=_limits(llg))
        if matcher.is_error():
            raise SpecdecError(f"{constraint.label}: cannot compile it ({_first_line(matcher.get_error())})")
        compiled = Compiled(constraint, matcher, tokenizer, int(vocab.vocab_size), int(vocab.eos_token))
        bits = _bits(matcher, compiled.n_vocab)
        bits[compiled.eos] = False
        if not bits.any():
            raise SpecdecError(f"{constraint.label}: it admits no token with this tokenizer"
                               + (" (only the empty text)" if matcher.is_accepting() else ""))
        return compiled

    return _COMPILED.get((id(tokenizer), constraint), make)


def _bits(matcher, n: int) -> np.ndarray:
    """``[n]`` bool: the tokens llguidance allows next."""
    packed = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
    return np.unpackbits(packed, bitorder="little")[:n].astype(bool)


# --------------------------------------------------------------------------- one generation


def _timed(method):
    """Add the method's wall time to ``Guide.seconds`` (outermost calls only: nested guide calls
    are not counted twice)."""

    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        if self._timing:
            return method(self, *args, **kwargs)
        self._timing, start = True, time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self._timing = False

    return timed


class Guide:
    """One generation's grammar state (module docstring). ``width``: the logits' row width (the
    target's ``vocab_limit``); ``stop_ids``: the engine's end-of-sequence ids."""

    def __init__(self, compiled: Compiled, width: int, stop_ids: Sequence[int]):
        self.matcher = compiled.matcher.deep_copy()
        self.n_vocab, self.eos, self.width = compiled.n_vocab, compiled.eos, int(width)
        self.stop_ids = frozenset(int(i) for i in stop_ids)
        self.consumed = 0  # tokens fed to the matcher so far (advance minus rollback)
        self.seconds, self._timing = 0.0, False  # wall time spent in the guide's methods (the mask's cost)
        if not self.stop_ids:
            raise SpecdecError("structured output needs an end-of-sequence token to end a complete text")

    @property
    def done(self) -> bool:
        """The text is complete: nothing but an end-of-sequence id may follow."""
        return bool(self.matcher.is_stopped())

    @_timed
    def mask(self, width: int | None = None) -> torch.Tensor:
        """``[width]`` bool (CPU): the tokens allowed next (see the module docstring)."""
        width = self.width if width is None else int(width)
        out = np.zeros(width, dtype=bool)
        m = min(width, self.n_vocab)
        out[:m] = _bits(self.matcher, self.n_vocab)[:m]
        if self.eos < width:
            out[self.eos] = False
        stop = bool(self.matcher.is_accepting())
        for i in self.stop_ids:
            if i < width:
                out[i] = stop
        if not out.any():
            error = self.matcher.get_error() if self.matcher.is_error() else "no token can follow"
            raise SpecdecError(f"structured output: {_first_line(error)}")
        return torch.from_numpy(out)

    @_timed
    def advance(self, tokens: Sequence[int]) -> int:
        """Feed ``tokens`` up to the first end-of-sequence id (excluded: nothing follows it); returns
        how many were fed. A refused token is an error (the engine only commits allowed ones)."""
        n = 0
        for t in tokens:
            t = int(t)
            if t in self.stop_ids:
                break
            if not self.matcher.consume_token(t):
                raise RuntimeError(f"structured output: token {t} is refused by the grammar "
                                   f"({_first_line(self.matcher.get_error())})")
            n += 1
        self.consumed += n
        return n

    @_timed
    def rollback(self, n: int) -> None:
        if n:
            if n > self.consumed or not self.matcher.rollback(int(n)):
                raise RuntimeError(f"structured output: cannot roll back {n} tokens")
            self.consumed -= n

    @contextlib.contextmanager
    def trial(self) -> Iterator["Guide"]:
        """Advance freely inside; on leaving, roll back to the state on entry."""
        start = self.consumed
        try:
            yield self
        finally:
            self.rollback(self.consumed - start)

    @_timed
    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the grammar allows from here (an end-of-sequence id counts
        when the text may end there, and ends the count)."""
        tokens = [int(t) for t in tokens]
        head = next((i for i, t in enumerate(tokens) if t in self.stop_ids), len(tokens))
        n = int(self.matcher.validate_tokens(tokens[:head])) if head else 0
        if n < head or head == len(tokens):
            return n
        with self.trial():
            self.advance(tokens[:head])
            return head + int(bool(self.matcher.is_accepting()))

    @_timed
    def masks(self, tokens: Sequence[int], width: int | None = None) -> torch.Tensor:
        """``[n+1, width]`` bool: row 0 for the current state, row ``i`` for the state after
        ``tokens[:i]``, up to the first token refused (or an end-of-sequence id); rows after it are
        unreachable and all True. The guide is left as it was."""
        width = self.width if width is None else int(width)
        rows = [self.mask(width)]
        with self.trial():
            for t in tokens:
                t = int(t)
                if t in self.stop_ids or not (t < width and bool(rows[-1][t])):
                    break
                self.advance([t])
                rows.append(self.mask(width))
        out = torch.ones(len(tokens) + 1, width, dtype=torch.bool)
        out[: len(rows)] = torch.stack(rows)
        return out

    @_timed
    def restrict(self, logits: torch.Tensor, tokens: Sequence[int] = ()) -> torch.Tensor:
        """``logits [n+1, V]`` (or ``[V]`` with no tokens) scored over ``[last, t_1..t_n]``, with every
        token the grammar forbids at -inf (:meth:`masks`); a new tensor."""
        rows = logits if logits.dim() == 2 else logits[None]
        allowed = self.masks(list(tokens), rows.shape[-1]).to(rows.device)
        out = rows.masked_fill(~allowed, float("-inf"))
        return out if logits.dim() == 2 else out[0]

    @_timed
    def tree_masks(self, tokens: Sequence[int], parents: Sequence[int], width: int | None = None) -> torch.Tensor:
        """``[n+1, width]`` bool for a token tree (node ``i`` is ``tokens[i]`` under node
        ``parents[i]``, -1: under the committed text; parents first): row 0 for the current state,
        row ``i+1`` for the state after node ``i``'s path. A node the grammar refuses under its parent
        (or an end-of-sequence node) is a pruned branch: its row, and its descendants' rows, are
        unreachable and all True. The guide is left as it was."""
        width = self.width if width is None else int(width)
        out = torch.ones(len(tokens) + 1, width, dtype=torch.bool)
        out[0] = self.mask(width)
        live: list[bool] = []  # per node: its path is one the grammar allows (and may continue)
        with self.walk() as walk:
            for i, (t, p) in enumerate(zip(tokens, parents)):
                t, row = int(t), int(p) + 1
                ok = (p < 0 or live[p]) and t not in self.stop_ids and t < width and bool(out[row][t])
                live.append(ok)
                if ok:
                    walk.to(walk.path(int(p)) + [t])
                    walk.paths.append(walk.current)
                    out[i + 1] = self.mask(width)
                else:
                    walk.paths.append(None)
        return out

    @_timed
    def restrict_tree(self, logits: torch.Tensor, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Tree logits ``[n+1, V]`` (row 0 after the committed text, row ``i+1`` after node ``i``)
        with every token the grammar forbids at -inf (:meth:`tree_masks`); a new tensor."""
        allowed = self.tree_masks(tokens, parents, logits.shape[-1]).to(logits.device)
        return logits.masked_fill(~allowed, float("-inf"))

    @contextlib.contextmanager
    def walk(self) -> Iterator["TreeWalk"]:
        """A :class:`TreeWalk` from the current state; the guide is rolled back to it on leaving."""
        with self.trial():
            yield TreeWalk(self)


class TreeWalk:
    """Moves a :class:`Guide` between the paths of a token tree: :meth:`to` rolls back to the
    longest prefix the current path shares with the asked one and advances along the rest, so a
    tree costs each node's tokens once per visit, not its whole path. ``paths`` (filled by the
    caller) holds each node's path, or None for a pruned node."""

    def __init__(self, guide: Guide):
        self.guide = guide
        self.current: list[int] = []
        self.paths: list[list[int] | None] = []  # per node: its path, None where refused

    def path(self, node: int) -> list[int]:
        """The tokens from the committed text to ``node`` (-1: none)."""
        if node < 0:
            return []
        path = self.paths[node]
        assert path is not None, "only a node the grammar allows has children"
        return list(path)

    def to(self, path: list[int]) -> None:
        keep = 0
        while keep < min(len(path), len(self.current)) and path[keep] == self.current[keep]:
            keep += 1
        self.guide.rollback(len(self.current) - keep)
        self.guide.advance(path[keep:])
        self.current = list(path)


def make_guide(tokenizer, constraint: Constraint | None, width: int, stop_ids: Sequence[int]) -> Guide | None:
    """A new generation's guide (None without a constraint)."""
    if constraint is None:
        return None
    return Guide(compile_constraint(tokenizer, constraint), width, stop_ids)


class Constraints:
    """What turns a request's constraint into a generation's :class:`Guide`, for one tokenizer,
    logits width and set of end-of-sequence ids (compiled once per constraint, cached). Made
    beside the engine (:class:`specdec.frontends.api.Pair`), so the engine itself holds no tokenizer."""

    def __init__(self, tokenizer, width: int, stop_ids: Sequence[int]):
        self.tokenizer, self.width, self.stop_ids = tokenizer, int(width), sorted(int(i) for i in stop_ids)

    def guide(self, constraint: Constraint | None) -> Guide | None:
        """A new generation's guide (None without a constraint); a constraint that cannot serve is
        a one-line error."""
        return make_guide(self.tokenizer, constraint, self.width, self.stop_ids)
