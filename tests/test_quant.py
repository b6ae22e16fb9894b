"""The int8 weight-only draft: both code paths compute one function, and ``auto`` picks it only
where it was measured faster (bfloat16 on a CPU)."""

import pytest
import torch
from torch import nn

from specdec.errors import SpecdecError
from specdec.models.backends.transformers.quant import Int8Linear, quantize_int8, resolve_quant

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


def test_int8_kernel_serves_every_width_on_cpu_without_a_dequantized_copy():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    q = Int8Linear(linear)
    if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        pytest.skip("this torch has no int8 weight-only kernel")
    assert q.weight is None and q.out_features == 48  # one int8 copy of the weights, nothing else
    x = torch.randn(33, 64, dtype=torch.bfloat16)
    rows = torch.cat([q(x[i:i + 1]) for i in range(33)])
    torch.testing.assert_close(q(x), rows, rtol=3e-2, atol=3e-2)  # wide passes: the same kernel
    ref = nn.functional.linear(x.float(), q.qweight.float() * q.scales.float()[:, None], linear.bias.float())
    torch.testing.assert_close(q(x).float(), ref, rtol=3e-2, atol=3e-2)


def test_packed_float32_linears_compute_the_same_function():
    from specdec.models.backends.transformers.kernels import PackedLinear, can_pack, pack_linears

    if not can_pack(torch.device("cpu")):
        pytest.skip("no oneDNN in this torch")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16, bias=False), nn.Linear(16, 8).bfloat16())
    x = torch.randn(2, 5, 32)
    ref = model[:3](x)
    assert pack_linears(model) == 2  # float32 ones only
    assert isinstance(model[0], PackedLinear) and type(model[3]) is nn.Linear
    torch.testing.assert_close(model[:3](x), ref, rtol=1e-5, atol=1e-5)
    assert model[:3](x[:, :1]).shape == (2, 1, 16)


def test_int8_prefill_path_computes_the_same_layer():
    from specdec.models.backends.transformers.quant import WIDE_ROWS

    torch.manual_seed(1)
    linear = nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    q = Int8Linear(linear)
    x = torch.randn(1, WIDE_ROWS + 6, 64, dtype=torch.bfloat16)  # a prefill: float32 GEMM on dequantized weights
    rows = torch.cat([q(x[:, i:i + 1]) for i in range(x.shape[1])], dim=1)  # one row at a time: the int8 kernel
    assert q(x).shape == (1, WIDE_ROWS + 6, 48) and q(x).dtype == torch.bfloat16
    torch.testing.assert_close(q(x).float(), rows.float(), rtol=3e-2, atol=3e-2)


def test_row_padded_linear_computes_the_two_row_gemm_and_keeps_its_parameters():
    from specdec.models.backends.transformers.kernels import RowPaddedLinear, can_pad_rows, set_row_padding

    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(64, 48).bfloat16(), nn.ReLU(), nn.Linear(48, 16, bias=False).bfloat16(),
                          nn.Linear(16, 8))  # the float32 layer is not a candidate
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    wide = model[:3](x)
    assert can_pad_rows(model) and set_row_padding(model, True) == 2
    assert type(model[0]) is RowPaddedLinear and type(model[3]) is nn.Linear
    one = x[1:2]
    two = one.expand(2, -1).contiguous()
    expect = nn.functional.linear(two, model[0].weight, model[0].bias)[:1]
    assert torch.equal(model[0](one), expect)  # the GEMM path's row, exactly
    assert model[0](one[0]).shape == (48,) and model[0](one.reshape(1, 1, 64)).shape == (1, 1, 48)
    assert torch.equal(model[:3](x), wide)  # wider inputs: as before
    torch.testing.assert_close(model[:3](one).float(), wide[1:2].float(), rtol=2e-2, atol=2e-2)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert set_row_padding(model, True) == 0 and set_row_padding(model, False) == 2
    assert type(model[0]) is nn.Linear
    assert not can_pad_rows(nn.Sequential(nn.Linear(4, 4)))  # float32: nothing to pad


@pytest.mark.parametrize("padded_faster, expected", [(True, ["pad1"]), (False, [])])
def test_choose_kernels_keeps_what_was_measured_faster(monkeypatch, padded_faster, expected):
    from specdec.models.backends.transformers import dtypes as calibrate
    from specdec.models.backends.transformers.kernels import RowPaddedLinear

    model = nn.Sequential(nn.Linear(8, 8).bfloat16())

    def fake_step(lm, repeats=5):  # a padded step costs 0.15 s, a plain one 0.2 s (or the reverse)
        padded = type(model[0]) is RowPaddedLinear
        return 0.15 if padded == padded_faster else 0.2

    monkeypatch.setattr(calibrate, "time_step", fake_step)
    assert calibrate.choose_kernels(model, lm=None) == expected
    assert (type(model[0]) is RowPaddedLinear) == padded_faster  # the faster one is left in force
    assert calibrate.choose_kernels(nn.Sequential(nn.Linear(8, 8)), lm=None) == []  # float32: not measured
