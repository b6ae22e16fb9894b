"""Fewer, larger kernels a layer: the static cache's passes without transformers' module code.

transformers' eager decoder layer launches about 40 kernels (three projections with biases, a
rotary embedding of ~10 ops, two cache writes, ``repeat_kv`` and an attention under a float mask
as wide as the cache, the MLP's three matrices, the norms, the adds), each a few microseconds even
inside a CUDA graph, so a one-token pass of a small model costs several times the time to read its
weights. :class:`FusedDecoder` runs the same arithmetic on the same weights with

- q/k/v (and their biases) one matrix ``wqkv``, gate and up one matrix ``w13`` (as gpt-fast does),
  merged once at load; the module's own ``q_proj`` .. ``up_proj`` weights become views of them
  (no second copy: transformers' forward still runs, on the same storage);
- attention by ``scaled_dot_product_attention`` with grouped-query heads (``enable_gqa``: no
  ``repeat_kv``) under a boolean mask built on the device from the pass's positions;
- keys and values written straight into the static cache's tensors at the pass's slots.

The step is a plain function of tensors with no host work, so ``torch.compile(fullgraph=True,
dynamic=False)`` takes it whole (:func:`compiled`), inside the width graphs.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

#: the decoder layers' attribute names this path reads (Qwen2, Llama and their kin)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
#: torch.compile's recompiles allowed per code object: one per pass width (and a spare)
COMPILE_CACHE_LIMIT = 64


def fused_refusal(model: nn.Module) -> str | None:
    """Why :class:`FusedDecoder` cannot run ``model`` (None: it can): a decoder of plain attention
    (q/k/v/o projections, no q/k norms, no sliding window) and a SiLU-gated MLP, RMS norms."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or getattr(inner, "rotary_emb", None) is None or getattr(inner, "norm", None) is None:
        return "not a decoder with layers, a rotary embedding and a final norm"
    config: Any = model.config  # a transformers config, its fields read by name
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its MLP's activation is {config.hidden_act}, not silu"
    if getattr(config, "use_sliding_window", False) or set(getattr(config, "layer_types", None) or ["full_attention"]) != {"full_attention"}:
        return "it has sliding-window layers"
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None or not all(type(getattr(attn, n, None)) is nn.Linear for n in ATTENTION) \
                or not all(type(getattr(mlp, n, None)) is nn.Linear for n in MLP):
            return "its layers are not plain linear q/k/v/o projections and a gate/up/down MLP"
        if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
            return "its attention normalizes q and k"
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not hasattr(norm, "variance_epsilon") or "RMSNorm" not in type(norm).__name__:
                return f"its norms are {type(norm).__name__}, not RMS norms"
    return None


def merge(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several linear layers of one input: their rows stacked; each
    layer's own weight and bias become views of it (the module still runs, on the same storage)."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    biased = [lin.bias is not None for lin in linears]
    bias = None
    if any(biased):
        bias = torch.cat([lin.bias.detach() if lin.bias is not None else lin.weight.new_zeros(lin.out_features)
                          for lin in linears])
    start = 0
    for lin in linears:
        rows = lin.out_features
        lin.weight = nn.Parameter(weight[start:start + rows], requires_grad=False)
        if lin.bias is not None and bias is not None:  # bias is not None when any layer has one
            lin.bias = nn.Parameter(bias[start:start + rows], requires_grad=False)
        start += rows
    return weight, bias


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: in float32, back to the input's dtype, then scaled."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding on ``x [1, heads, w, D]`` (cos/sin ``[1, 1, w, D]``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class FusedLayer:
    """One decoder layer's weights, merged: ``wqkv``/``bqkv``, ``wo``, ``w13`` (gate; up), ``w2``."""

    def __init__(self, layer: Any):  # a transformers decoder layer, its submodules read by name
        attn, mlp = layer.self_attn, layer.mlp
        self.wqkv, self.bqkv = merge([attn.q_proj, attn.k_proj, attn.v_proj])
        self.w13, self.b13 = merge([mlp.gate_proj, mlp.up_proj])
        self.wo, self.bo = attn.o_proj.weight, attn.o_proj.bias
        self.w2, self.b2 = mlp.down_proj.weight, mlp.down_proj.bias
        self.norm1, self.eps1 = layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon
        self.norm2, self.eps2 = layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon
        self.q_rows, self.kv_rows = attn.q_proj.out_features, attn.k_proj.out_features


class FusedDecoder:
    """The model's pass over ``ids``/``positions`` (``[1, w]`` device tensors) writing keys and
    values into ``caches`` (per layer ``(keys, values)``, each ``[1, kv_heads, capacity, D]``) at
    ``slots`` ``[w]``, attending under ``allowed`` (bool ``[w, capacity]``). Returns the logits of
    the last ``keep`` rows and the LM head's input ``[w, H]``."""

    def __init__(self, model: Any):  # a transformers causal LM, its submodules read by name
        inner = model.model
        config = model.config
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.norm, self.eps = inner.norm.weight, inner.norm.variance_epsilon
        head = model.get_output_embeddings()
        self.head, self.head_bias = head.weight, head.bias
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = self.head_dim ** -0.5
        self.layers = [FusedLayer(layer) for layer in inner.layers]

    def cache_shape(self, capacity: int) -> tuple[int, int, int, int]:
        return (1, self.kv_heads, capacity, self.head_dim)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, allowed: torch.Tensor,
                 caches: list[tuple[torch.Tensor, torch.Tensor]], keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.embedding(ids, self.embed)  # [1, w, H]
        cos, sin = self.rotary(x, positions)
        cos, sin = cos[:, None], sin[:, None]  # [1, 1, w, D]
        mask = allowed[None, None]
        w = ids.shape[-1]
        for layer, (keys, values) in zip(self.layers, caches):
            h = rms_norm(x, layer.norm1, layer.eps1)
            qkv = F.linear(h, layer.wqkv, layer.bqkv)
            q, k, v = qkv.split([layer.q_rows, layer.kv_rows, layer.kv_rows], dim=-1)
            q = rotate(q.view(1, w, self.heads, self.head_dim).transpose(1, 2), cos, sin)
            k = rotate(k.view(1, w, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
            keys.index_copy_(2, slots, k)
            values.index_copy_(2, slots, v.view(1, w, self.kv_heads, self.head_dim).transpose(1, 2))
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale,
                                               enable_gqa=self.kv_heads != self.heads)
            x = x + F.linear(a.transpose(1, 2).reshape(1, w, -1), layer.wo, layer.bo)
            h = rms_norm(x, layer.norm2, layer.eps2)
            gate, up = F.linear(h, layer.w13, layer.b13).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.w2, layer.b2)
        hidden = rms_norm(x, self.norm, self.eps)[0]  # [w, H]
        return F.linear(hidden[-keep:], self.head, self.head_bias), hidden


def compiled(fn: Callable) -> Callable:
    """``fn`` through ``torch.compile(fullgraph=True, dynamic=False)``, one compiled graph per pass
    width (the recompile limit raised to cover every width)."""
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < COMPILE_CACHE_LIMIT:
            setattr(config, name, COMPILE_CACHE_LIMIT)
    return torch.compile(fn, fullgraph=True, dynamic=False)
