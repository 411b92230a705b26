"""Random Hadamard rotation of the LLM's residual stream, folded into the weights (a pass applied before PTQ).

The NVFP4 paper (arXiv 2509.25149, TransformerEngine `NVFP4BlockScaling`) rotates 16-element blocks with a
random-sign Hadamard matrix so that outliers spread across an FP4 block. Its rotation runs inside the GEMM
kernels; a released checkpoint has to run on plain ModelOpt readers, so here the rotation is folded into the
weights instead, as QuaRot (arXiv 2404.00456) does: with R block-diagonal of 16x16 random Hadamards
(orthonormal) the network computes exactly the same function when

- every RMSNorm gain feeding the residual stream is folded into the Linears that read it (gain := 1), since an
  RMSNorm without gain commutes with R (it preserves the norm);
- every reader of the normalised stream (Mamba in_proj, q/k/v, MLP up, MoE router / shared / routed up or the
  latent fc1, lm_head) gets W diag(g) R^T: its 16-element *input* blocks, the NVFP4 blocks, are rotated;
- every writer of the stream (Mamba out_proj, o_proj, MLP down, MoE down / fc2, the embeddings and the
  projector's last Linear `mlp1.3`) gets R W: the residual stream itself becomes R h.

So the exported checkpoint keeps the plain layout (docs/format.md §11.4) and loads anywhere; only the weight values
change. `nvfp4_weight_error` in vl/quant/hadamard.py measures the same idea per matrix.
"""

from __future__ import annotations

import torch
from torch import nn

from vl.errors import ConfigError
from vl.quant.hadamard import random_hadamard, rotate_blocks
from vl.quant.nvfp4 import BLOCK

READERS = {"M": ("in_proj",), "*": ("q_proj", "k_proj", "v_proj"), "-": ("up_proj",)}
WRITERS = {"M": ("out_proj",), "*": ("o_proj",), "-": ("down_proj",)}


def _rows(w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """R applied to the output dim of a (..., out, in) weight (or a (out,) bias): R W."""
    if w.dim() == 1:
        return rotate_blocks(w, r)
    return rotate_blocks(w.float().transpose(-1, -2), r).transpose(-1, -2)


@torch.no_grad()
def _read(weight: torch.Tensor, gain: torch.Tensor, r: torch.Tensor) -> None:
    """W <- W diag(g) R^T in place: each 16-block of an input row b becomes r (g * b)."""
    weight.copy_(rotate_blocks(weight.float() * gain.float(), r).to(weight.dtype))


@torch.no_grad()
def _write(weight: torch.Tensor, r: torch.Tensor) -> None:
    weight.copy_(_rows(weight.float(), r).to(weight.dtype))


def _readers_of(kind: str, mixer: nn.Module) -> list[torch.Tensor]:
    if kind in READERS:
        return [getattr(mixer, n).weight for n in READERS[kind]]
    out = [mixer.gate.weight, mixer.shared_experts.up_proj.weight]  # "E"
    out.append(mixer.fc1_latent_proj.weight if isinstance(mixer.fc1_latent_proj, nn.Linear) else mixer.experts.up_proj)
    return out


def _writers_of(kind: str, mixer: nn.Module) -> list[nn.Module | torch.Tensor]:
    if kind in WRITERS:
        return [getattr(mixer, n) for n in WRITERS[kind]]
    out = [mixer.shared_experts.down_proj]
    out.append(mixer.fc2_latent_proj if isinstance(mixer.fc2_latent_proj, nn.Linear) else mixer.experts.down_proj)
    return out


@torch.no_grad()
def rotate_residual_stream(model: nn.Module, seed: int = 0) -> torch.Tensor:
    """Fold a block-diagonal random Hadamard rotation into a NemotronVL or NemotronHForCausalLM, in place.

    Returns the 16x16 block `r` used. The model's outputs are unchanged up to floating-point rounding
    (tests/quant/test_rotate.py); afterwards its RMSNorm gains in the residual path are 1.
    """
    lm = getattr(model, "language_model", model)
    cfg = lm.config
    if cfg.hidden_size % BLOCK:
        raise ConfigError(f"Hadamard rotation: hidden_size={cfg.hidden_size} is not a multiple of {BLOCK}")
    if lm.lm_head.weight is lm.backbone.embeddings.weight:
        raise ConfigError("Hadamard rotation: tied embeddings / lm_head cannot carry the two different folds "
                          "(E R^T and W diag(g) R^T); quantize without --hadamard")
    r = random_hadamard(BLOCK, seed)
    for block in lm.backbone.layers:
        gain = block.norm.weight
        for w in _readers_of(block.kind, block.mixer):
            _read(w, gain, r)
        for m in _writers_of(block.kind, block.mixer):
            if isinstance(m, nn.Linear):
                _write(m.weight, r)
                if m.bias is not None:
                    _write(m.bias, r)
            else:  # fused expert tensor (E, d, inter)
                _write(m, r)
        gain.fill_(1.0)
    _read(lm.lm_head.weight, lm.backbone.norm_f.weight, r)
    lm.backbone.norm_f.weight.fill_(1.0)
    emb = lm.backbone.embeddings.weight  # (V, d): each row e -> R e
    emb.copy_(rotate_blocks(emb.float(), r).to(emb.dtype))
    projector = getattr(model, "projector", None)
    if projector is not None:  # the vision vectors enter the residual stream through mlp1's last Linear
        last = [m for m in projector.mlp1 if isinstance(m, nn.Linear)][-1]
        _write(last.weight, r)
        if last.bias is not None:
            _write(last.bias, r)
    return r
