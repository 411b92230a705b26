"""Routed MoE experts held one Linear per expert, so that a quantized checkpoint's experts can stay packed.

The model holds each MoE layer's routed experts as two fused tensors (E, out, in), as transformers does
(vl/modeling/mlp.py `MoE`). A fused tensor is one dtype, so a checkpoint's packed FP8 / NVFP4 experts can only
live there dequantized: for Nemotron 3 Nano 30B-A3B that is 29.4B parameters, 58.7 GB of BF16, where the packed
NVFP4 bytes are 16.5 GB. `split_fused_experts` is the pass that replaces each fused tensor by an `nn.ModuleList`
of E bias-free `nn.Linear`s (named `mixer.experts.up_proj.{i}`, `mixer.experts.down_proj.{i}`), which
`swap_quantized_linears` then swaps for packed FP8 / NVFP4 Linears like any other; the MoE forward calls expert
i's module where it finds one (a list) and multiplies by row i of the tensor otherwise. Either way a token reads
only the rows of the experts its router chose.

`hub_to_split_name` maps the checkpoint's per-expert names (`mixer.experts.{i}.up_proj.weight`, the hub layout)
onto the split names (`mixer.experts.up_proj.{i}.weight`).
"""

from __future__ import annotations

import re

import torch
from torch import nn

_HUB_EXPERT = re.compile(r"^(.*\.mixer\.experts)\.(\d+)\.(up_proj|down_proj)\.([^.]+)$")
PROJECTIONS = ("up_proj", "down_proj")


def _is_routed(module_name: str) -> bool:
    """The MoE's `experts` holder (not its `shared_experts` MLP)."""
    return module_name == "experts" or module_name.endswith(".experts")


def hub_to_split_name(name: str) -> str:
    """`….mixer.experts.{i}.{up,down}_proj.{suffix}` -> `….mixer.experts.{up,down}_proj.{i}.{suffix}`; any other
    name unchanged."""
    m = _HUB_EXPERT.match(name)
    return f"{m.group(1)}.{m.group(3)}.{m.group(2)}.{m.group(4)}" if m else name


_SPLIT_EXPERT = re.compile(r"^(.*\.mixer\.experts)\.(up_proj|down_proj)\.(\d+)\.([^.]+)$")


def split_to_hub_name(name: str) -> str:
    """The inverse of `hub_to_split_name`: `….mixer.experts.{up,down}_proj.{i}.{suffix}` ->
    `….mixer.experts.{i}.{up,down}_proj.{suffix}`; any other name unchanged."""
    m = _SPLIT_EXPERT.match(name)
    return f"{m.group(1)}.{m.group(3)}.{m.group(2)}.{m.group(4)}" if m else name


def split_fused_experts(model: nn.Module, only=None) -> list[str]:
    """Replace every fused routed-expert tensor (E, out, in) (or those named in `only`) by E bias-free Linears on
    the same device, holding the same values (views of the fused tensor's rows; meta stays meta). Returns the
    replaced tensors' names."""
    done = []
    for name, mod in list(model.named_modules()):
        if not _is_routed(name):
            continue
        for proj in PROJECTIONS:
            fused = mod._parameters.get(proj)
            if fused is None or fused.dim() != 3 or (only is not None and f"{name}.{proj}" not in only):
                continue
            experts = nn.ModuleList()
            for row in fused.detach():
                lin = nn.Linear(row.shape[1], row.shape[0], bias=False, device="meta")
                lin.weight = nn.Parameter(row, requires_grad=fused.requires_grad)
                experts.append(lin)
            del mod._parameters[proj]
            mod.add_module(proj, experts)
            done.append(f"{name}.{proj}")
    return done


def routed_expert_bytes(model: nn.Module) -> int:
    """Bytes held by the routed experts' weights (and scales, when packed), fused or split."""
    total = 0
    for name, mod in model.named_modules():
        if not _is_routed(name):
            continue
        for proj in PROJECTIONS:
            held = getattr(mod, proj, None)
            if isinstance(held, torch.Tensor):
                total += held.numel() * held.element_size()
            elif isinstance(held, nn.Module):
                total += sum(t.numel() * t.element_size() for t in list(held.parameters()) + list(held.buffers()))
    return total
