"""The model interface: everything the engine, the drafters, the cost model, the server and the
benchmark use of a model, whatever runs it.

A :class:`Model` holds one KV cache and the token ids that cache holds. Prefix reuse and rollback
are written once, here: :meth:`Model.logits_for` feeds only what the cache lacks of a context, and
rolling back after a rejection is :meth:`Model.truncate` to a prefix (a key/value entry depends on
its prefix alone, so this is correct for any accept pattern). A backend implements the few
primitive operations below (``_append``, ``_crop``, ``_clear``, for token trees
``_append_tree``/``_keep``, and to copy the cache aside and back ``_state_bytes``/``_save``/``_load``),
and declares what it can do in :class:`Capabilities`, which the engine checks before generating:
an unsupported combination is a one-line error up front, never a failure mid-generation.

Backends: :mod:`specdec.models.backends.transformers.model` (transformers, eager PyTorch; CPU or GPU) and
:mod:`specdec.models.backends.llamacpp.model` (llama.cpp through llama-cpp-python's low-level API; GGUF files).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import torch

from ...errors import SpecdecError


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Capabilities:
    """What a backend's model can do beyond scoring a chain of tokens.

    ``trees``: score a token tree in one pass (tree attention) and keep one path of it.
    ``hidden``: return the final hidden states (the LM head's input, after the final norm) with the
    logits, and apply the LM head to hidden states (DropMatch). ``max_tree_leaves``: the most
    root-to-leaf paths an open tree may have (None: no limit). Opt-in: a backend that declares
    nothing can do neither, so a request that needs them is refused before any work
    (:meth:`specdec.core.engine.Engine.check_config`) instead of failing mid-generation."""

    trees: bool = False
    hidden: bool = False
    max_tree_leaves: int | None = None


@dataclass
class TreeState:
    """An open token tree in a cache: the context's ``base`` positions, then one entry per node."""

    base: int
    parents: list[int] = field(default_factory=list)  # per node: its parent node, -1 = the context's last token
    depths: list[int] = field(default_factory=list)  # per node: 1 under the context's last token

    def add(self, parents: Sequence[int]) -> int:
        """Record new nodes under ``parents`` (each an earlier node or -1); returns the first new
        node's index."""
        first = len(self.parents)
        for i, parent in enumerate(parents):
            if not -1 <= parent < first + i:
                raise ValueError(f"tree node {first + i}: parent {parent} is not an earlier node")
            self.parents.append(int(parent))
            self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        return first

    def check_path(self, path: Sequence[int]) -> None:
        expect = -1
        for node in path:
            if not 0 <= node < len(self.parents) or self.parents[node] != expect:
                raise ValueError(f"{list(path)} is not a root-to-node path of the tree")
            expect = node


@dataclass(frozen=True)
class Snapshot:
    """A copy of a model's cache in host memory (:meth:`Model.snapshot`): the ``tokens`` it holds,
    the backend's ``state`` of them, its size in ``nbytes``, and the model it belongs to (``owner``:
    its ``id``; only that model restores it)."""

    tokens: tuple[int, ...]
    state: object
    nbytes: int
    owner: int


class Scores(NamedTuple):
    """One pass's output: float32 logits ``[n, V]`` and, when asked for, the final hidden states
    ``[n, H]`` (the LM head's input, after the final norm; else None)."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None


class Model(ABC):
    """A causal LM fed token ids, with one KV cache and the ids that cache holds.

    Public surface (what the rest of specdec may use): ``name``, ``backend``, ``variant``, ``quant``,
    ``device`` (where logits live), ``vocab_size`` (rows of the LM head), ``vocab_limit`` (rows
    returned: the tokenizer's table), ``max_length`` (context limit or None), ``capabilities``,
    ``tokens`` / ``linear_tokens`` (what the cache holds), ``tree``, ``forward_calls``; the
    methods :meth:`reset`, :meth:`truncate`, :meth:`snapshot`, :meth:`restore`, :meth:`forward`,
    :meth:`logits_for`, :meth:`score`, :meth:`tree_logits`, :meth:`extend_tree`, :meth:`score_tree`, :meth:`keep_path`,
    :meth:`head_logits`, :meth:`eos_ids`, :meth:`parameter_bytes`, :meth:`cache_bytes`,
    :meth:`close`. Each method has one return type: the ``*_logits``/``forward``/``logits_for``
    family returns logits, :meth:`score` and :meth:`score_tree` a :class:`Scores` (logits and,
    when asked, hidden states).
    """

    backend: str = "?"
    capabilities: Capabilities = Capabilities()
    #: the weight quantization the backend applied at load (``"none"``: the weights as stored)
    quant: str = "none"
    #: the verify widths the cost model times (None: every width 1..17, then 24 and 32,
    #: :data:`specdec.models.costmodel.WIDTHS`; a backend with smooth curves may declare fewer)
    calibration_widths: tuple[int, ...] | None = None

    def __init__(self, name: str, vocab_size: int, vocab_limit: int | None, max_length: int | None,
                 device: torch.device, variant: str):
        self.name = name
        self.vocab_size = int(vocab_size)
        self.vocab_limit = int(vocab_limit or vocab_size)
        self.max_length = max_length
        self.device = device
        self.variant = variant
        self.forward_calls = 0
        self.tokens: list[int] = []
        self.tree: TreeState | None = None

    # ------------------------------------------------------------- backend primitives
    @abstractmethod
    def _append(self, ids: Sequence[int], num_logits: int, hidden: bool):
        """Run ``ids`` on top of the cache (positions ``len(self.tokens)..``); return float32 logits
        ``[num_logits, vocab_limit]`` of the last positions, and with ``hidden`` the final hidden
        states ``[num_logits, H]`` as a second value (else None)."""

    @abstractmethod
    def _crop(self, length: int) -> None:
        """Drop every cache entry at position ``>= length`` (no open tree)."""

    @abstractmethod
    def _clear(self) -> None:
        """Empty the cache."""

    def _state_bytes(self) -> int | None:
        """Bytes a copy of the cache's first ``len(self.tokens)`` positions takes (no open tree);
        None: the backend cannot copy its cache (:meth:`snapshot` then returns None)."""
        return None

    def _save(self) -> object:
        """A copy of the cache's first ``len(self.tokens)`` positions in host memory (no open tree)."""
        raise NotImplementedError

    def _load(self, state: object) -> None:
        """Make the (empty) cache hold what :meth:`_save` copied."""
        raise NotImplementedError

    def _append_tree(self, linear: list[int], ids: Sequence[int], parents: Sequence[int], first: int, hidden: bool):
        """One pass over ``linear`` (continuing the sequence) and then the new tree nodes
        ``first..`` (already recorded in ``self.tree``); logits of the last linear position (when
        ``linear``) and of every new node."""
        raise SpecdecError(f"{self.name}: the {self.backend} backend cannot score token trees")

    def _keep(self, path: Sequence[int]) -> None:
        """Close the open tree keeping the context and the nodes of ``path`` (a checked root-to-node
        path) at positions ``base..``."""
        raise SpecdecError(f"{self.name}: the {self.backend} backend cannot score token trees")

    # ------------------------------------------------------------------ cache
    def reset(self) -> None:
        """Empty the cache."""
        self._clear()
        self.tokens = []
        self.tree = None

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` cached positions, dropping the rest. An open token tree
        (:meth:`tree_logits`) is dropped whole: only its linear prefix can be kept this way."""
        if self.tree is not None:
            length = min(length, self.tree.base)
            self._crop_tree(length)
            self.tree = None
        if len(self.tokens) > length:
            self._crop(length)
            del self.tokens[length:]

    def _crop_tree(self, length: int) -> None:
        """Drop an open tree and every position ``>= length`` (``length <= tree.base``)."""
        self._crop(length)
        del self.tokens[length:]

    def snapshot(self, limit: int | None = None) -> Snapshot | None:
        """A copy of what the cache holds (an open token tree is dropped first), for :meth:`restore`
        to put back after other text ran; None when the backend cannot copy its cache, or when the
        copy would take more than ``limit`` bytes (then nothing is copied)."""
        if self.tree is not None:
            self.truncate(self.tree.base)
        size = self._state_bytes()
        if size is None or (limit is not None and size > limit):
            return None
        return Snapshot(tuple(self.tokens), self._save(), int(size), id(self))

    def restore(self, snapshot: Snapshot) -> None:
        """Make the cache hold what :meth:`snapshot` copied (of this model), whatever it holds now."""
        if snapshot.owner != id(self):
            raise ValueError(f"{self.name}: a snapshot of another model's cache")
        self.reset()
        self._load(snapshot.state)
        self.tokens = list(snapshot.tokens)

    @property
    def linear_tokens(self) -> list[int]:
        """The cached ids that form one sequence (all of them, unless a token tree is open)."""
        return self.tokens if self.tree is None else self.tokens[: self.tree.base]

    # ---------------------------------------------------------------- forward
    def forward(self, ids: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        """Append ``ids`` to the cache; logits ``[num_logits, V]`` (float32) of the last positions."""
        return self._feed(ids, num_logits, hidden=False).logits

    def _feed(self, ids: Sequence[int], num_logits: int, hidden: bool) -> Scores:
        if not ids:
            raise ValueError("forward needs at least one token")
        if self.tree is not None:
            raise RuntimeError("forward appends to one sequence, but a token tree is open; keep_path or truncate first")
        if hidden and not self.capabilities.hidden:
            raise SpecdecError(f"{self.name}: the {self.backend} backend cannot return hidden states")
        if not 1 <= num_logits <= len(ids):
            raise ValueError(f"num_logits={num_logits} must be in 1..{len(ids)}")
        logits, h = self._append(list(ids), num_logits, hidden)
        self.forward_calls += 1
        self.tokens.extend(int(t) for t in ids)
        return Scores(logits, h if hidden else None)

    def logits_for(self, context: Sequence[int], num_logits: int = 1) -> torch.Tensor:
        """Logits for the last ``num_logits`` positions of ``context``, feeding only what the cache
        lacks. Rows are the distributions *after* each of those positions."""
        return self.score(context, num_logits).logits

    def score(self, context: Sequence[int], num_logits: int = 1, hidden: bool = False) -> Scores:
        """:meth:`logits_for`, and with ``hidden=True`` also the final hidden states
        ``[num_logits, H]`` (the LM head's input, after the final norm)."""
        if num_logits > len(context):
            raise ValueError("num_logits is larger than the context")
        keep = min(common_prefix(self.linear_tokens, context), len(context) - num_logits)
        self.truncate(keep)
        return self._feed(context[keep:], num_logits, hidden)

    # ------------------------------------------------------------------ trees
    def tree_logits(self, context: Sequence[int], ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Logits ``[1 + len(ids), V]`` of :meth:`score_tree`."""
        return self.score_tree(context, ids, parents).logits

    def score_tree(self, context: Sequence[int], ids: Sequence[int], parents: Sequence[int],
                   hidden: bool = False) -> Scores:
        """One forward pass over what the cache lacks of ``context`` and then a token tree hanging
        after it: node ``i`` is ``ids[i]`` under node ``parents[i]`` (``-1``: under the context's last
        token; a parent comes before its children). Each node attends to the context and its own
        ancestors at position ``len(context) - 1 + depth``.

        Returns :class:`Scores`: logits ``[1 + len(ids), V]``, the row after the context, then the
        row after each node (and the hidden states ``[1 + len(ids), H]`` with ``hidden=True``). The
        tree stays open:
        :meth:`extend_tree` adds nodes, :meth:`keep_path` keeps one root-to-node path and closes it,
        and :meth:`truncate` (or :meth:`logits_for`) drops it whole.
        """
        self._check_tree(hidden)
        keep = min(common_prefix(self.linear_tokens, context), len(context) - 1)
        self.truncate(keep)
        linear = list(context[keep:])
        self.tree = TreeState(base=len(context))
        return self._grow(linear, ids, parents, hidden)

    def extend_tree(self, ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Add nodes to the open tree (``parents`` index all nodes so far, in the order they were
        added; ``-1`` is the context's last token): logits ``[len(ids), V]``, one row per new node."""
        if self.tree is None:
            raise RuntimeError("extend_tree needs an open tree (call tree_logits first)")
        if not ids:
            raise ValueError("extend_tree needs at least one node")
        self._check_tree(False)
        return self._grow([], ids, parents, False).logits

    def _check_tree(self, hidden: bool) -> None:
        if not self.capabilities.trees:
            raise SpecdecError(f"{self.name}: the {self.backend} backend cannot score token trees")
        if hidden and not self.capabilities.hidden:
            raise SpecdecError(f"{self.name}: the {self.backend} backend cannot return hidden states")

    def _grow(self, linear: list[int], ids: Sequence[int], parents: Sequence[int], hidden: bool) -> Scores:
        tree = self.tree
        assert tree is not None
        first = tree.add(parents)
        logits, h = self._append_tree(linear, list(ids), list(parents), first, hidden)
        self.forward_calls += 1
        self.tokens.extend([*linear, *(int(t) for t in ids)])
        return Scores(logits, h if hidden else None)

    def keep_path(self, path: Sequence[int]) -> None:
        """Close the open tree keeping only the nodes ``path`` (a root-to-node path, in order) after
        the context: the cache then equals a prefill of the context followed by the path's tokens."""
        tree = self.tree
        if tree is None:
            raise RuntimeError("keep_path needs an open tree")
        tree.check_path(path)
        self._keep(list(path))
        self.tree = None
        self.tokens = [*self.tokens[: tree.base], *(self.tokens[tree.base + n] for n in path)]

    # ------------------------------------------------------------ the rest
    def draft_block(self, first: torch.Tensor, k: int, choose, key, sampled: bool,
                    generator: torch.Generator | None):
        """The ``k`` draft steps after ``first`` (logits ``[V]``) run on the device in one go, each
        token chosen by ``choose`` (:func:`specdec.core.sampling.device_chooser`; ``key`` names it,
        ``sampled``: it reads uniform noise drawn by ``generator``) and fed to the next step: the
        first ``k - 1`` tokens are appended, as ``forward`` would. Returns ``(tokens, p, p1, raw
        [k, V], q [k, V] or None)`` (lists read back in one copy), or None where a model has no such
        loop (the drafter steps from the host)."""
        return None

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head applied to hidden states ``[..., H]`` -> float32 logits ``[..., V]``."""
        raise SpecdecError(f"{self.name}: the {self.backend} backend cannot apply its LM head to hidden states")

    def eos_ids(self) -> list[int]:
        """The end-of-generation ids the model itself declares (the tokenizer may add its own)."""
        return []

    @abstractmethod
    def parameter_bytes(self) -> int:
        """Bytes the weights take as held."""

    @abstractmethod
    def cache_bytes(self) -> int:
        """Bytes the KV cache takes now."""

    def close(self) -> None:
        """Release what the model holds beyond its weights (its cache)."""
        self.reset()

    def fingerprint_extra(self) -> dict:
        """What a timing of this model depends on beyond the machine, torch and the weights (the
        cost model's cache key, :func:`specdec.models.costmodel.fingerprint`): e.g. a library's version and
        thread count. None beyond torch's by default."""
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.backend} {self.variant}>"
