"""Parakeet (FastConformer) audio encoder: log-mel frames -> one hidden state per 8 frames (80 ms).

Follows FastConformer (Rekesh et al. 2023, arXiv 2305.05084) as transformers' `ParakeetEncoder` computes it, the
audio tower of Nemotron 3 Nano Omni (its `audio_config`):

1. subsampling: a stride-2 3x3 convolution (1 -> C channels), then per further factor of two a stride-2 depthwise
   3x3 and a pointwise convolution, each followed by ReLU; the time axis is re-masked after every convolution so
   padded frames stay zero; the (C x mel/8) rows of each time step are flattened and projected to D;
2. optional input scale sqrt(D) (`scale_input`; the Omni sets it off);
3. conformer blocks (Gulati et al. 2020): x += FF(LN x)/2; x += RelPosMHA(LN x); x += Conv(LN x); x += FF(LN x)/2;
   x = LN x. The attention is Transformer-XL's (Dai et al. 2019, §3.3): the score of query i for key j is
   ((q_i + u) . k_j + (q_i + v) . W_r p(i - j)) / sqrt(d), with p(r) sinusoidal (sin/cos interleaved) for every
   relative distance r in [-(T-1), T-1]. The convolution module is pointwise -> GLU -> depthwise (padded frames
   zeroed first) -> batch norm (inference statistics) -> activation -> pointwise.

Parameter names equal transformers' `ParakeetEncoder` state-dict keys, so a checkpoint adapter is a prefix
strip. Plain maths, no I/O; the mel features come from vl/processing/audio_features.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vl.config.parakeet import ParakeetConfig

_ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "relu": F.relu, "gelu": F.gelu}
_LN_EPS = 1e-5  # nn.LayerNorm's and nn.BatchNorm1d's defaults, as transformers builds them
_BN_EPS = 1e-5


def subsampled_length(lengths, config: ParakeetConfig):
    """Frames left after the subsampling convolutions: (L + 2p - k) // s + 1 per stride-s layer, p = (k - 1) // 2.

    Works on ints and integer tensors."""
    k, s = config.subsampling_conv_kernel_size, config.subsampling_conv_stride
    for _ in range(config.subsampling_layers):
        lengths = (lengths + 2 * ((k - 1) // 2) - k) // s + 1
    return lengths


def omni_embedding_lengths(feature_mask: torch.Tensor, config: ParakeetConfig) -> torch.Tensor:
    """Audio embeddings the Omni model keeps per clip: the subsampled length of *one more* frame than the mask
    counts. The feature extractor's mask covers L // hop frames, the STFT makes 1 + L // hop; transformers' Omni
    (`get_audio_features`) and its processor (`_estimate_audio_num_embeddings`) both count the latter, so where
    the two differ the last kept embedding is one the encoder computed as padding."""
    return subsampled_length(feature_mask.sum(-1).long() + 1, config)


# queries per attention block: a clip of T positions costs O(QUERY_BLOCK x T) attention memory instead of O(T^2)
# (10 minutes of audio is T = 7,500: a full score matrix per head and tensor is 225 MB in fp32); shorter clips are one
# block, so their maths is unchanged
QUERY_BLOCK = 1024


def sinusoid_relative_positions(length: int, dim: int, device=None) -> torch.Tensor:
    """p(r) for r = T-1, T-2, ..., -(T-1): rows (2T - 1, dim), sin and cos of r / 10000^(2i/dim) interleaved."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
    r = torch.arange(length - 1, -length, -1, device=device).float()
    angles = r[:, None] * inv_freq  # (2T-1, dim/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(2 * length - 1, dim)


def time_mask(lengths: torch.Tensor, length: int) -> torch.Tensor:
    return torch.arange(length, device=lengths.device) < lengths[:, None]  # (B, T) bool


class Subsampling(nn.Module):
    """x8 (in general x2^n) convolutional subsampling over (time, mel), then a Linear to the model width."""

    def __init__(self, config: ParakeetConfig):
        super().__init__()
        k, s, c = config.subsampling_conv_kernel_size, config.subsampling_conv_stride, config.subsampling_conv_channels
        p = (k - 1) // 2
        # indices as transformers numbers them (ReLUs included): conv, relu, [depthwise, pointwise, relu] * (n - 1)
        layers: list[nn.Module] = [nn.Conv2d(1, c, k, stride=s, padding=p), nn.ReLU()]
        for _ in range(config.subsampling_layers - 1):
            layers += [nn.Conv2d(c, c, k, stride=s, padding=p, groups=c), nn.Conv2d(c, c, 1), nn.ReLU()]
        self.layers = nn.ModuleList(layers)
        self.linear = nn.Linear(c * (config.num_mel_bins // s**config.subsampling_layers), config.hidden_size)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
        x = features.unsqueeze(1)  # (B, 1, T, mel)
        for layer in self.layers:
            if isinstance(layer, nn.ReLU):
                x = F.relu(x)
                continue
            x = F.conv2d(x, layer.weight, layer.bias, layer.stride, layer.padding, groups=layer.groups)
            if lengths is not None:
                if layer.stride[0] > 1:
                    lengths = (lengths + 2 * layer.padding[0] - layer.kernel_size[0]) // layer.stride[0] + 1
                x = x * time_mask(lengths, x.shape[2])[:, None, :, None]
        b, c, t, f = x.shape
        return self.linear(x.transpose(1, 2).reshape(b, t, c * f))  # (B, T', D)


class FeedForward(nn.Module):
    def __init__(self, config: ParakeetConfig):
        super().__init__()
        self.linear1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.attention_bias)
        self.linear2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.attention_bias)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x):
        return self.linear2(self.act(self.linear1(x)))


class RelPositionAttention(nn.Module):
    """Multi-head self-attention with Transformer-XL relative positions (content bias u, position bias v)."""

    def __init__(self, config: ParakeetConfig):
        super().__init__()
        h, d, width = config.num_attention_heads, config.head_size, config.hidden_size
        self.num_heads, self.head_dim = h, d
        self.q_proj = nn.Linear(width, h * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(width, h * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(width, h * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(h * d, width, bias=config.attention_bias)
        self.relative_k_proj = nn.Linear(width, h * d, bias=False)  # W_r
        self.bias_u = nn.Parameter(torch.zeros(h, d))  # content bias
        self.bias_v = nn.Parameter(torch.zeros(h, d))  # position bias

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape
        h, d = self.num_heads, self.head_dim
        q = self.q_proj(x).view(b, t, h, d).transpose(1, 2)  # (B, H, T, d)
        k = self.k_proj(x).view(b, t, h, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, h, d).transpose(1, 2)
        r = self.relative_k_proj(positions).view(-1, h, d).transpose(0, 1)  # (H, 2T-1, d): rows r = T-1 .. -(T-1)
        qu, qv = q + self.bias_u[:, None], q + self.bias_v[:, None]
        out = torch.cat([self._attend(qu[:, :, i0:i0 + QUERY_BLOCK], qv[:, :, i0:i0 + QUERY_BLOCK], k, v, r, mask, i0)
                         for i0 in range(0, t, QUERY_BLOCK)], dim=2)  # (B, H, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))

    def _attend(self, qu, qv, k, v, r, mask, i0: int) -> torch.Tensor:
        """Queries i0 .. i0+n-1 (content-biased `qu`, position-biased `qv`: (B, H, n, d)) against every key: (B, H,
        n, d). Key j seen from query i is at distance i - j, row (T - 1) - (i - j) of `r`; the rows these queries
        need are a window of n + T - 1, so a block costs O(n T) memory, not O(T^2)."""
        b, h, n, d = qu.shape
        t = k.shape[2]
        scale = d**-0.5
        first = (t - 1) - (i0 + n - 1)  # the window's first row: the last query's farthest-right key
        window = r[:, first:first + n + t - 1]  # (H, n + T - 1, d)
        content = qu @ k.transpose(-1, -2)  # (B, H, n, T)
        by_distance = qv @ window.transpose(-1, -2)  # (B, H, n, n + T - 1)
        i = torch.arange(i0, i0 + n, device=qu.device)
        rows = (t - 1) - i[:, None] + torch.arange(t, device=qu.device)[None, :] - first  # (n, T)
        position = by_distance.gather(-1, rows.expand(b, h, n, t))
        del by_distance
        scores = content.mul_(scale).add_(position.mul_(scale))  # content * scale + position * scale, in place
        del position
        if mask is not None:
            # the dtype's lowest value, not -inf: a padded query row then attends uniformly instead of giving NaN,
            # exactly as transformers does (its outputs at padded positions are never used)
            pair = mask[:, None, i0:i0 + n, None] & mask[:, None, None, :]  # (B, 1, n, T)
            scores.masked_fill_(~pair, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        return weights @ v


class ConvolutionModule(nn.Module):
    """pointwise (D -> 2D) -> GLU -> depthwise k -> batch norm (inference statistics) -> act -> pointwise."""

    def __init__(self, config: ParakeetConfig):
        super().__init__()
        width, k, bias = config.hidden_size, config.conv_kernel_size, config.convolution_bias
        self.pointwise_conv1 = nn.Conv1d(width, 2 * width, 1, bias=bias)
        self.depthwise_conv = nn.Conv1d(width, width, k, padding=(k - 1) // 2, groups=width, bias=bias)
        self.norm = nn.BatchNorm1d(width)  # the module only holds the statistics; forward never updates them
        self.pointwise_conv2 = nn.Conv1d(width, width, 1, bias=bias)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)  # (B, D, T)
        if mask is not None:
            x = x.masked_fill(~mask[:, None, :], 0.0)  # padded frames must not leak into the depthwise window
        x = self.depthwise_conv(x)
        n = self.norm
        x = (x - n.running_mean[:, None]) * torch.rsqrt(n.running_var[:, None] + _BN_EPS) * n.weight[:, None] \
            + n.bias[:, None]
        return self.pointwise_conv2(self.act(x)).transpose(1, 2)


class ConformerBlock(nn.Module):
    def __init__(self, config: ParakeetConfig):
        super().__init__()
        width = config.hidden_size
        self.feed_forward1 = FeedForward(config)
        self.self_attn = RelPositionAttention(config)
        self.conv = ConvolutionModule(config)
        self.feed_forward2 = FeedForward(config)
        self.norm_feed_forward1 = nn.LayerNorm(width, eps=_LN_EPS)
        self.norm_self_att = nn.LayerNorm(width, eps=_LN_EPS)
        self.norm_conv = nn.LayerNorm(width, eps=_LN_EPS)
        self.norm_feed_forward2 = nn.LayerNorm(width, eps=_LN_EPS)
        self.norm_out = nn.LayerNorm(width, eps=_LN_EPS)

    def forward(self, x, positions, mask):
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        x = x + self.self_attn(self.norm_self_att(x), positions, mask)
        x = x + self.conv(self.norm_conv(x), mask)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


class ParakeetEncoder(nn.Module):
    """`forward(input_features (B, T, mel), attention_mask (B, T)) -> (hidden (B, T', D), lengths (B,))`.

    `lengths` are the valid output frames per clip (transformers' output attention mask, summed): the subsampled
    length of the mask's count, or T' for every clip without a mask. Hidden states past a clip's length are
    computed from padding and carry no meaning."""

    def __init__(self, config: ParakeetConfig):
        super().__init__()
        self.config = config
        self.subsampling = Subsampling(config)
        self.layers = nn.ModuleList(ConformerBlock(config) for _ in range(config.num_hidden_layers))
        self.input_scale = config.hidden_size**0.5 if config.scale_input else 1.0

    def forward(self, input_features: torch.Tensor, attention_mask: torch.Tensor | None = None):
        in_lengths = None if attention_mask is None else attention_mask.sum(-1).long()
        x = self.subsampling(input_features, in_lengths) * self.input_scale  # (B, T', D)
        b, t, _ = x.shape
        if in_lengths is None:
            lengths, mask = torch.full((b,), t, dtype=torch.long, device=x.device), None
        else:
            lengths = subsampled_length(in_lengths, self.config)
            mask = time_mask(lengths, t)
            if bool(mask.all()):  # nothing padded (one clip): no position to mask
                mask = None
        positions = sinusoid_relative_positions(t, self.config.hidden_size, x.device).to(x.dtype)
        for layer in self.layers:
            x = layer(x, positions, mask)
        return x, lengths
