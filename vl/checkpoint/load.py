"""`vl.load_pretrained`: one entry point for every supported checkpoint directory.

Dispatch is on explicit `config.json` fields (`model_type`, then `architectures`), never on folder names.
`auto_map` remote code is never imported or executed: known architectures load natively, unknown ones are
refused. The model is built on the meta device and its tensors are assigned straight from the files in the
target dtype, so the weights exist once.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from vl.checkpoint import adapter as ad
from vl.checkpoint import nano_vl
from vl.checkpoint import nemotron_h as lm_adapter
from vl.checkpoint import omni as omni_adapter
from vl.checkpoint import quantized
from vl.checkpoint.files import CheckpointFiles, scan_non_finite
from vl.config import lm_config_from_hf
from vl.directory import checkpoint_kind, read_config, resolve_dir
from vl.errors import ConfigError
from vl.modeling.nemotron_h import NemotronHForCausalLM

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype, raw: dict) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        declared = raw.get("torch_dtype") or raw.get("dtype")
        if isinstance(declared, str) and declared in DTYPES:
            return DTYPES[declared]
        return torch.float32
    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r}: expected one of {sorted(DTYPES)} or a torch.dtype")
    return DTYPES[dtype]


def declared_storage_dtype(raw: dict) -> torch.dtype | None:
    declared = raw.get("torch_dtype") or raw.get("dtype")
    return DTYPES.get(declared) if isinstance(declared, str) else None


def assign_tensors(model: nn.Module, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                   keep_dtype: set[str] = frozenset()):
    """Assign tensors into a meta-device model; floating ones cast to `dtype` except fp32-kept ones and
    `keep_dtype` (packed FP8 / NVFP4 weights and their scales, whose dtype is their format)."""
    keep_fp32 = tuple(getattr(model, "keep_in_fp32", ()))
    out = {}
    for name, t in tensors.items():
        if t.is_floating_point() and name not in keep_dtype:
            target = torch.float32 if name.endswith(keep_fp32) else dtype
            t = t.to(target)
        out[name] = t
    model.load_state_dict(out, strict=True, assign=True)
    for name, p in model.named_parameters():
        p.requires_grad_(False)
    return model


def load_model(path, dtype=None, device_map=None, scan_nan: bool = False, quant_mode: str | None = None):
    """The model of a checkpoint directory with its tensors assigned, on the CPU, before any runtime pass
    (`vl.load_pretrained` = this + vl/runtime/pretrained.py). `device_map` only informs the quantized mode choice.

    quant_mode (FP8 / NVFP4 checkpoints only): None or "auto" (per device), "weight-only", "native",
    "dequantize"; see vl/checkpoint/quantized.py. `model.quantization` says what was chosen (None if plain)."""
    directory = resolve_dir(path)
    raw = read_config(directory)
    kind = checkpoint_kind(raw, directory)
    files = CheckpointFiles(directory)
    target = resolve_dtype(dtype, raw)
    notes: list[str] = []
    if kind == "nemotron_h":
        cfg = lm_config_from_hf(raw, where=str(directory / "config.json"), notes=notes)
        with torch.device("meta"):
            model = NemotronHForCausalLM(cfg)
        plan = lm_adapter.plan_lm(files.names())
    elif kind == "nemotron_h_omni":
        model, plan = omni_adapter.build_and_plan(raw, files, directory, notes=notes)
    else:
        model, plan = nano_vl.build_and_plan(raw, files, directory, notes=notes)
    if notes:  # once per load: what config.json holds that cannot change the maths (docs/config_policy.md)
        log.debug("%s: config keys accepted and ignored:\n  %s", directory, "\n  ".join(notes))
    qload = quantized.prepare(model, plan, files, quant_mode, device_map, target)
    ad.check_plan(plan, files, ad.expected_tensors(model), declared_storage_dtype(raw),
                  quantized=qload.checked_here() if qload else frozenset(), what=f"{kind} checkpoint")
    tensors = ad.materialize(plan, files, mapped=ad.row_tables(model))  # the rest in process memory
    if scan_nan:
        scan_non_finite(tensors)
    if kind == "nano_vl_v2":
        nano_vl.check_buffers(model, files, plan)
    elif kind == "nemotron_h_omni":
        omni_adapter.check_buffers(files, directory)
    if qload is not None:
        tensors = quantized.finish(tensors, plan, qload, target)
        fallback = qload.requested in (None, "auto") and qload.mode == "weight-only"
        log.log(logging.WARNING if fallback else logging.INFO, qload.notice(str(directory)))
    model = assign_tensors(model, tensors, target, qload.packed_keys() if qload else frozenset()).eval()
    model.checkpoint_dir = str(directory)
    model.config_notes = notes
    model.quantization = qload
    return model
