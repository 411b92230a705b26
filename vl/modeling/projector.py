"""Vision -> LLM projector of Nemotron Nano V2 VL: pixel shuffle v2, then `mlp1`.

Follows the reference `extract_feature` (HF remote `modeling.py`, vLLM `nano_nemotron_vl.py`): encoder
patch tokens (N, h*w, C) -> grid (N, h, w, C) -> pixel shuffle by 1/downsample_ratio (2x2 for the
released 0.5) -> (N, h*w/4, 4C) -> `mlp1` = RMSNorm -> Linear -> ReLU^2 -> Linear (no biases).
Facts: docs/format.md §6.1-6.3; numerics are tested against
transformers' `nemotron_h_omni` pixel shuffle + projector.

`mlp1` is an `nn.Sequential` so its keys are the checkpoint's: `mlp1.0.weight` (norm), `mlp1.1.weight`,
`mlp1.3.weight` (index 2 is the parameter-free activation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vl.errors import ConfigError, InputError
from vl.modeling.norms import RMSNorm  # fp32 statistics and weight multiply, weight as is (no +1)

SUPPORTED_PS_VERSIONS = ("v2",)


class SquaredReLU(nn.Module):
    """relu(x)^2 (Primer; Nemotron-H "relu2")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.square(F.relu(x))


def build_mlp1(in_dim: int, hidden_dim: int, out_dim: int, eps: float = 1e-5) -> nn.Sequential:
    """`mlp1`: RMSNorm(in) -> Linear(in, hidden) -> ReLU^2 -> Linear(hidden, out), all bias-free.

    For the 12B model: in = 4 * 1280 = 5120, hidden = `projector_hidden_size` = 20480 (the config
    class default of 4096 does not apply), out = LLM hidden 5120. The norm keeps its weight multiply in
    fp32 and casts only the result, as transformers' nemotron_h_omni projector norm does.
    """
    return nn.Sequential(
        RMSNorm(in_dim, eps=eps),
        nn.Linear(in_dim, hidden_dim, bias=False),
        SquaredReLU(),
        nn.Linear(hidden_dim, out_dim, bias=False),
    )


def shuffle_factor(downsample_ratio: float, ps_version: str = "v2") -> int:
    """Validated integer k = 1/downsample_ratio (2 for the released 0.5) for pixel shuffle `ps_version`."""
    if ps_version not in SUPPORTED_PS_VERSIONS:
        raise ConfigError(
            f"ps_version: expected one of {SUPPORTED_PS_VERSIONS}, found {ps_version!r}. v1 leaves the token "
            "grid transposed and no released Nano V2 VL checkpoint uses it; fix config.json or add v1 on purpose"
        )
    k = round(1 / downsample_ratio) if downsample_ratio > 0 else 0
    if k < 1 or abs(k * downsample_ratio - 1) > 1e-6:
        raise ConfigError(
            f"downsample_ratio: expected 1/k for a whole number k (0.5 in released checkpoints), found {downsample_ratio}"
        )
    return k


def pixel_shuffle_v2(x: torch.Tensor, downsample_ratio: float = 0.5) -> torch.Tensor:
    """(N, a, b, C) grid -> (N, a/k, b/k, k*k*C), k = 1/downsample_ratio, InternVL "v2" order.

    The reference view/permute sequence (docs/format.md §6.2). For k = 2, output token (i, j) holds
    concat(f[2i,2j], f[2i,2j+1], f[2i+1,2j], f[2i+1,2j+1]) = [TL, TR, BL, BR], tokens row-major.
    """
    k = shuffle_factor(downsample_ratio)
    n, a, b, c = x.shape
    if a % k or b % k:
        raise InputError(f"pixel shuffle: grid sides must be multiples of {k}; found {a}x{b} patches")
    x = x.reshape(n, a, b // k, k * c)  # (N, a, b/k, kC)  k neighbours along a row
    x = x.permute(0, 2, 1, 3)  # (N, b/k, a, kC)
    x = x.reshape(n, b // k, a // k, k * k * c)  # (N, b/k, a/k, k^2 C)  k rows stacked
    return x.permute(0, 2, 1, 3)  # (N, a/k, b/k, k^2 C)  "v2": back to row-major tokens


def patch_tokens_to_llm(
    tokens: torch.Tensor,
    grid_hw: tuple[int, int],
    mlp1: nn.Module,
    downsample_ratio: float = 0.5,
    ps_version: str = "v2",
) -> torch.Tensor:
    """Encoder patch tokens (N, h*w, C) on an h x w grid -> LLM-space vectors (N, h*w/k^2, D_llm)."""
    shuffle_factor(downsample_ratio, ps_version)
    n, length, c = tokens.shape
    h, w = grid_hw
    if h * w != length:
        raise InputError(f"projector: grid {h}x{w} needs {h * w} tokens per tile, found {length}")
    x = pixel_shuffle_v2(tokens.reshape(n, h, w, c), downsample_ratio)  # (N, h/k, w/k, k^2 C)
    x = x.reshape(n, -1, x.shape[-1])  # (N, h*w/k^2, k^2 C)
    return mlp1(x)  # (N, h*w/k^2, D_llm)


class VisionProjector(nn.Module):
    """Pixel shuffle + `mlp1` as one module; its own state-dict keys are `mlp1.{0,1,3}.weight`.

    A composition that must expose the checkpoint's top-level `mlp1.*` keys can hold `.mlp1` directly
    and call `patch_tokens_to_llm`; this wrapper only bundles the config with the weights.
    """

    def __init__(
        self,
        vit_dim: int,
        hidden_dim: int,
        llm_dim: int,
        downsample_ratio: float = 0.5,
        ps_version: str = "v2",
        eps: float = 1e-5,
    ):
        super().__init__()
        k = shuffle_factor(downsample_ratio, ps_version)
        self.downsample_ratio = downsample_ratio
        self.ps_version = ps_version
        self.mlp1 = build_mlp1(vit_dim * k * k, hidden_dim, llm_dim, eps=eps)

    def forward(self, tokens: torch.Tensor, grid_hw: tuple[int, int]) -> torch.Tensor:
        return patch_tokens_to_llm(tokens, grid_hw, self.mlp1, self.downsample_ratio, self.ps_version)
