"""Loading Nemotron 3 Nano Omni directories: the config as transformers reads it (the released key aliases
included), dispatch on config.json fields, the strict plan (every error names its tensor), BF16, and FP8 / NVFP4
(ModelOpt) copies made with our quantizer's library functions, through the existing quantized path."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

import vl
from omni_adapter import AUD, IMG, TINY_TEXT, TINY_VISION, hf_omni
from vl.checkpoint.files import CheckpointFiles, save_tensors
from vl.checkpoint.load import load_model
from vl.checkpoint.omni import export_state_dict
from vl.config.omni import omni_config_from_hf
from vl.directory import checkpoint_kind
from vl.errors import CheckpointError, ConfigError
from vl.quant.export import collect_input_amax, exclude_patterns, make_hf_quant_config, quantize_state_dict
from vl.quant.export import write_hf_quant_config
from vl.quant.linear import dequantize_linear_weight

RELEASED = {  # the shape of a released config.json: the remote class's name, older key names, RADIO's remote config
    "architectures": ["NemotronH_Nano_Omni_Reasoning_V3"], "model_type": "NemotronH_Nano_Omni_Reasoning_V3",
    "auto_map": {"AutoConfig": "configuration.NemotronH_Nano_Omni_Reasoning_V3_Config"}, "torch_dtype": "bfloat16",
    "llm_config": {**TINY_TEXT, "hybrid_override_pattern": "M*E", "architectures": ["NemotronHForCausalLM"]},
    "vision_config": {"architectures": ["RADIOModel"], "auto_map": {"AutoModel": "hf_model.RADIOModel"},
                      "args": {"model": "vit_huge_patch16_224", "teachers": [{}]}, "max_resolution": 2048,
                      "preferred_resolution": [512, 512], "patch_size": 16, "video_temporal_patch_size": 2,
                      "version": "c-radio_v4-h", "separate_video_embedder": True, "min_num_patches": 1024,
                      "max_num_patches": 13312, "video_target_num_patches": 1024, "video_maintain_aspect_ratio": True},
    "sound_config": {"model_type": "parakeet", "hidden_size": 1024, "num_mel_bins": 128,
                     "projection_hidden_size": 4096, "projection_bias": False, "sampling_rate": 16000},
    "vit_hidden_size": 1280, "projector_hidden_size": 20480, "downsample_ratio": 0.5, "ps_version": "v2",
    "img_context_token_id": 18, "video_context_token_id": 131081, "sound_context_token_id": 27,
    "img_context_token": "<image>", "sound_context_token": "<so_embedding>", "video_pruning_rate": 0.7,
    "video_temporal_patch_size": 2, "norm_mean": [0.48145466, 0.4578275, 0.40821073],
    "norm_std": [0.26862954, 0.26130258, 0.27577711], "template": "nemotron-h-omni",
}


def transformers_config(raw):
    from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import NemotronH_Omni_Reasoning_V3_Config

    raw = json.loads(json.dumps(raw))
    for key in ("model_type", "auto_map"):  # the remote class's name: transformers' own class is built directly
        raw.pop(key, None)
    # transformers 5.24 keeps the released `model_type: parakeet` and then fails on it (its __post_init__ pops it
    # from a copy it does not use); the rest of its reading is what ours must equal
    raw.get("sound_config", {}).pop("model_type", None)
    return NemotronH_Omni_Reasoning_V3_Config(**raw)


def test_released_config_reads_as_transformers_reads_it():
    notes = []
    ours = omni_config_from_hf(json.loads(json.dumps(RELEASED)), notes=notes)
    theirs = transformers_config(RELEASED)
    v, tv = ours.vision, theirs.vision_config
    assert (v.hidden_size, v.num_hidden_layers, v.num_attention_heads, v.mlp_dim, v.patch_size, v.max_img_size,
            v.num_prefix_tokens, v.video_temporal_patch_size) == (
        tv.hidden_size, tv.num_hidden_layers, tv.num_attention_heads, int(tv.hidden_size * tv.mlp_ratio),
        tv.patch_size, tv.max_img_size, tv.num_cls_tokens + tv.num_registers, tv.video_temporal_patch_size)
    assert (ours.tokens.image_token_id, ours.tokens.video_token_id, ours.tokens.audio_token_id) == (
        theirs.image_token_id, theirs.video_token_id, theirs.audio_token_id) == (18, 131081, 27)
    assert ours.vision_hidden_size == theirs.vision_hidden_size == 1280
    assert (ours.projector_hidden_size, ours.video_pruning_rate, ours.downsample_ratio) == (
        theirs.projector_hidden_size, theirs.video_pruning_rate, theirs.downsample_ratio)
    a, ta = ours.audio, theirs.audio_config
    assert (a.hidden_size, a.num_mel_bins, a.projection_hidden_size, a.projection_bias, a.attention_bias,
            a.scale_input, a.num_hidden_layers) == (ta.hidden_size, ta.num_mel_bins, ta.projection_hidden_size,
                                                    ta.projection_bias, ta.attention_bias, ta.scale_input,
                                                    ta.num_hidden_layers)
    assert a.attention_bias is False and a.scale_input is False  # the Omni defaults for keys the release omits
    assert ours.lm.pattern == theirs.text_config.hybrid_override_pattern == "M*E"
    assert ours.vision_final_norm == (theirs.text_config.num_nextn_predict_layers > 0) is True
    text = "\n".join(notes)  # accepted keys are named, not dropped
    for key in ("args", "max_resolution", "template", "norm_mean", "sampling_rate", "preferred_resolution",
                "min_num_patches", "video_target_num_patches", "separate_video_embedder"):
        assert key in text, key
    assert "unknown" not in text  # every key of the released config has its reason
    assert checkpoint_kind(RELEASED, Path("x")) == "nemotron_h_omni"


def test_a_folder_holding_a_hub_omni_directory_offers_it(tmp_path):
    """`vl app --model FOLDER` reads each sub-folder's config.json: a hub Omni directory (its remote class's name,
    auto_map and all) is offered as Omni, next to a transformers-written one; an unknown remote model is skipped
    with its reason."""
    from vl.directory import checkpoint_choices

    for name, raw in (("hub", RELEASED), ("transformers", {**RELEASED, "model_type": "nemotron_h_omni",
                                                           "architectures": ["NemotronH_Omni_Reasoning_V3"]}),
                      ("other", {"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(raw))
    found, skipped = checkpoint_choices(tmp_path)
    assert [(p.name, kind) for p, kind in found] == [("hub", "nemotron_h_omni"), ("transformers", "nemotron_h_omni")]
    assert [p.name for p, _ in skipped] == ["other"] and "remote code is never executed" in skipped[0][1]


@pytest.mark.parametrize("field,legacy,new_value,legacy_value,want", [
    ("vision_hidden_size", "vit_hidden_size", 1280, 1536, 1536),  # the field at its default: the older key counts
    ("vision_hidden_size", "vit_hidden_size", 1536, 1280, 1536),  # the field set: it wins
    ("image_token_id", "img_context_token_id", None, 18, 18),
    ("image_token_id", "img_context_token_id", 7, 18, 7),
])
def test_older_key_names_follow_transformers_precedence(field, legacy, new_value, legacy_value, want):
    raw = {"text_config": dict(TINY_TEXT), "vision_config": {**TINY_VISION, "hidden_size": 1536},
           "vision_hidden_size": 1536, field: new_value, legacy: legacy_value}
    theirs = transformers_config(raw)
    ours = omni_config_from_hf(json.loads(json.dumps(raw)))
    got = ours.vision_hidden_size if field == "vision_hidden_size" else ours.tokens.image_token_id
    assert got == getattr(theirs, field) == want


@pytest.mark.parametrize("change,match", [
    ({"vision_config": {**TINY_VISION, "use_swiglu_ffn": True}}, "use_swiglu_ffn=True would replace the ViT MLP"),
    ({"vision_config": {**TINY_VISION, "video_temporal_patch_size": 4}}, "must be equal"),
    ({"vision_config": {k: v for k, v in TINY_VISION.items() if k != "video_temporal_patch_size"}}, "must be equal"),
    ({"ps_version": "v1"}, "ps_version='v1' would lay out"),
    ({"vision_hidden_size": 48}, "vision_hidden_size=48 but vision_config.hidden_size=32"),
    ({"audio_config": {"hidden_size": 32}}, "projection_hidden_size is missing"),
    ({"vision_config": {**TINY_VISION, "separate_video_embedder": False}}, "separate_video_embedder=False would"),
])
def test_keys_that_change_the_maths_are_refused(change, match):
    raw = {"text_config": dict(TINY_TEXT), "vision_config": dict(TINY_VISION), "vision_hidden_size": 32, **change}
    with pytest.raises(ConfigError, match=match):
        omni_config_from_hf(raw)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A transformers-saved tiny Omni directory (fp32) and its reference model."""
    ref = hf_omni(seed=5)
    d = tmp_path_factory.mktemp("omni_saved")
    ref.save_pretrained(d)
    return d, ref


def prompt():
    grids = torch.tensor([[4, 6]])
    pv = torch.randn(24, 768)
    feats, mask = torch.randn(1, 41, 16), torch.ones(1, 41, dtype=torch.long)
    mask[0, -1] = 0  # the feature extractor's layout: one frame more than the mask counts
    ids = torch.tensor([[3, 10] + [IMG] * 6 + [11, 5, 20] + [AUD] * 6 + [21, 6]])  # 40 + 1 frames -> 21 -> 11 -> 6
    return dict(input_ids=ids, pixel_values=pv, image_grid_hw=grids, input_features=feats, input_features_mask=mask)


def copy_dir(src, dst):
    shutil.copytree(src, dst)
    return dst


def edit(d, fn):
    t = load_file(d / "model.safetensors")
    fn(t)
    save_file(t, d / "model.safetensors")


def test_export_is_the_released_layout_and_round_trips(saved):
    d, _ = saved
    files = CheckpointFiles(d)
    ours = load_model(d)
    out = export_state_dict(ours)
    ignored = {n for n in files.names() if n.endswith("summary_idxs")}
    assert set(out) == set(files.names()) - ignored
    assert all(torch.equal(out[n], files.get(n)) for n in out)


@pytest.mark.parametrize("mutate,match", [
    (lambda t: t.pop("mlp1.1.weight"), r"missing tensor 'projector.mlp1.1.weight'"),
    (lambda t: t.pop("vision_projector.vision_final_layernorm.weight"),
     r"missing tensor 'vision_final_layernorm.weight'"),
    (lambda t: t.__setitem__("sound_projection.linear3.weight", torch.zeros(2, 2)),
     r"unexpected tensor\(s\) \['sound_projection.linear3.weight'\]"),
    (lambda t: t.__setitem__("vision_model.radio_model.model.patch_generator.video_embedder.weight",
                             torch.zeros(32, 768)),
     r"'vision_model.radio_model.model.patch_generator.video_embedder.weight': expected shape \[32, 1536\]"),
    (lambda t: t.__setitem__("sound_encoder.encoder.subsampling.linear.weight",
                             torch.zeros(32, 16, dtype=torch.int32)),
     r"'sound_encoder.encoder.subsampling.linear.weight': expected a floating dtype, found torch.int32"),
])
def test_strict_loading_names_the_tensor(saved, tmp_path, mutate, match):
    d = copy_dir(saved[0], tmp_path / "bad")
    edit(d, mutate)
    with pytest.raises(CheckpointError, match=match):
        vl.load_pretrained(d)


@torch.no_grad()
def test_dispatch_reads_config_fields_never_the_folder_name(saved, tmp_path):
    d = copy_dir(saved[0], tmp_path / "NemotronH_Nano_VL_V2")  # a misleading folder name
    assert type(vl.load_pretrained(d)).__name__ == "NemotronOmni"
    cfg = json.loads((d / "config.json").read_text())
    del cfg["model_type"]  # `architectures` alone dispatches too
    (d / "config.json").write_text(json.dumps(cfg))
    assert type(vl.load_pretrained(d)).__name__ == "NemotronOmni"
    cfg["architectures"] = ["NemotronH_Nano_Omni_Reasoning_V3"]  # the released directories' remote class
    (d / "config.json").write_text(json.dumps(cfg))
    assert type(vl.load_pretrained(d)).__name__ == "NemotronOmni"
    cfg["architectures"] = ["SomethingElse"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="nemotron_h_omni"):
        vl.load_pretrained(d)


@torch.no_grad()
def test_bf16_directory_loads_exactly(tmp_path):
    """A BF16 save loads in BF16 by default (the declared dtype); in fp32 it equals the reference in fp32 on the
    same (BF16-representable) weights."""
    ref = hf_omni(seed=6).to(torch.bfloat16)
    ref.save_pretrained(tmp_path)
    ours = vl.load_pretrained(tmp_path)
    assert ours.language_model.lm_head.weight.dtype == torch.bfloat16
    assert ours.vision.blocks[0].attn.qkv.weight.dtype == torch.bfloat16
    assert ours.language_model.backbone.layers[0].mixer.A_log.dtype == torch.float32  # kept in fp32
    assert torch.isfinite(ours(**prompt()).logits).all()
    inputs = prompt()
    # the reference casts pixels to the tower's configured dtype (bfloat16 here) even after `.float()`, and its
    # `.to(bfloat16)` rounded the audio encoder's inverse frequencies (a buffer): recompute them in fp32
    inputs["pixel_values"] = inputs["pixel_values"].bfloat16().float()
    ref = ref.float()
    pos = ref.audio_tower.encode_positions
    pos.inv_freq = pos.compute_default_relative_positional_parameters(ref.config.audio_config)
    theirs = ref(**inputs).logits
    mine = vl.load_pretrained(tmp_path, dtype="float32")(**inputs).logits
    assert (mine - theirs).abs().max() <= 1e-5 * theirs.abs().max()


def quantized_copy(src, dst, algo):
    """`vl quantize`'s library steps on an Omni directory: activation amax from a calibration forward, the LM's
    Linears into ModelOpt tensors (vision tower, projectors and audio branch left alone), hf_quant_config.json."""
    model = load_model(src)
    lm = [f"language_model.{n}" for n, m in model.language_model.named_modules() if isinstance(m, nn.Linear)]
    pats = exclude_patterns(True, ("sound_encoder*", "sound_projection*", "vision_projector*"))
    amax = collect_input_amax(model, lambda: model(**prompt()), lm)
    files = CheckpointFiles(src)
    tensors = quantize_state_dict({n: files.get(n) for n in files.names()}, lm, algo, amax, exclude=pats)
    save_tensors(tensors, dst)
    shutil.copy(src / "config.json", dst / "config.json")
    write_hf_quant_config(dst, make_hf_quant_config(algo, pats))
    return dst


@pytest.mark.parametrize("algo", ["FP8", "NVFP4"])
@torch.no_grad()
def test_quantized_copy_loads_through_the_quantized_path(saved, tmp_path, algo):
    """The packed LM Linears load as quantized modules (weight-only on this CPU); the towers stay plain; the
    logits equal transformers' model carrying the dequantized weights."""
    d, ref = saved
    q = quantized_copy(d, tmp_path / algo, algo)
    ours = vl.load_pretrained(q)
    assert ours.quantization is not None and ours.quantization.fmt == {"FP8": "FP8", "NVFP4": "NVFP4"}[algo]
    packed = set(ours.quantization.packed)
    assert "language_model.backbone.layers.0.mixer.in_proj" in packed
    assert not any(n.startswith(("vision", "projector", "audio")) for n in packed)
    twin = hf_omni(seed=5)
    sd, stored = twin.state_dict(), load_file(q / "model.safetensors")
    for name, spec in ours.quantization.specs.items():
        tensors = {spec.key(s): stored[f"{name}.{s}"] for s in spec.shapes if s != "bias"}
        sd[name.replace("language_model.backbone.", "language_model.model.") + ".weight"] = \
            dequantize_linear_weight(spec, tensors, torch.float32)
    twin.load_state_dict(sd)
    inputs = prompt()
    theirs = twin(**inputs).logits
    assert (ours(**inputs).logits - theirs).abs().max() <= 1e-5 * theirs.abs().max()
    assert (theirs - ref(**inputs).logits).abs().max() > 0  # the quantization did change the weights


@torch.no_grad()
def test_packed_routed_experts_stay_packed_per_expert(saved, tmp_path):
    """An Omni checkpoint whose routed experts are NVFP4-packed per expert (as ModelOpt writes the released NVFP4)
    loads with each expert a packed Linear, and its logits equal the same model with every weight expanded."""
    from vl.quant.linear import QuantizedLinear
    from vl.quant.nvfp4 import nvfp4_global_scale, quantize_nvfp4

    src, _ = saved
    t = load_file(src / "model.safetensors")
    layer = next(k for k in t if ".mixer.experts.0.up_proj.weight" in k).split(".mixer.")[0]
    n = TINY_TEXT["n_routed_experts"]
    for i in range(n):
        for proj in ("up_proj", "down_proj"):
            key = f"{layer}.mixer.experts.{i}.{proj}"
            w, s, s2 = quantize_nvfp4(t[f"{key}.weight"].float())
            t.update({f"{key}.weight": w, f"{key}.weight_scale": s, f"{key}.weight_scale_2": s2,
                      f"{key}.input_scale": nvfp4_global_scale(4.0)})
    d = copy_dir(src, tmp_path / "packed_experts")
    save_file(t, d / "model.safetensors")
    packed = vl.load_pretrained(d)
    experts = packed.get_submodule(f"{layer}.mixer.experts")
    assert len(experts.up_proj) == n and all(isinstance(m, QuantizedLinear) for m in experts.down_proj)
    expanded = vl.load_pretrained(d, quant_mode="dequantize")
    inputs = prompt()
    a, b = packed(**inputs).logits, expanded(**inputs).logits
    assert (a - b).abs().max() <= 1e-5 * b.abs().max()
