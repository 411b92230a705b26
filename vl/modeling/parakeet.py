"""Parakeet (FastConformer) audio encoder: log-mel frames -> one hidden state per 8 frames (80 ms).

Follows FastConformer (Rekesh et al. 2023, arXiv 2305.05084) as transformers' `ParakeetEncoder` computes it, the
audio tower of Nemotron 3 Nano Omni (its `audio_config`):

1. subsampling: a stride-2 3x3 convolution (1 -> C channels), then per further factor of two a stride-2 depthwise
   3x3 and a pointwise convolution, each followed by ReLU; the time axis is re-masked after every convolution so
   padded frames stay zero; the (C x mel/8) rows of each time step are flattened and projected to D. The stack runs
   over time in chunks (`SUBSAMPLING_CHUNK`) with the overlap its receptive field needs, bit-identical to one pass;
2. optional input scale sqrt(D) (`scale_input`; the Omni sets it off);
3. conformer blocks (Gulati et al. 2020): x += FF(LN x)/2; x += RelPosMHA(LN x); x += Conv(LN x); x += FF(LN x)/2;
   x = LN x. The attention is Transformer-XL's (Dai et al. 2019, §3.3): the score of query i for key j is
   ((q_i + u) . k_j + (q_i + v) . W_r p(i - j)) / sqrt(d), with p(r) sinusoidal (sin/cos interleaved) for every
   relative distance r in [-(T-1), T-1]. The convolution module is pointwise -> GLU -> depthwise (padded frames
   zeroed first) -> batch norm (inference statistics) -> activation -> pointwise.

In bf16 on a CPU with AMX the attention runs as one kernel (vl/kernels/attention.py `relative_attention`: the position
term a tile product per block, float32 scores, each clip's keys up to its length); the torch path below (fp32,
elsewhere) rounds each term and their sum to bf16 as transformers does.

Parameter names equal transformers' `ParakeetEncoder` state-dict keys, so a checkpoint adapter is a prefix
strip. Plain maths, no I/O; the mel features come from vl/processing/audio_features.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vl.config.parakeet import ParakeetConfig
from vl.kernels import attention as tile_attention

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


# final (x8) frames per subsampling chunk: 256 x 80 ms = 20.5 s of audio. The stack runs over time one chunk at a
# time, so its largest activation (the first convolution's C x T/2 x mel/2) is ~1,030 rows, 34 MB in bf16 (67 MB in
# fp32) at the Omni's widths, instead of 30,001 rows (983 MB in bf16) on 10 minutes of audio; the rows the chunks'
# receptive fields share (3 of 1,027 in the first layer) are computed twice, well under 1 % of the work.
SUBSAMPLING_CHUNK = 256

# positions per matrix product of a 1x1 subsampling convolution (`_pointwise`): every product has this shape, so it
# runs the same kernel whatever the chunk; 1,024 x 256 channels is a full-speed GEMM and pads a 513-row x 32-mel
# chunk by 6 %
POINTWISE_ROWS = 1024


class Subsampling(nn.Module):
    """x8 (in general x2^n) convolutional subsampling over (time, mel), then a Linear to the model width.

    The convolutions run over time in chunks of `SUBSAMPLING_CHUNK` output frames. A chunk starts from the rows of
    each layer its outputs read (stride and receptive field followed back from the output range), clipped to the
    layer's length and padded with zeros where the whole run pads; every output row is then the same sum of the
    same products as in the whole run, so the result is bit-identical to it (tests/modeling/test_parakeet.py)."""

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
        convs = [layer for layer in self.layers if isinstance(layer, nn.Conv2d)]
        rows, valid = [x.shape[2]], [lengths]  # per conv: the rows of its input, the valid rows of each clip
        for conv in convs:
            rows.append(_conv_rows(rows[-1], conv))
            valid.append(None if lengths is None else _conv_rows(valid[-1], conv))
        b = x.shape[0]
        chunks = [self._chunk(x, convs, rows, valid, a, min(a + SUBSAMPLING_CHUNK, rows[-1])).transpose(1, 2)
                  .reshape(b, -1, self.linear.in_features) for a in range(0, rows[-1], SUBSAMPLING_CHUNK)]
        return self.linear(torch.cat(chunks, dim=1) if len(chunks) > 1 else chunks[0])  # (B, T', D)

    def _chunk(self, x, convs, rows, valid, start: int, stop: int) -> torch.Tensor:
        """Output rows [start, stop) of the convolution stack: (B, C, stop - start, mel / 2^n)."""
        spans = [(start, stop)]  # per conv from the last: the output rows it computes (within its output length)
        for conv, n_in in zip(reversed(convs), reversed(rows[:-1])):
            lo, hi = _input_span(*spans[-1], conv)
            spans.append((max(lo, 0), min(hi, n_in)))
        spans.reverse()  # spans[i]: the rows of conv i's input; spans[i + 1]: those of its output
        lo, hi = spans[0]
        x = x[:, :, lo:hi]
        i = 0
        for layer in self.layers:
            if isinstance(layer, nn.ReLU):
                x = F.relu(x)
                continue
            conv = convs[i]
            want_lo, want_hi = _input_span(*spans[i + 1], conv)  # the rows it reads, padding included
            lo, hi = spans[i]
            x = F.pad(x, (0, 0, lo - want_lo, want_hi - hi)) if (lo, hi) != (want_lo, want_hi) else x
            if conv.kernel_size == (1, 1) and conv.groups == 1:
                x = _pointwise(x, conv)
            else:
                x = F.conv2d(x, conv.weight, conv.bias, conv.stride, (0, conv.padding[1]), groups=conv.groups)
            if valid[i + 1] is not None:
                out_lo, out_hi = spans[i + 1]
                keep = torch.arange(out_lo, out_hi, device=x.device) < valid[i + 1][:, None]  # (B, rows)
                x = x * keep[:, None, :, None]
            i += 1
        return x


def _conv_rows(n, conv: nn.Conv2d):
    """Rows along time out of `conv` for `n` rows in (an int or an integer tensor): (n + 2p - k) // s + 1."""
    return (n + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1


def _pointwise(x: torch.Tensor, conv: nn.Conv2d) -> torch.Tensor:
    """A 1x1 convolution as float32 matrix products of one shape, `POINTWISE_ROWS` positions x C channels (the last
    one padded with zero rows), the bias added after, one rounding to x's dtype.

    Why not F.conv2d or one matmul: oneDNN's convolution splits its work by the tensor's size and the thread count,
    and the BLAS picks other kernels for small matrices, so either can sum a position's channels in another order
    in a chunk than in the whole run (1-ulp differences in fp32). A product of one fixed shape runs the same kernel
    every time, so each position's output is the same sum wherever the chunks begin."""
    b, c, t, f = x.shape
    rows = x.permute(0, 2, 3, 1).reshape(-1, c).float()  # (B t f, C): one row per position
    n = rows.shape[0]
    rows = F.pad(rows, (0, 0, 0, -n % POINTWISE_ROWS))
    w = conv.weight.reshape(conv.out_channels, c).t().float()  # (C, C_out)
    out = torch.cat([rows[i:i + POINTWISE_ROWS] @ w for i in range(0, n, POINTWISE_ROWS)])[:n]
    if conv.bias is not None:
        out = out + conv.bias.float()
    return out.to(x.dtype).view(b, t, f, conv.out_channels).permute(0, 3, 1, 2).contiguous()


def _input_span(lo: int, hi: int, conv: nn.Conv2d) -> tuple[int, int]:
    """The input rows output rows [lo, hi) of `conv` read, counting its zero padding as rows -p.. and n..: output
    row t reads s t - p .. s t - p + k - 1."""
    s, p, k = conv.stride[0], conv.padding[0], conv.kernel_size[0]
    return s * lo - p, s * (hi - 1) - p + k


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
        q = self.q_proj(x).view(b, t, h, d)  # (B, T, H, d)
        k = self.k_proj(x).view(b, t, h, d)
        v = self.v_proj(x).view(b, t, h, d)
        r = self.relative_k_proj(positions).view(-1, h, d)  # (2T-1, H, d): rows r = T-1 .. -(T-1)
        qu, qv = q + self.bias_u, q + self.bias_v
        keys = None if mask is None else mask.sum(-1)
        if mask is None or torch.equal(mask, time_mask(keys, t)):  # every key, or each row's first keys[b]
            out = tile_attention.relative_attention(qu, qv, k, v, r, keys=None if keys is None else keys.tolist())
            if out is not None:
                for i, n in enumerate([] if keys is None else keys.tolist()):
                    # a padded query: every pair masked, so it attends to all keys uniformly, as the torch path does
                    # (the Omni keeps one such position per clip: docs/audio.md, "How many audio tokens")
                    out[i, n:] = v[i].float().mean(0).to(out.dtype)
                return self.o_proj(out.view(b, t, h * d))
        qu, qv, v = qu.transpose(1, 2), qv.transpose(1, 2), v.transpose(1, 2).contiguous()  # (B, H, T, d)
        # the keys and positions transposed once for every query block's products (not copied again per block)
        k_t, r_t = k.permute(0, 2, 3, 1).contiguous(), r.permute(1, 2, 0).contiguous()  # (B, H, d, T), (H, d, 2T-1)
        out = torch.cat([self._attend(qu[:, :, i0:i0 + QUERY_BLOCK], qv[:, :, i0:i0 + QUERY_BLOCK], k_t, v, r_t, mask,
                                      i0)
                         for i0 in range(0, t, QUERY_BLOCK)], dim=2)  # (B, H, T, d)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))

    def _attend(self, qu, qv, k_t, v, r_t, mask, i0: int) -> torch.Tensor:
        """Queries i0 .. i0+n-1 (content-biased `qu`, position-biased `qv`: (B, H, n, d)) against every key (`k_t`:
        (B, H, d, T)): (B, H, n, d). Key j seen from query i is at distance i - j, position (T - 1) - (i - j) of `r_t`
        (H, d, 2T - 1); the positions these queries need are a window of n + T - 1, so a block costs O(n T) memory,
        not O(T^2)."""
        b, h, n, d = qu.shape
        t = k_t.shape[-1]
        scale = d**-0.5
        first = (t - 1) - (i0 + n - 1)  # the window's first position: the last query's farthest-right key
        content = qu @ k_t  # (B, H, n, T)
        by_distance = (qv @ r_t[:, :, first:first + n + t - 1]).mul_(scale).contiguous()  # (B, H, n, L = n + T - 1)
        # query i0 + i, key j: window row (n - 1 - i) + j. In the contiguous (n, L) block that is offset
        # (n - 1) + i (L - 1) + j: a strided view (Transformer-XL's "relative shift"), no gather, no index tensor
        width = by_distance.shape[-1]
        position = by_distance.as_strided((b, h, n, t), (h * n * width, n * width, width - 1, 1),
                                          by_distance.storage_offset() + n - 1)
        scores = content.mul_(scale).add_(position)  # content * scale + position * scale, in place
        del position, by_distance
        if mask is not None:
            # the dtype's lowest value, not -inf: a padded query row then attends uniformly instead of giving NaN,
            # exactly as transformers does (the Omni keeps one padded position per clip: docs/audio.md)
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
