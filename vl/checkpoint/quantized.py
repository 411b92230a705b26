"""Quantized checkpoints in the loader: which Linears an FP8 / NVFP4 (NVIDIA ModelOpt) directory stores packed,
the checks made from the safetensors headers before any tensor is read, and the execution mode that runs them.

Follows vLLM's ModelOpt path (docs/format.md §11.1, §11.2, §11.6): the config comes from `hf_quant_config.json`
or `config.json` `quantization_config`; the per-module truth is the tensors (a Linear is quantized iff its
weight is uint8 / float8 *and* its scales exist); the vision tower, `mlp1`, conv1d, norms, `A_log`, `D`,
`dt_bias` and embeddings are never quantized. The model code stays plain math; loading is a straight line of
passes (gpt-fast's `_load_model` shape): detect the packed Linears from the headers (`prepare`: one spec check,
`vl.quant.config.detect_quantized_linears`), pick the mode once, then either swap the quantized Linears into
the meta model (`vl.quant.swap_quantized_linears`: the strict key / shape / dtype check of
`vl.checkpoint.adapter` then sees each one's own ModelOpt tensors as what the model expects) or, in
"dequantize" mode, keep the plain Linears and expand each packed weight into them after reading (`finish`);
quantized layers are never built in that mode. Packed routed MoE experts stay packed too: the model's fused
(E, out, in) expert tensors are split into one Linear per expert before the swap (`_split_packed_experts`), and only
"dequantize" expands them into the fused tensors.

Modes (`quant_mode`): None / "auto" picks per device (CPU: weight-only; CUDA >= 8.9 with FP8: native
`torch._scaled_mm` per forward where the layer allows it; NVFP4: weight-only, native FP4 GEMM is not
implemented), "weight-only" keeps packed weights and dequantizes per forward, "native" demands the native
FP8 path (an error where it cannot run), "dequantize" expands once at load to plain Linears. One log line
says which mode runs and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from vl.checkpoint.adapter import Plan
from vl.checkpoint.files import CheckpointFiles
from vl.quant.experts import split_fused_experts
from vl.errors import CheckpointError, ConfigError
from vl.quant.config import (
    QUANT_SUFFIXES,
    LinearQuantSpec,
    QuantConfig,
    QuantFormatError,
    QuantUnavailableError,
    detect_quantized_linears,
    is_packed,
    read_quant_config,
)
from vl.quant.linear import (
    MODES,
    dequantize_linear_weight,
    linear_to_quantize,
    native_fp8_support,
    swap_quantized_linears,
)

log = logging.getLogger(__name__)

KV_SCALE_SUFFIXES = (".k_scale", ".v_scale")  # ModelOpt FP8 KV-cache scales on attention k/v projections


@dataclass
class QuantizedLoad:
    """What the loader decided for a quantized checkpoint (kept on the model as `model.quantization`)."""

    config: QuantConfig | None
    specs: dict[str, LinearQuantSpec]  # native module name -> spec (spec.name is the native name)
    checkpoint_names: dict[str, str]  # native module name -> checkpoint module name
    requested: str | None  # quant_mode as given
    mode: str  # "weight-only" | "native" | "auto" | "dequantize": what the quantized modules do
    why: str
    # fused MoE expert tensors stored packed per expert: native name -> per-expert specs (named by checkpoint
    # module), dequantized at load into the fused tensor; only in "dequantize" mode (otherwise each expert is a
    # packed Linear of `specs`)
    stacked: dict[str, list[LinearQuantSpec]] = field(default_factory=dict)
    files: CheckpointFiles | None = field(default=None, repr=False)

    @property
    def fmt(self) -> str:
        fmts = sorted({s.fmt for s in self.specs.values()} | {p.fmt for per in self.stacked.values() for p in per})
        return "/".join(f.upper() for f in fmts) or "none"

    @property
    def packed(self) -> list[str]:
        """Native modules that stay packed (quantized) in memory."""
        return [] if self.mode == "dequantize" else list(self.specs)

    def packed_keys(self) -> set[str]:
        """Native tensor names whose dtype the loader must not touch (packed weights and their scales)."""
        out = set()
        for name in self.packed:
            spec = self.specs[name]
            out.update(f"{name}.{s}" for s in spec.shapes if s != "bias")
        return out

    def checked_here(self) -> set[str]:
        """Native tensor names the quantization loader checks instead of the plan's dtype/shape check: fused
        expert tensors, and in "dequantize" mode the packed weights and scales that become plain weights."""
        out = set(self.stacked)
        if self.mode == "dequantize":
            out.update(spec.key(s) for spec in self.specs.values() for s in spec.shapes if s != "bias")
        return out

    def notice(self, where: str = "") -> str:
        src = self.config.source.rsplit("/", 1)[-1] if self.config is not None else "no quantization config"
        algo = f"{self.config.quant_algo}, " if self.config is not None else ""
        extra = ""
        experts = sum(".mixer.experts." in name for name in self.specs)
        if experts and self.mode != "dequantize":
            extra += f"; {experts} of them routed experts, kept packed one Linear per expert"
        if self.stacked:
            extra += (f"; packed routed experts of {len(self.stacked)} fused tensors dequantized at load (the model "
                      "holds them as one tensor, not as Linears)")
        return (f"vl: {where + ': ' if where else ''}{self.fmt} checkpoint ({algo}{len(self.specs)} quantized "
                f"Linears, {src}); running {self.mode}: {self.why}{extra}")


# --- header-only detection ---------------------------------------------------------------------------
def _checkpoint_sources(plan: Plan) -> dict[str, str]:
    """checkpoint tensor name -> native name, for the one-to-one entries of the plan."""
    return {srcs[0]: native for native, srcs in plan.sources.items() if native not in plan.stacked and len(srcs) == 1}


def detect_in_headers(plan: Plan, files: CheckpointFiles) -> dict[str, LinearQuantSpec]:
    """{checkpoint module: spec} for every packed Linear the plan reads, from the headers alone (the one spec
    check, vl/quant/config.py `detect_quantized_linears`; it also refuses scales without a packed weight).
    KV-cache scales (`k_scale` / `v_scale`) move to the plan's ignored list first: the KV cache runs in the
    compute dtype."""
    for native in list(plan.sources):
        srcs = plan.sources[native]
        if len(srcs) == 1 and srcs[0].endswith(KV_SCALE_SUFFIXES):
            plan.ignored[srcs[0]] = "FP8 KV-cache scale: the KV cache is kept in the compute dtype"
            del plan.sources[native]
    return detect_quantized_linears({s: files.infos[s] for srcs in plan.sources.values() for s in srcs})


def stacked_specs(plan: Plan, files: CheckpointFiles,
                  found: dict[str, LinearQuantSpec]) -> dict[str, list[LinearQuantSpec]]:
    """Fused natives (MoE routed experts) whose per-expert sources are packed: native -> per-expert specs.

    The experts' scale tensors have no native home (the adapter planned them as loose names); they leave the
    plan here and are read by `finish`, which dequantizes the experts into the fused tensor.
    """
    infos = files.infos
    out: dict[str, list[LinearQuantSpec]] = {}
    for native in list(plan.stacked):
        srcs = plan.sources.get(native, [])
        packed = [src for src in srcs if is_packed(infos[src].dtype)]
        if not packed:
            continue
        if len(packed) != len(srcs):
            raise QuantFormatError(f"{packed[0]}: some experts of {native} are packed and some are not "
                                   f"({srcs[0]} is {infos[srcs[0]].dtype}); expected one format for all experts")
        out[native] = [found[src[: -len(".weight")]] for src in srcs]
    scale_names = {sp.key(sfx) for specs in out.values() for sp in specs for sfx in sp.shapes if sfx != "weight"}
    for native in [n for n, srcs in plan.sources.items() if len(srcs) == 1 and srcs[0] in scale_names]:
        del plan.sources[native]
    return out


def linear_specs(plan: Plan, found: dict[str, LinearQuantSpec]) -> tuple[dict[str, LinearQuantSpec], dict[str, str]]:
    """({native module: spec named natively}, {native module: checkpoint module}) for the packed Linears that
    map one-to-one onto the model's (packed fused experts are `stacked_specs`'s)."""
    specs, names = {}, {}
    for ck_tensor, native_tensor in _checkpoint_sources(plan).items():
        ck = ck_tensor[: -len(".weight")]
        if ck_tensor.endswith(".weight") and ck in found:
            native = native_tensor[: -len(".weight")]
            specs[native], names[native] = replace(found[ck], name=native), ck
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


def check_mode(requested: str | None) -> None:
    """The one check of `quant_mode` against the one list of modes (vl/quant/linear.py `MODES`)."""
    if requested is not None and requested not in MODES:
        raise ConfigError(f"quant_mode={requested!r}: expected None or one of {MODES}")


def resolve_mode(requested: str | None, fmts: set[str], device_map) -> tuple[str, str]:
    """(module mode, why) for the quantized Linears of a checkpoint with formats `fmts` placed by `device_map`;
    `requested` has passed `check_mode`."""
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
    """Before `check_plan`: detect packed Linears from the headers and choose the mode; except in "dequantize"
    mode, swap quantized Linears into the meta model, so that the model's expected tensors are their ModelOpt
    tensors. None for an unquantized checkpoint."""
    check_mode(quant_mode)
    config = read_quant_config(files.directory)
    found = detect_in_headers(plan, files)
    stacked = stacked_specs(plan, files, found)
    specs, names = linear_specs(plan, found)
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
    if mode == "dequantize":  # the plain Linears stay: `finish` expands each packed weight into its own
        for name, spec in specs.items():
            linear_to_quantize(model, name, spec)
    else:
        if stacked:  # packed routed experts stay packed: one quantized Linear per expert (vl/quant/experts.py)
            _split_packed_experts(model, plan, stacked, specs, names)
            stacked = {}
        swap_quantized_linears(model, specs, mode, compute_dtype=compute_dtype)
    return QuantizedLoad(config, specs, names, quant_mode, mode, why, stacked, files)


def _split_packed_experts(model: nn.Module, plan: Plan, stacked: dict[str, list[LinearQuantSpec]],
                          specs: dict[str, LinearQuantSpec], names: dict[str, str]) -> None:
    """The fused tensors of packed routed experts become one Linear per expert (`split_fused_experts`), planned
    one-to-one from the checkpoint's per-expert tensors, so that `swap_quantized_linears` makes each a packed
    Linear like any other: a 30B-A3B NVFP4 checkpoint then holds its experts in 16.5 GB instead of 58.7 GB of BF16,
    and a token still reads only its router's k experts."""
    split_fused_experts(model, only=set(stacked))
    for native, per in stacked.items():
        base, proj = native.rsplit(".", 1)  # `….mixer.experts`, `up_proj`
        del plan.sources[native]
        plan.stacked.discard(native)
        for i, spec in enumerate(per):
            module = f"{base}.{proj}.{i}"
            specs[module], names[module] = replace(spec, name=module), spec.name
            for sfx in spec.shapes:
                if sfx != "bias":
                    plan.add(f"{module}.{sfx}", spec.key(sfx))


def finish(tensors: dict[str, torch.Tensor], plan: Plan, qload: QuantizedLoad,
           compute_dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """After the tensors are read: value checks (finite, positive scales; config cross-check), then the packed
    tensors that do not stay packed (fused experts; every Linear in "dequantize" mode) expanded to plain weights
    in `compute_dtype` (one dequantize formula for every path: vl/quant/linear.py `dequantize_linear_weight`)."""
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
        tensors[native] = torch.stack([dequantize_linear_weight(p, scales, compute_dtype) for p in per])
    if qload.mode == "dequantize":
        for name, spec in qload.specs.items():
            tensors[f"{name}.weight"] = dequantize_linear_weight(spec, tensors, compute_dtype)
            for s in QUANT_SUFFIXES:
                tensors.pop(f"{name}.{s}", None)
    qload.files = None
    return tensors
