"""Quantized checkpoints in the loader: which Linears an FP8 / NVFP4 (NVIDIA ModelOpt) directory stores packed,
the checks made from the safetensors headers before any tensor is read, and the execution mode that runs them.

Follows vLLM's ModelOpt path (docs/format.md §11.1, §11.2, §11.6): the config comes from `hf_quant_config.json`
or `config.json` `quantization_config`; the per-module truth is the tensors (a Linear is quantized iff its
weight is uint8 / float8 *and* its scales exist); the vision tower, `mlp1`, conv1d, norms, `A_log`, `D`,
`dt_bias` and embeddings are never quantized. The model code stays plain math: the loader builds the meta
model, then swaps the checkpoint's quantized Linears in from outside (`vl.quant.swap_quantized_linears`), so
the strict key / shape / dtype check of `vl.checkpoint.adapter` sees each quantized Linear's own ModelOpt
tensors as what the model expects.

Modes (`quant_mode`): None / "auto" picks per device (CPU: weight-only; CUDA >= 8.9 with FP8: native
`torch._scaled_mm` per forward where the layer allows it; NVFP4: weight-only, native FP4 GEMM is not
implemented), "weight-only" keeps packed weights and dequantizes per forward, "native" demands the native
FP8 path (an error where it cannot run), "dequantize" expands once at load to plain Linears. One log line
says which mode runs and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from vl.checkpoint.adapter import Plan
from vl.checkpoint.files import CheckpointFiles, TensorInfo
from vl.errors import CheckpointError, ConfigError
from vl.quant.config import (
    FP8_WEIGHT_DTYPES,
    QUANT_SUFFIXES,
    LinearQuantSpec,
    QuantConfig,
    QuantFormatError,
    QuantUnavailableError,
    detect_quantized_linears,
    linear_spec,
    read_quant_config,
)
from vl.quant.linear import MODES

log = logging.getLogger(__name__)

QUANT_MODES = MODES  # the one list of quantized execution modes (vl/quant/linear.py)
PACKED_DTYPES = (torch.uint8,) + FP8_WEIGHT_DTYPES
KV_SCALE_SUFFIXES = (".k_scale", ".v_scale")  # ModelOpt FP8 KV-cache scales on attention k/v projections
# Modules expanded at load in every mode (none: the model casts the lm_head input to its compute dtype, so a
# packed lm_head runs in the chosen mode like any other Linear).
DEQUANTIZE_AT_LOAD: tuple[str, ...] = ()


@dataclass
class QuantizedLoad:
    """What the loader decided for a quantized checkpoint (kept on the model as `model.quantization`)."""

    config: QuantConfig | None
    specs: dict[str, LinearQuantSpec]  # native module name -> spec (spec.name is the native name)
    checkpoint_names: dict[str, str]  # native module name -> checkpoint module name
    requested: str | None  # quant_mode as given
    mode: str  # "weight-only" | "native" | "auto" | "dequantize": what the quantized modules do
    why: str
    expanded: list[str] = field(default_factory=list)  # native modules dequantized at load in any mode
    # fused MoE expert tensors stored packed per expert: native name -> per-expert specs (named by checkpoint
    # module); always dequantized at load (the model holds them as one tensor, not as Linears)
    stacked: dict[str, list[LinearQuantSpec]] = field(default_factory=dict)
    originals: dict[str, nn.Module] = field(default_factory=dict, repr=False)  # meta Linears, for expansion
    files: CheckpointFiles | None = field(default=None, repr=False)

    @property
    def fmt(self) -> str:
        fmts = sorted({s.fmt for s in self.specs.values()} | {p.fmt for per in self.stacked.values() for p in per})
        return "/".join(f.upper() for f in fmts) or "none"

    @property
    def packed(self) -> list[str]:
        """Native modules that stay packed (quantized) in memory."""
        if self.mode == "dequantize":
            return []
        return [n for n in self.specs if n not in self.expanded]

    def packed_keys(self) -> set[str]:
        """Native tensor names whose dtype the loader must not touch (packed weights and their scales)."""
        out = set()
        for name in self.packed:
            spec = self.specs[name]
            out.update(f"{name}.{s}" for s in spec.shapes if s != "bias")
        return out

    def notice(self, where: str = "") -> str:
        src = self.config.source.rsplit("/", 1)[-1] if self.config is not None else "no quantization config"
        algo = f"{self.config.quant_algo}, " if self.config is not None else ""
        extra = f"; {', '.join(self.expanded)} dequantized at load (see DEQUANTIZE_AT_LOAD)" if (
            self.expanded and self.mode != "dequantize") else ""
        if self.stacked:
            extra += (f"; packed routed experts of {len(self.stacked)} fused tensors dequantized at load (the model "
                      "holds them as one tensor, not as Linears)")
        return (f"vl: {where + ': ' if where else ''}{self.fmt} checkpoint ({algo}{len(self.specs)} quantized "
                f"Linears, {src}); running {self.mode}: {self.why}{extra}")


# --- header-only detection ---------------------------------------------------------------------------
def _checkpoint_sources(plan: Plan) -> dict[str, str]:
    """checkpoint tensor name -> native name, for the one-to-one entries of the plan."""
    return {srcs[0]: native for native, srcs in plan.sources.items() if native not in plan.stacked and len(srcs) == 1}


def _header_spec(ck: str, native: str, infos: dict[str, TensorInfo]) -> LinearQuantSpec:
    """Spec of checkpoint module `ck` from its headers (the one check: vl/quant/config.py `linear_spec`)."""
    return linear_spec(ck, infos, native)


def stacked_specs(plan: Plan, files: CheckpointFiles) -> dict[str, list[LinearQuantSpec]]:
    """Fused natives (MoE routed experts) whose per-expert sources are packed: native -> per-expert specs.

    The experts' scale tensors have no native home (the adapter planned them as loose names); they leave the
    plan here and are read by `finish`, which dequantizes the experts into the fused tensor.
    """
    infos = files.infos
    out: dict[str, list[LinearQuantSpec]] = {}
    for native in list(plan.stacked):
        srcs = plan.sources.get(native, [])
        packed = [src for src in srcs if infos[src].dtype in PACKED_DTYPES]
        if not packed:
            continue
        if len(packed) != len(srcs):
            raise QuantFormatError(f"{packed[0]}: some experts of {native} are packed and some are not "
                                   f"({srcs[0]} is {infos[srcs[0]].dtype}); expected one format for all experts")
        out[native] = [_header_spec(src[: -len(".weight")], src[: -len(".weight")], infos) for src in srcs]
    scale_names = {sp.key(sfx) for specs in out.values() for sp in specs for sfx in sp.shapes if sfx != "weight"}
    for native in [n for n, srcs in plan.sources.items() if len(srcs) == 1 and srcs[0] in scale_names]:
        del plan.sources[native]
    return out


def header_specs(plan: Plan, files: CheckpointFiles) -> tuple[dict[str, LinearQuantSpec], dict[str, str]]:
    """({native module: spec}, {native module: checkpoint module}) from the headers alone, for the Linears.

    Also refuses scales whose weight is not packed. Packed fused MoE experts are `stacked_specs`'s.
    KV-cache scales (`k_scale` / `v_scale`) move to the plan's ignored list: the KV cache runs in the
    compute dtype.
    """
    infos = files.infos
    to_native = _checkpoint_sources(plan)
    for native in list(plan.sources):
        srcs = plan.sources[native]
        if len(srcs) == 1 and srcs[0].endswith(KV_SCALE_SUFFIXES):
            plan.ignored[srcs[0]] = "FP8 KV-cache scale: the KV cache is kept in the compute dtype"
            del plan.sources[native]
    specs, names = {}, {}
    for ck_tensor, native_tensor in to_native.items():
        if not ck_tensor.endswith(".weight") or infos[ck_tensor].dtype not in PACKED_DTYPES:
            continue
        ck, native = ck_tensor[: -len(".weight")], native_tensor[: -len(".weight")]
        specs[native] = _header_spec(ck, native, infos)
        names[native] = ck
    for name, info in infos.items():  # scales without a packed weight next to them
        for s in QUANT_SUFFIXES:
            if name.endswith("." + s):
                ck = name[: -len(s) - 1]
                w = infos.get(f"{ck}.weight")
                if w is None or w.dtype not in PACKED_DTYPES:
                    found = "no weight" if w is None else f"{ck}.weight is {w.dtype}"
                    raise QuantFormatError(
                        f"{name}: a quantization scale but {found}; expected a uint8 (NVFP4) or float8 (FP8) "
                        f"{ck}.weight next to it. The checkpoint is inconsistent.")
    return specs, names


# --- mode ----------------------------------------------------------------------------------------------
def _target_device(device_map) -> torch.device:
    if device_map is None or device_map == "cpu":
        return torch.device("cpu")
    if device_map == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(device_map, dict):
        devs = [d for d in device_map.values() if d not in ("cpu", "disk")]
        return torch.device(devs[0] if isinstance(devs[0], str) else f"cuda:{devs[0]}") if devs else torch.device(
            "cpu")
    return torch.device(device_map)


_RESIDENT = ("packed weights stay resident (decode: the fused CPU kernel where it builds, docs/quant_cpu_kernels.md; "
             "otherwise dequantized per layer in forward)")


def resolve_mode(requested: str | None, fmts: set[str], device_map) -> tuple[str, str]:
    """(module mode, why) for the quantized Linears of a checkpoint with formats `fmts` placed by `device_map`."""
    from vl.quant.linear import native_fp8_support

    if requested is not None and requested not in QUANT_MODES:
        raise ConfigError(f"quant_mode={requested!r}: expected None or one of {QUANT_MODES}")
    dev = _target_device(device_map)
    ok, why = native_fp8_support(dev) if dev.type == "cuda" else (False, f"tensors are on {dev.type}")
    if requested == "dequantize":
        return "dequantize", "requested; weights expanded once at load to the compute dtype (full-size memory)"
    if requested == "weight-only":
        return "weight-only", f"requested; {_RESIDENT}"
    if requested == "native":
        if "nvfp4" in fmts:
            raise QuantUnavailableError(
                "quant_mode='native': native NVFP4 GEMM is not implemented; use 'auto' or 'weight-only' (packed "
                "FP4 weights dequantized per forward) or 'dequantize'")
        if not ok:
            raise QuantUnavailableError(
                f"quant_mode='native': FP8 torch._scaled_mm cannot run here ({why}); expected a CUDA device of "
                "capability >= 8.9 in device_map. Use 'auto' or 'weight-only'.")
        return "native", f"requested; FP8 torch._scaled_mm ({why})"
    # auto
    if dev.type != "cuda":
        return "weight-only", f"auto on {dev.type}: no FP8/FP4 tensor cores; {_RESIDENT}"
    if fmts == {"fp8"} and ok:
        return "auto", f"auto: FP8 torch._scaled_mm where the layer allows it ({why}), weight-only elsewhere"
    reason = why if "fp8" in fmts and not ok else "native NVFP4 GEMM is not implemented"
    return "weight-only", f"auto: {reason}; {_RESIDENT}"


def native_blockers(specs: dict[str, LinearQuantSpec]) -> list[str]:
    """Why each layer cannot take the native FP8 path (the same conditions as FP8Linear._native_ok)."""
    out = []
    for name, s in specs.items():
        if s.fmt != "fp8":
            out.append(f"{name}: {s.fmt.upper()} has no native path")
        elif s.fp8_granularity != "tensor" or s.weight_dtype != torch.float8_e4m3fn:
            out.append(f"{name}: per-{s.fp8_granularity} {s.weight_dtype} scales (native covers per-tensor E4M3)")
        elif s.in_features % 16 or s.out_features % 16:
            out.append(f"{name}: in/out features {s.in_features}/{s.out_features} not divisible by 16")
    return out


# --- the two loader hooks ---------------------------------------------------------------------------------
def prepare(model: nn.Module, plan: Plan, files: CheckpointFiles, quant_mode: str | None = None, device_map=None,
            compute_dtype: torch.dtype = torch.bfloat16) -> QuantizedLoad | None:
    """Before `check_plan`: detect packed Linears from the headers and swap them into the meta model, so that
    the model's expected tensors are their ModelOpt tensors. None for an unquantized checkpoint."""
    from vl.quant.linear import swap_quantized_linears

    if quant_mode is not None and quant_mode not in QUANT_MODES:
        raise ConfigError(f"quant_mode={quant_mode!r}: expected None or one of {QUANT_MODES}")
    config = read_quant_config(files.directory)
    stacked = stacked_specs(plan, files)
    specs, names = header_specs(plan, files)
    for native, per in stacked.items():  # the fused tensor the experts expand into
        want = tuple(model.get_parameter(native).shape)
        got = (len(per), per[0].out_features, per[0].in_features)
        if want != got or len({(p.out_features, p.in_features) for p in per}) != 1:
            raise CheckpointError(f"{per[0].key('weight')}: expected {want[0]} experts of out={want[1]}, in={want[2]} "
                                  f"for {native}, found {len(per)} of out={per[0].out_features}, "
                                  f"in={per[0].in_features}")
    if not specs and not stacked:
        if config is not None:
            log.warning("vl: %s: %s declares quant_algo=%s but no tensor is packed (uint8/float8 with scales); "
                        "loading it as an unquantized checkpoint", files.directory, config.source, config.quant_algo)
        if quant_mode not in (None, "auto"):
            raise ConfigError(
                f"quant_mode={quant_mode!r}: {files.directory} is not a quantized checkpoint (no packed FP8/NVFP4 "
                "weights); quant_mode applies to ModelOpt FP8/NVFP4 checkpoints. To make one, run "
                "`vl quantize --format fp8|nvfp4`.")
        return None
    fmts = {s.fmt for s in specs.values()} | {p.fmt for per in stacked.values() for p in per}
    mode, why = resolve_mode(quant_mode, fmts, device_map)
    if mode == "native":
        blockers = native_blockers(specs)
        if blockers:
            raise QuantUnavailableError(
                f"quant_mode='native': {len(blockers)} quantized Linears cannot run torch._scaled_mm, e.g. "
                f"{'; '.join(blockers[:3])}. Use 'auto' (native where possible, weight-only elsewhere).")
    originals = {name: model.get_submodule(name) for name in specs}
    swap_quantized_linears(model, specs, "weight-only" if mode == "dequantize" else mode,
                           compute_dtype=compute_dtype)
    expanded = [n for n in specs if n.rsplit(".", 1)[-1] in DEQUANTIZE_AT_LOAD or n in DEQUANTIZE_AT_LOAD]
    return QuantizedLoad(config, specs, names, quant_mode, mode, why, expanded, stacked, originals, files)


def finish(model: nn.Module, tensors: dict[str, torch.Tensor], plan: Plan, qload: QuantizedLoad,
           compute_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """After the tensors are read: value checks (finite, positive scales; config cross-check), then, for the
    modules that do not stay packed, expansion to plain weights and the plain meta Linear put back."""
    from vl.quant.linear import _dequantized_weight_from  # one dequantize formula for every path

    to_native = _checkpoint_sources(plan)
    ck_view = {ck: tensors[native] for ck, native in to_native.items() if native in tensors}
    found = detect_quantized_linears(ck_view, qload.config)
    if set(found) != set(qload.checkpoint_names.values()):
        raise CheckpointError("quantized modules from the headers and from the tensors disagree: "
                              f"{sorted(set(found) ^ set(qload.checkpoint_names.values()))[:5]}")
    for native, per in qload.stacked.items():
        scales = qload.files.load_all([p.key(sfx) for p in per for sfx in p.shapes if sfx != "weight"])
        for i, p in enumerate(per):
            scales[p.key("weight")] = tensors[native][i]
        detect_quantized_linears(scales, qload.config)  # finite, positive scales
        tensors[native] = torch.stack([_dequantized_weight_from(p, scales, compute_dtype) for p in per])
    expand = list(qload.specs) if qload.mode == "dequantize" else list(qload.expanded)
    for name in expand:
        spec = qload.specs[name]
        tensors[f"{name}.weight"] = _dequantized_weight_from(spec, tensors, compute_dtype)
        for s in QUANT_SUFFIXES:
            tensors.pop(f"{name}.{s}", None)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, qload.originals[name])
    qload.originals, qload.files = {}, None
    return tensors
