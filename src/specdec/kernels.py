"""Faster exact CPU kernels for the same weights.

torch's float32 linear on a CPU re-packs the weight matrix for its GEMM kernel on every call with
more than one row, so a pass over a few tokens pays for reading and writing the whole weight
twice (measured on a 2-core AVX2 EPYC: one 1536x8960 projection takes 2.98 ms for 1 row but 6.47
for 2 and 8.70 for 8). Packing each weight once for oneDNN at load (``torch.utils.mkldnn``) does
the same arithmetic in float32 without that cost (2.56 / 4.35 / 4.75 ms): verify passes and
prefill get ~1.5-2x cheaper. ``scripts/matmul_paths.py`` measures the paths on any machine.
"""

from __future__ import annotations

import torch
from torch import nn


def can_pack(device: torch.device) -> bool:
    return device.type == "cpu" and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """A float32 linear layer whose weight is held in oneDNN's layout (``Tensor.to_mkldnn``), so
    the GEMM does not re-pack it on every call; inputs and outputs are ordinary tensors."""

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


def pack_linears(model: nn.Module) -> int:
    """Replace every float32 ``nn.Linear`` of a CPU model by a :class:`PackedLinear` (same
    weights, same float32 arithmetic); returns how many. A model elsewhere is left alone."""
    first = next(model.parameters(), None)
    if first is None or not can_pack(first.device):
        return 0
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32:
                setattr(module, name, PackedLinear(child))
                count += 1
    return count
