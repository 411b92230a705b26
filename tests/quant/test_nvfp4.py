"""NVFP4 golden values: E2M1 codes in both nibbles, block scales, edge cases (reliability N2, N3).

Expectations are written out by hand here, never produced by our own encoder.
"""

import pytest
import torch

from vl.quant.config import QuantFormatError
from vl.quant.nvfp4 import (
    dequantize_nvfp4,
    e2m1_codes,
    e2m1_values,
    fake_quantize_nvfp4_activation,
    nvfp4_global_scale,
    pack_fp4,
    quantize_nvfp4,
    ref_nvfp4_quant,
    unpack_fp4,
)

# code -> value, by the E2M1 definition (bit 3 sign, bits 0-2 index [0, .5, 1, 1.5, 2, 3, 4, 6])
CODE_VALUE = {0: 0.0, 1: 0.5, 2: 1.0, 3: 1.5, 4: 2.0, 5: 3.0, 6: 4.0, 7: 6.0,
              8: -0.0, 9: -0.5, 10: -1.0, 11: -1.5, 12: -2.0, 13: -3.0, 14: -4.0, 15: -6.0}
E4M3 = {448.0: 0x7E, 224.0: 0x76, 2.0: 0x40, 1.0: 0x38, 0.5: 0x30, 2.0**-9: 0x01}  # hand-encoded bytes


def u8(*vals):
    return torch.tensor(vals, dtype=torch.uint8)


@pytest.mark.parametrize("code", range(16))
def test_every_code_in_the_low_nibble_is_the_even_element(code):
    vals = e2m1_values(unpack_fp4(u8(code)))  # byte = code in bits 0-3
    assert vals.tolist() == [CODE_VALUE[code], 0.0]
    assert str(vals[0].item()) == str(CODE_VALUE[code])  # also the sign of zero (code 8 = -0.0)


@pytest.mark.parametrize("code", range(16))
def test_every_code_in_the_high_nibble_is_the_odd_element(code):
    vals = e2m1_values(unpack_fp4(u8(code << 4)))
    assert vals.tolist() == [0.0, CODE_VALUE[code]]
    assert str(vals[1].item()) == str(CODE_VALUE[code])


def test_pack_golden_bytes():
    codes = u8(0x1, 0x2, 0xF, 0x0, 0x0, 0xF, 0x7, 0x9)
    assert pack_fp4(codes).tolist() == [0x21, 0x0F, 0xF0, 0x97]
    assert unpack_fp4(u8(0x21, 0x0F, 0xF0, 0x97)).tolist() == codes.tolist()
    everything = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_fp4(unpack_fp4(everything)), everything)


@pytest.mark.parametrize("bad", [u8(1, 2, 3), u8(16, 0), torch.zeros(2, dtype=torch.int32)])
def test_pack_rejects_bad_codes(bad):
    with pytest.raises(QuantFormatError):
        pack_fp4(bad)


# (input, expected code): ModelOpt's thresholds, ties to the even code, sign bit kept for negatives
ROUNDING = [
    (0.0, 0), (0.25, 0), (0.2501, 1), (0.5, 1), (0.7499, 1), (0.75, 2), (1.25, 2), (1.2501, 3),
    (1.7499, 3), (1.75, 4), (2.5, 4), (2.5001, 5), (3.4999, 5), (3.5, 6), (5.0, 6), (5.0001, 7),
    (6.0, 7), (7.0, 7), (1e30, 7),
    (-0.1, 8), (-0.25, 8), (-0.3, 9), (-0.75, 10), (-1.75, 12), (-2.5, 12), (-3.5, 14), (-5.0, 14), (-5.5, 15),
    (-100.0, 15),
]


@pytest.mark.parametrize("x,code", ROUNDING)
def test_e2m1_rounding_thresholds(x, code):
    assert e2m1_codes(torch.tensor([x])).tolist() == [code]


def threshold_chain(v: float) -> int:
    """The reference `cast_to_fp4` threshold chain, written independently as plain Python."""
    a = abs(v)
    if a <= 0.25: c = 0
    elif a < 0.75: c = 1
    elif a <= 1.25: c = 2
    elif a < 1.75: c = 3
    elif a <= 2.5: c = 4
    elif a < 3.5: c = 5
    elif a <= 5.0: c = 6
    else: c = 7
    return c | (8 if v < 0 else 0)


def test_e2m1_codes_match_the_threshold_chain_on_random_and_tie_values():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    x = torch.cat([torch.randn(4000) * 3, ties, -ties, torch.linspace(-7, 7, 2801)])
    assert e2m1_codes(x).tolist() == [threshold_chain(v) for v in x.tolist()]


def test_dequantize_golden():
    # one row of 32 inputs = 2 blocks; block 0 scale 2.0, block 1 scale 0.5; weight_scale_2 = 0.25
    codes = torch.tensor([7, 15, 1, 9, 2, 3, 0, 8] + [4] * 8 + [6, 14, 5, 13] + [0] * 12, dtype=torch.uint8)
    packed = pack_fp4(codes).reshape(1, 16)
    scale = u8(E4M3[2.0], E4M3[0.5]).view(torch.float8_e4m3fn).reshape(1, 2)
    ws2 = torch.tensor(0.25)
    w = dequantize_nvfp4(packed, scale, ws2)
    # block 0 unit = 2.0 * 0.25 = 0.5; block 1 unit = 0.5 * 0.25 = 0.125
    expect = [3.0, -3.0, 0.25, -0.25, 0.5, 0.75, 0.0, -0.0] + [1.0] * 8 + [0.5, -0.5, 0.375, -0.375] + [0.0] * 12
    assert w.shape == (1, 32) and w[0].tolist() == expect


def test_quantize_golden_two_blocks():
    k = 0.01
    grid = [6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5, 0.0]
    block0 = torch.tensor(grid + [-g for g in grid]) * k  # amax 6k -> scale 448
    block1 = torch.tensor([3.0, -3.0] + [0.0] * 14) * k  # amax 3k -> scale 224
    w = torch.cat([block0, block1]).reshape(1, 32)
    packed, scale, ws2 = quantize_nvfp4(w)
    assert float(ws2) == pytest.approx(6 * k / 2688, rel=1e-7)  # amax / (6 * 448), multiplicative
    assert scale.view(torch.uint8).tolist() == [[E4M3[448.0], E4M3[224.0]]]
    # block 0: w / (448 * ws2) = w / k -> the grid itself; block 1: w / (224 * ws2) = 2 w / k -> +-6
    # the last element of block 0 is -0.0: the sign bit is (x < 0), so -0.0 encodes as code 0, as ModelOpt
    expect_codes = [7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 0] + [7, 15] + [0] * 14
    assert unpack_fp4(packed)[0].tolist() == expect_codes
    assert packed[0, :2].tolist() == [0x67, 0x45]  # (code1 << 4) | code0 for the first 4 elements


def test_zero_block_gets_unit_scale_and_no_nan():
    w = torch.cat([torch.zeros(16), torch.linspace(-1, 1, 16)]).reshape(1, 32)
    packed, scale, ws2 = quantize_nvfp4(w)
    assert scale.view(torch.uint8)[0, 0].item() == E4M3[1.0]
    assert unpack_fp4(packed)[0, :16].tolist() == [0] * 16
    d = dequantize_nvfp4(packed, scale, ws2)
    assert not torch.isnan(d).any() and torch.equal(d[0, :16], torch.zeros(16))


def test_all_zero_tensor():
    packed, scale, ws2 = quantize_nvfp4(torch.zeros(2, 16))
    assert float(ws2) == 1.0 and (scale.float() == 1.0).all()
    assert torch.equal(dequantize_nvfp4(packed, scale, ws2), torch.zeros(2, 16))


def test_tiny_block_clamps_to_smallest_subnormal_not_zero():
    w = torch.cat([torch.full((16,), 1000.0), torch.full((16,), 1e-6)]).reshape(1, 32)
    packed, scale, ws2 = quantize_nvfp4(w)
    # block 1: 1e-6 / (6 * 1000/2688) = 4.5e-7 < 2^-9 -> clamped to 2^-9 (byte 0x01), never 0
    assert scale.view(torch.uint8).tolist() == [[E4M3[448.0], E4M3[2.0**-9]]]
    d = dequantize_nvfp4(packed, scale, ws2)
    assert torch.isfinite(d).all()
    assert d[0, 0].item() == pytest.approx(1000.0, rel=1e-6)


def test_block_scale_above_448_saturates_and_values_clip():
    # a global scale 4x too small (e.g. shared across fused layers): block scale would be 4 * 448
    w = torch.tensor([12.0, -12.0, 6.0] + [0.0] * 13).reshape(1, 16)
    ws2 = torch.tensor(12.0 / 2688 / 4)
    packed, scale, _ = quantize_nvfp4(w, weight_scale_2=ws2)
    assert scale.view(torch.uint8).tolist() == [[E4M3[448.0]]]
    # unit = 448 * ws2 = 0.5: 12 -> 24 units -> clipped to code 7 (6 units = 3.0); 6 -> 12 units -> 3.0 too
    d = dequantize_nvfp4(packed, scale, ws2)
    assert d[0, :4].tolist() == pytest.approx([3.0, -3.0, 3.0, 0.0])


def test_global_scale_convention_is_multiplicative():
    assert float(nvfp4_global_scale(2688.0)) == 1.0
    assert float(nvfp4_global_scale(0.0)) == 1.0  # zero amax: any positive value, never 0 / NaN
    # doubling weight_scale_2 doubles the dequantized weight (it multiplies; it is not 1/gs)
    packed, scale, ws2 = quantize_nvfp4(torch.randn(4, 32))
    assert torch.equal(dequantize_nvfp4(packed, scale, ws2 * 2), dequantize_nvfp4(packed, scale, ws2) * 2)


@pytest.mark.parametrize("dist", ["normal", "student_t"])
def test_round_trip_error_within_the_format_bound(dist):
    shape = (64, 256)
    w = torch.randn(shape) if dist == "normal" else torch.distributions.StudentT(2.0).sample(shape)
    packed, scale, ws2 = quantize_nvfp4(w)
    d = dequantize_nvfp4(packed, scale, ws2)
    unit = (scale.float() * ws2).repeat_interleave(16, dim=1)  # value of one E2M1 step "1.0" per element
    # largest grid gap is 4 -> 6 (half gap 1 unit); clipping after the E4M3 rounding of the scale costs < 1 unit
    assert ((d - w).abs() <= unit * (1 + 1e-6)).all()
    rel = float((d - w).norm() / w.norm())
    assert rel < 0.12, rel  # measured ~0.09-0.10 on these draws


def test_strided_input_equals_contiguous():
    base = torch.randn(64, 128)
    strided = base.t()[::2]  # (64, 64) non-contiguous
    a = quantize_nvfp4(strided)
    b = quantize_nvfp4(strided.contiguous())
    assert torch.equal(a[0], b[0]) and torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8))
    assert torch.equal(a[2], b[2])
    big = torch.randint(0, 256, (8, 64), dtype=torch.uint8)
    sc = torch.rand(8, 16).to(torch.float8_e4m3fn)
    assert torch.equal(dequantize_nvfp4(big[:, ::2], sc[:, ::4], torch.tensor(1.0)),
                       dequantize_nvfp4(big[:, ::2].contiguous(), sc[:, ::4].contiguous(), torch.tensor(1.0)))


def test_2d_blocks_share_one_scale_per_16x16_tile():
    w = torch.randn(32, 64)
    _, s2d, _ = quantize_nvfp4(w, block_2d=True)
    s = s2d.float()
    assert s.shape == (32, 4)
    assert torch.equal(s[:16], s[:1].expand(16, -1)) and torch.equal(s[16:], s[16:17].expand(16, -1))


def test_shape_errors_name_the_problem():
    with pytest.raises(QuantFormatError, match="divisible by 16"):
        quantize_nvfp4(torch.randn(4, 24))
    with pytest.raises(QuantFormatError, match="expected shape"):
        dequantize_nvfp4(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 2).to(torch.float8_e4m3fn),
                         torch.tensor(1.0))
    with pytest.raises(QuantFormatError, match="float8_e4m3fn"):
        dequantize_nvfp4(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 1), torch.tensor(1.0))
    with pytest.raises(QuantFormatError, match="NaN"):
        quantize_nvfp4(torch.full((1, 16), float("nan")))


def test_ref_activation_quant_golden():
    # gs = 1 / input_scale = 1: block scale = e4m3(amax / 6) = 1 -> values rounded on the plain grid
    x = torch.tensor([[6.0, -2.6, 0.2, 1.3] + [0.0] * 12 + [0.0] * 16])
    vals, scale = ref_nvfp4_quant(x, torch.tensor(1.0))
    assert scale.tolist() == [[1.0, 0.0]]  # zero block: scale 0, no NaN (reciprocal of 0 taken as 0)
    assert vals[0, :4].tolist() == [6.0, -3.0, 0.0, 1.5]
    assert not torch.isnan(vals).any() and torch.equal(vals[0, 16:], torch.zeros(16))
    # input_scale = 2 (gs = 0.5): block scale = e4m3(0.5 * 6 / 6) = 0.5; x * gs / s = x
    vals2, scale2 = ref_nvfp4_quant(x, torch.tensor(2.0))
    assert scale2[0, 0].item() == 0.5 and torch.equal(vals2, vals)
    deq = fake_quantize_nvfp4_activation(x, torch.tensor(2.0))
    assert deq[0, :4].tolist() == [6.0, -3.0, 0.0, 1.5]  # vals * s / gs = vals * 0.5 / 0.5


def test_ref_activation_block_scale_saturates():
    x = torch.full((1, 16), 6.0)
    vals, scale = ref_nvfp4_quant(x, torch.tensor(1.0 / 1000.0))  # gs = 1000: scale 1000 -> 448
    assert scale.item() == 448.0 and vals.max().item() == 6.0
