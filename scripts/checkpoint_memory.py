"""Memory each released checkpoint needs: weights + cache at a given context, from the model geometries.

    python scripts/checkpoint_memory.py [--context 16384]

Parameter counts come from building each model on the meta device with this package's own modules (nothing is
allocated or downloaded); the geometries are the released config.json values written out in GEOMETRIES below
(docs/checkpoints.md says where each comes from). Cache bytes follow vl/runtime/cache.py: K/V per attention
layer in bf16, per Mamba layer a conv window (conv_kernel - 1 inputs, bf16) and the SSM state in fp32.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vl.config import LMConfig, VisionConfig, VLConfig, nano_12b_lm  # noqa: E402

GIB = 1024**3
# Nemotron Nano 9B v2 and Nemotron 3 Nano 30B-A3B: their published config.json values (docs/checkpoints.md).
NANO_9B = dict(vocab_size=131072, hidden_size=4480,
               pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
               num_attention_heads=40, num_key_value_heads=8, head_dim=128, intermediate_size=15680,
               mamba_num_heads=128, mamba_head_dim=80, n_groups=8, ssm_state_size=128)
NANO3_30B_A3B = dict(vocab_size=131072, hidden_size=2688,
                     pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
                     num_attention_heads=32, num_key_value_heads=2, head_dim=128, intermediate_size=1856,
                     mamba_num_heads=64, mamba_head_dim=64, n_groups=8, ssm_state_size=128,
                     n_routed_experts=128, num_experts_per_tok=6, moe_intermediate_size=1856,
                     moe_shared_expert_intermediate_size=3712, routed_scaling_factor=2.5)


def vl_12b() -> VLConfig:
    return VLConfig(lm=nano_12b_lm(), vision=VisionConfig(model="vit_huge_patch16_224", num_prefix_tokens=10),
                    force_image_size=512, projector_hidden_size=20480, vit_hidden_size=1280)


def counts(cfg) -> dict[str, int]:
    """Parameters by group: 'linear' = the LLM Linears ModelOpt quantizes (Mamba in/out_proj, attention q/k/v/o,
    MLP and expert up/down), 'other' = everything else of the LLM (embeddings, lm_head, norms, conv1d, A, D, dt
    bias, routers), 'vision' = RADIO + projector (never quantized)."""
    from vl.modeling.nemotron_h import NemotronHForCausalLM
    from vl.modeling.vlm import NemotronVL

    with torch.device("meta"):
        model = NemotronVL(cfg) if isinstance(cfg, VLConfig) else NemotronHForCausalLM(cfg)
    out = {"linear": 0, "other": 0, "vision": 0, "active_linear": 0}
    lm = cfg.lm if isinstance(cfg, VLConfig) else cfg
    for name, p in model.named_parameters():
        n = p.numel()
        if name.startswith(("vision.", "projector.")):
            out["vision"] += n
        elif name.endswith(("in_proj.weight", "out_proj.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight",
                            "o_proj.weight", "up_proj.weight", "down_proj.weight", "experts.up_proj",
                            "experts.down_proj")):
            out["linear"] += n
            out["active_linear"] += (n * lm.num_experts_per_tok // lm.n_routed_experts) if ".experts." in name else n
        else:
            out["other"] += n
    return out


def cache_bytes(lm: LMConfig, context: int) -> tuple[int, int]:
    kv = len(lm.attention_layers) * 2 * lm.num_key_value_heads * lm.head_dim * context * 2
    ssm = len(lm.mamba_layers) * (lm.mamba_num_heads * lm.mamba_head_dim * lm.ssm_state_size * 4
                                  + lm.mamba_conv_dim * (lm.conv_kernel - 1) * 2)
    return kv, ssm


def rows(context: int):
    models = [("Nano 12B v2 VL", vl_12b()), ("Nano 12B v2 (text)", nano_12b_lm()),
              ("Nano 9B v2 (text)", LMConfig(**NANO_9B)), ("Nemotron 3 Nano 30B-A3B (text)", LMConfig(**NANO3_30B_A3B))]
    for name, cfg in models:
        c = counts(cfg)
        lm = cfg.lm if isinstance(cfg, VLConfig) else cfg
        kv, ssm = cache_bytes(lm, context)
        total = c["linear"] + c["other"] + c["vision"]
        bf16 = total * 2
        fp8 = c["linear"] * 1 + (c["other"] + c["vision"]) * 2
        nvfp4 = c["linear"] * 9 // 16 + (c["other"] + c["vision"]) * 2  # 4-bit codes + one E4M3 scale per 16
        yield dict(name=name, params=total, linear=c["linear"], vision=c["vision"], active=c["active_linear"]
                   + c["other"] + c["vision"], bf16=bf16, fp8=fp8, nvfp4=nvfp4, kv=kv, ssm=ssm,
                   attn=len(lm.attention_layers), mamba=len(lm.mamba_layers))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=16384)
    a = p.parse_args(argv)
    head = ("model", "params (B)", "BF16 weights", "FP8 weights", "NVFP4 weights", f"KV @ {a.context}", "Mamba state",
            "BF16 + cache")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows(a.context):
        cells = [r["name"], f"{r['params'] / 1e9:.2f}" + (f" ({r['active'] / 1e9:.2f} active)"
                                                           if r["active"] != r["params"] else ""),
                 f"{r['bf16'] / GIB:.1f} GiB", f"{r['fp8'] / GIB:.1f} GiB", f"{r['nvfp4'] / GIB:.1f} GiB",
                 f"{r['kv'] / GIB * 1024:.0f} MiB ({r['attn']} layers)",
                 f"{r['ssm'] / 1e6:.0f} MB ({r['mamba']} layers)",
                 f"{(r['bf16'] + r['kv'] + r['ssm']) / GIB:.1f} GiB"]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
