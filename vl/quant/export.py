"""Post-training quantization of a BF16 / FP32 model into the NVIDIA ModelOpt checkpoint layout.

Produces, per quantizable Linear, the tensors a ModelOpt FP8 or NVFP4 export holds (docs/format.md §11.3, §11.4;
ModelOpt `NVFP4QTensor` / FP8 export conventions) plus the `hf_quant_config.json` content, so vLLM /
TensorRT-LLM and our own loader read the result like an NVIDIA checkpoint:

    FP8     weight e4m3 [out, in], weight_scale = amax/448 (scalar), input_scale = act_amax/448
    NVFP4   weight uint8 [out, in/2], weight_scale e4m3 [out, in/16], weight_scale_2 = amax/2688,
            input_scale = act_amax/2688
    FP8_PER_CHANNEL_PER_TOKEN  weight_scale [out], no input_scale (dynamic per-token activations)
    FP8_PB_WO                  weight_scale [out/128, 1, in/128, 1], no input_scale (weight-only)
    W4A16_NVFP4                NVFP4 weights, no input_scale (BF16 activations)

Activation amaxes come from calibration: `collect_input_amax(model, run)` records max|x| at the input of
each Linear while `run()` feeds representative data. Never quantized (as in the reference stack, docs/format.md §11.2):
vision tower, `mlp1`, conv1d, norms, embeddings; `lm_head` is excluded by default (ModelOpt's default).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterable, Mapping

import torch
import torch.nn as nn

from vl.errors import ConfigError
from vl.quant.config import (
    FP8_ALGOS,
    NVFP4_ALGOS,
    QuantConfig,
    QuantFormatError,
    is_excluded,
    never_quantized,
)
from vl.quant.fp8 import (
    fp8_scale_from_amax,
    quantize_fp8_blockwise,
    quantize_fp8_per_channel,
    quantize_fp8_per_tensor,
)
from vl.quant.nvfp4 import nvfp4_global_scale, quantize_nvfp4

EXPORT_ALGOS = FP8_ALGOS + NVFP4_ALGOS
STATIC_INPUT_ALGOS = ("FP8", "NVFP4")  # the algos whose checkpoints carry a static input_scale
DEFAULT_EXCLUDE = ("vision_model*", "mlp1*")
PRODUCER = {"name": "modelopt", "version": "nemotron-vl"}  # readers (vLLM) dispatch on name == modelopt


def exclude_patterns(exclude_lm_head: bool = True, extra: Iterable[str] = ()) -> tuple[str, ...]:
    pats = DEFAULT_EXCLUDE + (("lm_head", "language_model.lm_head") if exclude_lm_head else ()) + tuple(extra)
    return tuple(dict.fromkeys(pats))


def quantizable_linear_names(model: nn.Module, exclude: Iterable[str] = ()) -> list[str]:
    """Names of nn.Linear modules that are neither never-quantized nor matched by `exclude`."""
    exclude = tuple(exclude)
    return [
        name for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and not never_quantized(name) and not is_excluded(name, exclude)
    ]


def _quantize_one(name: str, w: torch.Tensor, algo: str, amax: float | None, block_2d: bool) -> dict:
    out: dict[str, torch.Tensor] = {}
    try:
        if algo == "FP8":
            out["weight"], out["weight_scale"] = quantize_fp8_per_tensor(w)
        elif algo == "FP8_PER_CHANNEL_PER_TOKEN":
            out["weight"], out["weight_scale"] = quantize_fp8_per_channel(w)
        elif algo == "FP8_PB_WO":
            out["weight"], out["weight_scale"] = quantize_fp8_blockwise(w)
        else:
            out["weight"], out["weight_scale"], out["weight_scale_2"] = quantize_nvfp4(w, block_2d=block_2d)
    except QuantFormatError as e:
        raise QuantFormatError(f"{name}.weight: {e}") from None
    if algo in STATIC_INPUT_ALGOS:
        if amax is None:
            raise QuantFormatError(
                f"{name}.input_scale: no calibration amax for this layer; expected input_amax['{name}'] "
                "(collect it with collect_input_amax) or a weight-only algo (W4A16_NVFP4, FP8_PB_WO)"
            )
        if not (amax == amax and amax != float("inf")) or amax < 0:
            raise QuantFormatError(f"{name}.input_scale: calibration amax must be finite and >= 0, found {amax}")
        out["input_scale"] = fp8_scale_from_amax(amax) if algo == "FP8" else nvfp4_global_scale(amax)
    return out


def quantize_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    linear_names: Iterable[str],
    algo: str = "NVFP4",
    input_amax: Mapping[str, float] | None = None,
    *,
    exclude: Iterable[str] = exclude_patterns(),
    block_2d: bool = False,
) -> dict[str, torch.Tensor]:
    """New state dict: each Linear in `linear_names` (minus never-quantized / excluded ones) replaced by its
    ModelOpt tensors; every other key is passed through untouched (the same tensor objects).

    `linear_names` says which weights are Linear (a state dict cannot tell a Linear from an embedding);
    get it from `quantizable_linear_names(model)`. `block_2d` shares one NVFP4 scale per 16x16 tile
    (still the plain [out, in/16] layout).
    """
    if algo not in EXPORT_ALGOS:
        raise ConfigError(f"export algo: expected one of {EXPORT_ALGOS}, found {algo!r}")
    exclude = tuple(exclude)
    input_amax = dict(input_amax or {})
    out = dict(state_dict)
    for name in linear_names:
        if never_quantized(name) or is_excluded(name, exclude):
            continue
        key = f"{name}.weight"
        if key not in state_dict:
            raise QuantFormatError(f"{key}: expected the weight of Linear '{name}' in the state dict, found none")
        w = state_dict[key].contiguous()  # a loaded model's down_proj may be stored by input rows (vl/runtime/cpu/matmul.py)
        if w.dim() != 2 or not w.is_floating_point() or w.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise QuantFormatError(f"{key}: expected a 2-D BF16/FP16/FP32 weight, found {w.dtype} {tuple(w.shape)}")
        amax = input_amax.get(name)
        for suffix, t in _quantize_one(name, w.detach(), algo, amax, block_2d).items():
            out[f"{name}.{suffix}"] = t
    return out


def make_hf_quant_config(
    algo: str, exclude: Iterable[str] = exclude_patterns(), kv_cache_quant_algo: str | None = None
) -> dict:
    """`hf_quant_config.json` content. Our own reader (vl.quant.config) round-trips it."""
    cfg = QuantConfig(
        quant_algo=algo,
        exclude_modules=tuple(exclude),
        group_size=16 if algo in NVFP4_ALGOS else None,
        kv_cache_quant_algo=kv_cache_quant_algo,
        producer=PRODUCER,
    )
    return cfg.to_hf_quant_config()


def export_quantized(
    model: nn.Module,
    algo: str = "NVFP4",
    input_amax: Mapping[str, float] | None = None,
    *,
    exclude_lm_head: bool = True,
    exclude: Iterable[str] = (),
    block_2d: bool = False,
) -> tuple[dict[str, torch.Tensor], dict]:
    """(quantized state dict, hf_quant_config dict) for an nn.Module whose module names follow the checkpoint."""
    pats = exclude_patterns(exclude_lm_head, exclude)
    names = quantizable_linear_names(model, pats)
    sd = quantize_state_dict(model.state_dict(), names, algo, input_amax, exclude=pats, block_2d=block_2d)
    # list the Linears we left alone by name too, when no pattern already covers them (readers such as
    # vLLM decide per layer from this list)
    skipped = [n for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and n not in names and not is_excluded(n, pats)]
    return sd, make_hf_quant_config(algo, pats + tuple(skipped))


def write_hf_quant_config(model_dir: str | os.PathLike, hf_quant_config: Mapping) -> str:
    path = os.path.join(os.fspath(model_dir), "hf_quant_config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(hf_quant_config, f, indent=2, sort_keys=False)
        f.write("\n")
    return path


def collect_input_amax(
    model: nn.Module, run: Callable[[], object], names: Iterable[str] | None = None
) -> dict[str, float]:
    """max|x| seen at the input of each nn.Linear (or of `names`) while `run()` executes. Hooks are removed
    afterwards even if `run` raises. A Linear never reached is absent from the result."""
    wanted = set(names) if names is not None else None
    amax: dict[str, float] = {}
    handles = []

    def hook_for(name):
        def hook(_mod, args):
            x = args[0]
            v = float(x.detach().abs().amax()) if x.numel() else 0.0
            amax[name] = max(amax.get(name, 0.0), v)
        return hook

    try:
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear) and (wanted is None or name in wanted):
                handles.append(m.register_forward_pre_hook(hook_for(name)))
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return amax
