"""What a quantized checkpoint says about itself: its ModelOpt config, its exclusions, and which Linears hold
quantized tensors. (The typed errors of `vl.quant` live in vl/errors.py with the others.)

References (docs/format.md §11.1, §11.2): vLLM `modelopt.py` (`ModelOptFp8Config.from_config`,
`ModelOptNvFp4Config`, `is_layer_excluded`) for the two config spellings and the exclusion rule;
vLLM `nemotron_h.py` / `mamba_mixer2.py` / `nano_nemotron_vl.py` for what is never quantized.

The per-module truth is the state dict: a Linear is quantized iff its `weight` is uint8 (NVFP4) or float8
(FP8) *and* its scale tensors exist. The config's exclude list is only a cross-check (mismatches are
logged, not trusted).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Mapping

import torch

from vl.errors import ConfigError, QuantFormatError, QuantUnavailableError  # noqa: F401 - the two quant errors are re-exported
from vl.quant.fp8 import fp8_scale_granularity
from vl.quant.nvfp4 import check_nvfp4_shapes

log = logging.getLogger(__name__)


# --- errors ----------------------------------------------------------------------------------------
# --- config ----------------------------------------------------------------------------------------
FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO")
NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
SUPPORTED_ALGOS = FP8_ALGOS + NVFP4_ALGOS + ("MIXED_PRECISION",)

# keys we read from hf_quant_config.json["quantization"] / config.json["quantization_config"]
_HF_QUANT_KEYS = ("quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules", "quantized_layers")
_CONFIG_KEYS = ("quant_method", "quant_algo", "ignore", "exclude_modules", "kv_cache_scheme",
                "kv_cache_quant_algo", "group_size", "quantized_layers")
# keys ModelOpt / converters are known to write that carry nothing we need (per-module truth is the
# state dict; activation scheme is fixed by the algo)
IGNORED_KEYS = ("producer", "config_groups", "has_zero_point", "pre_quant_scale", "awq_block_size",
                "activation_scheme", "format", "quantization_status", "global_compression_ratio")


@dataclass(frozen=True)
class QuantConfig:
    quant_algo: str  # one of SUPPORTED_ALGOS
    exclude_modules: tuple[str, ...] = ()
    group_size: int | None = None
    kv_cache_quant_algo: str | None = None
    quantized_layers: Mapping[str, Mapping] = field(default_factory=dict)  # MIXED_PRECISION only
    producer: Mapping = field(default_factory=dict)
    source: str = ""  # which file it came from, for messages

    def __post_init__(self):
        if self.quant_algo not in SUPPORTED_ALGOS:
            raise ConfigError(
                f"{self.source or 'quantization config'}: quant_algo {self.quant_algo!r} is not supported; "
                f"expected one of {', '.join(SUPPORTED_ALGOS)}"
            )
        if self.quant_algo in NVFP4_ALGOS and self.group_size not in (None, 16):
            raise ConfigError(
                f"{self.source or 'quantization config'}: NVFP4 group_size must be 16, found {self.group_size}"
            )

    @property
    def weight_format(self) -> str:
        """'fp8' | 'nvfp4' | 'mixed'."""
        if self.quant_algo in FP8_ALGOS:
            return "fp8"
        if self.quant_algo in NVFP4_ALGOS:
            return "nvfp4"
        return "mixed"

    def is_excluded(self, module_name: str) -> bool:
        return is_excluded(module_name, self.exclude_modules)

    def to_hf_quant_config(self) -> dict:
        """The `hf_quant_config.json` content (ModelOpt spelling)."""
        q: dict = {"quant_algo": self.quant_algo, "kv_cache_quant_algo": self.kv_cache_quant_algo}
        if self.group_size is not None:
            q["group_size"] = self.group_size
        q["exclude_modules"] = list(self.exclude_modules)
        if self.quantized_layers:
            q["quantized_layers"] = {k: dict(v) for k, v in self.quantized_layers.items()}
        return {"producer": dict(self.producer), "quantization": q}


def _check_keys(d: Mapping, known: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(d) - set(known) - set(IGNORED_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown keys {unknown}; expected only {sorted(known)} (ignored: {sorted(IGNORED_KEYS)}). "
            "If the checkpoint is valid, add the key to vl.quant.config with what it means."
        )


def parse_hf_quant_config(d: Mapping, source: str = "hf_quant_config.json") -> QuantConfig:
    """{"producer": {...}, "quantization": {"quant_algo": ..., "exclude_modules": [...], ...}}."""
    if not isinstance(d, Mapping) or not isinstance(d.get("quantization"), Mapping):
        raise ConfigError(f"{source}: expected an object with a 'quantization' object, found {type(d).__name__}")
    _check_keys(d, ("quantization",), source)
    q = d["quantization"]
    _check_keys(q, _HF_QUANT_KEYS, f"{source} 'quantization'")
    if q.get("quant_algo") is None:
        raise ConfigError(f"{source}: 'quantization.quant_algo' is missing; expected e.g. 'FP8' or 'NVFP4'")
    return QuantConfig(
        quant_algo=str(q["quant_algo"]),
        exclude_modules=tuple(q.get("exclude_modules") or ()),
        group_size=q.get("group_size"),
        kv_cache_quant_algo=q.get("kv_cache_quant_algo"),
        quantized_layers=dict(q.get("quantized_layers") or {}),
        producer=dict(d.get("producer") or {}),
        source=source,
    )


def parse_quantization_config(q: Mapping, source: str = "config.json quantization_config") -> QuantConfig:
    """config.json's {"quant_method": "modelopt", "quant_algo": ..., "ignore": [...], ...}."""
    if not isinstance(q, Mapping):
        raise ConfigError(f"{source}: expected an object, found {type(q).__name__}")
    method = q.get("quant_method")
    if method != "modelopt":
        raise ConfigError(
            f"{source}: quant_method {method!r} is not supported; only ModelOpt ('modelopt') FP8/NVFP4 "
            "checkpoints are. Use the BF16 checkpoint or a ModelOpt export."
        )
    _check_keys(q, _CONFIG_KEYS, source)
    if q.get("quant_algo") is None:
        raise ConfigError(f"{source}: 'quant_algo' is missing; expected e.g. 'FP8' or 'NVFP4'")
    exclude = tuple(q.get("ignore") or ()) + tuple(q.get("exclude_modules") or ())
    kv = q.get("kv_cache_quant_algo")
    scheme = q.get("kv_cache_scheme")
    if kv is None and isinstance(scheme, Mapping) and scheme.get("type") == "float" and scheme.get("num_bits") == 8:
        kv = "FP8"
    return QuantConfig(
        quant_algo=str(q["quant_algo"]),
        exclude_modules=tuple(dict.fromkeys(exclude)),
        group_size=q.get("group_size"),
        kv_cache_quant_algo=kv,
        quantized_layers=dict(q.get("quantized_layers") or {}),
        producer=dict(q.get("producer") or {}),
        source=source,
    )


def read_quant_config(model_dir: str | os.PathLike) -> QuantConfig | None:
    """hf_quant_config.json first, else config.json `quantization_config`; None for an unquantized checkpoint.

    When both exist, their quant_algo must agree (a disagreement means a hand-edited or mixed directory).
    """
    model_dir = os.fspath(model_dir)
    hf_path = os.path.join(model_dir, "hf_quant_config.json")
    cfg_path = os.path.join(model_dir, "config.json")
    from_hf = from_cfg = None
    if os.path.isfile(hf_path):
        from_hf = parse_hf_quant_config(_read_json(hf_path), source=hf_path)
    if os.path.isfile(cfg_path):
        qc = _read_json(cfg_path).get("quantization_config")
        if qc is not None:
            from_cfg = parse_quantization_config(qc, source=f"{cfg_path} quantization_config")
    if from_hf and from_cfg and from_hf.quant_algo != from_cfg.quant_algo:
        raise ConfigError(
            f"{model_dir}: hf_quant_config.json says quant_algo={from_hf.quant_algo!r} but config.json "
            f"quantization_config says {from_cfg.quant_algo!r}; expected them to agree. Fix one of the files."
        )
    return from_hf or from_cfg


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: expected valid JSON, found an error: {e}") from e
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(d).__name__}")
    return d


# --- exclusion rules -------------------------------------------------------------------------------
LM_PREFIX = "language_model."


def is_excluded(module_name: str, patterns) -> bool:
    """fnmatch against each pattern; a pattern without wildcards also covers the module's children.

    As vLLM does, the name is also tried with the `language_model.` prefix stripped, because ModelOpt
    exclude lists for VL models are sometimes written for the bare LLM.
    """
    names = [module_name]
    if module_name.startswith(LM_PREFIX):
        names.append(module_name[len(LM_PREFIX):])
    for p in patterns:
        for n in names:
            if fnmatch.fnmatchcase(n, p) or n.startswith(p + "."):
                return True
    return False


_NEVER_SUBSTRINGS = ("vision_model", "vision_tower", "visual")
_NEVER_PARTS = {"mlp1", "conv1d", "A_log", "D", "dt_bias", "embeddings", "embed_tokens", "embedding", "wte"}


def never_quantized(module_name: str) -> bool:
    """Modules the reference stack always keeps in high precision (docs/format.md §11.2): vision tower, projector
    `mlp1`, Mamba conv1d, norms, A_log / D / dt_bias, embeddings."""
    if any(s in module_name for s in _NEVER_SUBSTRINGS):
        return True
    parts = module_name.split(".")
    return any(p in _NEVER_PARTS or "norm" in p for p in parts)


# --- per-module detection --------------------------------------------------------------------------
QUANT_SUFFIXES = ("weight_scale", "weight_scale_2", "input_scale")
FP8_WEIGHT_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class LinearQuantSpec:
    """How one Linear is stored in the checkpoint; enough to build its quantized module before loading."""

    name: str  # module name, e.g. language_model.backbone.layers.0.mixer.in_proj
    fmt: str  # "fp8" | "nvfp4"
    out_features: int
    in_features: int
    has_input_scale: bool
    has_bias: bool = False
    fp8_granularity: str | None = None  # "tensor" | "channel" | "block" (fp8 only)
    weight_dtype: torch.dtype = torch.uint8  # uint8 (nvfp4) | float8_e4m3fn | float8_e5m2
    # checkpoint shape of each stored tensor (suffix -> shape), so modules can be built before loading
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def key(self, suffix: str) -> str:
        return f"{self.name}.{suffix}"


def _scalar_positive(t: torch.Tensor, key: str) -> None:
    if t.dtype != torch.float32:
        raise QuantFormatError(f"{key}: expected dtype float32, found {t.dtype}")
    if t.numel() != 1:
        raise QuantFormatError(f"{key}: expected a scalar (1 element), found shape {tuple(t.shape)}")
    v = float(t.reshape(()))
    if not (math.isfinite(v) and v > 0):
        raise QuantFormatError(f"{key}: expected a finite positive scale, found {v}")


def is_packed(dtype: torch.dtype) -> bool:
    """A weight dtype that holds quantized values: uint8 (two NVFP4 codes per byte) or float8 (FP8)."""
    return dtype == torch.uint8 or dtype in FP8_WEIGHT_DTYPES


def linear_spec(name: str, entries: Mapping) -> LinearQuantSpec:
    """The one structural check of a quantized Linear, from anything with `.shape` and `.dtype` per tensor
    (safetensors headers before loading, tensors after): `entries` maps `f"{name}.{suffix}"` to them, and the
    weight must be packed (uint8 NVFP4 or float8 FP8).
    QuantFormatError names the tensor when the layout is inconsistent (docs/format.md, FP8/NVFP4 layouts)."""
    w = entries[f"{name}.weight"]
    fmt = "nvfp4" if w.dtype == torch.uint8 else "fp8"
    if never_quantized(name):
        raise QuantFormatError(
            f"{name}.weight: found a {fmt.upper()} weight ({w.dtype}) in a module the reference stack never quantizes "
            "(vision tower, mlp1, conv1d, norms, embeddings); expected a BF16/FP32 weight here.")
    if len(w.shape) != 2:
        raise QuantFormatError(f"{name}.weight: expected a 2-D Linear weight, found shape {list(w.shape)}")
    present = {s: f"{name}.{s}" in entries for s in QUANT_SUFFIXES}
    if not present["weight_scale"]:
        raise QuantFormatError(
            f"{name}.weight_scale: missing; a {fmt.upper()} weight ({name}.weight, {w.dtype}) needs its scale. "
            "The checkpoint is incomplete; re-export or re-download it.")
    ws = entries[f"{name}.weight_scale"]
    if present["input_scale"]:
        _scalar_meta(entries[f"{name}.input_scale"], f"{name}.input_scale")
    shapes = {s: tuple(entries[f"{name}.{s}"].shape) for s in ("weight", "bias") + QUANT_SUFFIXES
              if f"{name}.{s}" in entries}
    bias = f"{name}.bias" in entries
    if fmt == "nvfp4":
        if not present["weight_scale_2"]:
            raise QuantFormatError(
                f"{name}.weight_scale_2: missing; an NVFP4 weight ({name}.weight) needs its float32 global scale "
                "(amax / 2688). The checkpoint is incomplete; re-export or re-download it.")
        check_nvfp4_shapes(w.shape, ws.shape, ws.dtype, name=f"{name}.weight_scale")
        _scalar_meta(entries[f"{name}.weight_scale_2"], f"{name}.weight_scale_2")
        return LinearQuantSpec(name, "nvfp4", w.shape[0], w.shape[1] * 2, present["input_scale"], bias,
                               weight_dtype=w.dtype, shapes=shapes)
    if present["weight_scale_2"]:
        raise QuantFormatError(f"{name}.weight_scale_2: unexpected for an FP8 weight ({w.dtype}); expected none")
    if ws.dtype != torch.float32:
        raise QuantFormatError(f"{name}.weight_scale: expected dtype float32 for FP8, found {ws.dtype}")
    try:
        gran = fp8_scale_granularity(w.shape, ws.shape)
    except QuantFormatError as e:
        raise QuantFormatError(f"{name}.weight_scale: {e}") from None
    return LinearQuantSpec(name, "fp8", w.shape[0], w.shape[1], present["input_scale"], bias,
                           fp8_granularity=gran, weight_dtype=w.dtype, shapes=shapes)


def _scalar_meta(t, key: str) -> None:
    if t.dtype != torch.float32:
        raise QuantFormatError(f"{key}: expected dtype float32, found {t.dtype}")
    if math.prod(t.shape) != 1:
        raise QuantFormatError(f"{key}: expected a scalar (1 element), found shape {list(t.shape)}")


def check_scale_values(spec: LinearQuantSpec, sd: Mapping[str, torch.Tensor]) -> None:
    """What only loaded values can show about a Linear `linear_spec` accepted: its scales are finite and positive."""
    name = spec.name
    for suffix in ("input_scale", "weight_scale_2"):
        if f"{name}.{suffix}" in sd:
            _scalar_positive(sd[f"{name}.{suffix}"], f"{name}.{suffix}")
    ws = sd[f"{name}.weight_scale"]
    if spec.fmt == "nvfp4" and bool(torch.isnan(ws.float()).any()):
        raise QuantFormatError(f"{name}.weight_scale: expected finite E4M3 block scales, found NaN")
    if spec.fmt == "fp8" and not bool((torch.isfinite(ws) & (ws > 0)).all()):
        raise QuantFormatError(f"{name}.weight_scale: expected finite positive scales, found zero/NaN/Inf")


def detect_quantized_linears(
    state_dict: Mapping[str, torch.Tensor], quant_config: QuantConfig | None = None
) -> dict[str, LinearQuantSpec]:
    """module name -> LinearQuantSpec for every quantized Linear in the state dict, or in safetensors headers
    (anything with `.shape` and `.dtype`: the loader's check before any tensor is read; value checks need tensors).

    Raises QuantFormatError naming the tensor for: a quantized weight without its scale(s), wrongly
    shaped / typed / NaN scales, scales next to an unquantized weight, a quantized weight where the
    reference never quantizes. `quant_config` (optional, tensors only) is only cross-checked; mismatches are logged.
    """
    specs: dict[str, LinearQuantSpec] = {}
    for key, w in state_dict.items():
        if not key.endswith(".weight"):
            continue
        name = key[: -len(".weight")]
        if not is_packed(w.dtype):
            orphans = [f"{name}.{s}" for s in QUANT_SUFFIXES if f"{name}.{s}" in state_dict]
            if orphans:
                raise QuantFormatError(
                    f"{orphans[0]}: a quantization scale but {name}.weight is {w.dtype}; expected a uint8 (NVFP4) or "
                    "float8 (FP8) weight next to it. The checkpoint is inconsistent.")
            continue
        spec = specs[name] = linear_spec(name, state_dict)
        if isinstance(w, torch.Tensor):
            check_scale_values(spec, state_dict)
    for key in state_dict:  # scales whose module has no weight at all
        for s in QUANT_SUFFIXES:
            if key.endswith("." + s) and key[: -len(s) - 1] + ".weight" not in state_dict:
                raise QuantFormatError(f"{key}: a quantization scale without its module's weight; expected "
                                       f"{key[: -len(s) - 1]}.weight next to it")
    if quant_config is not None:
        msgs = cross_check(specs, state_dict, quant_config)
        for msg in msgs[:5]:
            log.warning("vl.quant: tensors and %s disagree (tensors win): %s", quant_config.source or "config", msg)
        if len(msgs) > 5:
            log.warning("vl.quant: ... and %d more disagreements like these", len(msgs) - 5)
    return specs


def cross_check(
    specs: Mapping[str, LinearQuantSpec], state_dict: Mapping[str, torch.Tensor], quant_config: QuantConfig
) -> list[str]:
    """Disagreements between the tensors and the config (informational; the tensors win)."""
    msgs = []
    fmt = quant_config.weight_format
    for name, spec in specs.items():
        if quant_config.is_excluded(name):
            msgs.append(f"{name} is quantized ({spec.fmt}) but listed in exclude_modules")
        if fmt != "mixed" and spec.fmt != fmt:
            msgs.append(f"{name} is {spec.fmt} but quant_algo is {quant_config.quant_algo}")
    for key, t in state_dict.items():
        if not key.endswith(".weight") or t.dim() != 2 or not t.is_floating_point() or t.dtype in FP8_WEIGHT_DTYPES:
            continue
        name = key[: -len(".weight")]
        if name not in specs and not never_quantized(name) and not quant_config.is_excluded(name):
            msgs.append(f"{name} is unquantized ({t.dtype}) but not in exclude_modules")
    return msgs
