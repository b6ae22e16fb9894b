"""The transformers backend's static KV cache: preallocated, written at named slots, rolled back by
moving an index.

:class:`SlotCache` is transformers' ``StaticCache`` whose layers write each pass's keys and values
at the cache slots the model names for that pass (a device tensor, :class:`Slots`), not at a
running counter. The length the cache holds is then only :attr:`Model.tokens`' length: truncating
is an index move (nothing written, nothing copied), and entries past the length are stale until
overwritten, hidden from every pass by its 4D attention mask (a query at position ``p`` sees slots
``<= p``). Keeping a token tree's path moves only that path's entries. Capacity grows in powers of
two (a copy of the held entries, rare), so a pass attends over at most twice what the cache holds.

:class:`StaticHFModel` runs an :class:`~specdec.models.backends.transformers.model.HFModel` on it; with
:class:`~specdec.models.backends.transformers.graphs.WidthGraphs` its chain passes of up to a few tokens
run as captured CUDA graphs (:mod:`specdec.models.backends.transformers.graphs`), the same step function
either way.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .draftloop import DraftLoop
from .fused import FusedDecoder, compiled, fused_refusal
from .graphs import WidthGraphs
from .model import HFModel, additive_mask, tree_attention

#: the smallest capacity allocated (tokens); then powers of two
MIN_CAPACITY = 256


def capacity_for(needed: int, limit: int | None, current: int = 0) -> int:
    """The capacity to hold ``needed`` tokens: ``current`` when it does, else the next power of
    two from :data:`MIN_CAPACITY` (at most ``limit``, the model's context, unless ``needed`` is past it)."""
    if needed <= current:
        return current
    cap = MIN_CAPACITY
    while cap < needed:
        cap *= 2
    return max(needed, min(cap, limit)) if limit else cap


def static_fingerprint(graph_width: int, step: str = "modules") -> dict:
    """What the static cache (and passes of up to ``graph_width`` tokens as graphs; 0: none; its
    step ``modules``, ``fused`` or ``fused+compiled``) adds to a cost table's fingerprint: its
    timings are not the dynamic cache's."""
    return {"kv_cache": "static", **({"graphs": graph_width} if graph_width else {}),
            **({"step": step} if step != "modules" else {})}


class Slots:
    """Where the current pass writes: ``index``, a device tensor of cache slots, one per input
    token, shared by every layer of a :class:`SlotCache` (a captured graph reads it in place); and
    ``length``, what the cache holds (``get_seq_length``)."""

    def __init__(self):
        self.index: torch.Tensor | None = None
        self.length = 0


def static_refusal(config) -> str | None:
    """Why a model with this config cannot run on a :class:`SlotCache` (None: it can): every layer
    must be a plain full-attention one (a sliding window keeps a rolling buffer, not slots)."""
    try:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        layers = StaticCache(config=config, max_cache_len=1).layers  # allocates nothing until a pass
    except Exception as exc:  # noqa: BLE001 - any model transformers' static cache cannot take
        return f"transformers' StaticCache cannot hold this model ({type(exc).__name__}: {exc})"
    other = sorted({type(layer).__name__ for layer in layers if type(layer) is not StaticLayer})
    return f"this model's cache has {', '.join(other)} layers (the static cache needs full attention)" if other else None


def slot_cache(config, capacity: int, slots: Slots):
    """A :class:`SlotCache` (transformers' ``StaticCache`` with slot-indexed layers) of ``capacity`` tokens."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    class SlotLayer(StaticLayer):
        """A static layer that writes a pass's keys and values at ``slots.index``."""

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                allocate(self, key_states, value_states)
            self.keys.index_copy_(2, slots.index, key_states)
            self.values.index_copy_(2, slots.index, value_states)
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return slots.length

    cache = StaticCache(config=config, max_cache_len=capacity)
    cache.layers = [SlotLayer(max_cache_len=capacity) for _ in cache.layers]
    return cache


def allocate(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Preallocate a static layer's tensors for ``layer.max_cache_len`` tokens, shaped after a pass's."""
    batch, heads = keys.shape[:2]
    layer.dtype, layer.device = keys.dtype, keys.device
    layer.keys = torch.zeros((batch, heads, layer.max_cache_len, keys.shape[-1]), dtype=keys.dtype, device=keys.device)
    layer.values = torch.zeros((batch, heads, layer.max_cache_len, values.shape[-1]), dtype=values.dtype,
                               device=values.device)
    layer.is_initialized = True


def allocate_empty(layer, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """Preallocate a static layer's keys and values of ``shape`` before any pass (the fused step
    writes into them directly)."""
    layer.dtype, layer.device = dtype, device
    layer.keys = torch.zeros(shape, dtype=dtype, device=device)
    layer.values = torch.zeros(shape, dtype=dtype, device=device)
    layer.is_initialized = True


def chain_mask(slots: torch.Tensor, kv_index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[1, 1, w, capacity]``: a chain pass whose token ``r`` sits at slot (= position)
    ``slots[r]`` sees every slot up to its own; built on the device from the slots (no host work)."""
    return additive_mask(kv_index[None, :] <= slots[:, None], dtype)[None, None]


class StaticHFModel(HFModel):
    """An :class:`HFModel` on a static KV cache (:class:`SlotCache`): truncating moves an index,
    keeping a tree's path moves that path's entries. Every chain pass runs :meth:`step` on a
    ``[2, w]`` device tensor (token ids; positions, which are also the slots written); with
    ``graphs`` (a :class:`WidthGraphs` factory: ``graphs(step, device)``) the passes it takes run
    as captured graphs, the rest (a prefill, a token tree) eagerly on the same cache."""

    def __init__(self, model: torch.nn.Module, name: str = "model", vocab_limit: int | None = None,
                 graphs: Callable[..., WidthGraphs] | None = None, fused: bool = True, compile_step: bool = False,
                 draft_loop: bool = True):
        self.slots = Slots()
        self.capacity = 0
        self._kv_index: torch.Tensor | None = None
        self._caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        super().__init__(model, name, vocab_limit)
        #: why the fused step is off for this model (None: it runs every pass)
        self.fused_refusal = fused_refusal(model) if fused else "fused=False"
        self.fused = FusedDecoder(model) if self.fused_refusal is None else None
        self._fused_step = compiled(self.fused.__call__) if self.fused is not None and compile_step else self.fused
        self.step_kind = "modules" if self.fused is None else "fused+compiled" if compile_step else "fused"
        self.graphs = graphs(self.step, self.device) if graphs is not None else None
        #: the draft's K steps as one captured loop (with the graphs' capture), or None
        self.loop = DraftLoop(self.step, self.device, self.vocab_limit, self.graphs.capture) \
            if self.graphs is not None and draft_loop else None

    # ------------------------------------------------------------------ cache
    def _clear(self) -> None:
        if self.capacity == 0:  # allocated by the first pass, kept across generations
            self.cache = None
        self.slots.length = 0

    def _crop(self, length: int) -> None:
        """An index move: the entries past ``length`` stay, stale, until a pass overwrites them."""
        self.slots.length = length

    def _state_bytes(self) -> None:
        """A static cache is not copied aside (:meth:`~specdec.models.backends.base.Model.snapshot`
        returns None): another caller's request empties it, as before."""
        return None

    def _reserve(self, needed: int) -> None:
        """Room for ``needed`` tokens: a larger cache (the held entries copied over, every captured
        graph dropped: they read the old one) when the current one is too small."""
        capacity = capacity_for(needed, self.max_length, self.capacity)
        if capacity == self.capacity:
            return
        old, held = self.cache, len(self.tokens)
        self.cache = slot_cache(self.config, capacity, self.slots)
        if old is not None and held:
            for new_layer, old_layer in zip(self.cache.layers, old.layers):
                if old_layer.is_initialized:
                    allocate(new_layer, old_layer.keys, old_layer.values)
                    new_layer.keys[:, :, :held] = old_layer.keys[:, :, :held]
                    new_layer.values[:, :, :held] = old_layer.values[:, :, :held]
        if self.fused is not None:
            shape = self.fused.cache_shape(capacity)
            for layer in self.cache.layers:
                if not layer.is_initialized:
                    allocate_empty(layer, shape, self.dtype, self.device)
            self._caches = [(layer.keys, layer.values) for layer in self.cache.layers]
        self.capacity = capacity
        self._kv_index = torch.arange(capacity, device=self.device)
        self._drop_graphs()

    def _drop_graphs(self) -> None:
        for graphs in (self.graphs, self.loop):
            if graphs is not None:
                graphs.clear()

    def close(self) -> None:
        super().close()
        self.cache, self.capacity, self._kv_index, self._caches = None, 0, None, []
        self._drop_graphs()

    # ---------------------------------------------------------------- forward
    def step(self, inputs: torch.Tensor, keep: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One chain pass over ``inputs`` ``[2, w]`` (ids; positions = slots), all on the device:
        logits ``[keep or w, V]`` of the last positions and the LM head's input ``[w, H]``. What a
        captured graph records."""
        self.slots.index = inputs[1]
        assert self._kv_index is not None, "a pass runs on an allocated cache"
        if self._fused_step is not None:
            allowed = self._kv_index[None, :] <= inputs[1][:, None]
            return self._fused_step(inputs[0:1], inputs[1:2], inputs[1], allowed, self._caches, keep or inputs.shape[1])
        kwargs = {"logits_to_keep": keep or inputs.shape[1]} if self._keeps_logits else {}
        out = self.model(input_ids=inputs[0:1], position_ids=inputs[1:2], past_key_values=self.cache, use_cache=True,
                         attention_mask=chain_mask(inputs[1], self._kv_index, self.dtype), **kwargs)
        assert self._captured is not None, "a pass ran through the head"
        return out.logits[0], self._captured[0]

    @torch.inference_mode()
    def draft_block(self, first: torch.Tensor, k: int, choose, key, sampled: bool,
                    generator: torch.Generator | None):
        """The base class's draft loop, captured (:class:`~.draftloop.DraftLoop`); None without graphs
        or inside a tree."""
        if self.loop is None or self.tree is not None or k < 1:
            return None
        past = len(self.tokens)
        self._reserve(past + k)
        read, raw, q = self.loop.run(k, choose, key, sampled, first, past, generator)
        values = read.tolist()  # the round's one host read
        tokens = [int(v[0]) for v in values]
        self.slots.length = past + k - 1
        self.tokens.extend(tokens[: k - 1])
        return (tokens, [v[1] for v in values], [v[2] for v in values], raw.clone(),
                q.clone() if sampled else None)

    def _host(self, rows: list[list[int]]) -> torch.Tensor:
        """Host ids as a CPU tensor, pinned for an asynchronous copy to a GPU (no wait on the device)."""
        return torch.tensor(rows, dtype=torch.long, pin_memory=self.device.type == "cuda")

    @torch.inference_mode()
    def _append(self, ids: Sequence[int], num_logits: int, hidden: bool):
        past, width = len(self.tokens), len(ids)
        self._reserve(past + width)
        host = self._host([list(ids), list(range(past, past + width))])
        if self.graphs is not None and self.graphs.takes(width):
            logits, states = self.graphs.run(host)
        else:
            logits, states = self.step(host.to(self.device, non_blocking=True), num_logits)
        self.slots.length = past + width
        # copies: a graph's outputs are overwritten by its next replay
        return (logits[-num_logits:, : self.vocab_limit].to(torch.float32, copy=True),
                states[-num_logits:].clone() if hidden else None)

    @torch.inference_mode()
    def _append_tree(self, linear: list[int], ids: Sequence[int], parents: Sequence[int], first: int, hidden: bool):
        tree = self.tree
        assert tree is not None
        past, q = len(self.tokens), len(linear) + len(ids)
        self._reserve(past + q)
        allowed, positions = tree_attention(tree, past, len(linear), len(ids), first)
        padded = torch.zeros(q, self.capacity, dtype=torch.bool)
        padded[:, : past + q] = allowed
        host = self._host([[*linear, *ids], positions, list(range(past, past + q))]).to(self.device, non_blocking=True)
        self.slots.index = host[2]
        rows = len(ids) + (1 if linear else 0)
        if self.fused is not None:
            logits, states = self.fused(host[0:1], host[1:2], host[2], padded.to(self.device, non_blocking=True),
                                        self._caches, rows)
            self.slots.length = past + q
            return logits[:, : self.vocab_limit].float(), (states[-rows:] if hidden else None)
        kwargs = {"logits_to_keep": rows} if self._keeps_logits else {}
        out = self.model(input_ids=host[0:1], position_ids=host[1:2], past_key_values=self.cache, use_cache=True,
                         attention_mask=additive_mask(padded.to(self.device, non_blocking=True), self.dtype)[None, None],
                         **kwargs)
        self.slots.length = past + q
        logits = out.logits[0, -rows:, : self.vocab_limit].float()
        return logits, (self._hidden(rows) if hidden else None)

    @torch.inference_mode()
    def _keep(self, path: Sequence[int]) -> None:
        """The path's entries moved to the slots right after the context (only those that are not
        there already); the rest of the tree is past the new length, stale."""
        tree = self.tree
        assert tree is not None
        moved = [i for i, node in enumerate(path) if node != i]
        if moved:
            start = tree.base + moved[0]
            src = torch.tensor([tree.base + n for n in path[moved[0]:]], device=self.device)
            for layer in self.cache.layers:
                if layer.is_initialized:
                    layer.keys[:, :, start:start + len(src)] = layer.keys.index_select(2, src)
                    layer.values[:, :, start:start + len(src)] = layer.values.index_select(2, src)
        self.slots.length = tree.base + len(path)

    def fingerprint_extra(self) -> dict:
        return static_fingerprint(self.graphs.max_width if self.graphs is not None else 0, self.step_kind)
