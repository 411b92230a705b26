"""Grouped-query self-attention of Nemotron-H (`*` layers): no positional encoding at all (the Mamba
layers carry order), causal, SDPA. docs/format.md §7.4; transformers `NemotronHAttention`."""

from __future__ import annotations

import torch
from torch import nn

from vl.config import LMConfig


class Attention(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        d, bias = cfg.hidden_size, cfg.attention_bias
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=bias)

    def forward(self, h, kv=None, pos=0, key_valid=None):
        """h (b, t, d). kv: a `KVCache` written at [pos, pos+t) and read over [0, pos+t), or None.
        key_valid (b, pos+t) bool marks real (non-padding) keys, or None when there is no padding.

        `pos` may be a 0-d tensor (one-token decode with fixed shapes, for torch.compile / CUDA graphs): the
        whole cache is read, and keys past `pos` (and padding, `key_valid` over the whole cache) are masked.
        """
        b, t, _ = h.shape
        q = self.q_proj(h).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        if isinstance(pos, torch.Tensor):
            kv.k.index_copy_(2, pos.view(1), k)
            kv.v.index_copy_(2, pos.view(1), v)
            seen = torch.arange(kv.k.shape[2], device=h.device) <= pos  # (max_len,)
            mask = (seen & key_valid)[:, None, None, :] if key_valid is not None else seen[None, None, None, :]
            out = nn.functional.scaled_dot_product_attention(q, kv.k, kv.v, attn_mask=mask,
                                                             enable_gqa=self.n_heads != self.n_kv)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        if kv is not None:
            kv.k[:, :, pos:pos + t] = k
            kv.v[:, :, pos:pos + t] = v
            k, v = kv.k[:, :, :pos + t], kv.v[:, :, :pos + t]
        mask = attention_mask(t, pos, key_valid, h.device)
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and t > 1 and pos == 0,
            enable_gqa=self.n_heads != self.n_kv,
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def attention_mask(t: int, pos: int, key_valid, device):
    """Bool mask (b|1, 1, t, pos+t) or None when plain causal attention (or a single query) suffices.

    Query i (absolute position pos+i) sees keys j <= pos+i that are real. A padding query would see no key at
    all (NaN under softmax), so every query may always see itself; padding outputs are never used.
    """
    if key_valid is None and (pos == 0 or t == 1):
        return None
    q_idx = torch.arange(pos, pos + t, device=device)[:, None]
    k_idx = torch.arange(pos + t, device=device)[None, :]
    mask = k_idx <= q_idx  # (t, pos+t)
    if key_valid is not None:
        mask = (mask & key_valid[:, None, :]) | (k_idx == q_idx)  # (b, t, pos+t)
        return mask[:, None]
    return mask[None, None]
