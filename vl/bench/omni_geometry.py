"""`vl bench --geometry nano-omni-30b-a3b`: Nemotron 3 Nano Omni's 30B-A3B MoE LLM at its released widths on one
CPU machine, with its routed experts kept packed.

The writer of vl/bench/geometry.py streams the checkpoint (routed experts packed per expert under the hub's names,
`mixer.experts.{i}.{up,down}_proj.*`), and `vl.load_pretrained` loads it as a user's: the packed experts stay packed,
one quantized Linear per expert (vl/checkpoint/quantized.py, vl/quant/experts.py), 16.5 GB for this model where
their BF16 expansion would be 58.7 GB.

What it adds to the figures: the bytes one decode step reads (every weight except the embedding table, of the
routed experts only k of E per MoE layer: the router picks k per token and the MoE forward reads only those), the
BF16 / packed split of the resident bytes, and the BF16 bytes of the towers (RADIO ViT-H, the projector, Parakeet
and its projector), which text prefill and decode do not build.
"""

from __future__ import annotations


import torch
from torch import nn

from vl.config import LMConfig
from vl.config.omni import OmniConfig, omni_30b_a3b
from vl.quant.experts import routed_expert_bytes
from vl.quant.linear import QuantizedLinear, resident_weight_bytes

NAME = "nano-omni-30b-a3b"


def lm_config() -> LMConfig:
    return omni_30b_a3b().lm


def decode_bytes(model) -> int:
    """Bytes one decode step reads: every parameter and buffer except the embedding table (one row), and of the
    routed experts only top-k of E per MoE layer (every expert of a layer has the same size)."""
    cfg = model.config
    emb = model.backbone.embeddings.weight
    experts = routed_expert_bytes(model)
    read_experts = experts * cfg.num_experts_per_tok // cfg.n_routed_experts if cfg.n_routed_experts else 0
    return resident_weight_bytes(model) - emb.numel() * emb.element_size() - experts + read_experts


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def resident_split(model) -> dict[str, int]:
    """Resident bytes by part: packed (quantized) Linears, routed experts among them, and what stays BF16 / FP32
    (embedding table, output head, MoE routers, norms, the Mamba conv / A / D / dt parts)."""
    packed = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    packed_ids = {id(t) for m in packed for t in list(m.buffers()) + list(m.parameters())}
    out = {"packed": _bytes(t for m in packed for t in m.buffers() if t is not None),
           "routed_experts": routed_expert_bytes(model),
           "embeddings": _bytes([model.backbone.embeddings.weight]), "lm_head": _bytes([model.lm_head.weight])}
    groups = {"router": ("mixer.gate.",), "norms": ("norm",), "mamba_other": ("conv1d", "A_log", ".D", "dt_bias")}
    for key in groups:
        out[key] = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if id(t) in packed_ids or name.startswith(("backbone.embeddings", "lm_head")):
            continue
        key = next((k for k, subs in groups.items() if any(s in name for s in subs)), "other")
        out[key] = out.get(key, 0) + _bytes([t])
    return out


def tower_bytes(cfg: OmniConfig | None = None) -> dict[str, int]:
    """BF16 bytes of the Omni parts outside the LLM, from the model built on the meta device (exact sizes)."""
    from vl.modeling.omni import NemotronOmni

    with torch.device("meta"):
        omni = NemotronOmni(cfg or omni_30b_a3b())
    parts = {"vision tower (RADIO ViT-H/16)": omni.vision, "vision projector (mlp1)": omni.projector,
             "audio encoder (Parakeet)": omni.audio_encoder, "audio projector": omni.audio_projector}
    return {k: 2 * sum(p.numel() for p in m.parameters()) for k, m in parts.items() if isinstance(m, nn.Module)}
