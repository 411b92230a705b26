"""The hybrid cache: one object per sequence batch, allocated once (static shapes, gpt-fast `KVCache`).

Attention layers get preallocated K/V of `max_len`; Mamba layers get the conv window (the last k-1 inputs
of xBC) and the fp32 SSM state, whose size does not grow with the context. MLP/MoE layers hold nothing.
`valid` remembers which positions are real tokens (left padding of batched prompts), so later decode steps
mask padded keys without being told again.

`repack` builds the cache of a batch whose rows change between decode steps (continuous batching,
docs/server.md): rows that finished leave, rows prefilled on their own join. It relies on two facts of the
model: a Mamba layer's state is per row and has no length, and the attention layers have no positional
encoding, so a row's keys may sit at any columns as long as their order is kept and the columns to their left
are masked. Every row is placed right-aligned at the new common length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vl.config import LMConfig
from vl.errors import ContextLengthError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class KVCache:
    k: torch.Tensor  # (b, n_kv, max_len, head_dim)
    v: torch.Tensor


@dataclass
class MambaState:
    conv: torch.Tensor  # (b, conv_dim, k-1), model dtype
    ssm: torch.Tensor  # (b, heads, head_dim, d_state), mamba_ssm_cache_dtype (fp32)


class HybridCache:
    def __init__(self, cfg: LMConfig, batch_size: int, max_len: int, dtype=torch.float32, device="cpu"):
        self.cfg, self.max_len, self.batch_size = cfg, max_len, batch_size
        self.length = 0
        self.valid = torch.ones(batch_size, max_len, dtype=torch.bool, device=device)
        self.padded = False
        ssm_dtype = _DTYPES[cfg.mamba_ssm_cache_dtype]
        self.layers = []
        for c in cfg.pattern:
            if c == "*":
                shape = (batch_size, cfg.num_key_value_heads, max_len, cfg.head_dim)
                self.layers.append(KVCache(torch.zeros(shape, dtype=dtype, device=device),
                                           torch.zeros(shape, dtype=dtype, device=device)))
            elif c == "M":
                self.layers.append(MambaState(
                    torch.zeros(batch_size, cfg.mamba_conv_dim, cfg.conv_kernel - 1, dtype=dtype, device=device),
                    torch.zeros(batch_size, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size,
                                dtype=ssm_dtype, device=device)))
            else:
                self.layers.append(None)

    def mark(self, pos: int, t: int, mask):
        """Record which of the new positions [pos, pos+t) are real; return the key mask for attention
        over [0, pos+t), or None when nothing so far is padding."""
        self.check_room(pos, t)
        if mask is not None:
            self.valid[:, pos:pos + t] = mask
            self.padded = self.padded or not bool(mask.all())
        else:
            self.valid[:, pos:pos + t] = True
        return self.valid[:, :pos + t] if self.padded else None

    def check_room(self, pos: int, t: int) -> None:
        """Raise ContextLengthError unless positions [pos, pos+t) fit in the cache."""
        if pos + t > self.max_len:
            raise ContextLengthError(
                f"the cache holds {self.max_len} tokens but position {pos + t} was requested; "
                f"allocate a larger cache (prompt + max_new_tokens)")

    def real_lengths(self) -> torch.Tensor:
        """(b,) tokens each row holds: `valid` is False on a row's left padding and True from its first token."""
        return self.length - (~self.valid[:, :self.length]).sum(1)

    @staticmethod
    def repack(parts: list[tuple["HybridCache", list[int]]], room: int, *, bucket=None) -> "HybridCache":
        """A new cache holding `rows` of each `(cache, rows)` part, in that order, right-aligned at the longest
        row's length L (columns that are padding for every kept row are dropped), with `room` free positions
        after L (`bucket(L + room)` when given: fixed-shape steps round their cache lengths)."""
        lengths = [c.real_lengths()[rows] for c, rows in parts if rows]
        n_rows = sum(len(rows) for _, rows in parts)
        if not n_rows:
            raise ValueError("repack needs at least one row")
        first = parts[0][0]
        new_len = int(max(int(x.max()) for x in lengths))
        capacity = new_len + room if bucket is None else bucket(new_len + room)
        kv_dtype = next((layer.k.dtype for layer in first.layers if isinstance(layer, KVCache)), None)
        conv = next((layer.conv for layer in first.layers if isinstance(layer, MambaState)), None)
        dtype = kv_dtype or (conv.dtype if conv is not None else torch.float32)
        out = HybridCache(first.cfg, n_rows, capacity, dtype=dtype, device=first.valid.device)
        out.valid[:, :new_len] = False
        at = 0
        for cache, rows in parts:
            if not rows:
                continue
            src = torch.tensor(rows, device=cache.valid.device)
            dst = slice(at, at + len(rows))
            at += len(rows)
            shift = new_len - cache.length  # columns move right by `shift` (left when negative)
            lo_src, lo_dst = max(0, -shift), max(0, shift)
            out.valid[dst, lo_dst:new_len] = cache.valid[src, lo_src:cache.length]
            for mine, theirs in zip(out.layers, cache.layers):
                if isinstance(mine, KVCache):
                    mine.k[dst, :, lo_dst:new_len] = theirs.k[src, :, lo_src:cache.length]
                    mine.v[dst, :, lo_dst:new_len] = theirs.v[src, :, lo_src:cache.length]
                elif isinstance(mine, MambaState):
                    mine.conv[dst] = theirs.conv[src]
                    mine.ssm[dst] = theirs.ssm[src]
        out.length = new_len
        out.padded = not bool(out.valid[:, :new_len].all())
        return out

    def tensors(self):
        """Every tensor the cache holds (for static-address marking under CUDA graphs)."""
        yield self.valid
        for layer in self.layers:
            if layer is not None:
                yield from vars(layer).values()

    def nbytes(self) -> int:
        total = 0
        for layer in self.layers:
            if isinstance(layer, KVCache):
                total += layer.k.nbytes + layer.v.nbytes
            elif isinstance(layer, MambaState):
                total += layer.conv.nbytes + layer.ssm.nbytes
        return total

    def reset(self):
        self.length, self.padded = 0, False
        self.valid.fill_(True)
        for layer in self.layers:
            for tensor in (vars(layer).values() if layer is not None else ()):
                tensor.zero_()
