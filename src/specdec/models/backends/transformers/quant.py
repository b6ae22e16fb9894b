"""Weight-only int8 for the *draft* model: a cheaper drafter, the same guarantees.

The draft model only proposes; the lossless rules keep the target's output exact whatever the
draft is. So the draft can be quantized freely, and on a CPU, where one decoding step is bound by
reading the weights, int8 weights make a draft step up to ~2x faster. The target is never touched.
"""

from __future__ import annotations

import torch
from torch import nn

from ....errors import SpecdecError

QUANT_MODES = ("none", "int8", "auto")
#: From this many rows (a prefill), an int8 layer on the CPU kernel path multiplies in float32 by a
#: dequantized copy made for that call: the int8 kernel's cost grows ~linearly with rows, a float32
#: GEMM's much less, and a per-call copy costs no memory between calls.
WIDE_ROWS = 64


class Int8Linear(nn.Module):
    """A linear layer with symmetric per-output-channel int8 weights.

    On a CPU with bf16/fp16 activations every pass uses torch's int8 weight-only kernel
    (``_weight_int8pack_mm``), whatever its width: measured on a 2-core AVX2 EPYC it stays cheap
    up to 16 rows (1536x8960: 1.15 ms for 1 row, 3.65 for 8, 6.94 for 16), where the bf16 GEMM
    grows ~1.4 ms per row. From ``WIDE_ROWS`` rows (a prefill) it dequantizes the weight for that
    call and runs one float32 GEMM, whose cost grows far less with rows. Elsewhere (GPUs, float32 activations, where that kernel was measured
    ~2.3x slower than float32) it multiplies by ``weight``, the dequantized matrix, kept only
    there: on the int8 path no dequantized copy is held, so an int8 layer takes about half the
    memory of a bf16 one.
    """

    # its buffers (register_buffer)
    qweight: torch.Tensor
    scales: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()  # [N, K]
        scales = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)  # [N]
        q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)  # [N, K]
        dtype = linear.weight.dtype
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._int8_kernel = (w.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)
                             and hasattr(torch.ops.aten, "_weight_int8pack_mm"))
        self.register_buffer("qweight", q, persistent=False)
        self.register_buffer("scales", scales.to(dtype), persistent=False)
        dequantized = None if self._int8_kernel else (q.float() * scales[:, None]).to(dtype)
        self.register_buffer("weight", dequantized, persistent=False)
        bias = linear.bias.detach() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._int8_kernel and x.dtype == self.scales.dtype:
            rows = x.numel() // x.shape[-1]
            if rows >= WIDE_ROWS:  # a prefill: one float32 GEMM on a transient dequantized weight
                w = self.qweight.float() * self.scales.float()[:, None]
                y = nn.functional.linear(x.reshape(rows, x.shape[-1]).float(), w).to(x.dtype)
                y = y.reshape(*x.shape[:-1], self.out_features)
                return y if self.bias is None else y + self.bias
            y = torch.ops.aten._weight_int8pack_mm(x.reshape(rows, x.shape[-1]), self.qweight, self.scales)
            y = y.reshape(*x.shape[:-1], self.out_features)
            return y if self.bias is None else y + self.bias
        weight = self.weight if self.weight is not None else (self.qweight.to(x.dtype) * self.scales[:, None].to(x.dtype))
        return nn.functional.linear(x, weight, self.bias)


def quantize_int8(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` in ``model`` by an :class:`Int8Linear`; returns how many."""
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, Int8Linear(child))
                count += 1
    return count


def resolve_quant(mode: str, device: torch.device, dtype: torch.dtype) -> str:
    """``auto`` -> int8 for a bfloat16 model on a CPU (measured ~1.5-2x faster per draft step),
    none elsewhere: with float32 activations torch's int8 kernel was measured ~2.3x *slower* than
    the plain float32 layer here, and on a GPU it is not used."""
    if mode not in QUANT_MODES:
        raise SpecdecError(f"unknown draft quantization {mode!r}; choose one of: {', '.join(QUANT_MODES)}")
    if mode == "auto":
        return "int8" if device.type == "cpu" and dtype == torch.bfloat16 else "none"
    return mode


def is_quantized(model: nn.Module) -> bool:
    """Whether any linear layer of ``model`` holds int8 weights (:func:`quantize_int8`)."""
    return any(isinstance(m, Int8Linear) for m in model.modules())
