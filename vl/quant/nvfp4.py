"""NVFP4 (E2M1 values, E4M3 16-element block scales, FP32 global scale): pack, unpack, quantize, dequantize.

Follows the NVIDIA ModelOpt NVFP4 checkpoint layout (ModelOpt `NVFP4QTensor`; vLLM `modelopt.py` and
`nvfp4_emulation_utils.py`; docs/format.md §11.4):

    weight          uint8          [out, in/2]   element 2k = low nibble, 2k+1 = high nibble
    weight_scale    float8_e4m3fn  [out, in/16]  linear (not swizzled) layout
    weight_scale_2  float32        scalar        = amax(W) / (6 * 448), *multiplies*
    input_scale     float32        scalar        = amax(x) / (6 * 448), *multiplies*

    W[o, i] = LUT[code(o, i)] * float(weight_scale[o, i // 16]) * weight_scale_2

E2M1 code: bit 3 = sign, bits 0-2 index LUT = [0, 0.5, 1, 1.5, 2, 3, 4, 6]. Rounding to the grid is
round-half-to-even, written as ModelOpt's thresholds on |x|:
    <=0.25 -> 0, <0.75 -> 0.5, <=1.25 -> 1, <1.75 -> 1.5, <=2.5 -> 2, <3.5 -> 3, <=5 -> 4, else 6.
Negative values keep the sign bit even when they round to zero (code 8 = -0), as ModelOpt's `_cast_fp4`.

Block-scale edge cases (ModelOpt): a zero block gets scale 1.0 (so no 0/0), a tiny block is clamped up to
the smallest E4M3 subnormal 2^-9 instead of flushing to zero, and a block whose scale would exceed 448
(possible when the global scale is given, e.g. shared across fused layers) saturates at 448, its values
then clip at +-6.

Activation quantization for W4A4 emulation mirrors vLLM's `ref_nvfp4_quant`, which uses the reciprocal
global scale gs = 1 / input_scale (kernels divide, checkpoints multiply).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vl.errors import QuantFormatError
from vl.quant.fp8 import E4M3_MAX, cast_to_fp8

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MIN_SUBNORMAL = 2.0**-9
E2M1_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# code -> value for all 16 codes (8..15 negative; code 8 is -0).
_SIGNED_LUT = torch.tensor(E2M1_LUT + tuple(-v for v in E2M1_LUT), dtype=torch.float32)
# byte -> (value of the low nibble, value of the high nibble): dequantizes without an unpacked code tensor
_BYTE_LUT = torch.stack([_SIGNED_LUT[torch.arange(256) & 0x0F], _SIGNED_LUT[torch.arange(256) >> 4]], dim=-1)
_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)
_ROUND_UP_AT = torch.tensor([0.75, 1.75, 3.5], dtype=torch.float32)  # ties that go up (to the even code)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes (0..15) -> float32 values."""
    return _SIGNED_LUT.to(codes.device)[codes.long()]


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Round float values to E2M1 codes (uint8 0..15), saturating at +-6.

    E2M1 has no NaN: a NaN maps to code 7 (+6). Weight quantizers refuse NaN before getting here; in
    activation emulation a NaN block also has a NaN block scale, so the NaN still reaches the output.
    """
    x = x.float()
    sign = (x < 0).to(torch.uint8)
    mag = x.abs()
    # searchsorted(right=False) gives idx with bounds[idx-1] < v <= bounds[idx]: the "<=" thresholds;
    # the three "<" thresholds (ties rounding up to an even code) get +1 when hit exactly.
    code = torch.searchsorted(_BOUNDS.to(x.device), mag.contiguous()).to(torch.uint8)
    code = code + torch.isin(mag, _ROUND_UP_AT.to(x.device)).to(torch.uint8)
    return (sign << 3) | code


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Values on the E2M1 grid (float32), i.e. e2m1_values(e2m1_codes(x))."""
    return e2m1_values(e2m1_codes(x))


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 (..., n) with n even -> packed uint8 (..., n/2); element 2k in the low nibble."""
    if codes.shape[-1] % 2:
        raise QuantFormatError(f"pack_fp4: expected an even last dimension, found shape {tuple(codes.shape)}")
    if codes.dtype != torch.uint8:
        raise QuantFormatError(f"pack_fp4: expected uint8 codes, found {codes.dtype}")
    if codes.numel() and int(codes.max()) > 15:
        raise QuantFormatError("pack_fp4: expected 4-bit codes (0..15), found a value above 15")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """packed uint8 (..., n/2) -> codes uint8 (..., n)."""
    if packed.dtype != torch.uint8:
        raise QuantFormatError(f"unpack_fp4: expected uint8 packed weight, found {packed.dtype}")
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def nvfp4_global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """weight_scale_2 / input_scale convention: amax / (6 * 448); 1.0 for a zero amax (all-zero tensor)."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    return torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))


def _check_blocks(w: torch.Tensor, what: str) -> None:
    if w.dim() < 1 or w.shape[-1] % BLOCK:
        raise QuantFormatError(
            f"{what}: expected the last (input) dimension divisible by {BLOCK}, found shape {tuple(w.shape)}"
        )


def nvfp4_block_scales(
    w: torch.Tensor, weight_scale_2: torch.Tensor, block_2d: bool = False
) -> torch.Tensor:
    """E4M3 block scales (..., in/16) = e4m3(clamp(block_amax / (6 * weight_scale_2), 2^-9, 448)), 1.0 for zero blocks.

    block_2d: 16x16 tiles (rows x input) share one scale (TE NVFP4 weight recipe); the result keeps the
    plain [out, in/16] checkpoint layout (rows of a tile repeat the value), so any reader decodes it.
    """
    _check_blocks(w, "nvfp4_block_scales")
    blocks = w.float().reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1)  # (..., in/16)
    if block_2d:
        if w.dim() != 2 or w.shape[0] % BLOCK:
            raise QuantFormatError(
                f"2-D NVFP4 blocks need a 2-D weight with rows divisible by {BLOCK}, found shape {tuple(w.shape)}"
            )
        out_f, nb = amax.shape
        amax = amax.reshape(out_f // BLOCK, BLOCK, nb).amax(dim=1, keepdim=True).expand(-1, BLOCK, -1)
        amax = amax.reshape(out_f, nb)
    scale = amax / (E2M1_MAX * weight_scale_2.float().reshape(()))
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return scale.clamp(E4M3_MIN_SUBNORMAL, E4M3_MAX).to(torch.float8_e4m3fn)


def quantize_nvfp4(
    w: torch.Tensor,
    weight_scale_2: torch.Tensor | float | None = None,
    block_2d: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w (..., in) -> (packed uint8 (..., in/2), weight_scale e4m3 (..., in/16), weight_scale_2 float32 0-d)."""
    _check_blocks(w, "quantize_nvfp4")
    if not bool(torch.isfinite(w).all()):
        raise QuantFormatError("quantize_nvfp4: expected finite weights, found NaN or Inf; fix the source weights")
    if weight_scale_2 is None:
        weight_scale_2 = nvfp4_global_scale(w.detach().abs().amax())
    ws2 = torch.as_tensor(weight_scale_2, dtype=torch.float32, device=w.device).reshape(())
    scales = nvfp4_block_scales(w, ws2, block_2d=block_2d)  # (..., in/16) e4m3
    blocks = w.float().reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)
    scaled = blocks / (scales.float() * ws2).unsqueeze(-1)  # beyond +-6 only when a scale saturated
    codes = e2m1_codes(scaled.reshape(w.shape))
    return pack_fp4(codes), scales, ws2


def dequantize_nvfp4(
    packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """W = LUT[code] * float(weight_scale[o, i // 16]) * weight_scale_2, computed in float32, cast once."""
    check_nvfp4_shapes(packed.shape, weight_scale.shape, weight_scale.dtype)
    if packed.dtype != torch.uint8:
        raise QuantFormatError(f"dequantize_nvfp4: expected a uint8 packed weight, found {packed.dtype}")
    in_f = packed.shape[-1] * 2
    pairs = F.embedding(packed.int(), _BYTE_LUT.to(packed.device))  # (..., in/2, 2): (even, odd) element
    vals = pairs.reshape(*packed.shape[:-1], in_f // BLOCK, BLOCK)
    s = weight_scale.float().to(vals.device) * weight_scale_2.float().to(vals.device).reshape(())
    return (vals * s.unsqueeze(-1)).reshape(*packed.shape[:-1], in_f).to(dtype)


def check_nvfp4_shapes(packed_shape, scale_shape, scale_dtype: torch.dtype, name: str = "") -> None:
    """weight [.., in/2] and weight_scale [.., in/16] e4m3 must agree; raises QuantFormatError naming `name`."""
    where = f"{name}: " if name else ""
    packed_shape, scale_shape = tuple(packed_shape), tuple(scale_shape)
    in_f = packed_shape[-1] * 2 if packed_shape else 0
    expected = packed_shape[:-1] + (in_f // BLOCK,)
    if in_f % BLOCK or scale_shape != expected:
        raise QuantFormatError(
            f"{where}NVFP4 weight_scale: expected shape {expected} (one scale per {BLOCK} inputs of a packed "
            f"weight {packed_shape}), found {scale_shape}"
        )
    if scale_dtype != torch.float8_e4m3fn:
        raise QuantFormatError(f"{where}NVFP4 weight_scale: expected dtype float8_e4m3fn, found {scale_dtype}")


def ref_nvfp4_quant(x: torch.Tensor, input_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference W4A4 activation quantization (vLLM `ref_nvfp4_quant` with gs = 1 / input_scale).

    x (..., K) with K % 16 == 0 -> (values on the E2M1 grid float32 (..., K), block scales float32 (..., K/16)).
    Dequantized activation = values * scale / gs. Unlike weights there is no 2^-9 floor: a zero or tiny
    block gets scale 0 and its values become 0 (reciprocal of 0 is taken as 0), never NaN.
    """
    _check_blocks(x, "ref_nvfp4_quant")
    gs = 1.0 / input_scale.float().reshape(())
    blocks = x.float().reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)  # (..., K/16, 1)
    scale = cast_to_fp8(gs * (amax / E2M1_MAX)).float()  # clamp +-448, e4m3 round
    denom = scale / gs
    out_scale = torch.where(denom == 0, torch.zeros_like(denom), 1.0 / denom)
    vals = round_to_e2m1(torch.clamp(blocks * out_scale, -E2M1_MAX, E2M1_MAX))
    return vals.reshape(x.shape), scale.squeeze(-1)


def fake_quantize_nvfp4_activation(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """W4A4 emulation: the activation the FP4 GEMM effectively sees, back in x's dtype."""
    vals, scale = ref_nvfp4_quant(x, input_scale)
    gs = 1.0 / input_scale.float().reshape(())
    blocks = vals.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
    return (blocks * (scale / gs).unsqueeze(-1)).reshape(x.shape).to(x.dtype)  # vLLM: sf / global_scale
