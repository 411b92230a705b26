"""Video frames -> tubelets, as Nemotron 3 Nano Omni wants: one aspect-preserving tile per frame, frames packed in
pairs.

Follows transformers' `nemotron_h_omni` video processor (docs/format.md, "Omni processing"): every frame of a video
is resized to one tile whose patch grid sits near `video_target_num_patches` with the frame's aspect ratio (or a
square tile when `video_maintain_aspect_ratio` is off), sides multiples of the pixel-shuffle factor; bicubic with
antialiasing on float32, then `(x / 255 - mean) / std`. Every `temporal_patch_size` consecutive frames are stacked
along the channel axis into one tubelet; an odd tail is padded by repeating the last frame (the prompt labels only
the real frames). Efficient Video Sampling is not applied here: the prompt keeps every placeholder, and the model
drops positions after its encoder, as the reference does.

Decoding, sampling, caps and timestamps are video.py's (`load_video`); this module only gives it the per-frame
resize (`OmniFrameResizer`), which runs where the frames are decoded (in the sandbox worker when isolated), so
full-resolution frames never accumulate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from vl.errors import ConfigError
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.processing.omni_images import _positive_int, check_norm, merge_factor, resize_float
from vl.processing.video import VideoFrames, load_video


@dataclass(frozen=True)
class OmniVideoConfig:
    """The video processor's knobs (transformers' names). `norm_mean`/`norm_std` come from the checkpoint."""
    norm_mean: tuple[float, float, float]
    norm_std: tuple[float, float, float]
    patch_size: int = 16
    downsample_ratio: float = 0.5
    video_target_num_patches: int = 1024
    video_maintain_aspect_ratio: bool = True
    temporal_patch_size: int = 2

    def __post_init__(self):
        mean, std = check_norm(self.norm_mean, self.norm_std)
        object.__setattr__(self, "norm_mean", mean)
        object.__setattr__(self, "norm_std", std)
        _positive_int(self.patch_size, "patch_size")
        _positive_int(self.video_target_num_patches, "video_target_num_patches")
        _positive_int(self.temporal_patch_size, "temporal_patch_size")
        if not isinstance(self.video_maintain_aspect_ratio, bool):
            raise ConfigError(f"video_maintain_aspect_ratio must be a bool, found {self.video_maintain_aspect_ratio!r}")
        merge_factor(self.downsample_ratio)

    @property
    def merge(self) -> int:
        return merge_factor(self.downsample_ratio)


def frame_grid(height: int, width: int, config: OmniVideoConfig) -> tuple[int, int]:
    """(rows, cols) in patches of the tile every frame of a `height` x `width` video is resized to: the target
    area spread by the aspect ratio, each side rounded to the nearest patch (Python's round: halves to even), then
    both moved up to multiples of the merge factor when the area stays within the target, else both down (never
    below the factor). Without aspect ratio: the largest square of merge-multiple side within the target."""
    target, merge = config.video_target_num_patches, config.merge
    if not config.video_maintain_aspect_ratio:
        side = max(merge, math.isqrt(target) // merge * merge)
        return side, side
    aspect = width / max(height, 1)
    rows, cols = max(round(math.sqrt(target / aspect)), 1), max(round(math.sqrt(target * aspect)), 1)
    if merge > 1:
        up_rows, up_cols = -(-rows // merge) * merge, -(-cols // merge) * merge
        if up_rows * up_cols <= target:
            rows, cols = up_rows, up_cols
        else:
            rows, cols = max(merge, rows // merge * merge), max(merge, cols // merge * merge)
    return rows, cols


def normalize_frames(frames: torch.Tensor, norm_mean, norm_std) -> torch.Tensor:
    """float (..., 3, H, W) in 0..255 -> `(x / 255 - mean) / std`, in that order (the video processor's)."""
    mean = torch.tensor(norm_mean, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(norm_std, dtype=torch.float32).view(3, 1, 1)
    return (frames / 255.0 - mean) / std


def preprocess_frames(frames: torch.Tensor, config: OmniVideoConfig) -> torch.Tensor:
    """uint8 (T, 3, H, W) frames of one video -> normalised float32 (T, 3, rows * p, cols * p)."""
    rows, cols = frame_grid(int(frames.shape[-2]), int(frames.shape[-1]), config)
    p = config.patch_size
    return normalize_frames(resize_float(frames, rows * p, cols * p), config.norm_mean, config.norm_std)


def to_tubelets(frames: torch.Tensor, temporal_patch_size: int) -> torch.Tensor:
    """(T, C, H, W) -> (ceil(T / t), t * C, H, W): consecutive frames stacked on the channel axis; a short last
    tubelet is filled by repeating the last frame."""
    t = temporal_patch_size
    if short := frames.shape[0] % t:
        frames = torch.cat([frames, frames[-1:].expand(t - short, *frames.shape[1:])])
    return frames.reshape(-1, t * frames.shape[1], *frames.shape[2:])


def tokens_per_tubelet(height: int, width: int, config: OmniVideoConfig) -> int:
    """Placeholders one tubelet fills: its patches after pixel shuffle."""
    p = config.patch_size
    return (height // p) * (width // p) // config.merge**2


class OmniFrameResizer:
    """The per-frame resize video.py applies while decoding (picklable, so it runs in a sandbox worker too). The
    tile is fixed by the first frame it sees (after display rotation), so that a stream that changes resolution
    still yields frames of one size; each frame comes out resized and normalised, float32 (3, H, W)."""

    def __init__(self, config: OmniVideoConfig):
        self.config, self.grid = config, None

    def __call__(self, image) -> np.ndarray:
        a = np.asarray(image)
        pixels = torch.from_numpy(np.array(a, copy=True)).permute(2, 0, 1)  # (3, H, W) uint8; PIL's are read-only
        if self.grid is None:
            self.grid = frame_grid(a.shape[0], a.shape[1], self.config)
        p = self.config.patch_size
        x = resize_float(pixels, self.grid[0] * p, self.grid[1] * p)
        return normalize_frames(x, self.config.norm_mean, self.config.norm_std).numpy()


@dataclass
class OmniVideo:
    tubelets: torch.Tensor  # (num_tubelets, t * 3, H, W) float32
    num_frames: int  # real frames (the last tubelet may repeat the last one)
    tokens_per_tubelet: int
    frames: VideoFrames | None = None  # the decode's record (indices, timestamps, fps, notes); None for raw frames

    @property
    def num_tokens(self) -> int:
        return int(self.tubelets.shape[0]) * self.tokens_per_tubelet


def omni_video_from_frames(frames, config: OmniVideoConfig) -> OmniVideo:
    """Decoded uint8 frames, (T, H, W, 3) array or list of RGB images -> `OmniVideo`."""
    a = np.stack([np.asarray(f) for f in frames]) if isinstance(frames, (list, tuple)) else np.asarray(frames)
    if a.dtype != np.uint8 or a.ndim != 4 or a.shape[-1] != 3 or a.shape[0] < 1:
        raise ValueError(f"expected uint8 frames (T, H, W, 3) with T >= 1, found {a.dtype} {a.shape}")
    x = preprocess_frames(torch.from_numpy(np.array(a, copy=True)).permute(0, 3, 1, 2), config)
    return OmniVideo(to_tubelets(x, config.temporal_patch_size), int(a.shape[0]),
                     tokens_per_tubelet(x.shape[-2], x.shape[-1], config))


def load_omni_video(source, config: OmniVideoConfig, *, target_fps: float = 2.0, max_frames: int = 128,
                    backend: str = "decord", timestamp_convention: str = "exact",
                    limits: MediaLimits = DEFAULT_LIMITS, isolate: bool = False) -> OmniVideo:
    """Untrusted video -> `OmniVideo`: decoded, sampled and capped by video.py, each frame resized as it is
    decoded."""
    frames = load_video(source, norm_mean=config.norm_mean, norm_std=config.norm_std,
                        tile_size=OmniFrameResizer(config), target_fps=target_fps, max_frames=max_frames,
                        backend=backend, timestamp_convention=timestamp_convention, limits=limits, isolate=isolate)
    x = frames.pixel_values  # (T, 3, H, W), already normalised
    return OmniVideo(to_tubelets(x, config.temporal_patch_size), int(x.shape[0]),
                     tokens_per_tubelet(x.shape[-2], x.shape[-1], config), frames)
