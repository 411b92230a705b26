"""Routed MoE experts held one Linear per expert, so that a quantized checkpoint's experts can stay packed.

The model holds each MoE layer's routed experts as two fused tensors (E, out, in), as transformers does
(vl/modeling/mlp.py `MoE`). A fused tensor is one dtype, so a checkpoint's packed FP8 / NVFP4 experts can only
live there dequantized: for Nemotron 3 Nano 30B-A3B that is 29.4B parameters, 58.7 GB of BF16, where the packed
NVFP4 bytes are 16.5 GB. `split_fused_experts` is the pass that replaces each fused tensor by an `nn.ModuleList`
of E bias-free `nn.Linear`s (named `mixer.experts.up_proj.{i}`, `mixer.experts.down_proj.{i}`), which
`swap_quantized_linears` then swaps for packed FP8 / NVFP4 Linears like any other; the MoE forward calls expert
i's module where it finds one (a list) and multiplies by row i of the tensor otherwise. Either way a token reads
only the rows of the experts its router chose.

For one token (decode) the MoE asks the list for its k experts' projections at once (`ExpertList.project`):
where they are packed NVFP4 (or FP8) Linears on the CPU with the fused kernel available, the k products are one
kernel call (vl/kernels/gemv.py `nvfp4_group`, `fp8_group`), so the threads wake once per projection rather than once per expert, with the
bits each expert's own forward gives; anything else calls the experts one by one.

`hub_to_split_name` maps the checkpoint's per-expert names (`mixer.experts.{i}.up_proj.weight`, the hub layout)
onto the split names (`mixer.experts.up_proj.{i}.weight`).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from vl.kernels import gemv
from vl.quant.linear import FP8Linear, NVFP4Linear

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


class ExpertList(nn.ModuleList):
    """A MoE layer's E routed experts' projections (one of up / down), one Linear per expert."""

    def project(self, ids: list[int], x: torch.Tensor) -> torch.Tensor:
        """Experts `ids`' projections of x: (1, in), one row for every expert, or (len(ids), in), row i for expert
        ids[i] -> (len(ids), out) in x's dtype; each row what `self[ids[i]]` gives for its input row."""
        y = self._grouped(ids, x)
        if y is not None:
            return y
        return torch.cat([self[e](x if x.shape[0] == 1 else x[i:i + 1]) for i, e in enumerate(ids)])

    def _grouped(self, ids, x):  # -> the kernel's (len(ids), out), or None where it does not apply
        if (x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16) or len(ids) < 2
                or torch.compiler.is_compiling() or (torch.is_grad_enabled() and x.requires_grad)):
            return None
        kern = gemv.kernel()
        if kern is None:
            return None
        ops = self._operands(kern, ids)
        if ops is None:
            return None
        rows = [0] * len(ids) if x.shape[0] == 1 else list(range(len(ids)))
        w, a = [ops["w"][e] for e in ids], [ops["a"][e] for e in ids]
        if ops["fmt"] == "nvfp4":
            y = kern.nvfp4_group(x, rows, w, a, [ops["gs"][e] for e in ids], ops["n"], x.dtype == torch.bfloat16)
        else:
            y = kern.fp8_group(x, rows, w, a, ops["kind"], ops["n"], x.dtype == torch.bfloat16)
        return y.to(x.dtype)

    def _operands(self, kern, ids):
        """The experts' packed pointers (and NVFP4 global scales), bound once per kernel and list of modules,
        re-bound when a used expert's tensors move or change in place (as QuantizedLinear re-binds its own call);
        None where the experts are not all weight-only NVFP4 Linears, or all FP8 ones of one scale kind, that the
        kernel reads as their own forward would."""
        mods = tuple(self._modules.values())
        cached = self.__dict__.get("_group_ops")
        if cached is not None and cached[0] is kern and len(cached[1]) == len(mods) and all(
                a is b for a, b in zip(cached[1], mods)):
            ops, keys = cached[2], cached[3]
            if ops is None or all(keys[e] == _key(mods[e]) for e in ids):
                return ops
        ops, keys = None, []
        for m in mods:
            packed = m.packed_operands() if type(m) in (NVFP4Linear, FP8Linear) else None
            first = ops or {"fmt": packed and packed["fmt"], "kind": packed and packed.get("kind"),
                            "n": m.out_features, "k": m.in_features, "w": [], "a": [], "gs": [], "keep": []}
            if (packed is None or m.bias is not None or m.mode not in ("weight-only", "auto") or m.emulate_activations
                    or (m.out_features, m.in_features, packed["fmt"], packed.get("kind"))
                    != (first["n"], first["k"], first["fmt"], first["kind"])):
                ops, keys = None, []
                break
            ops = first
            ops["w"].append(packed["weight"].data_ptr())
            if packed["fmt"] == "nvfp4":
                ops["a"].append(packed["block_scale"].data_ptr())
                ops["gs"].append(packed["global_scale"])
            else:  # a float32 copy of the scale: kept alive here while the pointer is bound
                ops["keep"].append(packed["scale"])
                ops["a"].append(packed["scale"].data_ptr())
            keys.append(_key(m))
        self.__dict__["_group_ops"] = (kern, mods, ops, keys)
        return ops


def _key(m) -> tuple:
    """What a bound expert's pointers depend on: each of its buffers' storage and in-place version."""
    return tuple((b.data_ptr(), b._version) for b in m._buffers.values() if b is not None)


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
            experts = ExpertList()
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
