"""Nemotron-H: the hybrid Mamba-2 / attention / MLP (/ MoE) language model.

One block class holding one mixer chosen by the pattern character (docs/format.md §7.1-7.2):
h = h + mixer(RMSNorm(h)) per layer, then `norm_f` and an untied `lm_head`. Parameter names follow the
hub layout (`backbone.embeddings`, `backbone.layers.{i}.norm`, `backbone.layers.{i}.mixer.*`,
`backbone.norm_f`, `lm_head`), so a state dict of this module *is* a Nemotron-H checkpoint.
Plain math: caches are passed in, nothing here samples, places or loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vl.config import LMConfig
from vl.modeling.attention import Attention
from vl.modeling.mamba2 import Mamba2Mixer
from vl.modeling.mlp import MLP, MoE
from vl.modeling.norms import RMSNorm

MIXERS = {"M": Mamba2Mixer, "*": Attention, "-": MLP, "E": MoE}


class Block(nn.Module):
    def __init__(self, cfg: LMConfig, kind: str):
        super().__init__()
        self.kind = kind
        self.norm = RMSNorm(cfg.hidden_size, cfg.layer_norm_epsilon)
        self.mixer = MIXERS[kind](cfg)

    def forward(self, h, layer_cache=None, pos=0, mask=None, key_valid=None):
        x = self.norm(h.to(self.norm.weight.dtype))
        if self.kind == "M":
            x = self.mixer(x, layer_cache, mask)
        elif self.kind == "*":
            x = self.mixer(x, layer_cache, pos, key_valid)
        else:
            x = self.mixer(x)
        return h + x


class Backbone(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, c) for c in cfg.pattern)
        self.norm_f = RMSNorm(cfg.hidden_size, cfg.layer_norm_epsilon)


@dataclass
class CausalLMOutput:
    logits: torch.Tensor  # (b, t_kept, vocab) fp32
    last_hidden_state: torch.Tensor  # (b, t_kept, d) after norm_f


class NemotronHForCausalLM(nn.Module):
    # small parameters whose precision matters more than their bytes (router as transformers keeps it;
    # the SSM decay and skip as vLLM keeps A)
    keep_in_fp32 = (".mixer.gate.weight", ".e_score_correction_bias", ".A_log", ".D", ".dt_bias")

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.config = cfg
        self.backbone = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.weight
        # the layers after the last Mamba / attention layer keep no state and mix no positions (MLP, MoE):
        # with `logits_to_keep`, they only need to run at the kept positions
        stateful = [i for i, c in enumerate(cfg.pattern) if c in "M*"]
        self.stateless_tail = stateful[-1] + 1 if stateful else 0

    @property
    def lm_config(self) -> LMConfig:
        return self.config

    def embed(self, input_ids):
        return self.backbone.embeddings(input_ids)

    def forward(self, input_ids=None, inputs_embeds=None, cache=None, input_pos=None, attention_mask=None,
                logits_to_keep: int = 0, cache_only: bool = False):
        """input_ids (b, t) or inputs_embeds (b, t, d).

        cache: a `HybridCache` (vl.runtime.cache) or None. input_pos: the absolute position of the first new
        token (default: the cache's length, or 0). attention_mask (b, t): 1 for real tokens, 0 for left
        padding of the new tokens; the cache remembers it for later steps. logits_to_keep: 0 = all positions,
        k = the last k only (prefill needs only the last): the stateless layers after the last Mamba / attention
        layer, `norm_f` and `lm_head` then run at those k positions only, and `last_hidden_state` has k positions.

        A 0-d tensor `input_pos` selects fixed-shape one-token decode (`decode_step`): nothing on the Python
        side depends on the position, so the step can be compiled and captured as a CUDA graph.

        cache_only: a prompt chunk that is not the prompt's last only fills `cache`: the layers after the last
        Mamba / attention layer, `norm_f` and `lm_head` (a read of the whole head per chunk) are skipped, and the
        output is None. The cache holds what a full call would have left in it.
        """
        if cache_only and cache is None:
            raise ValueError("cache_only needs a cache to fill")
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        b, t, _ = h.shape
        if isinstance(input_pos, torch.Tensor):
            return self._static_step(h, cache, input_pos)
        pos = input_pos if input_pos is not None else (cache.length if cache is not None else 0)
        mask = None if attention_mask is None else attention_mask.bool()
        key_valid = None
        if cache is not None:
            key_valid = cache.mark(pos, t, mask)
        elif mask is not None and not bool(mask.all()):
            key_valid = mask
        if mask is not None and bool(mask.all()):
            mask = None  # no padding among the new tokens: skip the masking work
        if self.config.residual_in_fp32:
            h = h.float()
        for i, block in enumerate(self.backbone.layers):
            if i == self.stateless_tail and cache_only:
                break
            if i == self.stateless_tail and logits_to_keep:
                h = h[:, -logits_to_keep:]
            h = block(h, cache.layers[i] if cache is not None else None, pos, mask, key_valid)
        if cache_only:
            cache.length = pos + t
            return None
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        h = self.backbone.norm_f(h)
        if cache is not None:
            cache.length = pos + t
        logits = self.lm_head(h.to(self.backbone.embeddings.weight.dtype)).float()
        return CausalLMOutput(logits=logits, last_hidden_state=h)

    def _static_step(self, h, cache, pos):
        """One decode token at tensor position `pos` (b, 1, d) -> CausalLMOutput; the caller advances `pos`."""
        key_valid = cache.valid if cache.padded else None
        if self.config.residual_in_fp32:
            h = h.float()
        for i, block in enumerate(self.backbone.layers):
            h = block(h, cache.layers[i], pos, None, key_valid)
        h = self.backbone.norm_f(h)
        logits = self.lm_head(h.to(self.backbone.embeddings.weight.dtype)).float()
        return CausalLMOutput(logits=logits, last_hidden_state=h)
