"""Model wrappers and loading: Hugging Face folders, hub ids, GGUF files and the bundled pair.

:class:`CausalLM` wraps a transformers causal LM with one KV cache and the list of token ids that
cache holds, so rolling back is cropping to a prefix. Architecture differences stay here: the
engine only calls :meth:`CausalLM.logits_for` and :meth:`CausalLM.truncate`.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from .errors import SpecdecError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu. ``cuda`` without a GPU is a user error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecdecError("device 'cuda' was asked for, but torch sees no CUDA GPU; use --device cpu")
    if device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise SpecdecError(f"unknown device {device!r}; choose cpu, cuda, cuda:N or auto")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 (float16 on a GPU without bf16 support)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return torch.float16
        return torch.bfloat16
    if dtype not in DTYPES:
        raise SpecdecError(f"unknown dtype {dtype!r}; choose one of: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def tensor_bytes(tensors) -> int:
    """Bytes of distinct tensors (shared storage counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        try:
            key = ("dense", t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # oneDNN (mkldnn) tensors have no storage
            key = ("id", id(t))
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def output_rows(head: torch.nn.Module) -> int:
    """Rows of an LM head (plain, int8-quantized or packed linear)."""
    rows = getattr(head, "out_features", None)
    return int(rows) if rows is not None else int(head.weight.shape[0])


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


@dataclass
class TreeState:
    """An open token tree in a cache: the context's ``base`` positions, then one entry per node."""

    base: int
    parents: list[int] = field(default_factory=list)  # per node: its parent node, -1 = the context's last token
    depths: list[int] = field(default_factory=list)  # per node: 1 under the context's last token


def gather_cache(cache, index: torch.Tensor) -> None:
    """Keep the cache positions ``index`` (ascending) in every layer, in place. Only plain
    (full-attention) layers can be gathered; a sliding-window or other layer is a user error."""
    from transformers.cache_utils import DynamicLayer

    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise SpecdecError(
                f"token trees need a plain key/value cache, but this model's cache has a {type(layer).__name__}; "
                "use a chain drafter (model, pld, model+pld)")
        if layer.is_initialized and layer.keys.numel():
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)


class CausalLM:
    """A causal LM fed token ids, with one KV cache and the ids that cache holds.

    The cache only ever holds a prefix of some token sequence, and a key/value entry depends on its
    prefix alone; so :meth:`logits_for` reuses the longest common prefix of what is cached and what
    is asked for, and rolling back after a rejection is a crop. That makes rollback correct by
    construction for any accept pattern.
    """

    def __init__(self, model: torch.nn.Module, name: str = "model", vocab_limit: int | None = None):
        self.model = model.eval()
        self.name = name
        self.config = model.config
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        head = model.get_output_embeddings()
        if head is None:
            raise SpecdecError(f"{name}: the model has no output embeddings (LM head); is it a causal LM?")
        self.head = head
        self.vocab_size = output_rows(head)
        self.vocab_limit = vocab_limit or self.vocab_size
        self.max_length = int(getattr(self.config, "max_position_embeddings", 0) or 0) or None
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._captured: torch.Tensor | None = None
        self._hook = self.head.register_forward_hook(self._capture_head_input)
        self.forward_calls = 0
        self.reset()

    def close(self) -> None:
        """Detach from the model (its hook, its cache): the model can be wrapped again."""
        self._hook.remove()
        self.reset()

    def _capture_head_input(self, module, inputs, output) -> None:
        self._captured = inputs[0]

    # ------------------------------------------------------------------ cache
    def reset(self) -> None:
        """Empty the cache."""
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.config)
        self.tokens: list[int] = []
        self.tree: TreeState | None = None

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` cached positions, dropping the rest. An open token tree
        (:meth:`tree_logits`) is dropped whole: only its linear prefix can be kept this way."""
        if self.tree is not None:
            length = min(length, self.tree.base)
            self.tree = None
        extra = len(self.tokens) - length
        if extra > 0:
            self.cache.crop(-extra)
            del self.tokens[length:]

    @property
    def linear_tokens(self) -> list[int]:
        """The cached ids that form one sequence (all of them, unless a token tree is open)."""
        return self.tokens if self.tree is None else self.tokens[: self.tree.base]

    # ---------------------------------------------------------------- forward
    @torch.inference_mode()
    def forward(self, ids: Sequence[int], num_logits: int = 1, hidden: bool = False):
        """Append ``ids`` to the cache; logits ``[num_logits, V]`` (float32) of the last positions.

        With ``hidden=True`` also returns the final hidden states ``[num_logits, H]`` (the LM head's
        input: after the final norm), read by a hook, so it costs nothing extra.
        """
        if not ids:
            raise ValueError("forward needs at least one token")
        if self.tree is not None:
            raise RuntimeError("forward appends to one sequence, but a token tree is open; keep_path or truncate first")
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        kwargs = {"logits_to_keep": num_logits} if self._keeps_logits else {}
        out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, **kwargs)
        self.forward_calls += 1
        self.cache = out.past_key_values if out.past_key_values is not None else self.cache
        self.tokens.extend(int(t) for t in ids)
        logits = out.logits[0, -num_logits:, : self.vocab_limit].float()  # [num_logits, V]
        if not hidden:
            return logits
        h = self._captured[0, -num_logits:]  # [num_logits, H]
        return logits, h

    def logits_for(self, context: Sequence[int], num_logits: int = 1, hidden: bool = False):
        """Logits for the last ``num_logits`` positions of ``context``, feeding only what the cache
        lacks. Rows are the distributions *after* each of those positions."""
        if num_logits > len(context):
            raise ValueError("num_logits is larger than the context")
        keep = min(common_prefix(self.linear_tokens, context), len(context) - num_logits)
        self.truncate(keep)
        return self.forward(context[keep:], num_logits, hidden)

    # ------------------------------------------------------------------ trees
    def tree_logits(self, context: Sequence[int], ids: Sequence[int], parents: Sequence[int], hidden: bool = False):
        """One forward pass over what the cache lacks of ``context`` and then a token tree hanging
        after it: node ``i`` is ``ids[i]`` under node ``parents[i]`` (``-1``: under the context's last
        token; a parent comes before its children). Each node attends to the context and its own
        ancestors (a 4D tree attention mask) at position ``len(context) - 1 + depth``.

        Returns logits ``[1 + len(ids), V]``: the row after the context, then the row after each
        node (and the hidden states ``[1 + len(ids), H]`` with ``hidden=True``). The tree stays open:
        :meth:`extend_tree` adds nodes, :meth:`keep_path` keeps one root-to-node path and closes it,
        and :meth:`truncate` (or :meth:`logits_for`) drops it whole.
        """
        keep = min(common_prefix(self.linear_tokens, context), len(context) - 1)
        self.truncate(keep)
        linear = list(context[keep:])
        self.tree = TreeState(base=len(context))
        return self._forward_tree(linear, ids, parents, hidden)

    def extend_tree(self, ids: Sequence[int], parents: Sequence[int], hidden: bool = False):
        """Add nodes to the open tree (``parents`` index all nodes so far, in the order they were
        added; ``-1`` is the context's last token): logits ``[len(ids), V]``, one row per new node."""
        if self.tree is None:
            raise RuntimeError("extend_tree needs an open tree (call tree_logits first)")
        if not ids:
            raise ValueError("extend_tree needs at least one node")
        return self._forward_tree([], ids, parents, hidden)

    @torch.inference_mode()
    def _forward_tree(self, linear: list[int], ids: Sequence[int], parents: Sequence[int], hidden: bool):
        tree = self.tree
        assert tree is not None
        past = len(self.tokens)
        first = len(tree.parents)  # index of the first new node
        for i, parent in enumerate(parents):
            if not -1 <= parent < first + i:
                raise ValueError(f"tree node {first + i}: parent {parent} is not an earlier node")
            tree.parents.append(int(parent))
            tree.depths.append(1 if parent < 0 else tree.depths[parent] + 1)
        q = len(linear) + len(ids)
        allowed = torch.zeros(q, past + q, dtype=torch.bool)
        for r in range(len(linear)):  # the linear part: causal
            allowed[r, : past + r + 1] = True
        allowed[len(linear):, : tree.base] = True  # every node sees the whole context
        for j in range(len(ids)):
            node = first + j
            while node >= 0:  # itself and its ancestors
                allowed[len(linear) + j, tree.base + node] = True
                node = tree.parents[node]
        positions = [past + r for r in range(len(linear))] + [tree.base - 1 + tree.depths[first + j] for j in range(len(ids))]
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        input_ids = torch.tensor([[*linear, *ids]], dtype=torch.long, device=self.device)
        rows = len(ids) + (1 if linear else 0)
        kwargs = {"logits_to_keep": rows} if self._keeps_logits else {}
        out = self.model(
            input_ids=input_ids, past_key_values=self.cache, use_cache=True,
            attention_mask=mask[None, None].to(self.device), position_ids=torch.tensor([positions], device=self.device),
            **kwargs,
        )
        self.forward_calls += 1
        self.cache = out.past_key_values if out.past_key_values is not None else self.cache
        self.tokens.extend([*linear, *(int(t) for t in ids)])
        logits = out.logits[0, -rows:, : self.vocab_limit].float()
        if not hidden:
            return logits
        return logits, self._captured[0, -rows:]

    def keep_path(self, path: Sequence[int]) -> None:
        """Close the open tree keeping only the nodes ``path`` (a root-to-node path, in order) after
        the context: their key/value entries are gathered, so the cache equals a prefill of the
        context followed by the path's tokens."""
        tree = self.tree
        if tree is None:
            raise RuntimeError("keep_path needs an open tree")
        expect = -1
        for node in path:
            if not 0 <= node < len(tree.parents) or tree.parents[node] != expect:
                raise ValueError(f"{list(path)} is not a root-to-node path of the tree")
            expect = node
        self.tree = None
        index = [*range(tree.base), *(tree.base + n for n in path)]
        tokens = [*self.tokens[: tree.base], *(self.tokens[tree.base + n] for n in path)]
        if len(index) < len(self.tokens):
            gather_cache(self.cache, torch.tensor(index, device=self.device))
        self.tokens = tokens

    @torch.inference_mode()
    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head applied to hidden states ``[..., H]`` -> float32 logits ``[..., V]``."""
        return self.head(hidden)[..., : self.vocab_limit].float()

    def parameter_bytes(self) -> int:
        """Bytes of the weights as held: parameters and buffers (int8 and packed layers keep their
        weights in buffers), each storage counted once (tied embeddings share one)."""
        return tensor_bytes([*self.model.parameters(), *self.model.buffers()])

    def cache_bytes(self) -> int:
        total = 0
        for layer in getattr(self.cache, "layers", []):
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total


# -------------------------------------------------------------------------- loading
@dataclass
class Loaded:
    """A loaded model and its tokenizer, with where they came from."""

    model: torch.nn.Module
    tokenizer: object
    source: str
    path: Path | None


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def locate(source: str) -> tuple[str, Path | None]:
    """Classify a model source: ``('bundled', None)``, ``('folder', path)``, ``('gguf', path)`` or
    ``('hub', None)``. A path that does not exist is a user error."""
    from .bundled import BUNDLED

    if not isinstance(source, str) or not source.strip():
        raise SpecdecError("model source is empty; give a bundled name, a folder, a .gguf file or a hub id")
    if source in BUNDLED:
        return "bundled", None
    path = Path(source).expanduser()
    if path.exists():
        if path.is_dir():
            if not (path / "config.json").exists():
                raise SpecdecError(f"{source}: folder has no config.json; is it a Hugging Face model folder?")
            return "folder", path
        if path.suffix == ".gguf":
            return "gguf", path
        raise SpecdecError(f"{source}: not a model folder or a .gguf file")
    if source.startswith((".", "/", "~")) or source.endswith(".gguf") or not _HUB_ID.match(source):
        names = ", ".join(BUNDLED)
        raise SpecdecError(
            f"model not found: {source!r} is neither an existing path, a hub id (org/name), "
            f"nor a bundled model ({names})"
        )
    return "hub", None


def resolve(source: str, progress: bool = True) -> tuple[str, str, Path | None]:
    """``(kind, ref, path)``: what ``from_pretrained`` should read for ``source`` (bundled models and
    GGUF files are prepared into their cached folders first). ``kind`` is ``folder`` or ``hub``."""
    kind, path = locate(source)
    if kind == "bundled":
        from .bundled import ensure_prepared

        path = ensure_prepared(source, progress=progress)
        kind = "folder"
    if kind == "gguf":
        from .convert import ensure_converted

        path = ensure_converted(path, progress=progress)
        kind = "folder"
    return kind, (str(path) if path is not None else source), path


def load_config(source: str, progress: bool = True):
    """The model's transformers config (no weights), e.g. to key a cost table before loading."""
    kind, ref, _ = resolve(source, progress)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(ref)
    except OSError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecdecError(f"could not load the config of model {source!r} ({first_line})") from exc


def load(source: str, dtype: torch.dtype, device: torch.device, progress: bool = True) -> Loaded:
    """Load a causal LM and its tokenizer from a bundled name, folder, .gguf file or hub id."""
    kind, ref, path = resolve(source, progress)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(ref)
        model = AutoModelForCausalLM.from_pretrained(ref, dtype=dtype)
    except OSError as exc:
        where = "the hub: no such local path, and the hub did not answer or has no such id" if kind == "hub" else ref
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecdecError(f"could not load model {source!r} from {where} ({first_line})") from exc
    finally:
        if not progress:
            hf_logging.enable_progress_bar()
    model.to(device)
    return Loaded(model=model, tokenizer=tokenizer, source=source, path=path)


def check_same_vocabulary(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Refuse a draft whose token table differs from the target's: its ids would mean other text."""
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv == dv:
        return
    differing = sorted(set(tv.items()) ^ set(dv.items()), key=lambda kv: kv[1])
    examples = ", ".join(f"{tok!r}->{idx}" for tok, idx in differing[:3])
    raise SpecdecError(
        f"draft {draft_name!r} and target {target_name!r} do not share a tokenizer: vocabularies of "
        f"{len(dv)} and {len(tv)} tokens differ in {len(differing)} entries (e.g. {examples}). "
        "Speculative decoding needs the same token table; pick a draft from the target's family, "
        "or use --drafter pld, which needs no draft model."
    )
