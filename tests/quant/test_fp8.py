"""FP8 golden values and bit-exactness against an independent pure-Python encoder (reliability N1)."""

import math

import pytest
import torch

from vl.quant.config import QuantFormatError
from vl.quant.fp8 import (
    cast_to_fp8,
    dequantize_fp8,
    fake_quantize_fp8_activation,
    fp8_scale_granularity,
    has_e4m3_nan,
    quantize_fp8_activation,
    quantize_fp8_blockwise,
    quantize_fp8_per_channel,
    quantize_fp8_per_tensor,
)

# (exponent bits, mantissa bits, bias, max) per format
FORMATS = {torch.float8_e4m3fn: (4, 3, 7, 448.0), torch.float8_e5m2: (5, 2, 15, 57344.0)}


def ref_fp8_bits(v: float, fmt=torch.float8_e4m3fn) -> int:
    """Independent encoder: saturate, then round-half-to-even on the format's grid, by hand."""
    _, mbits, bias, vmax = FORMATS[fmt]
    if math.isnan(v):
        return -1  # checked separately
    sign = 0x80 if (v < 0 or (v == 0 and math.copysign(1.0, v) < 0)) else 0
    a = min(abs(v), vmax)
    if a == 0:
        return sign
    emin = 1 - bias  # smallest normal exponent
    m, ex = math.frexp(a)  # a = m * 2**ex, m in [0.5, 1)
    e = ex - 1
    if e < emin:  # subnormal: integer multiples of 2**(emin - mbits); q == 2**mbits rolls into the first normal
        return sign | round(a / 2.0 ** (emin - mbits))
    q = round(a / 2.0 ** (e - mbits))  # in [2**mbits, 2**(mbits+1)], Python rounds half to even
    if q == 2 ** (mbits + 1):
        q, e = 2**mbits, e + 1
    return sign | ((e + bias) << mbits) | (q - 2**mbits)


def bits(t: torch.Tensor) -> list[int]:
    return t.view(torch.uint8).flatten().tolist()


def test_reference_encoder_agrees_with_hand_golden_values():
    # sanity of the test's own encoder on values worked out by hand
    assert ref_fp8_bits(1.0) == 0x38 and ref_fp8_bits(448.0) == 0x7E and ref_fp8_bits(2.0**-9) == 0x01
    assert ref_fp8_bits(57344.0, torch.float8_e5m2) == 0x7B and ref_fp8_bits(1.0, torch.float8_e5m2) == 0x3C


E4M3_GOLDEN = [  # value -> expected byte, worked out by hand (S EEEE MMM, bias 7)
    (0.0, 0x00), (-0.0, 0x80), (1.0, 0x38), (-1.0, 0xB8), (448.0, 0x7E), (-448.0, 0xFE),
    (449.0, 0x7E), (464.0, 0x7E), (1e6, 0x7E), (float("inf"), 0x7E), (float("-inf"), 0xFE),  # saturate
    (240.0, 0x77),  # 1.875 * 2^7
    (2.0**-6, 0x08),  # smallest normal
    (2.0**-9, 0x01), (-(2.0**-9), 0x81), (7 * 2.0**-9, 0x07),  # subnormals
    (2.0**-10, 0x00),  # exact tie between 0 and 2^-9 -> even (0)
    (1.5 * 2.0**-9, 0x02),  # tie between 1 and 2 (x 2^-9) -> even (2)
    (1.0625, 0x38),  # tie between 1 and 1.125 -> even mantissa (1.0)
    (1.1875, 0x3A),  # tie between 1.125 and 1.25 -> even mantissa (1.25)
]


@pytest.mark.parametrize("value,byte", E4M3_GOLDEN)
def test_e4m3_golden_values(value, byte):
    assert bits(cast_to_fp8(torch.tensor([value]))) == [byte]


def test_nan_stays_nan_and_dequantizes_to_nan():
    q = cast_to_fp8(torch.tensor([float("nan")]))
    assert bits(q)[0] & 0x7F == 0x7F  # E4M3FN NaN encoding
    assert torch.isnan(dequantize_fp8(q.reshape(1, 1), torch.tensor(2.0))).all()
    assert torch.isnan(quantize_fp8_activation(torch.tensor([[1.0, float("nan")]]), torch.tensor(1.0)).float()[0, 1])


def test_weight_quantizers_refuse_nan():
    w = torch.randn(4, 4)
    w[1, 2] = float("nan")
    for fn in (quantize_fp8_per_tensor, quantize_fp8_per_channel):
        with pytest.raises(QuantFormatError, match="NaN"):
            fn(w)


def _values(n: int) -> torch.Tensor:
    # normal values, values that land in the subnormal range after scaling, exact zeros
    x = torch.randn(n) * torch.where(torch.rand(n) < 0.2, 1e-4, 1.0)
    x[1 :: max(1, n // 7)] = 0.0
    return x


@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("n", [1, 17, 1025, 8193])
def test_per_tensor_bit_identical_to_reference(n, fmt):
    x = _values(n)
    q, scale = quantize_fp8_per_tensor(x, fp8_dtype=fmt)
    vmax = FORMATS[fmt][3]
    amax = float(x.abs().max())
    assert float(scale) == pytest.approx(amax / vmax if amax > 0 else 1.0, rel=1e-7)
    scaled = (x.float() / scale).tolist()  # the division is part of the format; encode each result by hand
    assert bits(q) == [ref_fp8_bits(v, fmt) for v in scaled]


@pytest.mark.parametrize("n", [1, 17, 1025])
def test_per_channel_bit_identical_to_reference(n):
    w = torch.stack([_values(n) * (i + 1) for i in range(3)])  # (3, n)
    q, scale = quantize_fp8_per_channel(w)
    assert scale.shape == (3,)
    for i in range(3):
        assert float(scale[i]) == pytest.approx(float(w[i].abs().max()) / 448.0, rel=1e-7)
        assert bits(q[i]) == [ref_fp8_bits(v) for v in (w[i] / scale[i]).tolist()]


def test_blockwise_bit_identical_to_reference_and_layout():
    w = torch.randn(256, 384)
    w[128:, :128] *= 100.0  # one tile with a very different range
    q, scale = quantize_fp8_blockwise(w)
    assert scale.shape == (2, 1, 3, 1)
    assert fp8_scale_granularity(w.shape, scale.shape) == "block"
    for bo in range(2):
        for bi in range(3):
            tile = w[bo * 128:(bo + 1) * 128, bi * 128:(bi + 1) * 128]
            s = scale[bo, 0, bi, 0]
            assert float(s) == pytest.approx(float(tile.abs().max()) / 448.0, rel=1e-7)
            qt = q[bo * 128:(bo + 1) * 128, bi * 128:(bi + 1) * 128]
            assert bits(qt.contiguous()) == [ref_fp8_bits(v) for v in (tile / s).flatten().tolist()]


def test_dequantize_is_w8_times_scale_for_every_granularity():
    w = torch.randn(256, 128)
    for q, s in (quantize_fp8_per_tensor(w), quantize_fp8_per_channel(w), quantize_fp8_blockwise(w)):
        d = dequantize_fp8(q, s)
        if s.dim() == 0:
            expect = q.float() * s
        elif s.dim() == 1:
            expect = q.float() * s[:, None]
        else:
            expect = q.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 2).reshape(256, 128)
        assert torch.equal(d, expect)


@pytest.mark.parametrize("kind", ["tensor", "channel"])
def test_round_trip_error_within_half_ulp(kind):
    w = torch.cat([torch.randn(32, 64), torch.distributions.StudentT(2.0).sample((32, 64))])  # heavy-tailed half
    q, s = quantize_fp8_per_tensor(w) if kind == "tensor" else quantize_fp8_per_channel(w)
    err = (dequantize_fp8(q, s) - w).abs()
    unit = s if s.dim() == 0 else s[:, None]
    # 3 mantissa bits: half ulp = 2^-4 relative for normals; subnormal spacing is 2^-9 (half: 2^-10) in scaled units
    bound = torch.maximum(w.abs() * 2.0**-4, 2.0**-10 * unit.expand_as(w))
    assert (err <= bound * (1 + 1e-6)).all()


def test_strided_equals_contiguous():
    base = torch.randn(64, 96)
    strided = base.t()[:, ::2]  # non-contiguous view
    for fn in (quantize_fp8_per_tensor, quantize_fp8_per_channel):
        qs, ss = fn(strided)
        qc, sc = fn(strided.contiguous())
        assert bits(qs.contiguous()) == bits(qc) and torch.equal(ss, sc)
    x = torch.randn(8, 32)[:, ::2]
    assert torch.equal(quantize_fp8_activation(x, torch.tensor(0.01)).view(torch.uint8),
                       quantize_fp8_activation(x.contiguous(), torch.tensor(0.01)).view(torch.uint8))


def test_zero_tensor_gives_unit_scale_and_zeros():
    for fn in (quantize_fp8_per_tensor, quantize_fp8_per_channel):
        q, s = fn(torch.zeros(3, 16))
        assert torch.all(s == 1.0)
        assert torch.equal(dequantize_fp8(q, s), torch.zeros(3, 16))


def test_static_activation_quantization_saturates_at_448():
    s = torch.tensor(0.5)
    x = torch.tensor([[1000.0, -1000.0, 1.0, 0.3]])
    xq = quantize_fp8_activation(x, s)
    assert xq.float().tolist() == [[448.0, -448.0, 2.0, 0.625]]  # 0.6 -> 0.625 (nearest E4M3 step is 1/16 there)
    assert fake_quantize_fp8_activation(x, s).tolist() == [[224.0, -224.0, 1.0, 0.3125]]


def test_bad_scale_shape_is_a_named_format_error():
    with pytest.raises(QuantFormatError, match="expected a scalar"):
        fp8_scale_granularity((16, 32), (3,))
    with pytest.raises(QuantFormatError, match="float8"):
        dequantize_fp8(torch.zeros(2, 2), torch.tensor(1.0))


def test_nan_code_scan_finds_every_nan_code_across_pieces(monkeypatch):
    import vl.quant.fp8 as fp8

    monkeypatch.setattr(fp8, "NAN_SCAN_CHUNK", 1000)  # many pieces, the last one short
    codes = torch.arange(256, dtype=torch.uint8)
    clean = codes[(codes & 0x7F) != 0x7F].repeat(40)[:10_007]  # every finite code, no NaN
    assert not has_e4m3_nan(clean.view(torch.float8_e4m3fn))
    for pos in (0, 999, 1000, 5_500, 10_006):
        for code in (0x7F, 0xFF):
            w = clean.clone()
            w[pos] = code
            assert has_e4m3_nan(w.view(torch.float8_e4m3fn).reshape(-1, 1)), (pos, code)
            assert bool(torch.isnan(w.view(torch.float8_e4m3fn).float()).any())  # what the scan stands for
