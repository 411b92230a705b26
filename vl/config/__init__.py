"""Configuration: nested frozen dataclasses and adapters from foreign `config.json` files.

Style follows gpt-fast `ModelArgs`: plain frozen dataclasses, derived fields computed and validated in
`__post_init__`, named presets as functions. Adapters map every key of a foreign config to one of three
fates: mapped to a field, named in an explicit ignore list (with the reason), or a `ConfigError`.
Nothing is dropped silently.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from vl.config_policy import Check, KeyReader
from vl.errors import ConfigError

# Pattern characters of Nemotron-H (`hybrid_override_pattern`) and the layer-type names that
# transformers (`layers_block_type`) and older exports use for them.
LAYER_CHARS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_TYPE_TO_CHAR = {
    "linear_attention": "M", "mamba": "M", "mamba2": "M",
    "full_attention": "*", "attention": "*",
    "mlp": "-", "moe": "E",
}
ACTIVATIONS = ("relu2", "gelu", "silu", "relu")


def _float(value, key):
    """JSON floats as transformers writes them, including `{"__float__": "Infinity"}`."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config key {key!r}: expected a number, found {value!r}") from None


@dataclass(frozen=True)
class LMConfig:
    """Nemotron-H hybrid language model. Field names follow transformers' `NemotronHConfig`."""

    vocab_size: int = 256
    hidden_size: int = 64
    pattern: str = "M-M*-"  # one character per layer: M mamba-2, * attention, - MLP, E MoE
    # attention
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    attention_bias: bool = False
    # MLP
    intermediate_size: int = 128
    mlp_hidden_act: str = "relu2"
    mlp_bias: bool = False
    # Mamba-2
    mamba_num_heads: int = 8
    mamba_head_dim: int = 16
    n_groups: int = 2
    ssm_state_size: int = 16
    conv_kernel: int = 4
    chunk_size: int = 128
    use_conv_bias: bool = True
    use_bias: bool = False  # in_proj / out_proj bias
    mamba_hidden_act: str = "silu"
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    mamba_ssm_cache_dtype: str = "float32"
    # MoE (Nemotron 3 family)
    n_routed_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    moe_shared_expert_intermediate_size: int = 0
    moe_latent_size: int | None = None
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    # everything else
    layer_norm_epsilon: float = 1e-5
    residual_in_fp32: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 131072
    bos_token_id: int | None = 1
    eos_token_id: tuple[int, ...] = (2,)
    pad_token_id: int | None = 0

    def __post_init__(self):
        bad = sorted(set(self.pattern) - set(LAYER_CHARS))
        if not self.pattern or bad:
            raise ConfigError(
                f"layer pattern {self.pattern!r}: expected a non-empty string over {''.join(LAYER_CHARS)}, "
                f"found characters {bad}"
            )
        for name in ("mlp_hidden_act",):
            if getattr(self, name) not in ACTIVATIONS:
                raise ConfigError(f"{name}={getattr(self, name)!r}: supported are {ACTIVATIONS}")
        if self.mamba_hidden_act != "silu":
            raise ConfigError(f"mamba_hidden_act={self.mamba_hidden_act!r}: only 'silu' exists in Nemotron-H")
        if "*" in self.pattern and self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if "M" in self.pattern and self.mamba_num_heads % self.n_groups:
            raise ConfigError(f"mamba_num_heads={self.mamba_num_heads} must be a multiple of n_groups={self.n_groups}")
        if "E" in self.pattern:
            if not (self.n_routed_experts and self.num_experts_per_tok and self.moe_intermediate_size):
                raise ConfigError("pattern has MoE layers 'E' but n_routed_experts / num_experts_per_tok / "
                                  "moe_intermediate_size are not all set")
            if self.n_routed_experts % self.n_group:
                raise ConfigError(f"n_routed_experts={self.n_routed_experts} not divisible by n_group={self.n_group}")
        lo, hi = self.time_step_limit
        if not (0.0 <= lo <= hi):
            raise ConfigError(f"time_step_limit={self.time_step_limit}: expected 0 <= low <= high")
        if self.mamba_ssm_cache_dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"mamba_ssm_cache_dtype={self.mamba_ssm_cache_dtype!r} is not a float dtype name")

    # derived ------------------------------------------------------------------------------------
    @property
    def num_hidden_layers(self) -> int:
        return len(self.pattern)

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        return self.mamba_d_inner + 2 * self.n_groups * self.ssm_state_size

    @property
    def mamba_in_proj_dim(self) -> int:  # [z | x | B | C | dt]
        return self.mamba_d_inner + self.mamba_conv_dim + self.mamba_num_heads

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, c in enumerate(self.pattern) if c == "*")

    @property
    def mamba_layers(self) -> tuple[int, ...]:
        return tuple(i for i, c in enumerate(self.pattern) if c == "M")

    def replace(self, **changes) -> "LMConfig":
        return dataclasses.replace(self, **changes)


# --- adapter: transformers / hub `nemotron_h` config.json -> LMConfig ---------------------------------

_LM_RENAMES = {  # foreign alias -> our field
    "mamba_n_groups": "n_groups",
    "mamba_d_conv": "conv_kernel",
    "mamba_chunk_size": "chunk_size",
    "mamba_conv_bias": "use_conv_bias",
    "mamba_dt_limit": "time_step_limit",
    "attention_head_dim": "head_dim",
    "kv_channels": "head_dim",
    "num_local_experts": "n_routed_experts",
    "mamba_n_heads": "mamba_num_heads",
    "mamba_d_head": "mamba_head_dim",
    "mamba_d_state": "ssm_state_size",
}

# Keys of real Nemotron-H configs that do not change inference, each with the reason it is safe. The generic
# classes (transformers' PretrainedConfig attributes, generation defaults, dtype/attention hints, token ids,
# `_` bookkeeping) are vl/config_policy.py's; this table holds what is particular to Nemotron-H.
LM_IGNORED = {
    "auto_map": "remote code is never executed", "_name_or_path": "metadata",
    "initializer_range": "initialisation only", "rescale_prenorm_residual": "initialisation only",
    "time_step_min": "initialisation only (transformers' torch path also clamps dt with it; we follow the "
                     "kernels and vLLM: no clamp)",
    "time_step_max": "initialisation only", "time_step_floor": "initialisation only",
    "mamba_dt_min": "initialisation only", "mamba_dt_max": "initialisation only",
    "mamba_dt_init_floor": "initialisation only", "time_step_rank": "initialisation only",
    "expand": "derived: d_inner is mamba_num_heads * mamba_head_dim",
    "mamba_expand": "derived: d_inner is mamba_num_heads * mamba_head_dim",
    "use_cache": "runtime choice", "num_logits_to_keep": "runtime choice",
    "use_mamba_kernels": "runtime choice (kernels are picked at run time)",
    "attention_dropout": "training only", "hidden_dropout": "training only",
    "output_router_logits": "training only", "router_aux_loss_coef": "training only",
    "mamba_proj_bias": "unused by the reference; in_proj/out_proj bias follows use_bias",
    "moe_shared_expert_overlap": "scheduling hint",
    "n_shared_experts": "the shared expert is one MLP of moe_shared_expert_intermediate_size",
    "num_nextn_predict_layers": "multi-token-prediction heads are not used for decoding (mtp.* tensors ignored)",
    "mtp_layers_block_type": "multi-token-prediction heads are not used for decoding (mtp.* tensors ignored)",
    "mtp_hybrid_override_pattern": "multi-token-prediction heads are not used for decoding (mtp.* tensors ignored)",
    "num_hidden_layers": "derived: checked against the pattern length",
    "rms_norm_eps": "duplicate of layer_norm_epsilon (used when that is absent)",
    "norm_eps": "duplicate of layer_norm_epsilon",
    "quantization_config": "read by the quantized-checkpoint loader",
    "rope_theta": "unused: Nemotron-H has no RoPE", "partial_rotary_factor": "unused: Nemotron-H has no RoPE",
    "rope_scaling": "unused: Nemotron-H has no RoPE", "rope_parameters": "unused: Nemotron-H has no RoPE",
}
LM_CHECKS = {
    "sliding_window": Check((None,), "restrict attention to a sliding window (Nemotron-H attends to all tokens)"),
    "position_embedding_type": Check(("nope", None), "add position embeddings (Nemotron-H has none)"),
}


def lm_config_from_hf(raw: dict, *, where: str = "config.json", notes: list | None = None,
                      section: str = "config.json") -> LMConfig:
    """Build an `LMConfig` from a transformers/hub `nemotron_h` config dict under the policy of
    vl/config_policy.py; accepted-and-ignored keys are appended to `notes`."""
    raw = dict(raw)
    fields = {f.name for f in dataclasses.fields(LMConfig)} - {"pattern"}
    out: dict = {}
    reader = KeyReader(where, section, notes)

    # layer pattern: hybrid_override_pattern (str or list of chars) or layers_block_type / layer_types
    pattern = None
    for key in ("hybrid_override_pattern", "layers_block_type", "layer_types"):
        if key in raw and raw[key] is not None:
            value = raw.pop(key)
            if pattern is not None:
                continue  # both given: the first (hybrid_override_pattern) wins, the other is a duplicate
            if key == "hybrid_override_pattern":
                pattern = "".join(value)
            else:
                try:
                    pattern = "".join(_TYPE_TO_CHAR[t] for t in value)
                except (KeyError, TypeError):
                    raise ConfigError(f"{where}: {key}={value!r} has layer types outside {sorted(_TYPE_TO_CHAR)}")
        else:
            raw.pop(key, None)
    if pattern is None:
        raise ConfigError(f"{where}: no layer pattern (expected hybrid_override_pattern or layers_block_type)")
    out["pattern"] = pattern

    if "layer_norm_epsilon" not in raw and "rms_norm_eps" in raw:
        raw["layer_norm_epsilon"] = raw["rms_norm_eps"]
    n_layers = raw.get("num_hidden_layers")
    if n_layers is not None and n_layers != len(pattern):
        raise ConfigError(f"{where}: num_hidden_layers={n_layers} but the layer pattern has {len(pattern)} layers")

    names = set(fields) | set(_LM_RENAMES)
    for key, value in reader.sort(raw, mapped=names, specific=LM_IGNORED, checks=LM_CHECKS).items():
        target = _LM_RENAMES.get(key, key)
        if target in out and key != target:
            continue  # the canonical key wins over an alias
        out[target] = value
    reader.finish("Nemotron-H")

    if "time_step_limit" in out:
        lo, hi = out["time_step_limit"]
        out["time_step_limit"] = (_float(lo, "time_step_limit"), _float(hi, "time_step_limit"))
    eos = out.get("eos_token_id")
    if eos is not None:
        out["eos_token_id"] = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    else:
        out["eos_token_id"] = ()
    if out.get("moe_latent_size") is None:
        out["moe_latent_size"] = None
    for key in ("layer_norm_epsilon", "routed_scaling_factor"):
        if key in out:
            out[key] = _float(out[key], key)
    if "E" not in pattern:  # MoE fields present in every transformers config but meaningless here
        for key in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "moe_shared_expert_intermediate_size", "moe_latent_size"):
            out.pop(key, None)
    return LMConfig(**out)


def lm_config_to_hf(cfg: LMConfig) -> dict:
    """The inverse adapter: a config dict that transformers' `NemotronHConfig` reads back to the same model."""
    d = dataclasses.asdict(cfg)
    d.pop("pattern")
    d["hybrid_override_pattern"] = cfg.pattern
    d["num_hidden_layers"] = cfg.num_hidden_layers
    d["time_step_limit"] = list(cfg.time_step_limit)  # json writes inf as Infinity, which transformers reads
    d["eos_token_id"] = list(cfg.eos_token_id) if len(cfg.eos_token_id) != 1 else cfg.eos_token_id[0]
    d["model_type"] = "nemotron_h"
    d["architectures"] = ["NemotronHForCausalLM"]
    if "E" not in cfg.pattern:
        for key in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "moe_shared_expert_intermediate_size", "moe_latent_size", "n_group", "topk_group",
                    "norm_topk_prob", "routed_scaling_factor"):
            d.pop(key)
    return d


# --- presets -----------------------------------------------------------------------------------------

def tiny_lm(**changes) -> LMConfig:
    """A few-thousand-parameter model with every layer kind except MoE, for tests."""
    return LMConfig(**changes)


def bench_180m_lm(**changes) -> LMConfig:
    """~180M parameters with the 12B model's proportions (d_inner = 2 x hidden, 8 groups, state 128,
    a quarter of the layers Mamba-2, a few attention layers, the rest ReLU^2 MLPs), for CPU benchmarks."""
    base = dict(
        vocab_size=16384, hidden_size=1024, pattern="M-M-M*-M-M-M-M*-M-M-M-", num_attention_heads=8,
        num_key_value_heads=2, head_dim=128, intermediate_size=3072, mamba_num_heads=32, mamba_head_dim=64,
        n_groups=8, ssm_state_size=128, chunk_size=128,
    )
    base.update(changes)
    return LMConfig(**base)


def nano_12b_lm(**changes) -> LMConfig:
    """Nemotron Nano 12B v2 (the LLM of Nano V2 VL), from docs/format.md §2.2."""
    base = dict(
        vocab_size=131072, hidden_size=5120,
        pattern="M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-",
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, intermediate_size=20480,
        mamba_num_heads=128, mamba_head_dim=80, n_groups=8, ssm_state_size=128, chunk_size=128,
    )
    base.update(changes)
    return LMConfig(**base)


def nano3_30b_a3b_lm(**changes) -> LMConfig:
    """Nemotron 3 Nano 30B-A3B, the hybrid MoE LLM of Nemotron 3 Nano Omni: 52 layers (23 Mamba-2, 23 MoE, 6
    attention), hidden 2688, 128 routed experts of width 1856 (6 per token) and one shared expert of 3712. The
    widths are transformers' `NemotronHConfig` defaults with the overrides its `Nemotron3_5TranscribeConfig` gives
    its text_config (the same released LLM), as docs/format.md §3.7 lists them; docs/benchmarks.md names each."""
    base = dict(
        vocab_size=131072, hidden_size=2688,
        pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
        num_attention_heads=32, num_key_value_heads=2, head_dim=128, intermediate_size=1856,
        mamba_num_heads=64, mamba_head_dim=64, n_groups=8, ssm_state_size=128, chunk_size=128,
        n_routed_experts=128, num_experts_per_tok=6, moe_intermediate_size=1856,
        moe_shared_expert_intermediate_size=3712, routed_scaling_factor=2.5, max_position_embeddings=262144,
    )
    base.update(changes)
    return LMConfig(**base)


# --- vision tower and the composed VL model ----------------------------------------------------------

@dataclass(frozen=True)
class VisionConfig:
    """RADIO ViT. Width/depth/heads come from a timm ViT name, RADIO's own convention."""

    model: str = "vit_tiny_patch16_224"
    patch_size: int = 16
    cpe_max_size: int = 2048
    num_prefix_tokens: int = 8  # cls + register rows; read from the checkpoint tensor's shape at load

    def __post_init__(self):
        if self.cpe_max_size % self.patch_size:
            raise ConfigError(f"cpe_max_size={self.cpe_max_size} must be a multiple of patch_size={self.patch_size}")


@dataclass(frozen=True)
class MediaTokenConfig:
    img_start: str = "<img>"
    img_end: str = "</img>"
    img_context: str = "<image>"
    video_context: str = "<video>"
    img_context_id: int | None = None
    video_context_id: int | None = None


@dataclass(frozen=True)
class VLConfig:
    """`NemotronH_Nano_VL_V2`: RADIO -> pixel shuffle -> mlp1 -> Nemotron-H."""

    lm: LMConfig = field(default_factory=LMConfig)
    vision: VisionConfig = field(default_factory=VisionConfig)
    force_image_size: int = 512
    downsample_ratio: float = 0.5
    ps_version: str = "v2"
    projector_hidden_size: int = 20480
    vit_hidden_size: int = 1280
    use_thumbnail: bool = True
    max_num_tiles: int = 12
    norm_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    norm_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    tokens: MediaTokenConfig = field(default_factory=MediaTokenConfig)
    video_pruning_rate: float = 0.0
    template: str | None = None  # informational; the prompt format lives in vl/processing/chat.py

    def __post_init__(self):
        if self.ps_version != "v2":
            raise ConfigError(f"ps_version={self.ps_version!r}: only 'v2' (the released models) is supported")
        if self.force_image_size % self.vision.patch_size:
            raise ConfigError(f"force_image_size={self.force_image_size} is not a multiple of the patch size "
                              f"{self.vision.patch_size}")
        k = round(1 / self.downsample_ratio)
        if abs(k * self.downsample_ratio - 1) > 1e-9 or (self.force_image_size // self.vision.patch_size) % k:
            raise ConfigError(f"downsample_ratio={self.downsample_ratio} must be 1/k with k dividing the patch grid "
                              f"{self.force_image_size // self.vision.patch_size}")
        if not 0.0 <= self.video_pruning_rate < 1.0:
            raise ConfigError(f"video_pruning_rate={self.video_pruning_rate}: expected a fraction in [0, 1)")
        if len(self.norm_mean) != 3 or len(self.norm_std) != 3 or min(self.norm_std) <= 0:
            raise ConfigError(f"norm_mean/norm_std must be three numbers each (std > 0), got {self.norm_mean}, "
                              f"{self.norm_std}")

    @property
    def grid(self) -> int:  # patches per tile side
        return self.force_image_size // self.vision.patch_size

    @property
    def tokens_per_tile(self) -> int:
        return int(self.grid * self.downsample_ratio) ** 2

    def replace(self, **changes) -> "VLConfig":
        return dataclasses.replace(self, **changes)


_VL_MAPPED = {"force_image_size", "downsample_ratio", "ps_version", "projector_hidden_size", "vit_hidden_size",
              "use_thumbnail", "max_num_tiles", "norm_mean", "norm_std", "video_pruning_rate", "template"}
_VL_TOKENS = {"img_start_token": "img_start", "img_end_token": "img_end", "img_context_token": "img_context",
              "video_context_token": "video_context", "img_context_token_id": "img_context_id",
              "image_context_token_id": "img_context_id", "image_token_id": "img_context_id",
              "video_context_token_id": "video_context_id", "video_token_id": "video_context_id"}
VL_IGNORED = {  # what is particular to NemotronH_Nano_VL_V2 (generic classes: vl/config_policy.py)
    "auto_map": "remote code is never executed", "_name_or_path": "metadata",
    "is_composition": "transformers bookkeeping", "use_cache": "runtime choice",
    "image_tag_type": "checked: must be 'internvl' (<img>...</img>)",
    "patch_size": "duplicate of vision_config.patch_size (checked equal)",
    "vision_hidden_size": "duplicate of vit_hidden_size",
    "sound_context_token": "audio branch (absent)", "sound_context_token_id": "audio branch (absent)",
    "tie_word_embeddings": "the LM config decides",
    "quantization_config": "read by the quantized-checkpoint loader",
    "image_size": "duplicate of force_image_size",
    "max_sequence_length": "context hint; the LM's max_position_embeddings bounds the context",
    "max_dynamic_patch": "duplicate of max_num_tiles",
    "gradient_checkpointing": "training only", "mlp_checkpoint": "training only",
}
VL_CHECKS = {
    "min_num_patches": Check((None,), "switch images to dynamic-resolution patching (later Nemotron VL models); "
                                      "Nano V2 VL tiles images"),
    "max_num_patches": Check((None,), "switch images to dynamic-resolution patching (later Nemotron VL models); "
                                      "Nano V2 VL tiles images"),
    "sound_config": Check((None, {}), "add the audio branch of later models"),
    "video_temporal_patch_size": Check((1, None), "embed video frames in tubelets (V3/Omni); V2 embeds each frame"),
    "select_layer": Check((-1, None), "take vision features from an earlier ViT block"),
    "pad2square": Check((False, None), "pad images to a square before tiling (ours resizes each tile)"),
    "dynamic_image_size": Check((True, None), "turn tiling off"),
    "min_dynamic_patch": Check((1, None), "set a minimum tile count above 1"),
}
# vision_config (RADIO's remote `RADIOConfig`): we read args.model, args.cpe_max_size and patch_size.
VISION_IGNORED = {
    "auto_map": "remote code is never executed", "_name_or_path": "metadata",
    "version": "informational (e.g. radio_v2.5-h)",
    "max_resolution": "largest input RADIO accepts; our tiles are force_image_size",
    "preferred_resolution": "informational; our tiles are force_image_size",
    "adaptor_names": "RADIO teacher adaptor heads (unused by the VLM; tensors ignored)",
    "adaptor_configs": "RADIO teacher adaptor heads (unused by the VLM; tensors ignored)",
    "feature_normalizer_config": "RADIO feature normaliser (unused by the VLM; tensors ignored)",
    "inter_feature_normalizer_config": "RADIO feature normaliser (unused by the VLM; tensors ignored)",
    "use_cache": "runtime choice",
}
VISION_CHECKS = {
    "vitdet_window_size": Check((None,), "window attention in the ViT (ViTDet); the released models attend globally"),
}
# vision_config.args is RADIO's training command line (argparse namespace): optimiser, data, logging, teachers.
# Only the keys that build the network matter; the rest is accepted as one class, named in the notes.
ARGS_MAPPED = ("model", "cpe_max_size")
ARGS_CHECKS = {
    "model_norm": Check((False, None), "add a final norm after the ViT blocks"),
    "vitdet_window_size": Check((None,), "window attention in the ViT (ViTDet); the released models attend globally"),
    "window_size": Check((None,), "window attention in the ViT"),
    "model_kwargs": Check(({}, None), "pass extra options to the timm ViT constructor"),
    "in_chans": Check((3, None), "change the number of input channels"),
    "min_num_patches": Check((None,), "switch to dynamic-resolution patching"),
    "max_num_patches": Check((None,), "switch to dynamic-resolution patching"),
}
ARGS_PREFIX_TOKENS = ("teachers", "register_multiple", "cls_token_per_teacher", "num_registers", "num_cls_tokens",
                      "cpe_num_registers")


def vision_config_from_hf(vc: dict, where: str, notes: list | None = None) -> VisionConfig:
    if not isinstance(vc, dict):
        raise ConfigError(f"{where}: vision_config must be an object")
    args = vc.get("args") or {}
    if not isinstance(args, dict):
        raise ConfigError(f"{where}: vision_config.args must be an object, found {type(args).__name__}")
    reader = KeyReader(where, "vision_config", notes)
    reader.sort({k: v for k, v in vc.items() if k != "args"}, mapped=("model", "patch_size"),
                specific=VISION_IGNORED, checks=VISION_CHECKS)
    args_reader = KeyReader(where, "vision_config.args", reader.notes)
    training = {k: "RADIO training arguments (optimiser, data, logging; they do not build the network)"
                for k in args if k not in ARGS_MAPPED and k not in ARGS_CHECKS}
    training.update({k: "cls/register token count (read from the cls_token tensor's shape instead)"
                     for k in ARGS_PREFIX_TOKENS if k in args})
    training.update({k: "duplicate of vision_config.patch_size" for k in ("patch_size",) if k in args})
    args_reader.sort(args, mapped=ARGS_MAPPED, specific=training, checks=ARGS_CHECKS)
    name = args.get("model") or vc.get("model")
    if not name:
        raise ConfigError(f"{where}: vision_config.args.model (a timm ViT name such as vit_huge_patch16_224) is missing")
    reader.finish("RADIO vision_config")
    args_reader.finish("RADIO vision_config.args")
    patch = vc.get("patch_size", args.get("patch_size", 16))
    patch = patch[0] if isinstance(patch, list) else patch
    return VisionConfig(model=name, patch_size=int(patch), cpe_max_size=int(args.get("cpe_max_size") or 2048))


# RADIO's default input conditioner is OpenAI CLIP's mean/std (NVlabs RADIO `input_conditioner.py`,
# `get_default_conditioner`); docs/checkpoints.md says where the normalisation is read from.
RADIO_DEFAULT_NORM = {"norm_mean": [0.48145466, 0.4578275, 0.40821073],
                      "norm_std": [0.26862954, 0.26130258, 0.27577711]}


def with_normalisation(raw: dict, preprocessor: dict | None) -> dict:
    """config.json's norm_mean/norm_std, else preprocessor_config.json's (norm_* or image_*), else RADIO's default.
    The loader and the processor both resolve it here, so they agree; the loader then checks the checkpoint's
    own input_conditioner buffers against the result."""
    raw = dict(raw)
    pre = preprocessor or {}
    for key, alias in (("norm_mean", "image_mean"), ("norm_std", "image_std")):
        if raw.get(key) is None:
            raw[key] = pre.get(key) if pre.get(key) is not None else pre.get(alias) or RADIO_DEFAULT_NORM[key]
    return raw


def vl_config_from_hf(raw: dict, *, num_prefix_tokens: int | None = None, where: str = "config.json",
                      notes: list | None = None) -> VLConfig:
    """Build a `VLConfig` from a `NemotronH_Nano_VL_V2` config.json under the policy of vl/config_policy.py;
    accepted-and-ignored keys of every section are appended to `notes`."""
    raw = dict(raw)
    notes = [] if notes is None else notes
    lm_key = "llm_config" if raw.get("llm_config") is not None else "text_config"
    lm_raw = raw.pop("llm_config", None) or raw.pop("text_config", None)
    raw.pop("text_config", None)
    if lm_raw is None:
        raise ConfigError(f"{where}: neither llm_config nor text_config is present")
    lm = lm_config_from_hf(lm_raw, where=f"{where} ({lm_key})", notes=notes, section=lm_key)
    vision = vision_config_from_hf(raw.pop("vision_config", None), where, notes)
    if num_prefix_tokens is not None:
        vision = dataclasses.replace(vision, num_prefix_tokens=num_prefix_tokens)
    reader = KeyReader(where, "top level", notes)
    if raw.get("patch_size") not in (None, vision.patch_size):
        reader.refuse("patch_size", raw["patch_size"], "differ from vision_config.patch_size",
                      str(vision.patch_size))
    if raw.get("image_tag_type", "internvl") not in ("internvl", None):
        reader.refuse("image_tag_type", raw["image_tag_type"], "change the image tags around each run",
                      "'internvl' (<img>...</img>)")
    taken = reader.sort(raw, mapped=set(_VL_MAPPED) | set(_VL_TOKENS), specific=VL_IGNORED, checks=VL_CHECKS)
    reader.finish("NemotronH_Nano_VL_V2")
    out, tokens = {}, {}
    for key, value in taken.items():
        if key in _VL_MAPPED:
            out[key] = value
        elif value is not None:
            tokens[_VL_TOKENS[key]] = value
    if out.get("max_num_tiles") is None and raw.get("max_dynamic_patch") is not None:
        out["max_num_tiles"] = raw["max_dynamic_patch"]
    for key in ("force_image_size", "max_num_tiles", "use_thumbnail", "template", "norm_mean", "norm_std"):
        if out.get(key) is None:
            out.pop(key, None)
    for key in ("norm_mean", "norm_std"):
        if key in out:
            out[key] = tuple(_float(v, key) for v in out[key])
    if "downsample_ratio" in out:
        out["downsample_ratio"] = _float(out["downsample_ratio"], "downsample_ratio")
    if "video_pruning_rate" in out:
        out["video_pruning_rate"] = _float(out["video_pruning_rate"] or 0.0, "video_pruning_rate")
    cfg = VLConfig(lm=lm, vision=vision, tokens=MediaTokenConfig(**tokens), **out)
    return cfg


def vl_config_to_hf(cfg: VLConfig) -> dict:
    t = cfg.tokens
    d = {
        "architectures": ["NemotronH_Nano_VL_V2"], "model_type": "NemotronH_Nano_VL_V2",
        "llm_config": lm_config_to_hf(cfg.lm),
        "vision_config": {"model_type": "radio", "patch_size": cfg.vision.patch_size,
                          "args": {"model": cfg.vision.model, "cpe_max_size": cfg.vision.cpe_max_size}},
        "force_image_size": cfg.force_image_size, "patch_size": cfg.vision.patch_size,
        "downsample_ratio": cfg.downsample_ratio, "ps_version": cfg.ps_version, "image_tag_type": "internvl",
        "projector_hidden_size": cfg.projector_hidden_size, "vit_hidden_size": cfg.vit_hidden_size,
        "use_thumbnail": cfg.use_thumbnail, "max_num_tiles": cfg.max_num_tiles,
        "norm_mean": list(cfg.norm_mean), "norm_std": list(cfg.norm_std),
        "img_start_token": t.img_start, "img_end_token": t.img_end, "img_context_token": t.img_context,
        "video_context_token": t.video_context, "img_context_token_id": t.img_context_id,
        "video_context_token_id": t.video_context_id, "video_pruning_rate": cfg.video_pruning_rate,
    }
    if cfg.template is not None:
        d["template"] = cfg.template
    return d


def tiny_vl(**changes) -> VLConfig:
    """A tiny Nano-V2-VL-shaped model for tests: 64 px tiles, patch 16, 4 tokens per tile."""
    base = dict(lm=LMConfig(vocab_size=300), vision=VisionConfig(model="vit_tiny_patch16_224", num_prefix_tokens=4),
                force_image_size=64, projector_hidden_size=96, vit_hidden_size=192,
                tokens=MediaTokenConfig(img_context_id=299, video_context_id=298))
    base.update(changes)
    return VLConfig(**base)
