"""`vl bench --geometry nano-omni-30b-a3b`: Nemotron 3 Nano Omni's 30B-A3B MoE LLM at its released widths on one
CPU machine, with its routed experts kept packed.

The writer of vl/bench/geometry.py streams the checkpoint (routed experts packed per expert under the hub's names,
`mixer.experts.{i}.{up,down}_proj.*`). `vl.load_pretrained` would dequantize packed routed experts into the
model's fused BF16 tensors (vl/checkpoint/quantized.py `finish`): 58.7 GB for this model, more than the machine.
So this file loads the checkpoint the same way with one difference: the fused expert tensors are first split into
one Linear per expert (vl/quant/experts.py), which `swap_quantized_linears` makes packed FP8 / NVFP4 Linears like
every other quantized Linear; the tensors are read with the library's checkpoint reader (embedding table mapped,
the rest in process memory) and the model gets the library's runtime passes.

What it adds to the figures: the bytes one decode step reads (every weight except the embedding table, of the
routed experts only k of E per MoE layer: the router picks k per token and the MoE forward reads only those), the
BF16 / packed split of the resident bytes, and the BF16 bytes of the towers (RADIO ViT-H, the projector, Parakeet
and its projector), which text prefill and decode do not build.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from vl.checkpoint.adapter import row_tables
from vl.checkpoint.files import CheckpointFiles
from vl.config import LMConfig, lm_config_from_hf
from vl.config.omni import OmniConfig, omni_30b_a3b
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.quant.config import detect_quantized_linears
from vl.quant.experts import hub_to_split_name, routed_expert_bytes, split_fused_experts
from vl.quant.linear import QuantizedLinear, resident_weight_bytes, swap_quantized_linears
from vl.runtime.pretrained import runtime_passes

NAME = "nano-omni-30b-a3b"


def lm_config() -> LMConfig:
    return omni_30b_a3b().lm


@torch.no_grad()
def load_split_experts(path) -> NemotronHForCausalLM:
    """A `nemotron_h` FP8 / NVFP4 checkpoint with packed per-expert routed experts, loaded weight-only with the
    experts kept packed (one quantized Linear per expert). Strict: every tensor of the model and no other."""
    path = Path(path)
    raw = json.loads((path / "config.json").read_text())
    raw.pop("quantization_config", None)  # read from the tensors below, as the library's loader detects it
    cfg = lm_config_from_hf(raw, where=str(path / "config.json"))
    files = CheckpointFiles(path)
    native = {hub_to_split_name(k): k for k in files.infos}
    with torch.device("meta"):
        model = NemotronHForCausalLM(cfg)
    split_fused_experts(model)
    specs = detect_quantized_linears({n: files.infos[k] for n, k in native.items()})
    swap_quantized_linears(model, specs, "weight-only")
    mapped = row_tables(model)
    tensors = files.load_all(mapped={native[n] for n in mapped})
    model.load_state_dict({n: tensors.pop(k) for n, k in native.items()}, strict=True, assign=True)
    model.eval().requires_grad_(False)
    return runtime_passes(model)


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
