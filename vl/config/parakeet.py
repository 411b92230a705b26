"""The audio encoder's config: Nemotron 3 Nano Omni's `audio_config` (older directories: `sound_config`), the
fields of transformers' `ParakeetEncoderConfig` as a frozen dataclass, read by the one config policy
(vl/config_policy.py): keys mapped, accepted and named, or refused when they change the maths we do not implement."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from vl.config_policy import Check, KeyReader
from vl.errors import ConfigError

PARAKEET_ACTIVATIONS = ("silu", "swish", "relu", "gelu")  # the names of transformers' ACT2FN that it implements


@dataclass(frozen=True)
class ParakeetConfig:
    """Parakeet / FastConformer encoder (vl/modeling/parakeet.py), field for field transformers'
    `ParakeetEncoderConfig` with its defaults; `projection_*` size the Omni's audio projector (`embed_audio`).

    The Omni config supplies `attention_bias=False, scale_input=False` where its `audio_config` omits them
    (`parakeet_config_from_hf(..., omni=True)`), as transformers' `NemotronH_Omni_Reasoning_V3_Config` does."""

    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 8
    head_dim: int | None = None  # None: hidden_size // num_attention_heads (`head_size`)
    intermediate_size: int = 4096
    hidden_act: str = "silu"
    attention_bias: bool = True  # q/k/v/o projections and the feed-forward Linears
    convolution_bias: bool = True  # the conformer convolution module's three convolutions
    conv_kernel_size: int = 9
    subsampling_factor: int = 8
    subsampling_conv_channels: int = 256
    num_mel_bins: int = 80
    subsampling_conv_kernel_size: int = 3
    subsampling_conv_stride: int = 2
    scale_input: bool = True  # multiply the subsampled features by sqrt(hidden_size)
    projection_hidden_size: int | None = None  # Omni audio projector: RMSNorm -> Linear -> ReLU² -> Linear
    projection_bias: bool = False

    def __post_init__(self):
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "conv_kernel_size", "subsampling_factor", "subsampling_conv_channels", "num_mel_bins",
                     "subsampling_conv_kernel_size", "subsampling_conv_stride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"ParakeetConfig.{name} must be a positive integer, found {value!r}")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                              f"{self.num_attention_heads}; set head_dim")
        if self.head_dim is not None and (isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int)
                                          or self.head_dim <= 0):
            raise ConfigError(f"ParakeetConfig.head_dim must be a positive integer or None, found {self.head_dim!r}")
        if self.hidden_size % 2:
            raise ConfigError(f"hidden_size={self.hidden_size} must be even (sin/cos position pairs)")
        if self.hidden_act not in PARAKEET_ACTIVATIONS:
            raise ConfigError(f"hidden_act={self.hidden_act!r}: expected one of {PARAKEET_ACTIVATIONS}")
        if self.conv_kernel_size % 2 == 0:
            raise ConfigError(f"conv_kernel_size={self.conv_kernel_size} must be odd: the depthwise convolution "
                              "pads (k - 1) / 2 on each side to keep the length")
        layers = self.subsampling_layers  # checks the factor
        k, s = self.subsampling_conv_kernel_size, self.subsampling_conv_stride
        if s == 1:
            raise ConfigError("subsampling_conv_stride=1 does not subsample; expected 2 or more")
        freq = self.num_mel_bins
        for _ in range(layers):
            freq = (freq + 2 * ((k - 1) // 2) - k) // s + 1
        if freq != self.num_mel_bins // s**layers:
            raise ConfigError(
                f"num_mel_bins={self.num_mel_bins} leaves {freq} frequency rows after {layers} stride-{s} "
                f"convolutions where the subsampling Linear expects num_mel_bins // {s**layers} = "
                f"{self.num_mel_bins // s**layers}; use a multiple of {s**layers}"
            )

    @property
    def head_size(self) -> int:
        """Per-head width: `head_dim` when the config sets it, else hidden_size / num_attention_heads."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def subsampling_layers(self) -> int:
        layers = round(math.log2(self.subsampling_factor))
        if self.subsampling_factor < 2 or 2**layers != self.subsampling_factor:
            raise ConfigError(f"subsampling_factor={self.subsampling_factor} must be a power of two >= 2 "
                              "(one stride-2 convolution per factor of two)")
        return layers


_PARAKEET_FIELDS = tuple(f.name for f in dataclasses.fields(ParakeetConfig))
PARAKEET_IGNORED = {
    **{k: "training-only regularisation (no effect in inference)"
       for k in ("dropout", "dropout_positions", "layerdrop", "activation_dropout", "attention_dropout")},
    "initializer_range": "initialisation only",
    "max_position_embeddings": "relative positions are computed for any length (transformers does the same); "
                               "not a limit on the maths",
    "sampling_rate": "the feature extractor's sampling rate is the one used (preprocessor_config.json)",
}
OMNI_AUDIO_DEFAULTS = {"attention_bias": False, "scale_input": False}


def parakeet_config_from_hf(raw: dict, *, where: str = "config.json", section: str = "audio_config",
                            omni: bool = True, notes: list | None = None) -> ParakeetConfig:
    """`ParakeetConfig` from an `audio_config` (or legacy `sound_config`) dict under vl/config_policy.py's policy.

    `omni=True` applies the Omni config's defaults for keys its released checkpoints omit (`attention_bias` and
    `scale_input` False); `omni=False` reads a plain `ParakeetEncoderConfig` (both True by default)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {section} must be an object, found {type(raw).__name__}")
    raw = {**(OMNI_AUDIO_DEFAULTS if omni else {}), **raw}
    reader = KeyReader(where, section, notes)
    checks = {"num_key_value_heads": Check((raw.get("num_attention_heads", 8), None),
                                           "make the attention grouped-query (fewer key/value heads)")}
    taken = reader.sort(raw, mapped=_PARAKEET_FIELDS, specific=PARAKEET_IGNORED, checks=checks)
    if taken.get("hidden_act", "silu") not in PARAKEET_ACTIVATIONS:
        reader.refuse("hidden_act", taken["hidden_act"], "use an activation this encoder does not implement",
                      " or ".join(PARAKEET_ACTIVATIONS))
    reader.finish("Parakeet audio_config")
    return ParakeetConfig(**taken)


def parakeet_config_to_hf(cfg: ParakeetConfig) -> dict:
    """The `audio_config` dict transformers' `ParakeetEncoderConfig` reads (and the Omni projector's keys)."""
    return {k: v for k, v in dataclasses.asdict(cfg).items()
            if not (v is None and k in ("head_dim", "projection_hidden_size"))}


def tiny_parakeet(**changes) -> ParakeetConfig:
    """A tiny Parakeet encoder for tests: 2 layers of width 32, 16 mel bins, subsampling x8."""
    base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_kernel_size=5,
                subsampling_conv_channels=8, num_mel_bins=16, attention_bias=False, scale_input=False,
                projection_hidden_size=48)
    base.update(changes)
    return ParakeetConfig(**base)
