"""16 kHz mono waveforms -> normalised log-mel frames, the input of the Parakeet encoder (vl/modeling/parakeet.py).

The features are those of transformers' `ParakeetFeatureExtractor` (NeMo's `AudioToMelSpectrogramPreprocessor`
with per-feature normalisation), which Nemotron 3 Nano Omni's processor calls on all clips of a request at once:

1. clips padded to the longest with `padding_value`; pre-emphasis x[t] - 0.97 x[t-1] (the first sample kept),
   zero past each clip's end;
2. STFT: a symmetric Hann window of `win_length` (400) centred in `n_fft` (512) points, hop 160, the signal
   zero-padded by n_fft / 2 on both sides (so 1 + L // hop frames); power |X|^2 (the magnitude formed, then squared);
3. a Slaney-scale, Slaney-normalised mel filterbank from 0 Hz to sr / 2 (librosa's `filters.mel(norm="slaney")`:
   triangles in Hz between mel-spaced edges, each divided by half its width), then log(mel + 2^-24);
4. per clip and mel bin, over the clip's valid frames (L + 2 (n_fft // 2) - n_fft) // hop (= L // hop): subtract
   the mean, divide by the unbiased standard deviation + 1e-5; frames past the clip's end set to 0.

`attention_mask` marks those valid frames. A clip with fewer than two valid frames (under 2 hops, 20 ms) has no
standard deviation (transformers' extractor returns NaN, NeMo's raises): it is refused with `AudioTooShortError`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vl.config_policy import Check, KeyReader
from vl.errors import AudioTooShortError, ConfigError

LOG_GUARD = 2.0**-24  # added to the mel energies before the log (NeMo's log_zero_guard_value)
NORM_EPS = 1e-5  # added to the standard deviation


@dataclass(frozen=True)
class MelConfig:
    """The keys of transformers' `ParakeetFeatureExtractor` (preprocessor_config.json). The defaults are the
    extractor's own; the Omni checkpoint's file sets `feature_size` (the encoder's `num_mel_bins`)."""

    feature_size: int = 80  # mel bins
    sampling_rate: int = 16_000
    hop_length: int = 160
    n_fft: int = 512
    win_length: int = 400
    preemphasis: float | None = 0.97
    padding_value: float = 0.0

    def __post_init__(self):
        for name in ("feature_size", "sampling_rate", "hop_length", "n_fft", "win_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"MelConfig.{name} must be a positive integer, found {value!r}")
        if self.win_length > self.n_fft:
            raise ConfigError(f"win_length={self.win_length} must not exceed n_fft={self.n_fft}")

    def valid_frames(self, num_samples):
        """Frames the normalisation and the mask count for a clip of `num_samples` (ints or a tensor)."""
        return (num_samples + (self.n_fft // 2) * 2 - self.n_fft) // self.hop_length

    @property
    def min_samples(self) -> int:
        """The shortest clip with two valid frames (one frame has no standard deviation)."""
        return 2 * self.hop_length + self.n_fft - (self.n_fft // 2) * 2

    def stft_frames(self, num_samples):
        """Frames the centred STFT makes: 1 + L // hop (the Omni counts its audio embeddings from these)."""
        return 1 + num_samples // self.hop_length


_MAPPED = tuple(f for f in MelConfig.__dataclass_fields__)
_IGNORED = {
    "feature_extractor_type": "the class name (the features are always these)",
    "processor_class": "the processor's class name",
    "return_attention_mask": "the mask is always returned",
    "return_token_timestamps": "deprecated in the extractor; timestamps are not produced",
}
_CHECKS = {"padding_side": Check(("right",), "pad clips at their start, which the extractor's pre-emphasis mask "
                                             "and normalisation do not follow")}


def mel_config_from_preprocessor(raw: dict, *, where: str = "preprocessor_config.json",
                                 notes: list | None = None) -> MelConfig:
    """`MelConfig` from a `ParakeetFeatureExtractor` dict (preprocessor_config.json, or the `feature_extractor`
    entry of processor_config.json) under vl/config_policy.py's policy."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the feature extractor's settings must be an object, found {type(raw).__name__}")
    reader = KeyReader(where, "feature_extractor", notes)
    taken = reader.sort(raw, mapped=_MAPPED, specific=_IGNORED, checks=_CHECKS)
    reader.finish("ParakeetFeatureExtractor")
    return MelConfig(**taken)


def _hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney's mel scale (librosa `htk=False`): linear 3 mel / 200 Hz below 1 kHz, logarithmic above."""
    linear = 3.0 * hz / 200.0
    log = 15.0 + torch.log(hz.clamp_min(1e-10) / 1000.0) * (27.0 / math.log(6.4))
    return torch.where(hz >= 1000.0, log, linear)


def _mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    linear = 200.0 * mel / 3.0
    log = 1000.0 * torch.exp((mel - 15.0) * (math.log(6.4) / 27.0))
    return torch.where(mel >= 15.0, log, linear)


def mel_filterbank(config: MelConfig) -> torch.Tensor:
    """(n_mels, n_fft // 2 + 1) float32: triangles in Hz between n_mels + 2 mel-spaced edges from 0 to sr / 2,
    each scaled by 2 / (upper edge - lower edge). Computed in float64 and rounded to float32 before the
    scaling, as librosa (and transformers) do, so the float32 weights agree bit for bit."""
    n_freq = config.n_fft // 2 + 1
    fft_hz = torch.linspace(0, config.sampling_rate // 2, n_freq, dtype=torch.float64)
    top = _hz_to_mel(torch.tensor(config.sampling_rate / 2, dtype=torch.float64))
    edges = _mel_to_hz(torch.linspace(0.0, float(top), config.feature_size + 2, dtype=torch.float64))
    rising = (fft_hz[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])  # (n_freq, n_mels)
    falling = (edges[None, 2:] - fft_hz[:, None]) / (edges[2:] - edges[1:-1])
    triangles = torch.minimum(rising, falling).clamp_min(0.0).to(torch.float32)
    area = 2.0 / (edges[2:] - edges[:-2])  # float64, applied to the float32 triangles then rounded again
    return (triangles * area).to(torch.float32).T.contiguous()


def _log_mel(padded: torch.Tensor, first: int, end: int, config: MelConfig, bank: torch.Tensor) -> torch.Tensor:
    """log-mel of frames [first, end) of the zero-padded signal: (B, n_mels, end - first)."""
    hop = config.hop_length
    segment = padded[:, first * hop : (end - 1) * hop + config.n_fft]
    window = torch.hann_window(config.win_length, periodic=False)  # centred in n_fft by torch.stft
    spec = torch.stft(segment, config.n_fft, hop_length=hop, win_length=config.win_length, window=window,
                      center=False, return_complex=True)  # (B, n_freq, end - first)
    # the magnitude first, then its square (NeMo's order): mel bins of a steady tone have a standard deviation of
    # ~1e-4 across frames, so a last-bit difference in the power shows in the normalised features
    magnitude = torch.view_as_real(spec).square().sum(-1).sqrt()
    return torch.log(bank @ magnitude.square() + LOG_GUARD)


def log_mel_features(waveforms: Sequence, config: MelConfig = MelConfig(), filterbank: torch.Tensor | None = None,
                     chunk_frames: int = 6000):
    """Clips (1-D float arrays or tensors at `config.sampling_rate`) -> (features (B, T, n_mels) float32,
    attention_mask (B, T) bool), T = 1 + (longest clip) // hop. A clip's features do not depend on the others in
    the batch (but for the rounding of sums over a different number of padded frames).

    The spectrum is taken `chunk_frames` frames (60 s) at a time, so memory holds the log-mel frames and one
    chunk's spectrum, not an hour's complex spectrum; the frames are the same whatever the chunk."""
    clips = [torch.as_tensor(np.asarray(w) if not isinstance(w, torch.Tensor) else w).to(torch.float32).reshape(-1)
             for w in waveforms]
    if not clips:
        raise ValueError("log_mel_features needs at least one clip")
    lengths = torch.tensor([c.numel() for c in clips])
    valid = config.valid_frames(lengths)  # (B,)
    short = [i for i, n in enumerate(valid.tolist()) if n < 2]
    if short:
        n, least, rate = clips[short[0]].numel(), config.min_samples, config.sampling_rate
        raise AudioTooShortError(
            f"audio clip {short[0] + 1} has {n} samples ({n / rate * 1000:.1f} ms at {rate} Hz): its features need "
            f"at least {least} samples ({least / rate * 1000:.1f} ms); send a longer clip."
        )
    longest = int(lengths.max())
    x = torch.full((len(clips), longest), float(config.padding_value))
    for i, c in enumerate(clips):
        x[i, : c.numel()] = c
    inside = torch.arange(longest)[None, :] < lengths[:, None]  # (B, L)
    if config.preemphasis is not None:
        x = torch.cat([x[:, :1], x[:, 1:] - config.preemphasis * x[:, :-1]], dim=1).masked_fill(~inside, 0.0)
    bank = mel_filterbank(config) if filterbank is None else filterbank
    half = config.n_fft // 2
    x = torch.nn.functional.pad(x, (half, half))  # the centred STFT's zero padding
    frames = 1 + longest // config.hop_length
    # frames stay the last axis in memory (the STFT's layout, and the reference's): the sums over time below then
    # add in the reference's order, which matters for bins that barely vary (their deviation is ~1e-4)
    logmel = torch.cat([_log_mel(x, t, min(t + chunk_frames, frames), config, bank)
                        for t in range(0, frames, chunk_frames)], dim=2).transpose(1, 2)  # (B, T, n_mels)
    mask = torch.arange(frames)[None, :] < valid[:, None]  # (B, T)
    m = mask[..., None]
    count = valid[:, None, None].to(torch.float32)
    mean = (logmel * m).sum(dim=1, keepdim=True) / count
    var = (((logmel * m) - mean) ** 2 * m).sum(dim=1, keepdim=True) / (count - 1)
    features = (logmel - mean) / (var.sqrt() + NORM_EPS) * m
    return features, mask
