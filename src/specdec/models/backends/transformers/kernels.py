"""Faster exact CPU kernels for the same weights.

torch's float32 linear on a CPU re-packs the weight matrix for its GEMM kernel on every call with
more than one row, so a pass over a few tokens pays for reading and writing the whole weight
twice (measured on a 2-core AVX2 EPYC: one 1536x8960 projection takes 2.98 ms for 1 row but 6.47
for 2 and 8.70 for 8). Packing each weight once for oneDNN at load (``torch.utils.mkldnn``) does
the same arithmetic in float32 without that cost (2.56 / 4.35 / 4.75 ms): verify passes and
prefill get ~1.5-2x cheaper. ``scripts/matmul_paths.py`` measures the paths on any machine.

The other way round, a CPU with native bf16 (``avx512_bf16``) runs a bf16 linear over *one* row
on a slower path than over two (measured on a 2-core EPYC with avx512_bf16, 1536x8960: 1.04 ms
for 1 row, 0.80 for 2), so a plain decoding step of the 1.5B target took 235 ms as it is and
197 ms with every one-row linear run as two copies of the row (:class:`RowPaddedLinear`). On an
AVX2-only CPU the one-row path is the fast one. Whether to pad is therefore measured per machine
(:mod:`specdec.models.backends.transformers.dtypes`) and recorded in the model's cost table as the
kernel choice ``pad1``.
"""

from __future__ import annotations

import torch
from torch import nn


def can_pack(device: torch.device) -> bool:
    return device.type == "cpu" and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """A float32 linear layer whose weight is held in oneDNN's layout (``Tensor.to_mkldnn``), so
    the GEMM does not re-pack it on every call; inputs and outputs are ordinary tensors."""

    # its buffers (register_buffer)
    weight: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", linear.weight.detach().float().to_mkldnn(), persistent=False)
        bias = None if linear.bias is None else linear.bias.detach().float().to_mkldnn()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous().to_mkldnn()
        y = torch._C._nn.mkldnn_linear(rows, self.weight, self.bias).to_dense()
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


class RowPaddedLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters) that runs a one-row input as two identical rows and keeps
    the first: the same weights and formula, on the GEMM path instead of the one-row path. The
    second row's result is thrown away. Rows of wider inputs are computed as before."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[-1]:
            return nn.functional.linear(x, self.weight, self.bias)
        two = x.reshape(1, -1).expand(2, -1).contiguous()
        return nn.functional.linear(two, self.weight, self.bias)[:1].reshape(*x.shape[:-1], self.out_features)


def can_pad_rows(model: nn.Module) -> bool:
    """Whether :func:`set_row_padding` applies: a CPU model with half-precision ``nn.Linear`` layers."""
    return any(type(m) in (nn.Linear, RowPaddedLinear) and m.weight.device.type == "cpu"
               and m.weight.dtype in (torch.bfloat16, torch.float16) for m in model.modules())


def set_row_padding(model: nn.Module, on: bool) -> int:
    """Turn :class:`RowPaddedLinear` on (or back off) for every half-precision CPU ``nn.Linear`` of
    ``model``, in place (the modules keep their parameters); returns how many layers changed."""
    src, dst = (nn.Linear, RowPaddedLinear) if on else (RowPaddedLinear, nn.Linear)
    count = 0
    for m in model.modules():
        if type(m) is src and m.weight.device.type == "cpu" and m.weight.dtype in (torch.bfloat16, torch.float16):
            m.__class__ = dst
            count += 1
    return count


def pack_linears(model: nn.Module) -> int:
    """Replace every float32 ``nn.Linear`` of a CPU model by a :class:`PackedLinear` (same
    weights, same float32 arithmetic); returns how many. A model elsewhere is left alone."""
    first = next(model.parameters(), None)
    if first is None or not can_pack(first.device):
        return 0
    # (parent, name) pairs only: a list holding the Linear modules themselves would keep every
    # dense weight alive until the end, beside its packed copy (the load peaked at ~2x the weights)
    slots = [(module, name) for module in model.modules() for name, child in module.named_children()
             if type(child) is nn.Linear and child.weight.dtype == torch.float32]
    for module, name in slots:
        setattr(module, name, PackedLinear(getattr(module, name)))
    return len(slots)
