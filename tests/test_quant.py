"""The int8 weight-only draft: both code paths compute one function, and ``auto`` picks it only
where it was measured faster (bfloat16 on a CPU)."""

import pytest
import torch
from torch import nn

from specdec.errors import SpecdecError
from specdec.quant import Int8Linear, quantize_int8, resolve_quant

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize(
    "mode, device, dtype, expected",
    [
        ("auto", CPU, torch.bfloat16, "int8"),
        ("auto", CPU, torch.float32, "none"),
        ("auto", CPU, torch.float16, "none"),
        ("auto", CUDA, torch.bfloat16, "none"),
        ("int8", CPU, torch.float32, "int8"),
        ("none", CPU, torch.bfloat16, "none"),
    ],
)
def test_resolve_quant(mode, device, dtype, expected):
    assert resolve_quant(mode, device, dtype) == expected


def test_resolve_quant_rejects_unknown_mode():
    with pytest.raises(SpecdecError, match="unknown draft quantization 'int4'"):
        resolve_quant("int4", CPU, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_paths_agree_and_stay_close_to_the_float_layer(dtype):
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=True).to(dtype)
    q = Int8Linear(linear)
    one = torch.randn(1, 64, dtype=dtype)  # decoding step: the int8 kernel (when torch has it)
    wide = torch.cat([one, torch.randn(7, 64, dtype=dtype)])  # prefill: the dequantized matrix
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(q(one)[0], q(wide)[0], rtol=tol, atol=tol)
    # per-channel int8 keeps the layer within a small relative error of the float one
    err = (q(wide).float() - linear(wide).float()).abs().max() / linear(wide).float().abs().max()
    assert err < 0.03


def test_quantize_int8_replaces_every_linear():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4, bias=False)))
    assert quantize_int8(model) == 2
    assert all(not type(m) is nn.Linear for m in model.modules())
    assert model(torch.randn(3, 8)).shape == (3, 4)
