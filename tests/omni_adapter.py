"""transformers' `nemotron_h_omni` (Nemotron 3 Nano Omni) as the tests' reference.

`hf_omni` builds a tiny random transformers `NemotronH_Omni_Reasoning_V3` (eager attention, every parameter and the
audio batch-norm statistics random) for the Omni parity and loading tests, which load what its `save_pretrained`
writes (the released layout) with `vl.load_pretrained`.

The rest maps the Omni image path onto Nano V2 VL for the V2 numerics tests: transformers' Omni class holds the
same RADIO tower, pixel shuffle, projector and merge as Nano V2 VL, under other names (q/k/v split,
`multi_modal_projector.{layer_norm,linear_1,linear_2}`, `model.` prefix). This adapter renames an in-memory Omni
state dict and config into a Nano V2 VL checkpoint; the parts V2 does not have (the video tubelet embedder, audio)
are refused or dropped with a reason.
"""

from __future__ import annotations

import torch

from vl.errors import CheckpointError

_VISION_PREFIX = "vision_model.radio_model.model."

IMG, VID, AUD = 299, 298, 297  # placeholder ids of the tiny Omni configs (vocab 300)
TINY_VISION = dict(model_type="radio", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, mlp_ratio=4.0,
                   patch_size=16, max_img_size=128, num_cls_tokens=2, num_registers=2, video_temporal_patch_size=2)
TINY_TEXT = dict(model_type="nemotron_h", vocab_size=300, hidden_size=64, hybrid_override_pattern="M*EM-",
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=8,
                 mamba_head_dim=16, n_groups=2, ssm_state_size=16, chunk_size=16, n_routed_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
                 num_nextn_predict_layers=1)
TINY_AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_mel_bins=16,
                  conv_kernel_size=5, subsampling_conv_channels=8, projection_hidden_size=48, projection_bias=True)


def hf_omni(vision=None, text=None, audio=TINY_AUDIO, seed: int = 1, **top):
    """A random transformers Omni model: the tiny configs above (each overridable; `audio=None` builds no audio
    branch), eager attention everywhere, `randomize_` weights and random batch-norm statistics."""
    from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3_Config,
    )
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import NemotronH_Omni_Reasoning_V3

    from vl.modeling.random_init import randomize_

    kwargs = dict(projector_hidden_size=96, vision_hidden_size=(vision or TINY_VISION)["hidden_size"],
                  image_token_id=IMG, video_token_id=VID, audio_token_id=AUD)
    kwargs.update(top)
    cfg = NemotronH_Omni_Reasoning_V3_Config(vision_config=dict(vision or TINY_VISION),
                                             text_config=dict(text or TINY_TEXT),
                                             audio_config=None if audio is None else dict(audio), **kwargs)
    for sub in (cfg, cfg.vision_config, cfg.text_config, cfg.audio_config):
        if sub is not None:
            sub._attn_implementation = "eager"
    from transformers.initialization import no_init_weights

    torch.manual_seed(seed)
    with no_init_weights():  # every parameter is overwritten below: transformers' own init would only cost time
        model = randomize_(NemotronH_Omni_Reasoning_V3(cfg), seed).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # small biases: near-1 biases in every conv and Linear of the
            if name.startswith("audio_tower.") and name.endswith(".bias") and "norm" not in name:  # Conformer
                p.copy_(0.1 * torch.randn(p.shape, generator=g))  # would blow its activations up to ~100
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            elif name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    return model


def omni_state_dict_to_nano_vl(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if name.startswith("language_model.model."):
            out["language_model.backbone." + name[len("language_model.model."):]] = t
        elif name.startswith("language_model."):
            out[name] = t
        elif name.startswith("multi_modal_projector."):
            part = name[len("multi_modal_projector."):]
            key = {"layer_norm.weight": "mlp1.0.weight", "linear_1.weight": "mlp1.1.weight",
                   "linear_2.weight": "mlp1.3.weight"}.get(part)
            if key is None:
                raise CheckpointError(f"{name}: no Nano V2 VL equivalent (projector biases are not part of V2)")
            out[key] = t
        elif name.startswith("vision_model."):
            _vision(name[len("vision_model."):], t, sd, out)
        elif name.startswith(("audio_tower.", "embed_audio.")):
            raise CheckpointError(f"{name}: the audio branch has no Nano V2 VL equivalent")
        elif name.startswith("vision_final_layernorm."):
            raise CheckpointError(f"{name}: a final vision norm is not part of Nano V2 VL")
        else:
            raise CheckpointError(f"{name}: unknown Omni tensor")
    return out


def _vision(rest: str, t, sd, out):
    emb = {"embeddings.patch_projection.weight": "patch_generator.embedder.weight",
           "embeddings.position_embedding": "patch_generator.pos_embed",
           "embeddings.cls_register_token": "patch_generator.cls_token.token"}
    if rest in emb:
        out[_VISION_PREFIX + emb[rest]] = t
    elif rest in ("summary_idxs", "embeddings.video_patch_projection.weight"):
        return  # teacher indices / V3 tubelet embedder: not part of V2
    elif rest.startswith("encoder.layer."):
        i, part = rest[len("encoder.layer."):].split(".", 1)
        dst = f"{_VISION_PREFIX}blocks.{i}."
        if part.startswith("layer_scale"):
            if not torch.all(t == 1):
                raise CheckpointError(f"vision_model.{rest}: LayerScale != 1 cannot be expressed in Nano V2 VL")
            return
        if part.startswith("attention.q_proj."):
            kind = part.rsplit(".", 1)[1]
            src = f"vision_model.encoder.layer.{i}.attention."
            out[dst + f"attn.qkv.{kind}"] = torch.cat([sd[src + f"{p}_proj.{kind}"] for p in "qkv"])
        elif part.startswith(("attention.k_proj.", "attention.v_proj.")):
            return  # folded into qkv above
        elif part.startswith("attention.o_proj."):
            out[dst + "attn.proj." + part.rsplit(".", 1)[1]] = t
        else:
            out[dst + part] = t  # norm1, norm2, mlp.fc1, mlp.fc2 keep their names
    else:
        raise CheckpointError(f"vision_model.{rest}: unknown RADIO tensor")


def omni_config_to_nano_vl(cfg) -> dict:
    """transformers `NemotronH_Omni_Reasoning_V3_Config` -> a Nano V2 VL config.json dict.

    The vision width must be a timm ViT name's width (RADIO's convention); `vit_name` is that name.
    """
    from vl.config import lm_config_from_hf, lm_config_to_hf

    v = cfg.vision_config
    vit_name = getattr(v, "vit_name", None)
    if vit_name is None:
        raise CheckpointError("set `vision_config.vit_name` to the timm ViT name of the tower's dimensions")
    return {
        "architectures": ["NemotronH_Nano_VL_V2"], "model_type": "NemotronH_Nano_VL_V2",
        "llm_config": lm_config_to_hf(lm_config_from_hf(cfg.text_config.to_dict())),
        "vision_config": {"patch_size": v.patch_size, "args": {"model": vit_name, "cpe_max_size": v.max_img_size}},
        "force_image_size": cfg.force_image_size, "downsample_ratio": cfg.downsample_ratio, "ps_version": "v2",
        "projector_hidden_size": cfg.projector_hidden_size, "vit_hidden_size": cfg.vision_hidden_size,
        "norm_mean": list(v.norm_mean), "norm_std": list(v.norm_std), "img_context_token_id": cfg.image_token_id,
        "video_pruning_rate": cfg.video_pruning_rate,
    }
