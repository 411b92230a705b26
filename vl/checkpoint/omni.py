"""Adapter for Nemotron 3 Nano Omni directories (`model_type: nemotron_h_omni`), the released layout
(docs/format.md §3.7), which is also what transformers' `NemotronH_Omni_Reasoning_V3.save_pretrained` writes
(its conversion mapping reversed on save).

Checkpoint name                                   native name
vision_model.radio_model.model.{...}              vision.{...}   (patch_generator.video_embedder included)
  ... .blocks.{i}.layer_scale{1,2}.lambda1        vision.blocks.{i}.ls{1,2}.gamma   (transformers-written only)
vision_projector.vision_final_layernorm.*         vision_final_layernorm.*          (LMs with MTP layers)
mlp1.{0,1,3}.weight                               projector.mlp1.{0,1,3}.weight
sound_encoder.encoder.{...}                       audio_encoder.{...}
sound_projection.{norm,linear1,linear2}.*         audio_projector.{...}
language_model.{backbone.*, lm_head.weight}       language_model.{...}   (via the Nemotron-H adapter)
Ignored with a reason: the teacher summary indices, RADIO's adaptors and feature normalisers, the encoder's own
mel featurizer buffers (`sound_encoder.encoder.feature_extractor.*`: mel features come from the processor, as in
transformers), MTP heads. `vision_model.radio_model.input_conditioner.*` are checked against the preprocessor's
normalisation when both exist, and not loaded (pixels arrive normalised).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vl.checkpoint import nemotron_h as lm_adapter
from vl.checkpoint.adapter import Plan
from vl.checkpoint.files import CheckpointFiles
from vl.config.omni import omni_config_from_hf
from vl.directory import read_preprocessor
from vl.errors import CheckpointError

VISION = "vision_model.radio_model.model."
CONDITIONER = "vision_model.radio_model.input_conditioner."
RENAMES = {  # checkpoint prefix -> native prefix (no prefix is the start of another)
    VISION: "vision.",
    "vision_projector.vision_final_layernorm.": "vision_final_layernorm.",
    "mlp1.": "projector.mlp1.",
    "sound_encoder.encoder.": "audio_encoder.",
    "sound_projection.": "audio_projector.",
}
IGNORED_PREFIXES = {
    "vision_model.radio_model.summary_idxs": "teacher summary indices (training only)",
    "vision_model.radio_model.adaptors.": "RADIO teacher adaptor heads (unused by the VLM)",
    "vision_model.radio_model.feature_normalizer.": "RADIO optional feature normaliser (unused by the VLM)",
    "vision_model.radio_model.inter_feature_normalizer.": "RADIO optional feature normaliser (unused by the VLM)",
    "sound_encoder.encoder.feature_extractor.": "the encoder's own mel featurizer buffers: mel features come from "
                                                "the processor (transformers ignores them too)",
}
_LAYER_SCALE = re.compile(r"^(blocks\.\d+\.)layer_scale([12])\.lambda1$")


def has_layer_scale(names) -> bool:
    return any(_LAYER_SCALE.match(n[len(VISION):]) for n in names if n.startswith(VISION))


def plan_omni(names) -> Plan:
    names = list(names)
    plan = lm_adapter.plan_lm(names, prefix="language_model.", native_prefix="language_model.")
    for name in names:
        if name.startswith("language_model."):
            continue
        reason = next((r for p, r in IGNORED_PREFIXES.items() if name.startswith(p)), None)
        if reason:
            plan.ignored[name] = reason
        elif name.startswith(CONDITIONER):
            plan.ignored[name] = "input normalisation buffer: checked against the preprocessor's normalisation"
        elif name.startswith(VISION) and _LAYER_SCALE.match(name[len(VISION):]):
            m = _LAYER_SCALE.match(name[len(VISION):])
            plan.add(f"vision.{m.group(1)}ls{m.group(2)}.gamma", name)
        else:
            prefix = next((p for p in RENAMES if name.startswith(p)), None)
            plan.add(RENAMES[prefix] + name[len(prefix):] if prefix else name, name)  # no home: unexpected
    return plan


def build_and_plan(raw: dict, files: CheckpointFiles, directory: Path, notes: list | None = None):
    """config.json (+ whether the tower stores LayerScale) -> meta model + plan."""
    from vl.modeling.omni import NemotronOmni

    names = files.names()
    cfg = omni_config_from_hf(raw, where=str(directory / "config.json"), notes=notes,
                              layer_scale=has_layer_scale(names))
    with torch.device("meta"):
        model = NemotronOmni(cfg)
    return model, plan_omni(names)


def check_buffers(files: CheckpointFiles, directory: Path):
    """The checkpoint's RADIO normalisation buffers, where it has them, must agree with the normalisation the
    processor applies (preprocessor_config.json `image_mean`/`image_std`, or the older `norm_mean`/`norm_std`)."""
    pre = read_preprocessor(directory) or {}
    for key, alias in (("norm_mean", "image_mean"), ("norm_std", "image_std")):
        name = CONDITIONER + key
        want = pre.get(alias) if pre.get(alias) is not None else pre.get(key)
        if name not in files.infos or want is None:
            continue
        got = [float(v) for v in files.get(name).flatten()]
        if len(got) != len(want) or any(abs(a - float(b)) > 1e-4 for a, b in zip(got, want)):
            raise CheckpointError(f"{directory}: {name}={got} disagrees with preprocessor_config.json's "
                                  f"{alias if pre.get(alias) is not None else key}={list(want)}; refusing to guess "
                                  "the image normalisation: fix preprocessor_config.json")


_NATIVE_LAYER_SCALE = re.compile(r"^vision\.(blocks\.\d+\.)ls([12])\.gamma$")


def export_state_dict(model) -> dict[str, torch.Tensor]:
    """Native state dict -> the released names (the inverse of `plan_omni`; the LM through the Nemotron-H adapter,
    routed experts per expert). Buffers the loader ignores (summary indices, normalisation) are not written."""
    sd = model.state_dict()
    out = lm_adapter.export_lm(sd, native_prefix="language_model.", prefix="language_model.")
    back = {native: ck for ck, native in RENAMES.items()}
    for name, t in sd.items():
        if name.startswith("language_model."):
            continue
        m = _NATIVE_LAYER_SCALE.match(name)
        if m:
            out[f"{VISION}{m.group(1)}layer_scale{m.group(2)}.lambda1"] = t
            continue
        prefix = next((p for p in back if name.startswith(p)), None)
        if prefix is None:
            raise CheckpointError(f"{name}: no checkpoint name for this parameter (vl/checkpoint/omni.py RENAMES)")
        out[back[prefix] + name[len(prefix):]] = t
    return out
