"""A toy model whose module names follow the Nano V2 VL checkpoint (shared by the quant tests)."""

import torch.nn as nn
import torch.nn.functional as F

IN_PROJ = "language_model.backbone.layers.0.mixer.in_proj"
OUT_PROJ = "language_model.backbone.layers.0.mixer.out_proj"


def toy(d=64, bias=False):
    """vision_model / mlp1 stay high precision, the LM mixer Linears get quantized, lm_head is optional."""
    mixer = nn.ModuleDict({"in_proj": nn.Linear(d, 2 * d, bias=bias), "out_proj": nn.Linear(2 * d, d, bias=bias)})
    return nn.ModuleDict({
        "vision_model": nn.ModuleDict({"proj": nn.Linear(32, 32)}),
        "mlp1": nn.Sequential(nn.LayerNorm(32), nn.Linear(32, d)),
        "language_model": nn.ModuleDict({
            "backbone": nn.ModuleDict({"layers": nn.ModuleList([nn.ModuleDict({"mixer": mixer})])}),
            "lm_head": nn.Linear(d, 48, bias=False),
        }),
    })


def run(m, x):  # (B, 32) -> (B, 48)
    h = m["mlp1"](m["vision_model"]["proj"](x))
    mixer = m["language_model"]["backbone"]["layers"][0]["mixer"]
    return m["language_model"]["lm_head"](mixer["out_proj"](F.relu(mixer["in_proj"](h))))
