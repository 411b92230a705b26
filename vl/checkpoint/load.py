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


MAPPED_MIN_BYTES = 64 << 10  # smaller encoder tensors (norms, biases) are read: a map costs a page or more each


def encoder_names(model: nn.Module, plan, files: CheckpointFiles, target: torch.dtype) -> set[str]:
    """Native names of the encoder weights (every part but `language_model`) that can stay views of the file map:
    stored in the dtype they will run in (`assign_tensors` makes no copy), of at least MAPPED_MIN_BYTES."""
    keep_fp32 = tuple(getattr(model, "keep_in_fp32", ()))
    out = set()
    for part, module in model.named_children():
        if part == "language_model":
            continue
        for name, _ in [*module.named_parameters(), *module.named_buffers()]:
            native = f"{part}.{name}"
            srcs = plan.sources.get(native)
            if not srcs or native in plan.stacked:
                continue
            info = files.infos[srcs[0]]
            want = torch.float32 if native.endswith(keep_fp32) else target
            if info.dtype == want and info.nbytes >= MAPPED_MIN_BYTES:
                out.add(native)
    return out


def load_model(path, dtype=None, device_map=None, scan_nan: bool = False, quant_mode: str | None = None,
               map_encoders=False):
    """The model of a checkpoint directory with its tensors assigned, on the CPU, before any runtime pass
    (`vl.load_pretrained` = this + vl/runtime/pretrained.py). `device_map` only informs the quantized mode choice.
    `map_encoders`: the encoders' weights stay views of the checkpoint file's map (`encoder_names`;
    vl/runtime/cpu/encoder_pages.py); a callable decides from the checkpoint files' bytes, once they are checked.
    `model.mapped_encoder_bytes` says how many bytes were mapped.

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
    if callable(map_encoders):
        map_encoders = map_encoders(sum(info.nbytes for info in files.infos.values()))
    whole = encoder_names(model, plan, files, target) if map_encoders else set()
    tensors = ad.materialize(plan, files, mapped=ad.row_tables(model), whole=whole)  # the rest in process memory
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
    model.mapped_encoder_bytes = sum(files.infos[plan.sources[n][0]].nbytes for n in whole)
    return model
