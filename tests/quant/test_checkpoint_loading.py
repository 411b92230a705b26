"""FP8 / NVFP4 checkpoints through `vl.load_pretrained`: every execution mode this machine runs, strict checks,
the reliability rows for quantized weights (C7), and the engine on a quantized checkpoint.

The oracle for "loads correctly" is independent of the loader: the FP32 source model with each packed Linear's
weight replaced by the dequantization of the tensors in the exported file (vl.quant.fp8 / nvfp4 formulas).
"""

import logging

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from data_recipes.calibration import SYNTHETIC
import vl
from vl.errors import CheckpointError, ConfigError
from vl.quant.config import QuantFormatError, QuantUnavailableError
from vl.quant.fp8 import dequantize_fp8
from vl.quant.linear import QuantizedLinear, native_fp8_support, resident_weight_bytes
from vl.quant.nvfp4 import dequantize_nvfp4

from tiny_quant import copy_checkpoint, quantized, rel_err, tiny_vl

IN_PROJ = "language_model.backbone.layers.0.mixer.in_proj"
# logits of a random 5-layer model amplify weight error; measured: FP8 ~0.07, NVFP4 ~0.27
CLOSE = {"fp8": 0.15, "nvfp4": 0.5}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return tiny_vl(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return {fmt: quantized(tmp_path_factory, fmt) for fmt in ("fp8", "nvfp4")}


@pytest.fixture(scope="module")
def inputs(src):
    proc = vl.load_processor(src)
    img = Image.fromarray((torch.rand(80, 120, 3) * 255).byte().numpy())
    x = proc([{"role": "user", "content": [{"type": "image", "image": img},
                                           {"type": "text", "text": "What is the total? Describe the image."}]}])
    return dict(input_ids=x.input_ids, pixel_values=x.pixel_values, media=x.media)


def packed_modules(tensors):
    return sorted(k[: -len(".weight")] for k, t in tensors.items()
                  if k.endswith(".weight") and t.dtype in (torch.uint8, torch.float8_e4m3fn))


def dequantized_from_file(tensors, name):
    w = tensors[f"{name}.weight"]
    if w.dtype == torch.uint8:
        return dequantize_nvfp4(w, tensors[f"{name}.weight_scale"], tensors[f"{name}.weight_scale_2"])
    return dequantize_fp8(w, tensors[f"{name}.weight_scale"])


@pytest.fixture(scope="module")
def oracle(src, exported, inputs):
    """fmt -> logits of the FP32 model carrying the export's dequantized weights; plus the FP32 logits."""
    out = {"fp32": vl.load_pretrained(src)(**inputs).logits}
    for fmt, path in exported.items():
        model = vl.load_pretrained(src)
        tensors = load_file(str(path / "model.safetensors"))
        with torch.no_grad():
            for name in packed_modules(tensors):
                model.get_submodule(name).weight.copy_(dequantized_from_file(tensors, name))
        out[fmt] = model(**inputs).logits
    return out


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("mode", [None, "auto", "weight-only", "dequantize"])
def test_every_cpu_mode_runs_the_exported_weights_and_stays_close(fmt, mode, exported, inputs, oracle):
    model = vl.load_pretrained(exported[fmt], quant_mode=mode)
    logits = model(**inputs).logits
    assert torch.allclose(logits, oracle[fmt], atol=1e-4, rtol=1e-4), rel_err(logits, oracle[fmt])
    err = rel_err(logits, oracle["fp32"])
    print(f"{fmt} mode={mode} ({model.quantization.mode}): logits rel err vs FP32 = {err:.4f}")
    assert 0 < err < CLOSE[fmt]
    expected = "dequantize" if mode == "dequantize" else "weight-only"  # CPU: auto resolves to weight-only
    assert model.quantization.mode == expected


@pytest.mark.parametrize("fmt, ratio", [("fp8", 0.51), ("nvfp4", 0.29)])
def test_weight_only_keeps_packed_weights(fmt, ratio, exported):
    tensors = load_file(str(exported[fmt] / "model.safetensors"))
    names = packed_modules(tensors)
    packed = vl.load_pretrained(exported[fmt], quant_mode="weight-only")
    plain = vl.load_pretrained(exported[fmt], quant_mode="dequantize")
    mods = {n: packed.get_submodule(n) for n in names}
    assert all(isinstance(m, QuantizedLinear) for m in mods.values())
    assert {m.weight.dtype for m in mods.values()} == {torch.uint8 if fmt == "nvfp4" else torch.float8_e4m3fn}
    for n in names:  # the packed bytes are the file's bytes, untouched by the compute-dtype cast
        assert torch.equal(mods[n].weight.view(torch.uint8), tensors[f"{n}.weight"].view(torch.uint8))
    held = sum(resident_weight_bytes(m) for m in mods.values())
    as_bf16 = sum(2 * plain.get_submodule(n).weight.numel() for n in names)
    lm_packed = resident_weight_bytes(packed.language_model)
    lm_plain = resident_weight_bytes(plain.language_model)
    print(f"{fmt}: quantized Linears hold {held} B vs {as_bf16} B as BF16 ({held / as_bf16:.3f}); "
          f"LLM weight-only {lm_packed} B vs dequantized (fp32) {lm_plain} B")
    assert held <= ratio * as_bf16
    assert lm_packed < lm_plain
    assert not any(isinstance(m, QuantizedLinear) for m in plain.modules())


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_dequantize_builds_no_quantized_layer(fmt, exported, inputs, oracle, monkeypatch):
    """"dequantize" expands the packed weights into the model's own Linears: no quantized module is built (and
    swapped back) on the way, and no packed or scale tensor stays."""
    def refuse(*args, **kwargs):
        raise AssertionError("a quantized Linear was built in dequantize mode")

    monkeypatch.setattr(QuantizedLinear, "__init__", refuse)
    model = vl.load_pretrained(exported[fmt], quant_mode="dequantize", dtype="bf16")
    tensors = load_file(str(exported[fmt] / "model.safetensors"))
    for name in packed_modules(tensors):
        mod = model.get_submodule(name)
        assert type(mod) is torch.nn.Linear and mod.weight.dtype == torch.bfloat16
        assert torch.equal(mod.weight, dequantized_from_file(tensors, name).bfloat16())
    assert not any(k.endswith(("weight_scale", "weight_scale_2", "input_scale")) for k in model.state_dict())
    assert {t.dtype for t in model.state_dict().values() if t.is_floating_point()} <= {torch.bfloat16, torch.float32}


def test_never_quantized_modules_load_as_plain_high_precision(src, exported):
    ref = vl.load_pretrained(src)
    model = vl.load_pretrained(exported["nvfp4"], quant_mode="weight-only")
    quantized_names = {n for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    assert quantized_names and all(n.startswith("language_model.backbone.layers.") for n in quantized_names)
    ref_sd = ref.state_dict()
    for key, t in model.state_dict().items():
        if key.rsplit(".", 1)[0] in quantized_names:
            continue
        assert t.dtype == ref_sd[key].dtype and torch.equal(t, ref_sd[key]), key  # vision, mlp1, conv1d, lm_head...


def test_native_is_refused_on_cpu_with_the_reason(exported):
    with pytest.raises(QuantUnavailableError, match="capability >= 8.9"):
        vl.load_pretrained(exported["fp8"], quant_mode="native")
    with pytest.raises(QuantUnavailableError, match="NVFP4"):
        vl.load_pretrained(exported["nvfp4"], quant_mode="native")


CUDA_FP8 = pytest.mark.skipif(not (torch.cuda.is_available() and native_fp8_support("cuda")[0]),
                              reason="native FP8 needs a CUDA GPU of capability >= 8.9 (torch._scaled_mm); this "
                                     "machine has none")


@CUDA_FP8
def test_auto_on_cuda_runs_native_fp8_where_it_can_and_matches_w8a8_emulation(exported, inputs, caplog):
    """Layer by layer (a random model amplifies 2e-4 per layer into ~3e-2 at the logits, measured on an H200):
    each native layer, fed the input its W8A8-emulating twin saw, gives the twin's output."""
    auto = vl.load_pretrained(exported["fp8"], device_map="cuda")
    assert auto.quantization.mode == "auto"
    emulated = vl.load_pretrained(exported["fp8"], quant_mode="weight-only", device_map="cuda")
    probe = torch.zeros(1, device="cuda")
    errors = {}
    for name, m in auto.named_modules():
        if isinstance(m, QuantizedLinear) and m._native_ok(probe)[0]:
            twin = emulated.get_submodule(name)
            twin.emulate_activations = True  # W8A8 numerics, as the native kernel

            def check(mod, args, out, native=m, name=name):
                errors[name] = rel_err(native(args[0]), out)

            twin.register_forward_hook(check)
    cuda = {k: v.cuda() if torch.is_tensor(v) else v for k, v in inputs.items()}
    with caplog.at_level(logging.INFO, logger="vl.quant.linear"):
        logits = auto(**cuda).logits
    emulated(**cuda)
    assert errors  # the tiny model's in_proj (328 rows) is the one kind of layer left weight-only
    worst = max(errors, key=errors.get)
    print(f"native FP8 vs W8A8 emulation, {len(errors)} layers: worst {worst} rel err {errors[worst]:.2e}")
    assert errors[worst] < 1e-3
    plain = vl.load_pretrained(exported["fp8"], quant_mode="dequantize")(**inputs).logits
    assert rel_err(logits.cpu(), plain) < 0.3  # W8A8 vs W8A16 on the whole model: activation error on top
    assert any("run native" in r.getMessage() for r in caplog.records)


@CUDA_FP8
def test_native_names_the_layers_it_cannot_run(exported):
    with pytest.raises(QuantUnavailableError, match="in_proj: in/out features 64/328 not divisible by 16"):
        vl.load_pretrained(exported["fp8"], quant_mode="native", device_map="cuda")


def test_auto_notice_says_which_mode_and_why(exported, caplog):
    with caplog.at_level(logging.INFO, logger="vl.checkpoint.load"):
        vl.load_pretrained(exported["nvfp4"])
    lines = [r.getMessage() for r in caplog.records if r.name == "vl.checkpoint.load"]
    assert len(lines) == 1
    assert "NVFP4" in lines[0] and "running weight-only" in lines[0] and "cpu" in lines[0]


# --- strict checks and the bad-checkpoint rows ------------------------------------------------------------
@pytest.mark.parametrize("fmt, key", [("nvfp4", "weight_scale"), ("nvfp4", "weight_scale_2"), ("fp8", "weight_scale")])
def test_packed_weight_without_its_scale_is_refused_naming_it(fmt, key, exported, tmp_path):
    bad = copy_checkpoint(exported[fmt], tmp_path / "bad", lambda t: t.pop(f"{IN_PROJ}.{key}"))
    with pytest.raises(QuantFormatError, match=f"{IN_PROJ}.{key}: missing") as info:
        vl.load_pretrained(bad)
    assert info.value.code == "bad_quant_format"


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.__setitem__(f"{IN_PROJ}.weight_scale", t[f"{IN_PROJ}.weight_scale"].bfloat16()),
     f"{IN_PROJ}.weight_scale: expected dtype float32 for FP8, found torch.bfloat16"),
    (lambda t: t.__setitem__("language_model.lm_head.weight_scale", torch.tensor(1.0)),
     "language_model.lm_head.weight_scale: a quantization scale but language_model.lm_head.weight is"),
    (lambda t: t.__setitem__(f"{IN_PROJ}.input_scale", torch.tensor([1.0, 2.0])),
     f"{IN_PROJ}.input_scale: expected a scalar"),
])
def test_inconsistent_fp8_tensors_are_refused_naming_them(edit, match, exported, tmp_path):
    bad = copy_checkpoint(exported["fp8"], tmp_path / "bad", edit)
    with pytest.raises(QuantFormatError, match=match):
        vl.load_pretrained(bad)


def test_nan_block_scale_is_refused(exported, tmp_path):
    def edit(t):
        s = t[f"{IN_PROJ}.weight_scale"].clone()
        s.view(torch.uint8)[0, 0] = 0x7F  # E4M3 NaN
        t[f"{IN_PROJ}.weight_scale"] = s

    with pytest.raises(QuantFormatError, match=f"{IN_PROJ}.weight_scale: expected finite"):
        vl.load_pretrained(copy_checkpoint(exported["nvfp4"], tmp_path / "bad", edit))


@pytest.mark.parametrize("module", ["mlp1.1", "vision_model.radio_model.model.blocks.0.attn.qkv"])
def test_packed_vision_or_projector_weight_is_refused(module, exported, tmp_path):
    def edit(t):
        for suffix in ("weight", "weight_scale", "weight_scale_2"):
            t[f"{module}.{suffix}"] = t[f"{IN_PROJ}.{suffix}"].clone()

    with pytest.raises(QuantFormatError, match=rf"{module}.weight: found a NVFP4 weight \(torch.uint8\) in a module "
                                               "the reference stack never quantizes"):
        vl.load_pretrained(copy_checkpoint(exported["nvfp4"], tmp_path / "bad", edit))


def test_strict_checks_still_name_unexpected_and_misshaped_tensors(exported, tmp_path):
    extra = copy_checkpoint(exported["nvfp4"], tmp_path / "extra",
                            lambda t: t.__setitem__("language_model.backbone.surprise", torch.zeros(3)))
    with pytest.raises(CheckpointError, match="unexpected tensor.*language_model.backbone.surprise"):
        vl.load_pretrained(extra)

    def shrink(t):  # a packed weight and its block scales for fewer output rows than the model's in_proj
        for s in ("weight", "weight_scale"):
            t[f"{IN_PROJ}.{s}"] = t[f"{IN_PROJ}.{s}"][:-16].contiguous()

    with pytest.raises(CheckpointError, match=f"{IN_PROJ}.weight: expected a Linear of in=64, out=328"):
        vl.load_pretrained(copy_checkpoint(exported["nvfp4"], tmp_path / "shrunk", shrink))


def test_kv_cache_scales_are_ignored_with_a_reason(exported, inputs, oracle, tmp_path):
    k = "language_model.backbone.layers.3.mixer.k_proj.k_scale"
    ok = copy_checkpoint(exported["fp8"], tmp_path / "kv", lambda t: t.__setitem__(k, torch.tensor(0.5)))
    assert torch.allclose(vl.load_pretrained(ok)(**inputs).logits, oracle["fp8"], atol=1e-4, rtol=1e-4)


def test_quant_mode_on_a_plain_checkpoint_or_an_unknown_mode_is_an_error(src, exported):
    with pytest.raises(ConfigError, match="not a quantized checkpoint"):
        vl.load_pretrained(src, quant_mode="weight-only")
    assert vl.load_pretrained(src, quant_mode="auto").quantization is None
    with pytest.raises(ConfigError, match="quant_mode='fast'"):
        vl.load_pretrained(exported["fp8"], quant_mode="fast")


def test_quantized_lm_head_loads_and_stays_packed(tmp_path_factory, src, inputs):
    path = quantized(tmp_path_factory, "nvfp4", "--no-exclude-lm-head")
    tensors = load_file(str(path / "model.safetensors"))
    assert tensors["language_model.lm_head.weight"].dtype == torch.uint8
    model = vl.load_pretrained(path, quant_mode="weight-only")
    assert isinstance(model.language_model.lm_head, QuantizedLinear)  # runs weight-only like every other Linear
    ref = vl.load_pretrained(src)
    with torch.no_grad():
        for name in packed_modules(tensors):
            ref.get_submodule(name).weight.copy_(dequantized_from_file(tensors, name))
    assert torch.allclose(model(**inputs).logits, ref(**inputs).logits, atol=1e-4, rtol=1e-4)


def test_text_only_nemotron_h_checkpoint(tmp_path):
    from tiny_models import save_hf_nemotron

    from vl.quantize.ptq import quantize_checkpoint

    d, _ = save_hf_nemotron(tmp_path, "hybrid")
    res = quantize_checkpoint(d, tmp_path / "fp8", "fp8", num_calib=2, progress=False, calib_source=SYNTHETIC)
    ids = torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(0))
    model = vl.load_pretrained(res.out_dir)
    assert type(model).__name__ == "NemotronHForCausalLM"
    assert {n for n, m in model.named_modules() if isinstance(m, QuantizedLinear)} == set(res.quantized)
    ref = vl.load_pretrained(d)
    plain = ref(ids).logits
    with torch.no_grad():
        for name in res.quantized:
            ref.get_submodule(name).weight.copy_(dequantized_from_file(res.tensors, name))
    got = model(ids).logits
    assert torch.allclose(got, ref(ids).logits, atol=1e-4, rtol=1e-4)
    assert rel_err(got, plain) < CLOSE["fp8"]


def test_engine_chats_on_a_quantized_checkpoint(exported):
    msgs = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (64, 64), (200, 30, 30))},
                                         {"type": "text", "text": "Describe the image."}]}]
    packed = vl.Engine.from_pretrained(exported["nvfp4"])
    assert packed.model.quantization.mode == "weight-only"
    a = packed.chat(msgs, max_new_tokens=6, thinking=False)
    plain = vl.Engine(vl.load_pretrained(exported["nvfp4"], quant_mode="dequantize"), packed.processor)
    b = plain.chat(msgs, max_new_tokens=6, thinking=False)
    assert a.stats.new_tokens >= 1 and a.stats.vision_tokens_before > 0
    assert a.token_ids == b.token_ids  # weight-only computes with exactly the dequantized weights


def _pack_experts(tensors, layer="backbone.layers.1.mixer.experts", n=8):
    """NVFP4-pack every routed expert of one MoE layer in a hub-layout state dict, as ModelOpt would."""
    from vl.quant.nvfp4 import nvfp4_global_scale, quantize_nvfp4

    for i in range(n):
        for proj in ("up_proj", "down_proj"):
            key = f"{layer}.{i}.{proj}"
            w, s, s2 = quantize_nvfp4(tensors[f"{key}.weight"].float())
            tensors.update({f"{key}.weight": w, f"{key}.weight_scale": s, f"{key}.weight_scale_2": s2,
                            f"{key}.input_scale": nvfp4_global_scale(4.0)})


def test_packed_moe_experts_stay_packed_per_expert_or_are_dequantized(tmp_path, caplog):
    """Packed routed experts load as one packed Linear per expert (weight-only, the CPU default: the 30B-A3B's
    experts stay 16.5 GB instead of 58.7 GB of BF16), or expanded into the fused tensor in "dequantize" mode; both
    equal the reference carrying the dequantized weights."""
    from tiny_models import save_hf_nemotron
    from vl.quant.linear import QuantizedLinear

    d, _ = save_hf_nemotron(tmp_path, "moe")
    packed = copy_checkpoint(d, tmp_path / "packed", _pack_experts)
    tensors = load_file(str(packed / "model.safetensors"))
    ref = vl.load_pretrained(d)
    with torch.no_grad():
        for proj in ("up_proj", "down_proj"):
            ref.get_parameter(f"backbone.layers.1.mixer.experts.{proj}").copy_(torch.stack([
                dequantized_from_file(tensors, f"backbone.layers.1.mixer.experts.{i}.{proj}") for i in range(8)]))
    ids = torch.randint(3, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    want = ref(ids).logits
    with caplog.at_level(logging.INFO, logger="vl.checkpoint.load"):
        model = vl.load_pretrained(packed)
    assert "16 of them routed experts, kept packed" in caplog.records[-1].getMessage()
    experts = model.backbone.layers[1].mixer.experts
    assert len(experts.up_proj) == 8 and all(isinstance(m, QuantizedLinear) for m in experts.up_proj)
    assert experts.up_proj[3].weight.dtype == torch.uint8  # still packed in memory
    assert torch.allclose(model(ids).logits, want, atol=1e-5, rtol=1e-5)
    expanded = vl.load_pretrained(packed, quant_mode="dequantize")
    assert expanded.backbone.layers[1].mixer.experts.up_proj.dtype == torch.float32
    assert torch.allclose(expanded(ids).logits, want, atol=1e-5, rtol=1e-5)
    key = "backbone.layers.1.mixer.experts.3.down_proj.weight_scale_2"
    bad = copy_checkpoint(packed, tmp_path / "bad", lambda t: t.pop(key))
    with pytest.raises(QuantFormatError, match=f"{key}: missing"):
        vl.load_pretrained(bad)


def test_experts_held_per_expert_export_under_the_hub_names():
    from vl.checkpoint.nemotron_h import export_lm
    from vl.quant.experts import hub_to_split_name, split_to_hub_name

    hub = "backbone.layers.1.mixer.experts.5.down_proj.weight_scale_2"
    assert hub_to_split_name(hub) == "backbone.layers.1.mixer.experts.down_proj.5.weight_scale_2"
    assert split_to_hub_name(hub_to_split_name(hub)) == hub
    t = torch.zeros(2)
    assert list(export_lm({hub_to_split_name(hub): t, "backbone.norm_f.weight": t})) == [hub, "backbone.norm_f.weight"]
