"""Configuration of Nemotron 3 Nano Omni (`model_type: nemotron_h_omni`): nested frozen dataclasses and the reader
of its `config.json`, as transformers' `NemotronH_Omni_Reasoning_V3_Config` reads it.

transformers' config (configuration_nemotron_h_omni.py) nests three sub-configs: `text_config` (Nemotron-H, read by
vl/config/__init__.py `lm_config_from_hf`), `vision_config` (transformers' `RadioConfig`: width, depth and heads are fields,
not a timm name as in Nano V2 VL) and the optional `audio_config` (`ParakeetEncoderConfig` plus the audio
projector's `projection_hidden_size` / `projection_bias`; read by vl/config/__init__.py `parakeet_config_from_hf` with the
Omni defaults). Released directories predate transformers' field names
and store six of them under older names (`_legacy_field_names`): `llm_config`, `sound_config`,
`img_context_token_id`, `video_context_token_id`, `sound_context_token_id`, `vit_hidden_size`. As there, an older
name is read only when the newer field is absent or holds its class default. Every other key goes through the one
policy of vl/config_policy.py: mapped, accepted and named, or refused when it would change the maths.
A config without `audio_config` (or with it null) builds no audio branch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from vl.config import LMConfig, _float, lm_config_from_hf, nano3_30b_a3b_lm
from vl.config.parakeet import ParakeetConfig, parakeet_config_from_hf
from vl.config_policy import Check, KeyReader
from vl.errors import ConfigError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # transformers' RadioConfig defaults
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class OmniVisionConfig:
    """The RADIO tower as transformers' `RadioConfig` sizes it (defaults: C-RADIO ViT-H/16)."""

    hidden_size: int = 1280
    num_hidden_layers: int = 32
    num_attention_heads: int = 16
    mlp_ratio: float = 4.0
    patch_size: int = 16
    max_img_size: int = 2048  # CPE table side in pixels
    num_cls_tokens: int = 3
    num_registers: int = 7
    video_temporal_patch_size: int | None = 2  # frames per tubelet; None: no video embedder
    layer_norm_eps: float = 1e-6
    norm_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN  # informational: the processor normalises
    norm_std: tuple[float, float, float] = OPENAI_CLIP_STD
    layer_scale: bool = False  # LayerScale tensors in the checkpoint (set by the loader from the tensor names)

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"vision_config: hidden_size={self.hidden_size} is not divisible by "
                              f"num_attention_heads={self.num_attention_heads}")
        if self.patch_size < 1 or self.max_img_size % self.patch_size:
            raise ConfigError(f"vision_config: max_img_size={self.max_img_size} must be a multiple of "
                              f"patch_size={self.patch_size}")
        if self.video_temporal_patch_size is not None and self.video_temporal_patch_size < 2:
            raise ConfigError(f"vision_config.video_temporal_patch_size={self.video_temporal_patch_size}: expected "
                              "None or at least 2 (tubelets are told from images by their channel count)")

    @property
    def mlp_dim(self) -> int:  # transformers RadioMLP: int(hidden_size * mlp_ratio)
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def num_prefix_tokens(self) -> int:  # cls + register rows, dropped after the blocks
        return self.num_cls_tokens + self.num_registers


@dataclass(frozen=True)
class OmniTokenConfig:
    """Placeholder ids (config.json) and strings (transformers' Omni processor). Video tubelets use the image
    token: the model tells them apart by which input carries the pixels."""

    image_token_id: int | None = None
    video_token_id: int | None = None
    audio_token_id: int | None = None
    image_token: str = "<image>"
    image_start: str = "<img>"
    image_end: str = "</img>"
    audio_token: str = "<so_embedding>"
    audio_start: str = "<so_start>"
    audio_end: str = "<so_end>"


@dataclass(frozen=True)
class OmniConfig:
    """`NemotronH_Omni_Reasoning_V3`: RADIO (+ tubelet embedder) -> [final LayerNorm] -> pixel shuffle -> mlp1,
    Parakeet -> audio projector, both merged at their placeholders into Nemotron-H."""

    lm: LMConfig = field(default_factory=LMConfig)
    vision: OmniVisionConfig = field(default_factory=OmniVisionConfig)
    audio: ParakeetConfig | None = None  # None: no audio branch
    downsample_ratio: float = 0.5
    projector_hidden_size: int = 4096
    vision_hidden_size: int = 1280
    video_pruning_rate: float = 0.0
    video_temporal_patch_size: int = 2
    lm_mtp_layers: int = 0  # text_config.num_nextn_predict_layers: MTP heads (unused) and the vision final norm
    force_image_size: int | None = None  # informational: images come at their own resolution
    tokens: OmniTokenConfig = field(default_factory=OmniTokenConfig)

    def __post_init__(self):
        if self.vision_hidden_size != self.vision.hidden_size:
            raise ConfigError(f"vision_hidden_size={self.vision_hidden_size} but vision_config.hidden_size="
                              f"{self.vision.hidden_size}; the projector input is sized by both")
        if self.vision.video_temporal_patch_size != self.video_temporal_patch_size:
            raise ConfigError(
                f"vision_config.video_temporal_patch_size ({self.vision.video_temporal_patch_size}) and "
                f"video_temporal_patch_size ({self.video_temporal_patch_size}) must be equal (transformers refuses "
                "the mismatch too): the tower's tubelet embedding and the processor's packing would disagree")
        k = round(1 / self.downsample_ratio) if self.downsample_ratio > 0 else 0
        if k < 1 or abs(k * self.downsample_ratio - 1) > 1e-9:
            raise ConfigError(f"downsample_ratio={self.downsample_ratio}: expected 1/k for a whole number k")
        if not 0.0 <= self.video_pruning_rate < 1.0:
            raise ConfigError(f"video_pruning_rate={self.video_pruning_rate}: expected a fraction in [0, 1)")

    @property
    def merge_size(self) -> int:  # pixel-shuffle factor k: grid sides are multiples of it
        return round(1 / self.downsample_ratio)

    @property
    def vision_final_norm(self) -> bool:
        """Megatron adds a final LayerNorm to every block built from the shared config when the LM has MTP layers,
        the vision tower included (transformers `vision_final_layernorm`)."""
        return self.lm_mtp_layers > 0

    def replace(self, **changes) -> "OmniConfig":
        return dataclasses.replace(self, **changes)


def omni_30b_a3b(**changes) -> OmniConfig:
    """Nemotron 3 Nano Omni 30B-A3B at its released widths (docs/format.md §3.7): the Nemotron 3 Nano 30B-A3B LLM
    (`nano3_30b_a3b_lm`), the C-RADIO ViT-H/16 tower (transformers' `RadioConfig` defaults, 2 frames per tubelet),
    the projector at 20480, and the Parakeet encoder (hidden 1024, 24 layers, 128 mel bins) with its 4096-wide audio
    projector. Image / audio token ids are left unset (the tokenizer gives them)."""
    base = dict(lm=nano3_30b_a3b_lm(), vision=OmniVisionConfig(), projector_hidden_size=20480,
                audio=ParakeetConfig(num_mel_bins=128, attention_bias=False, scale_input=False,
                                     projection_hidden_size=4096))
    base.update(changes)
    return OmniConfig(**base)


# --- reader: transformers / released `nemotron_h_omni` config.json -> OmniConfig ------------------------

# transformers `_legacy_field_names`: older name -> field; the older one counts when the field is at its default
LEGACY = {"img_context_token_id": "image_token_id", "video_context_token_id": "video_token_id",
          "sound_context_token_id": "audio_token_id", "llm_config": "text_config", "sound_config": "audio_config",
          "vit_hidden_size": "vision_hidden_size"}
_TOP_DEFAULTS = {"text_config": None, "vision_config": None, "audio_config": None, "force_image_size": None,
                 "downsample_ratio": 0.5, "projector_hidden_size": 4096, "vision_hidden_size": 1280,
                 "video_pruning_rate": 0.0, "video_temporal_patch_size": 2, "image_token_id": None,
                 "video_token_id": None, "audio_token_id": None}
_PROCESSOR = "read by the processor (patch budget, frame and audio handling), not by the model"
OMNI_IGNORED = {  # what is particular to the Omni top level (generic classes: vl/config_policy.py)
    "auto_map": "remote code is never executed", "_name_or_path": "metadata",
    "is_composition": "transformers bookkeeping", "use_cache": "runtime choice",
    "tie_word_embeddings": "the LM config decides", "quantization_config": "read by the quantized-checkpoint loader",
    "patch_size": "duplicate of vision_config.patch_size (checked equal)",
    "template": "informational; the prompt format lives in vl/processing/chat.py",
    "max_sequence_length": "context hint; the LM's max_position_embeddings bounds the context",
    "norm_mean": "the processor's normalisation (pixels reach the model normalised)",
    "norm_std": "the processor's normalisation (pixels reach the model normalised)",
    "img_start_token": "placeholder string (the tokenizer's)", "img_end_token": "placeholder string (the tokenizer's)",
    "img_context_token": "placeholder string (the tokenizer's)",
    "video_context_token": "placeholder string (the tokenizer's)",
    "sound_context_token": "placeholder string (the tokenizer's)",
    "min_num_patches": _PROCESSOR, "max_num_patches": _PROCESSOR, "max_model_len": _PROCESSOR,
    "video_target_num_patches": _PROCESSOR, "video_maintain_aspect_ratio": _PROCESSOR,
    "use_thumbnail": _PROCESSOR, "max_num_tiles": _PROCESSOR, "dynamic_image_size": _PROCESSOR,
    "image_size": "duplicate of force_image_size (informational)",
    "gradient_checkpointing": "training only", "mlp_checkpoint": "training only",
}
OMNI_CHECKS = {
    "ps_version": Check(("v2", None), "lay out the pixel-shuffled grid another way (only v2 exists in transformers)"),
    "image_tag_type": Check(("internvl", None), "change the image tags around each run"),
    "select_layer": Check((-1, None), "take vision features from an earlier ViT block"),
}

_VISION_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "mlp_ratio", "patch_size",
                  "max_img_size", "num_cls_tokens", "num_registers", "video_temporal_patch_size", "layer_norm_eps",
                  "norm_mean", "norm_std")
# keys the released (remote-code) vision_config repeats from the processors: how pixels are cut, not the tower
_PROCESSOR_ONLY = ("sizes the patch grid the processors cut (preprocessor_config.json / "
                   "video_preprocessor_config.json, whose defaults are the released values, as transformers reads "
                   "them); not the tower's maths")
OMNI_VISION_IGNORED = {
    "auto_map": "remote code is never executed", "_name_or_path": "metadata", "use_cache": "runtime choice",
    "initializer_range": "initialisation only", "drop_path_rate": "training only",
    "attention_probs_dropout_prob": "training only", "hidden_dropout_prob": "training only",
    "image_size": "RADIO's pretraining resolution (informational; the CPE table is max_img_size)",
    "summary_idxs": "teacher summary tokens (unused by the VLM; the buffer is ignored)",
    "patch_dim": "derived from num_channels and patch_size (checked)",
    "video_patch_dim": "derived from video_temporal_patch_size and patch_dim (checked)",
    "args": "the remote RADIOConfig's training arguments; transformers sizes the tower by hidden_size, "
            "num_hidden_layers, ... (their defaults are ViT-H/16) and so does this reader",
    "max_resolution": "largest input RADIO accepts (informational)",
    "preferred_resolution": "informational", "version": "informational (e.g. radio_v2.5-h)",
    "adaptor_names": "RADIO teacher adaptor heads (unused by the VLM; tensors ignored)",
    "adaptor_configs": "RADIO teacher adaptor heads (unused by the VLM; tensors ignored)",
    "feature_normalizer_config": "RADIO feature normaliser (unused by the VLM; tensors ignored)",
    "inter_feature_normalizer_config": "RADIO feature normaliser (unused by the VLM; tensors ignored)",
    "min_num_patches": _PROCESSOR_ONLY, "max_num_patches": _PROCESSOR_ONLY,
    "video_target_num_patches": _PROCESSOR_ONLY, "video_maintain_aspect_ratio": _PROCESSOR_ONLY,
}
OMNI_VISION_CHECKS = {
    "separate_video_embedder": Check((True, None), "send video tubelets through the image patch embedder (the "
                                     "released towers have their own video embedder)"),
    "hidden_act": Check(("gelu", None), "change the ViT MLP activation (RADIO uses exact GELU)"),
    "use_swiglu_ffn": Check((False, None), "replace the ViT MLP by a SwiGLU feed-forward"),
    "qkv_bias": Check((True, None), "drop the q/k/v biases of the ViT attention"),
    "num_channels": Check((3, None), "change the number of input channels"),
    "vitdet_window_size": Check((None,), "window attention in the ViT (ViTDet); the released models attend globally"),
    "layer_norm_eps": Check((1e-6, None), "change the ViT LayerNorm epsilon (timm/RADIO use 1e-6)"),
}

def _legacy(raw: dict, reader: KeyReader) -> dict:
    """transformers' `__post_init__` rule: an older key is taken when the field is absent or at its default."""
    raw = dict(raw)
    for old, new in LEGACY.items():
        if old not in raw:
            continue
        value = raw.pop(old)
        if value is not None and raw.get(new, _TOP_DEFAULTS[new]) == _TOP_DEFAULTS[new]:
            raw[new] = value  # honoured under its newer name
        elif value is not None:
            reader.notes.append(f"{reader.label}: {old} (the older name of {new}) not read: {new} is set to "
                                f"{raw[new]!r}, which wins as in transformers")
    return raw


def omni_vision_config_from_hf(vc: dict | None, where: str, notes: list | None = None,
                               layer_scale: bool = False) -> OmniVisionConfig:
    if vc is None:  # transformers: RadioConfig() with the Omni default of 2 frames per tubelet
        return OmniVisionConfig(layer_scale=layer_scale)
    if not isinstance(vc, dict):
        raise ConfigError(f"{where}: vision_config must be an object, found {type(vc).__name__}")
    reader = KeyReader(where, "vision_config", notes)
    taken = reader.sort(vc, mapped=set(_VISION_FIELDS) | {"layerscale_value"}, specific=OMNI_VISION_IGNORED,
                        checks={k: c for k, c in OMNI_VISION_CHECKS.items() if k != "layer_norm_eps"})
    eps = _float(taken.get("layer_norm_eps", 1e-6), "vision_config.layer_norm_eps")
    if abs(eps - 1e-6) > 1e-12:
        reader.refuse("layer_norm_eps", eps, OMNI_VISION_CHECKS["layer_norm_eps"].changes, "1e-06")
    scale = taken.pop("layerscale_value", 1.0)
    if not layer_scale and scale is not None and _float(scale, "vision_config.layerscale_value") != 1.0:
        reader.refuse("layerscale_value", scale, "scale every ViT residual branch by this constant (transformers "
                      "initialises the LayerScale it finds no tensor for with it)", "1.0, or LayerScale tensors in "
                      "the checkpoint")
    out = {k: v for k, v in taken.items() if k in _VISION_FIELDS and k != "layer_norm_eps"}
    out.setdefault("video_temporal_patch_size", None)  # a given vision_config without it has no tubelet embedder
    for key in ("norm_mean", "norm_std"):
        if out.get(key) is not None:
            out[key] = tuple(_float(v, f"vision_config.{key}") for v in out[key])
        else:
            out.pop(key, None)
    if "mlp_ratio" in out:
        out["mlp_ratio"] = _float(out["mlp_ratio"], "vision_config.mlp_ratio")
    patch = out.get("patch_size", 16)
    if vc.get("patch_dim") not in (None, 3 * patch * patch):
        reader.refuse("patch_dim", vc["patch_dim"], "disagree with num_channels * patch_size**2",
                      str(3 * patch * patch))
    t = out.get("video_temporal_patch_size")
    if vc.get("video_patch_dim") is not None and (t is None or vc["video_patch_dim"] != 3 * t * patch * patch):
        reader.refuse("video_patch_dim", vc["video_patch_dim"], "disagree with video_temporal_patch_size * patch_dim",
                      str(None if t is None else 3 * t * patch * patch))
    reader.finish("RADIO vision_config")
    return OmniVisionConfig(layer_scale=layer_scale, **out)


def omni_config_from_hf(raw: dict, *, where: str = "config.json", notes: list | None = None,
                        layer_scale: bool = False) -> OmniConfig:
    """Build an `OmniConfig` from a `nemotron_h_omni` config.json (transformers-written or a released one with its
    older key names) under the policy of vl/config_policy.py; accepted-and-ignored keys go to `notes`.
    `layer_scale`: the checkpoint holds the tower's LayerScale tensors (the loader knows from the tensor names)."""
    notes = [] if notes is None else notes
    reader = KeyReader(where, "top level", notes)
    raw = _legacy(raw, reader)
    text = raw.pop("text_config", None)
    if text is None:
        raise ConfigError(f"{where}: neither text_config nor llm_config is present (the Nemotron-H language model)")
    if not isinstance(text, dict):
        raise ConfigError(f"{where}: text_config must be an object, found {type(text).__name__}")
    lm = lm_config_from_hf(text, where=f"{where} (text_config)", notes=notes, section="text_config")
    mtp = int(text.get("num_nextn_predict_layers") or 0)
    vision = omni_vision_config_from_hf(raw.pop("vision_config", None), where, notes, layer_scale)
    audio_raw = raw.pop("audio_config", None)
    audio = None
    if audio_raw not in (None, {}):  # transformers: a null audio_config builds no audio branch
        audio = parakeet_config_from_hf(audio_raw, where=where, section="audio_config", omni=True, notes=notes)
        if audio.projection_hidden_size is None:
            raise ConfigError(f"{where}: audio_config.projection_hidden_size is missing; the audio projector needs "
                              "it (the released config has 4096)")
    if raw.get("patch_size") not in (None, vision.patch_size):
        reader.refuse("patch_size", raw["patch_size"], "differ from vision_config.patch_size", str(vision.patch_size))
    mapped = {k for k in _TOP_DEFAULTS if k not in ("text_config", "vision_config", "audio_config")}
    taken = reader.sort(raw, mapped=mapped, specific=OMNI_IGNORED, checks=OMNI_CHECKS)
    reader.finish("NemotronH_Omni_Reasoning_V3")
    out = {k: v for k, v in taken.items() if v is not None}
    tokens = OmniTokenConfig(**{k: out.pop(k) for k in ("image_token_id", "video_token_id", "audio_token_id")
                                if k in out})
    for key in ("downsample_ratio", "video_pruning_rate"):
        if key in out:
            out[key] = _float(out[key], key)
    return OmniConfig(lm=lm, vision=vision, audio=audio, lm_mtp_layers=mtp, tokens=tokens, **out)
