"""FP8 (E4M3 / E5M2) quantize and dequantize as pure tensor functions.

Follows the NVIDIA ModelOpt FP8 checkpoint layout as read by vLLM (`modelopt.py`,
`ModelOptFp8LinearMethod`; docs/format.md §11.3):

    weight        float8_e4m3fn [out, in]
    weight_scale  float32 scalar (per tensor) | [out] (per channel) | [out/128, 1, in/128, 1] (block, FP8_PB_WO)
    input_scale   float32 scalar, static activation scale

    dequant:    W  = float(W8) * weight_scale                  (scales multiply)
    activation: xq = e4m3(clamp(x / input_scale, -448, 448))
    GEMM:       y  = (xq @ W8^T) * (input_scale * weight_scale)

Casting rules (the same on every device, whatever torch's own cast does out of range):
- values are divided in float32, then clamped to +-max (448 for E4M3, 57344 for E5M2), then cast with
  round-to-nearest-even. So +-inf and finite overflow *saturate* to +-max (E4M3FN has no infinity;
  E5M2 has one but ModelOpt-style saturation is kept for both).
- NaN stays NaN (E4M3FN encodes it as 0x7F/0xFF) and dequantizes to NaN. Weight quantizers refuse
  non-finite weights instead (a NaN amax would poison the whole tensor's scale); activations are not
  checked in the hot path, so a NaN activation propagates as NaN, as it would in BF16.
- a zero amax gives scale 1.0 (any positive scale represents an all-zero tensor), never 0 or NaN.
"""

from __future__ import annotations

import torch

from vl.errors import QuantFormatError

E4M3_MAX = 448.0
E5M2_MAX = 57344.0
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_BLOCK = 128  # ModelOpt FP8_PB_WO block edge


def fp8_max(fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> float:
    if fp8_dtype == torch.float8_e4m3fn:
        return E4M3_MAX
    if fp8_dtype == torch.float8_e5m2:
        return E5M2_MAX
    raise QuantFormatError(f"expected an FP8 dtype (float8_e4m3fn or float8_e5m2), found {fp8_dtype}")


def cast_to_fp8(x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """Saturating round-to-nearest-even cast (see the module docstring for inf/NaN)."""
    m = fp8_max(fp8_dtype)
    return x.float().clamp(-m, m).to(fp8_dtype)


def _safe_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    amax = amax.float()
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


def _require_finite(w: torch.Tensor, what: str) -> None:
    if not bool(torch.isfinite(w).all()):
        raise QuantFormatError(
            f"{what}: expected finite values to quantize, found NaN or Inf; fix the source weights first"
        )


def quantize_fp8_per_tensor(
    w: torch.Tensor, scale: torch.Tensor | float | None = None, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (w8 same shape, scale float32 0-d). scale = amax / max unless given."""
    if scale is None:
        _require_finite(w, "quantize_fp8_per_tensor")
        scale = _safe_scale(w.detach().abs().amax(), fp8_max(fp8_dtype))
    scale = torch.as_tensor(scale, dtype=torch.float32, device=w.device).reshape(())
    return cast_to_fp8(w.float() / scale, fp8_dtype), scale


def quantize_fp8_per_channel(
    w: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per output row: w (out, in) -> (w8 (out, in), scale float32 (out,))."""
    if w.dim() != 2:
        raise QuantFormatError(f"per-channel FP8 expects a 2-D weight (out, in), found shape {tuple(w.shape)}")
    _require_finite(w, "quantize_fp8_per_channel")
    scale = _safe_scale(w.detach().abs().amax(dim=1), fp8_max(fp8_dtype))  # (out,)
    return cast_to_fp8(w.float() / scale[:, None], fp8_dtype), scale


def quantize_fp8_blockwise(
    w: torch.Tensor, block: int = FP8_BLOCK, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """block x block tiles: w (out, in) -> (w8, scale float32 (out/b, 1, in/b, 1)) as ModelOpt FP8_PB_WO."""
    out_f, in_f = _check_block_shape(w.shape, block)
    _require_finite(w, "quantize_fp8_blockwise")
    tiles = w.float().reshape(out_f // block, block, in_f // block, block)
    scale = _safe_scale(tiles.abs().amax(dim=(1, 3), keepdim=True), fp8_max(fp8_dtype))  # (ob, 1, ib, 1)
    return cast_to_fp8(tiles / scale, fp8_dtype).reshape(out_f, in_f), scale


def _check_block_shape(shape, block: int) -> tuple[int, int]:
    if len(shape) != 2 or shape[0] % block or shape[1] % block:
        raise QuantFormatError(
            f"block FP8 expects a 2-D weight with both dims divisible by {block}, found shape {tuple(shape)}"
        )
    return int(shape[0]), int(shape[1])


def fp8_scale_granularity(weight_shape, scale_shape) -> str:
    """'tensor' | 'channel' | 'block' from the scale's shape, or QuantFormatError saying what fits."""
    weight_shape, scale_shape = tuple(weight_shape), tuple(scale_shape)
    numel = 1
    for s in scale_shape:
        numel *= s
    if numel == 1 and len(scale_shape) <= 1:
        return "tensor"
    if len(weight_shape) == 2:
        out_f, in_f = weight_shape
        if scale_shape in ((out_f,), (out_f, 1)):
            return "channel"
        if (
            len(scale_shape) == 4
            and scale_shape[1] == 1
            and scale_shape[3] == 1
            and scale_shape[0] * FP8_BLOCK == out_f
            and scale_shape[2] * FP8_BLOCK == in_f
        ):
            return "block"
    raise QuantFormatError(
        f"FP8 weight_scale: expected a scalar, [out] / [out, 1] or [out/128, 1, in/128, 1] for a weight of "
        f"shape {weight_shape}, found shape {scale_shape}"
    )


def dequantize_fp8(w8: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W = float(W8) * weight_scale for any granularity above; computed in float32, then cast once."""
    if w8.dtype not in FP8_DTYPES:
        raise QuantFormatError(f"dequantize_fp8: expected float8_e4m3fn/float8_e5m2 weight, found {w8.dtype}")
    kind = fp8_scale_granularity(w8.shape, weight_scale.shape)
    w = w8.float()
    s = weight_scale.float().to(w.device)
    if kind == "tensor":
        out = w * s.reshape(())
    elif kind == "channel":
        out = w * s.reshape(-1, 1)
    else:
        ob, _, ib, _ = s.shape
        out = (w.reshape(ob, FP8_BLOCK, ib, FP8_BLOCK) * s).reshape(w.shape)
    return out.to(dtype)


NAN_SCAN_CHUNK = 1 << 20  # codes per step of `has_e4m3_nan`: its temporary stays 1 MiB, in cache


def has_e4m3_nan(w8: torch.Tensor) -> bool:
    """Whether an E4M3 tensor holds a NaN code (0x7F / 0xFF: all exponent and mantissa bits set). One pass at
    ~13 GB/s on one core, in cache-sized pieces; `((w & 0x7F) == 0x7F).any()` on the whole tensor ran at
    0.4 GB/s (a 12B model's first decode step spent ~20 s in it)."""
    flat = w8.reshape(-1).view(torch.uint8)
    return any(int((flat[i:i + NAN_SCAN_CHUNK] & 0x7F).amax()) == 0x7F for i in range(0, flat.numel(), NAN_SCAN_CHUNK))


def quantize_fp8_activation(
    x: torch.Tensor, input_scale: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> torch.Tensor:
    """Static activation quantization: xq = e4m3(clamp(x / input_scale, +-448)). Same shape as x."""
    return cast_to_fp8(x.float() / input_scale.float().reshape(()), fp8_dtype)


def fake_quantize_fp8_activation(x: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """W8A8 emulation: the value the GEMM sees, xq * input_scale, back in x's dtype."""
    s = input_scale.float().reshape(())
    return (quantize_fp8_activation(x, s).float() * s).to(x.dtype)


def fp8_scale_from_amax(amax: torch.Tensor | float, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """input_scale / weight_scale convention of ModelOpt: amax / 448 (1.0 for a zero amax)."""
    return _safe_scale(torch.as_tensor(amax, dtype=torch.float32), fp8_max(fp8_dtype))
