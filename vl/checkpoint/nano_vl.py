"""Adapter for `NemotronH_Nano_VL_V2` checkpoint directories, both ways (docs/format.md §3.1-§3.3, §3.6).

Checkpoint name                                   native name
vision_model.radio_model.model.{...}              vision.{...}
mlp1.{0,1,3}.weight                               projector.mlp1.{0,1,3}.weight
language_model.{backbone.*, lm_head.weight}       language_model.{...}   (via the Nemotron-H adapter)
Checked and not loaded: `vision_model.radio_model.input_conditioner.norm_mean/norm_std` (must equal the
config's normalisation). Ignored with a reason: `summary_idxs`, later models' `video_embedder`, RADIO's
teacher adaptors and feature normalisers. Our own `save_pretrained` writes exactly this layout, so a
checkpoint of ours *is* a Nano V2 VL checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vl.checkpoint import nemotron_h as lm_adapter
from vl.checkpoint.adapter import Plan
from vl.checkpoint.files import CheckpointFiles, save_tensors
from vl.config import VLConfig, vl_config_from_hf, vl_config_to_hf, with_normalisation
from vl.directory import read_preprocessor
from vl.errors import CheckpointError

VISION = "vision_model.radio_model.model."
CONDITIONER = "vision_model.radio_model.input_conditioner."
CLS_TOKEN = VISION + "patch_generator.cls_token.token"
IGNORED_PREFIXES = {
    "vision_model.radio_model.summary_idxs": "teacher summary indices (training only)",
    VISION + "patch_generator.video_embedder.": "tubelet embedder of V3/Omni checkpoints (V2 has none)",
    "vision_model.radio_model.adaptors.": "RADIO teacher adaptor heads (unused by the VLM; vLLM skips them)",
    "vision_model.radio_model.feature_normalizer.": "RADIO optional feature normaliser (unused by the VLM)",
    "vision_model.radio_model.inter_feature_normalizer.": "RADIO optional feature normaliser (unused by the VLM)",
}


def plan_vl(names) -> Plan:
    names = list(names)
    plan = lm_adapter.plan_lm(names, prefix="language_model.", native_prefix="language_model.")
    for name in names:
        if name.startswith("language_model."):
            continue
        reason = next((r for p, r in IGNORED_PREFIXES.items() if name.startswith(p)), None)
        if reason:
            plan.ignored[name] = reason
        elif name.startswith(CONDITIONER):
            plan.ignored[name] = "input normalisation buffer: checked against norm_mean/norm_std"
        elif name.startswith(VISION):
            plan.add("vision." + name[len(VISION):], name)
        elif name.startswith("mlp1."):
            plan.add("projector." + name, name)
        else:
            plan.add(name, name)  # no native home: reported as unexpected by the strict check
    return plan


def _conditioner(files: CheckpointFiles, key: str):
    name = CONDITIONER + key
    return tuple(float(v) for v in files.get(name).flatten()) if name in files.infos else None


def build_and_plan(raw: dict, files: CheckpointFiles, directory: Path, notes: list | None = None):
    """Config (with K from the cls-token tensor and normalisation resolved) -> meta model + plan."""
    from vl.modeling.vlm import NemotronVL

    if CLS_TOKEN not in files.infos:
        raise CheckpointError(f"{directory}: missing tensor {CLS_TOKEN!r} (it also fixes the number of cls/register "
                              f"tokens)")
    k = files.infos[CLS_TOKEN].shape[0]
    raw = with_normalisation(raw, read_preprocessor(directory))  # the same resolution as vl.load_processor
    cfg = vl_config_from_hf(raw, num_prefix_tokens=k, where=str(directory / "config.json"), notes=notes)
    with torch.device("meta"):
        model = NemotronVL(cfg)
    return model, plan_vl(files.names())


def check_buffers(model, files: CheckpointFiles, plan: Plan):
    """The checkpoint's own normalisation buffers must agree with the config the processor will use."""
    cfg: VLConfig = model.config
    for key, want in (("norm_mean", cfg.norm_mean), ("norm_std", cfg.norm_std)):
        got = _conditioner(files, key)
        if got is not None and any(abs(a - b) > 1e-4 for a, b in zip(got, want)):
            raise CheckpointError(f"{files.directory}: input_conditioner.{key}={got} disagrees with the config's "
                                  f"{key}={list(want)} (config.json, else preprocessor_config.json, else RADIO's "
                                  f"default); refusing to guess the image normalisation: write the right {key} "
                                  f"into config.json")


def export_state_dict(model) -> dict[str, torch.Tensor]:
    """Native state dict -> checkpoint names, with the normalisation buffers the reference carries."""
    sd = model.state_dict()
    out = lm_adapter.export_lm(sd, native_prefix="language_model.", prefix="language_model.")
    for name, t in sd.items():
        if name.startswith("vision."):
            out[VISION + name[len("vision."):]] = t
        elif name.startswith("projector."):
            out[name[len("projector."):]] = t
    cfg = model.config
    out[CONDITIONER + "norm_mean"] = torch.tensor(cfg.norm_mean, dtype=torch.float32).view(3, 1, 1)
    out[CONDITIONER + "norm_std"] = torch.tensor(cfg.norm_std, dtype=torch.float32).view(3, 1, 1)
    return out


def save_pretrained(model, directory, tokenizer=None, max_shard_bytes: int = 4 * 1024**3):
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = export_state_dict(model)
    dtype = next(t.dtype for n, t in tensors.items() if n.startswith("language_model.") and t.is_floating_point())
    cfg = vl_config_to_hf(model.config)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    save_tensors(tensors, directory, max_shard_bytes=max_shard_bytes)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory
