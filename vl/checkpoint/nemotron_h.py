"""Adapter for text-only Nemotron-H checkpoints (`model_type: nemotron_h`), both ways.

Accepted layouts (docs/format.md §3.3-§3.4; transformers `conversion_mapping.py` "nemotron_h"):
- hub / Megatron export and what transformers 5 `save_pretrained` writes: `backbone.*`, per-expert
  `mixer.experts.{i}.{up,down}_proj.weight`;
- transformers' in-memory layout: `model.*`, fused `mixer.experts.{up,down}_proj` of shape (E, out, in).
Native names are the hub layout with fused experts. Multi-token-prediction heads (`mtp.*`) are ignored.
Exports write the hub layout, which both transformers and vLLM read.
"""

from __future__ import annotations

import re

import torch

from vl.checkpoint.adapter import Plan
from vl.errors import CheckpointError
from vl.quant.experts import split_to_hub_name

_EXPERT = re.compile(r"^(.*\.mixer\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$")


def plan_lm(names, prefix: str = "", native_prefix: str = "") -> Plan:
    """Plan for the LM tensors under `prefix` (e.g. "language_model." inside a VL checkpoint)."""
    plan = Plan()
    experts: dict[str, dict[int, str]] = {}
    for name in names:
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        if rest.startswith(("mtp.", "model.mtp.", "backbone.mtp.")):
            plan.ignored[name] = "multi-token-prediction head (not used for decoding)"
            continue
        if rest.startswith("model."):
            rest = "backbone." + rest[len("model."):]
        m = _EXPERT.match(rest)
        if m:
            experts.setdefault(f"{native_prefix}{m.group(1)}.{m.group(3)}", {})[int(m.group(2))] = name
        else:
            plan.add(native_prefix + rest, name)
    for native, by_index in experts.items():  # stacked in expert order; indices must be 0..E-1
        if sorted(by_index) != list(range(len(by_index))):
            raise CheckpointError(f"{native}: expert indices {sorted(by_index)} are not 0..{len(by_index) - 1}")
        for i in range(len(by_index)):
            plan.add(native, by_index[i], stack=True)
    return plan


def export_lm(state_dict: dict[str, torch.Tensor], native_prefix: str = "", prefix: str = "") -> dict:
    """Native LM state dict -> hub layout (per-expert tensors, from fused tensors or from experts held one Linear
    each), keys prefixed with `prefix`."""
    out = {}
    for name, t in state_dict.items():
        if not name.startswith(native_prefix):
            continue
        rest = split_to_hub_name(name[len(native_prefix):])  # experts held one (packed) Linear each: hub names
        if rest.endswith(".mixer.experts.up_proj") or rest.endswith(".mixer.experts.down_proj"):
            base, proj = rest.rsplit(".", 1)
            for i in range(t.shape[0]):
                out[f"{prefix}{base}.{i}.{proj}.weight"] = t[i]
        else:
            out[prefix + rest] = t
    return out
