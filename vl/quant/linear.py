"""Quantized Linear modules and the pass that swaps them into a model.

Model code stays plain math (gpt-fast style): quantization is a pass applied from outside,
`swap_quantized_linears(model, state_dict_or_specs, mode)`. The modules keep the ModelOpt checkpoint
names as their state-dict keys (`weight`, `weight_scale`, `weight_scale_2`, `input_scale`, `bias`), so
loading and saving use the checkpoint's own names.

Execution modes (peer practice, docs/format.md §11.6: a one-time notice, never a hard error on
an older GPU unless "native" was asked for explicitly):
- "dequantize":  expand once to `compute_dtype`; the result is a plain nn.Linear (BF16-sized memory).
- "weight-only": keep packed FP8 / FP4 weights + scales resident; dequantize per forward in the
                 activation dtype (an NVFP4 model holds ~1/4 of its BF16 weight bytes). The pure-torch
                 reference path and the CPU default; on the CPU, products of up to 16 rows (decode) run the
                 fused dequantize + dot kernel of vl/kernels/gemv.py instead (same weights, float32 sums).
- "native":      FP8 through `torch._scaled_mm` (CUDA capability >= 8.9, per-tensor scales); raises
                 QuantUnavailableError when that is not possible. Native NVFP4 GEMM is not implemented.
- "auto":        per forward, native FP8 when the input is on a capable GPU, else weight-only.
`emulate_activations=True` also quantizes inputs the way the checkpoint's W8A8 / W4A4 kernels would
(static `input_scale`), so CPU runs can reproduce the numerics of the quantized GEMM.
"""

from __future__ import annotations

import abc
import functools
import logging
from dataclasses import dataclass, field
from typing import Mapping

import torch
import torch.nn as nn

from vl.errors import CheckpointError, ConfigError
from vl.kernels import gemm, gemv
from vl.quant.config import (
    QUANT_SUFFIXES,
    LinearQuantSpec,
    QuantFormatError,
    QuantUnavailableError,
    detect_quantized_linears,
)
from vl.quant.fp8 import (
    E4M3_MAX,
    FP8_BLOCK,
    cast_to_fp8,
    dequantize_fp8,
    fake_quantize_fp8_activation,
    has_e4m3_nan,
)
from vl.quant.nvfp4 import dequantize_nvfp4, fake_quantize_nvfp4_activation

log = logging.getLogger(__name__)

MODES = ("auto", "weight-only", "native", "dequantize")
# weight rows multiplied per GEMM call in a many-row forward (multiple of 128), fewer for wide inputs: a row block
# holds at most DEQUANT_CHUNK_ELEMS weights (a 12B down_proj's 2048 x 20480 block was 80 MiB of bf16; 384 rows: 15)
DEQUANT_CHUNK_ROWS = 2048
DEQUANT_CHUNK_ELEMS = 8 * 1024 * 1024
# weight elements expanded at a time inside such a row block: the formats' float32 / int32 temporaries stay
# ~16 MiB each instead of growing with the row block (a 12B down_proj's 2048 rows: 0.5 GB of them at once)
DEQUANT_BLOCK_ELEMS = 4 * 1024 * 1024
_NOTICED: set[tuple] = set()


def _notice_once(key: tuple, msg: str, *args) -> None:
    if key not in _NOTICED:
        _NOTICED.add(key)
        log.info(msg, *args)


def native_fp8_support(device: torch.device | str | None = None) -> tuple[bool, str]:
    """(available, why) for FP8 `torch._scaled_mm` on `device` (default: current CUDA device)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device in this process"
    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda":
        return False, f"tensors are on {device.type}, not CUDA"
    if not hasattr(torch, "_scaled_mm"):
        return False, f"torch {torch.__version__} has no torch._scaled_mm"
    cap = _capability(device.index if device.index is not None else torch.cuda.current_device())
    if cap < (8, 9):
        return False, f"CUDA capability {cap[0]}.{cap[1]} < 8.9 (FP8 tensor cores start at Ada/Hopper)"
    return True, f"CUDA capability {cap[0]}.{cap[1]}"


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


class QuantizedLinear(nn.Module, abc.ABC):
    """Shared parts: checkpoint-named buffers, dtype-checked loading, mode dispatch."""

    fmt = ""

    def __init__(self, spec: LinearQuantSpec, mode: str = "weight-only", emulate_activations: bool = False,
                 device=None, bias_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        if mode not in ("auto", "weight-only", "native"):
            raise ConfigError(f"{spec.name}: quantized Linear mode must be auto / weight-only / native, found {mode!r}")
        if emulate_activations and not spec.has_input_scale:
            raise QuantFormatError(
                f"{spec.name}.input_scale: missing; activation emulation needs the static input scale. "
                "Run without emulate_activations (weight-only), or export with calibration amaxes."
            )
        self.name = spec.name
        self.in_features = spec.in_features
        self.out_features = spec.out_features
        self.mode = mode
        self.emulate_activations = emulate_activations
        self.granularity = spec.fp8_granularity
        for suffix, dtype in self._stored(spec):
            shape = spec.shapes[suffix] if suffix in spec.shapes else self._default_shape(suffix, spec)
            self.register_buffer(suffix, torch.empty(shape, dtype=dtype, device=device))
        if not spec.has_input_scale:
            self.register_buffer("input_scale", None)  # attribute exists, no state-dict key
        if spec.has_bias:
            self.bias = nn.Parameter(torch.zeros(spec.out_features, dtype=bias_dtype, device=device),
                                     requires_grad=False)
        else:
            self.bias = None

    # --- subclasses fill in -----------------------------------------------------------------------
    @abc.abstractmethod
    def _stored(self, spec):  # -> [(suffix, dtype)]
        """The tensors this format stores, as (suffix, dtype)."""

    def _default_shape(self, suffix, spec):
        return ()

    @abc.abstractmethod
    def dequantized_rows(self, r0: int, r1: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Output rows r0:r1 of the weight expanded to `dtype`, exactly as the checkpoint's packed values and
        scales give them (r0 a multiple of 128 or 0, so a block-scaled row block is whole)."""

    def _dequantized_block(self, r0: int, r1: int, dtype: torch.dtype) -> torch.Tensor:
        """`dequantized_rows(r0, r1, dtype)`, expanded a multiple of 128 rows at a time into one tensor of
        `dtype`: the same values (each weight is expanded on its own), with bounded temporaries."""
        if (dtype in (torch.float32, torch.bfloat16) and self.weight.device.type == "cpu"
                and not torch.compiler.is_compiling()):
            kern = gemv.kernel()
            out = self._expanded(kern, r0, r1, dtype) if kern is not None else None
            if out is not None:  # the packed kernel's expansion: the same values, one lookup per weight
                return out
        step = max(FP8_BLOCK, DEQUANT_BLOCK_ELEMS // max(self.in_features, 1) // FP8_BLOCK * FP8_BLOCK)
        if r1 - r0 <= step:
            return self.dequantized_rows(r0, r1, dtype)
        out = torch.empty(r1 - r0, self.in_features, dtype=dtype, device=self.weight.device)
        for s in range(r0, r1, step):
            e = min(s + step, r1)
            out[s - r0:e - r0] = self.dequantized_rows(s, e, dtype)
        return out

    def _expanded(self, kern, r0: int, r1: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Rows r0:r1 expanded by the packed kernel (vl/kernels/gemv.py), or None where it does not read them."""
        return None

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight expanded to `dtype`, exactly as the checkpoint's packed values and scales give it."""
        return _by_row_chunks(lambda r0, r1: self.dequantized_rows(r0, r1, dtype), self.out_features,
                              self.in_features, dtype, self.weight.device)

    @abc.abstractmethod
    def _fake_quant_input(self, x):
        """The input rounded through the format's static input scale (what the native W8A8 / W4A4 kernels see)."""

    def _native(self, x):
        raise QuantUnavailableError(
            f"{self.name}: native {self.fmt.upper()} GEMM is not implemented; use mode 'weight-only' "
            "(dequantize per forward) or 'dequantize'"
        )

    def _native_ok(self, x) -> tuple[bool, str]:
        return False, f"native {self.fmt.upper()} GEMM is not implemented"

    # --- shared -----------------------------------------------------------------------------------
    def packed_operands(self) -> dict | None:
        """The packed tensors as the CPU kernels read them (`kernels/quant_gemv.cpp`, also through the fused decode
        step of vl/runtime/cpu/decode.py), or None where this layer's bytes must take the reference path."""
        return None

    def _fused_layer(self, kern):  # -> call(x2, round_bf16) -> (M, out) float32, or None when this layer cannot
        return None

    def _fused_gemv(self, x2, kern, round_bf16):  # -> (M, out) float32, or None when this layer cannot
        # the layer's kernel call is bound once per (kernel, tensors, tensor versions): decode calls every layer
        # once per token, and re-deriving pointers, scales and checks each time cost more than a small layer's maths
        bufs = tuple(b for b in self._buffers.values() if b is not None)
        key = (kern,) + bufs + tuple(b._version for b in bufs)
        cached = self.__dict__.get("_fused_cache")
        if cached is None or len(cached[0]) != len(key) or any(a is not b for a, b in zip(cached[0], key)):
            cached = self.__dict__["_fused_cache"] = (key, self._fused_layer(kern))
        call = cached[1]
        return None if call is None or x2.shape[0] > call.max_rows(round_bf16) else call(x2, round_bf16)

    def _weight_only(self, x):
        if self.emulate_activations:
            x = self._fake_quant_input(x)
        rows = x.numel() // self.in_features if self.in_features else 0
        if (x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and 0 < rows <= gemv.TILE_MAX_ROWS
                and not torch.compiler.is_compiling() and not (torch.is_grad_enabled() and x.requires_grad)):
            kern = gemv.kernel()
            if kern is not None:  # few rows (decode, short prompts on tiles): read the packed bytes once (gemv.py)
                x2 = x.reshape(rows, self.in_features)  # the kernel wrapper casts as it needs
                y = self._fused_gemv(x2, kern, x.dtype == torch.bfloat16)
                if y is not None:
                    if self.bias is not None:
                        y = y + self.bias.float()
                    return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        b = self.bias.to(x.dtype) if self.bias is not None else None
        blocks = row_blocks(self.out_features, self.in_features)
        if len(blocks) == 1:
            return gemm.linear(x, self._dequantized_block(0, self.out_features, x.dtype), b)
        # large layers (prefill): one row block of the weight at a time into its slice of the output, so the
        # transient is one block, not the whole layer in the compute dtype (a 12B MLP is 210 MB in bf16); the rows
        # padded to the GEMM's rounded count once for all blocks, not once per block
        xp = gemm.padded_rows(x.reshape(rows, self.in_features))
        y = x.new_empty(xp.shape[0], self.out_features)
        for r0, r1 in blocks:
            y[:, r0:r1] = gemm.linear(xp, self._dequantized_block(r0, r1, x.dtype), b[r0:r1] if b is not None else None)
        return y[:rows].reshape(*x.shape[:-1], self.out_features)

    def forward(self, x):  # (..., in) -> (..., out)
        if self.mode == "weight-only":
            return self._weight_only(x)
        ok, why = self._native_ok(x)
        if self.mode == "native":
            if not ok:
                raise QuantUnavailableError(
                    f"{self.name}: native {self.fmt.upper()} execution requested but unavailable: {why}. "
                    "Use mode 'auto' or 'weight-only'."
                )
            return self._native(x)
        path = "native" if ok else "weight-only"
        _notice_once((self.fmt, path, why), "vl.quant: %s Linears (auto) run %s: %s", self.fmt.upper(), path, why)
        return self._native(x) if ok else self._weight_only(x)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # torch's copy_ would silently convert a wrong dtype (e.g. a BF16 tensor into the uint8 buffer);
        # the checkpoint contract says a wrong dtype is an error naming the tensor (docs/reliability_policy.md row C7).
        for suffix in QUANT_SUFFIXES + ("weight",):
            key = prefix + suffix
            buf = getattr(self, suffix, None)
            if key in state_dict and isinstance(buf, torch.Tensor) and state_dict[key].dtype != buf.dtype:
                raise QuantFormatError(f"{key}: expected dtype {buf.dtype}, found {state_dict[key].dtype}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def _apply(self, fn, recurse=True):
        # nn.Module.to(dtype) / .half() cast every floating buffer, and float8 counts as floating: that would
        # turn packed weights and float32 scales into BF16. Quantized tensors follow device moves only.
        bufs = {n: b for n, b in self._buffers.items() if b is not None}
        for n in bufs:
            self._buffers[n] = None
        try:
            super()._apply(fn, recurse)  # parameters (bias) follow the requested dtype as usual
        finally:
            for n, b in bufs.items():
                target = fn(torch.empty(0, dtype=b.dtype, device=b.device)).device  # probe the move
                self._buffers[n] = b if b.device == target else b.to(target)
        return self

    def extra_repr(self) -> str:
        extra = f", granularity={self.granularity}" if self.granularity else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fmt={self.fmt}{extra}, mode={self.mode}, emulate_activations={self.emulate_activations}")


def row_block(in_features: int) -> int:
    """Weight rows per block in a many-row forward: DEQUANT_CHUNK_ROWS, fewer for wide inputs (at most
    DEQUANT_CHUNK_ELEMS weights), a multiple of 128 (a 128 x 128 scale block is never split)."""
    return max(FP8_BLOCK, min(DEQUANT_CHUNK_ROWS, DEQUANT_CHUNK_ELEMS // max(in_features, 1) // FP8_BLOCK * FP8_BLOCK))


def row_blocks(out_f: int, in_f: int) -> list[tuple[int, int]]:
    """The (r0, r1) row blocks of a layer's weight that a many-row forward takes one at a time (`row_block` rows)."""
    step = row_block(in_f)
    return [(r0, min(r0 + step, out_f)) for r0 in range(0, max(out_f, 1), step)]


def _by_row_chunks(rows, out_f: int, in_f: int, dtype, device) -> torch.Tensor:
    """Dequantize row blocks into one output (rows are independent, so the result equals one big call)."""
    blocks = row_blocks(out_f, in_f)
    if len(blocks) == 1:
        return rows(0, out_f)
    out = torch.empty(out_f, in_f, dtype=dtype, device=device)
    for r0, r1 in blocks:
        out[r0:r1] = rows(r0, r1)
    return out


class FP8Linear(QuantizedLinear):
    """ModelOpt FP8: weight float8 [out, in], weight_scale float32 (scalar | [out] | block), input_scale scalar."""

    fmt = "fp8"

    def _stored(self, spec):
        out = [("weight", spec.weight_dtype), ("weight_scale", torch.float32)]
        return out + ([("input_scale", torch.float32)] if spec.has_input_scale else [])

    def _default_shape(self, suffix, spec):
        return (spec.out_features, spec.in_features) if suffix == "weight" else ()

    def dequantized_rows(self, r0, r1, dtype=torch.float32):
        s = self.weight_scale
        if self.granularity == "channel":
            s = s[r0:r1]
        elif self.granularity == "block":
            s = s[r0 // FP8_BLOCK:(r1 + FP8_BLOCK - 1) // FP8_BLOCK]
        return dequantize_fp8(self.weight[r0:r1], s, dtype)

    def _fake_quant_input(self, x):
        return fake_quantize_fp8_activation(x, self.input_scale)

    def packed_operands(self) -> dict | None:
        w = self.weight
        if not (w.dtype == torch.float8_e4m3fn and w.device.type == "cpu" and w.is_contiguous() and self._nan_free()):
            return None
        return {"fmt": "fp8", "weight": w, "scale": self.weight_scale.float().contiguous(),
                "kind": self.granularity or "tensor"}

    def _expanded(self, kern, r0, r1, dtype):
        w, s = self.weight, self.weight_scale
        if not (w.dtype == torch.float8_e4m3fn and w.is_contiguous() and s.device.type == "cpu"):
            return None
        scale = self.__dict__.get("_scale_f32")
        if scale is None or scale[0] is not s or scale[1] != s._version:
            scale = self.__dict__["_scale_f32"] = (s, s._version, s.float().contiguous())
        return kern.fp8_expand(w, scale[2], self.granularity or "tensor", r0, r1, dtype)

    def _nan_free(self) -> bool:
        """No NaN code (0x7F / 0xFF) in the weight, which the kernels do not decode (they take the reference path).
        A scan of the whole weight, so remembered per weight tensor and version."""
        w = self.weight
        memo = self.__dict__.get("_nan_memo")
        if memo is None or memo[0] is not w or memo[1] != w._version:
            memo = self.__dict__["_nan_memo"] = (w, w._version, not has_e4m3_nan(w))
        return memo[2]

    def _fused_layer(self, kern):
        ops = self.packed_operands()
        return None if ops is None else kern.fp8_layer(ops["weight"], ops["scale"], ops["kind"])

    def _native_ok(self, x):
        ok, why = native_fp8_support(x.device)
        if not ok:
            return ok, why
        if self.granularity != "tensor" or self.weight.dtype != torch.float8_e4m3fn:
            return False, (f"native path covers per-tensor E4M3 only "
                           f"(this layer: {self.granularity}, {self.weight.dtype})")
        if self.in_features % 16 or self.out_features % 16:
            return False, (f"torch._scaled_mm needs in/out features divisible by 16, "
                           f"found {self.in_features}/{self.out_features}")
        return True, why

    def _native(self, x):
        """W8A8 as the checkpoint's kernel: xq = e4m3(clamp(x / s_in)); y = (xq @ W8^T) * s_in * s_w (+ bias)."""
        x2 = x.reshape(-1, self.in_features)  # (M, in)
        if self.input_scale is not None:
            s_in = self.input_scale.float().reshape(())
        else:  # dynamic per-tensor scale, as ModelOpt FP8 without calibration
            s_in = (x2.abs().amax().float() / E4M3_MAX).clamp(min=torch.finfo(torch.float32).tiny)
        xq = cast_to_fp8(x2.float() / s_in)  # divide in fp32: one rounding (to e4m3), as the emulation does
        out_dtype = x.dtype if x.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16
        y = torch._scaled_mm(xq, self.weight.t(), scale_a=s_in, scale_b=self.weight_scale.float().reshape(()),
                             out_dtype=out_dtype)
        if isinstance(y, tuple):  # older torch returned (out, amax)
            y = y[0]
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class NVFP4Linear(QuantizedLinear):
    """ModelOpt NVFP4: weight uint8 [out, in/2], weight_scale e4m3 [out, in/16], weight_scale_2 / input_scale fp32."""

    fmt = "nvfp4"

    def _stored(self, spec):
        out = [("weight", torch.uint8), ("weight_scale", torch.float8_e4m3fn), ("weight_scale_2", torch.float32)]
        return out + ([("input_scale", torch.float32)] if spec.has_input_scale else [])

    def _default_shape(self, suffix, spec):
        if suffix == "weight":
            return (spec.out_features, spec.in_features // 2)
        if suffix == "weight_scale":
            return (spec.out_features, spec.in_features // 16)
        return ()

    def dequantized_rows(self, r0, r1, dtype=torch.float32):
        return dequantize_nvfp4(self.weight[r0:r1], self.weight_scale[r0:r1], self.weight_scale_2, dtype)

    def _fake_quant_input(self, x):
        return fake_quantize_nvfp4_activation(x, self.input_scale)

    def _expanded(self, kern, r0, r1, dtype):
        ops = self.packed_operands()
        return None if ops is None else kern.nvfp4_expand(ops["weight"], ops["block_scale"], ops["global_scale"],
                                                          r0, r1, dtype)

    def packed_operands(self) -> dict | None:
        w, s = self.weight, self.weight_scale
        if not (w.device.type == "cpu" and w.is_contiguous() and s.is_contiguous() and self.in_features % 16 == 0):
            return None
        return {"fmt": "nvfp4", "weight": w, "block_scale": s, "global_scale": float(self.weight_scale_2)}

    def _fused_layer(self, kern):
        ops = self.packed_operands()
        return None if ops is None else kern.nvfp4_layer(ops["weight"], ops["block_scale"], ops["global_scale"])


_MODULE_FOR = {"fp8": FP8Linear, "nvfp4": NVFP4Linear}


@dataclass
class SwapReport:
    mode: str
    modules: dict[str, str] = field(default_factory=dict)  # module name -> fmt
    consumed_keys: set[str] = field(default_factory=set)  # state-dict keys now held by the swapped modules


def _mode_notice(mode: str, fmts: set[str], n: int, emulate: bool) -> str:
    parts = []
    if mode == "dequantize":
        parts.append("dequantized once to plain Linear weights (full-size memory)")
    elif mode == "weight-only":
        parts.append("weight-only: packed weights stay resident; few-row products (decode) run the fused CPU "
                     "kernel where it builds, others dequantize per forward")
    elif mode == "native":
        parts.append("native: FP8 torch._scaled_mm (errors if the device cannot)")
    else:
        parts.append("auto: per forward, native where the device allows it, otherwise weight-only")
        if "fp8" in fmts:
            ok, why = native_fp8_support()
            parts.append("FP8 uses torch._scaled_mm on CUDA >= 8.9" + (f" ({why})" if ok else f" (not here: {why})"))
        if "nvfp4" in fmts:
            parts.append("NVFP4 runs weight-only (native NVFP4 GEMM not implemented)")
    if emulate:
        parts.append("inputs are quantized with the static input_scale (W8A8/W4A4 emulation)")
    return f"vl.quant: {n} {'/'.join(sorted(f.upper() for f in fmts))} Linears, " + "; ".join(parts)


def swap_quantized_linears(
    model: nn.Module,
    source: Mapping[str, torch.Tensor] | Mapping[str, LinearQuantSpec],
    mode: str = "auto",
    *,
    compute_dtype: torch.dtype = torch.bfloat16,
    emulate_activations: bool = False,
    prefix: str = "",
) -> SwapReport:
    """Replace the model's nn.Linear modules that the checkpoint stores quantized.

    source: a state dict (quantized tensors are detected per module and moved into the new modules;
    the caller loads the remaining keys, e.g. those not in `report.consumed_keys`) or a
    {module name: LinearQuantSpec} map from `detect_quantized_linears` (empty modules to be filled by a
    later `model.load_state_dict`). `prefix` is stripped from state-dict keys / spec names to reach
    model module names (e.g. "" when they already match).
    mode "dequantize" returns plain nn.Linear modules in `compute_dtype` and so needs the tensors.
    """
    if mode not in MODES:
        raise ConfigError(f"quantized Linear mode: expected one of {MODES}, found {mode!r}")
    values = list(source.values())
    is_specs = bool(values) and all(isinstance(v, LinearQuantSpec) for v in values)
    specs = dict(source) if is_specs else detect_quantized_linears(source)
    if is_specs and mode == "dequantize":
        raise ConfigError("mode 'dequantize' needs the checkpoint tensors: pass the state dict, not specs")
    if mode == "native" and any(s.fmt == "nvfp4" for s in specs.values()):
        raise QuantUnavailableError(
            "mode 'native': native NVFP4 GEMM is not implemented; use 'auto' or 'weight-only' (packed FP4 "
            "weights dequantized per forward) or 'dequantize'"
        )
    report = SwapReport(mode=mode)
    for ck_name, spec in specs.items():
        name = ck_name[len(prefix):] if prefix and ck_name.startswith(prefix) else ck_name
        old = linear_to_quantize(model, name, spec)
        # with tensors in hand the new module's buffers are placeholders replaced right below: keep them on meta
        device = old.weight.device if is_specs else "meta"
        if mode == "dequantize":
            new = _dequantized_linear(spec, source, compute_dtype)
        else:
            new = _MODULE_FOR[spec.fmt](spec, mode=mode, emulate_activations=emulate_activations, device=device,
                                        bias_dtype=compute_dtype)
            if not is_specs:
                for suffix in QUANT_SUFFIXES + ("weight",):
                    if hasattr(new, suffix) and getattr(new, suffix) is not None and spec.key(suffix) in source:
                        setattr(new, suffix, source[spec.key(suffix)])  # same tensor, no copy
                if spec.has_bias:  # kept in the checkpoint's dtype; cast to the activation dtype per forward
                    new.bias = nn.Parameter(source[spec.key("bias")], requires_grad=False)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
        report.modules[name] = spec.fmt
        if not is_specs:
            report.consumed_keys.update(spec.key(s) for s in spec.shapes)
    if specs:
        log.info(_mode_notice(mode, set(report.modules.values()), len(specs), emulate_activations))
        first = model.get_submodule(next(iter(report.modules)))
        if mode in ("weight-only", "auto") and first.weight.device.type in ("cpu", "meta"):
            # build (or find in the persistent cache) the fused decode kernel now, at load, not on the first request
            log.info("vl.quant: CPU decode of weight-only layers: %s", gemv.status())
    return report


def linear_to_quantize(model: nn.Module, name: str, spec: LinearQuantSpec) -> nn.Module:
    """The model's Linear `name`, checked against the checkpoint's quantized one (in/out features, bias)."""
    try:
        mod = model.get_submodule(name)
    except AttributeError:
        raise CheckpointError(
            f"{spec.key('weight')}: the checkpoint has a quantized Linear '{name}' but the model has no such "
            "module; expected the model's module names to follow the checkpoint (check the key adapter/prefix)"
        ) from None
    if not isinstance(mod, (nn.Linear, QuantizedLinear)):
        raise CheckpointError(f"{name}: expected an nn.Linear to quantize, found {type(mod).__name__}")
    if (mod.in_features, mod.out_features) != (spec.in_features, spec.out_features):
        raise CheckpointError(
            f"{spec.key('weight')}: expected a Linear of in={mod.in_features}, out={mod.out_features} as in the "
            f"model, found in={spec.in_features}, out={spec.out_features} in the checkpoint"
        )
    if (getattr(mod, "bias", None) is not None) != spec.has_bias:
        raise CheckpointError(
            f"{spec.key('bias')}: the model's Linear {'has' if mod.bias is not None else 'has no'} bias but the "
            f"checkpoint {'has' if spec.has_bias else 'has none'}"
        )
    return mod


def dequantize_linear_weight(spec: LinearQuantSpec, sd: Mapping[str, torch.Tensor], dtype) -> torch.Tensor:
    if spec.fmt == "fp8":
        return dequantize_fp8(sd[spec.key("weight")], sd[spec.key("weight_scale")], dtype)
    return dequantize_nvfp4(sd[spec.key("weight")], sd[spec.key("weight_scale")], sd[spec.key("weight_scale_2")],
                            dtype)


def _dequantized_linear(spec: LinearQuantSpec, sd, dtype) -> nn.Linear:
    w = dequantize_linear_weight(spec, sd, dtype)
    lin = nn.Linear(spec.in_features, spec.out_features, bias=spec.has_bias, device=w.device, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        if spec.has_bias:
            lin.bias.copy_(sd[spec.key("bias")].to(dtype))
    return lin


def dequantize_state_dict(
    state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """Plain state dict: every quantized Linear weight expanded to `dtype`, its scale tensors dropped.

    For loaders that want an ordinary BF16 model from an FP8 / NVFP4 checkpoint (CPU, older GPUs).
    """
    specs = detect_quantized_linears(state_dict)
    out = dict(state_dict)
    for spec in specs.values():
        out[spec.key("weight")] = dequantize_linear_weight(spec, state_dict, dtype)
        for s in QUANT_SUFFIXES:
            out.pop(spec.key(s), None)
    return out


def resident_weight_bytes(model: nn.Module) -> int:
    """Bytes spanned by the model's parameters and buffers, where views overlap (tied or shared weights) counted
    once. A tensor counts its own byte range, not its whole storage: the huge-page arena (vl/runtime/cpu/hugepages.py)
    is one storage under many small weights."""
    spans: dict[torch.device, list[tuple[int, int]]] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type == "meta" or t.numel() == 0:
            continue
        extent = (sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()
        spans.setdefault(t.device, []).append((t.data_ptr(), t.data_ptr() + extent))
    total = 0
    for ranges in spans.values():
        end = 0
        for lo, hi in sorted(ranges):
            total += max(0, hi - max(lo, end))
            end = max(end, hi)
    return total
