"""The transformers backend: a Hugging Face causal LM in eager PyTorch (CPU or GPU).

:class:`HFModel` implements :class:`specdec.models.backends.base.Model` over a transformers model and its
``DynamicCache``: rollback crops the cache, token trees run with a 4D attention mask and keep a path
by gathering its cache entries, hidden states come from a hook on the LM head's input (free).
Architecture differences stay here, in :mod:`specdec.models.backends.transformers`.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Sequence, cast

import torch

from ....errors import SpecdecError
from ..base import Capabilities, Model
from .quant import is_quantized

if TYPE_CHECKING:
    from transformers import PreTrainedModel

BACKEND = "transformers"


def variant_name(dtype: torch.dtype, quant: str) -> str:
    """A transformers model's variant as the cost model names it: ``bfloat16``, ``bfloat16+int8``."""
    name = str(dtype).replace("torch.", "")
    return name if quant == "none" else f"{name}+{quant}"


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
    return int(rows) if rows is not None else int(cast(torch.Tensor, head.weight).shape[0])


def tree_attention(tree, past: int, n_linear: int, n_new: int, first: int) -> tuple[torch.Tensor, list[int]]:
    """What a pass over ``n_linear`` tokens continuing the sequence and then the tree's nodes
    ``first..first + n_new - 1`` may attend to, and their positions: ``allowed`` ``[q, past + q]``
    (bool: the linear part causal; a node sees the context and itself and its ancestors, at cache
    index ``tree.base + node``) and each row's position (a node's: ``tree.base - 1 + depth``)."""
    q = n_linear + n_new
    allowed = torch.zeros(q, past + q, dtype=torch.bool)
    for r in range(n_linear):  # the linear part: causal
        allowed[r, : past + r + 1] = True
    allowed[n_linear:, : tree.base] = True  # every node sees the whole context
    for j in range(n_new):
        node = first + j
        while node >= 0:  # itself and its ancestors
            allowed[n_linear + j, tree.base + node] = True
            node = tree.parents[node]
    positions = [past + r for r in range(n_linear)] + [tree.base - 1 + tree.depths[first + j] for j in range(n_new)]
    return allowed, positions


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention pattern as the additive mask attention reads: 0 where allowed, the dtype's
    lowest value elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, torch.finfo(dtype).min)


class HFModel(Model):
    """A transformers causal LM with one ``DynamicCache`` (see :class:`~specdec.models.backends.base.Model`)."""

    backend = BACKEND
    capabilities = Capabilities(trees=True, hidden=True)
    #: the verify widths its cost table times: PyTorch's curves are smooth, so every width up to 9, then
    #: coarser (k=auto picks K only where K + 1 was timed; wide eager passes cost seconds on a CPU)
    calibration_widths = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32)

    def __init__(self, model: PreTrainedModel, name: str = "model", vocab_limit: int | None = None):
        self.model = model.eval()
        self.config = model.config
        head = model.get_output_embeddings()
        if head is None:
            raise SpecdecError(f"{name}: the model has no output embeddings (LM head); is it a causal LM?")
        self.head = head
        param = next(model.parameters())
        self.dtype = param.dtype
        self.quant = "int8" if is_quantized(model) else "none"
        variant = variant_name(self.dtype, self.quant)
        max_length = int(getattr(self.config, "max_position_embeddings", 0) or 0) or None
        super().__init__(name, output_rows(head), vocab_limit, max_length, param.device, variant)
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._captured: torch.Tensor | None = None
        self._hook = self.head.register_forward_hook(self._capture_head_input)
        self.reset()

    def close(self) -> None:
        """Detach from the model (its hook, its cache): the model can be wrapped again."""
        self._hook.remove()
        self.reset()

    def _capture_head_input(self, module, inputs, output) -> None:
        self._captured = inputs[0]

    def _hidden(self, rows: int) -> torch.Tensor:
        """The last pass's last ``rows`` LM-head inputs (the hook's capture)."""
        assert self._captured is not None, "a pass ran through the head"
        return self._captured[0, -rows:]

    # ------------------------------------------------------------------ cache
    def _clear(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.config)

    def _crop(self, length: int) -> None:
        extra = len(self.tokens) - length
        if extra > 0:
            self.cache.crop(-extra)

    def _held_layers(self) -> list | None:
        """The cache's layers, when each is a plain key/value layer (else None: a sliding-window or
        static layer is not copied aside)."""
        from transformers.cache_utils import DynamicLayer

        layers = list(getattr(self.cache, "layers", None) or [])
        return layers if all(type(layer) is DynamicLayer for layer in layers) else None

    def _state_bytes(self) -> int | None:
        layers = self._held_layers()
        if layers is None:
            return None
        n = len(self.tokens)
        return sum(t[..., :n, :].numel() * t.element_size() for layer in layers if layer.is_initialized
                   for t in (layer.keys, layer.values))

    def _save(self) -> list:
        n = len(self.tokens)
        layers = self._held_layers()
        assert layers is not None  # saved only where _state_bytes measured them
        return [(layer.keys[..., :n, :].to("cpu", copy=True), layer.values[..., :n, :].to("cpu", copy=True))
                if layer.is_initialized else None for layer in layers]

    def _load(self, state: object) -> None:
        assert isinstance(state, list)  # what _save made
        for index, held in enumerate(state):
            if held is not None:
                self.cache.update(held[0].to(self.device), held[1].to(self.device), index)

    # ---------------------------------------------------------------- forward
    @torch.inference_mode()
    def _append(self, ids: Sequence[int], num_logits: int, hidden: bool):
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        kwargs = {"logits_to_keep": num_logits} if self._keeps_logits else {}
        out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True, **kwargs)
        self.cache = out.past_key_values if out.past_key_values is not None else self.cache
        logits = out.logits[0, -num_logits:, : self.vocab_limit].float()  # [num_logits, V]
        return logits, (self._hidden(num_logits) if hidden else None)

    @torch.inference_mode()
    def _append_tree(self, linear: list[int], ids: Sequence[int], parents: Sequence[int], first: int, hidden: bool):
        tree = self.tree
        assert tree is not None
        past = len(self.tokens)
        allowed, positions = tree_attention(tree, past, len(linear), len(ids), first)
        mask = additive_mask(allowed, self.dtype)
        input_ids = torch.tensor([[*linear, *ids]], dtype=torch.long, device=self.device)
        rows = len(ids) + (1 if linear else 0)
        kwargs = {"logits_to_keep": rows} if self._keeps_logits else {}
        out = self.model(
            input_ids=input_ids, past_key_values=self.cache, use_cache=True,
            attention_mask=mask[None, None].to(self.device), position_ids=torch.tensor([positions], device=self.device),
            **kwargs,
        )
        self.cache = out.past_key_values if out.past_key_values is not None else self.cache
        logits = out.logits[0, -rows:, : self.vocab_limit].float()
        return logits, (self._hidden(rows) if hidden else None)

    def _keep(self, path: Sequence[int]) -> None:
        tree = self.tree
        assert tree is not None
        index = [*range(tree.base), *(tree.base + n for n in path)]
        if len(index) < len(self.tokens):
            gather_cache(self.cache, torch.tensor(index, device=self.device))

    @torch.inference_mode()
    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head applied to hidden states ``[..., H]`` -> float32 logits ``[..., V]``."""
        return self.head(hidden)[..., : self.vocab_limit].float()

    def eos_ids(self) -> list[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return sorted(ids)

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
