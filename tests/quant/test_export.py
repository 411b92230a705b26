"""PTQ export to the ModelOpt layout: load-back equality, exclusions, determinism, calibration hooks."""

import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from vl.quant.config import (
    QuantFormatError,
    cross_check,
    detect_quantized_linears,
    parse_hf_quant_config,
    read_quant_config,
)
from vl.quant.export import (
    collect_input_amax,
    export_quantized,
    quantizable_linear_names,
    quantize_state_dict,
    write_hf_quant_config,
)
from vl.quant.fp8 import dequantize_fp8
from vl.quant.linear import dequantize_state_dict, swap_quantized_linears
from vl.quant.nvfp4 import dequantize_nvfp4

from quant_toy import IN_PROJ, OUT_PROJ, run, toy

ALGOS = ["NVFP4", "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "W4A16_NVFP4"]


def model_and_amax(d=128):
    m = toy(d=d)
    x = torch.randn(6, 32)
    return m, collect_input_amax(m, lambda: run(m, x))


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def dequant(sd, name):
    if sd[f"{name}.weight"].dtype == torch.uint8:
        return dequantize_nvfp4(sd[f"{name}.weight"], sd[f"{name}.weight_scale"], sd[f"{name}.weight_scale_2"])
    return dequantize_fp8(sd[f"{name}.weight"], sd[f"{name}.weight_scale"])


@pytest.mark.parametrize("algo", ALGOS)
def test_export_saved_and_loaded_back_dequantizes_to_what_the_exporter_computed(algo, tmp_path):
    m, amax = model_and_amax()
    sd, cfg = export_quantized(m, algo, amax)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    write_hf_quant_config(tmp_path, cfg)
    back = load_file(str(tmp_path / "model.safetensors"))
    assert set(back) == set(sd) and all(same(back[k], sd[k]) for k in sd)
    plain = dequantize_state_dict(back, dtype=torch.float32)
    for name in (IN_PROJ, OUT_PROJ):
        assert torch.equal(plain[f"{name}.weight"], dequant(sd, name))
        # and the exporter's rounding is within the format bound of the source weight
        w = m.get_submodule(name).weight.detach()
        rel = float((plain[f"{name}.weight"] - w).norm() / w.norm())
        assert rel < (0.12 if "NVFP4" in algo else 0.04), rel
    qc = read_quant_config(tmp_path)
    assert qc.quant_algo == algo
    specs = detect_quantized_linears(back, qc)
    assert set(specs) == {IN_PROJ, OUT_PROJ}
    assert cross_check(specs, back, qc) == []  # the export agrees with its own config


@pytest.mark.parametrize("algo", ["NVFP4", "FP8"])
def test_excluded_modules_are_untouched(algo):
    m, amax = model_and_amax()
    src = m.state_dict()
    sd, cfg = export_quantized(m, algo, amax)
    for key in ("vision_model.proj.weight", "vision_model.proj.bias", "mlp1.0.weight", "mlp1.1.weight",
                "mlp1.1.bias", "language_model.lm_head.weight"):
        assert sd[key] is src[key] or torch.equal(sd[key], src[key])
        assert sd[key].dtype == torch.float32
    assert not any(k.startswith(("vision_model", "mlp1", "language_model.lm_head")) and "scale" in k for k in sd)
    q = parse_hf_quant_config(cfg)
    assert q.is_excluded("vision_model.proj") and q.is_excluded("mlp1.1") and q.is_excluded("language_model.lm_head")
    assert not q.is_excluded(IN_PROJ)


def test_lm_head_can_be_quantized_on_request():
    m, amax = model_and_amax()
    sd, cfg = export_quantized(m, "NVFP4", amax, exclude_lm_head=False)
    assert sd["language_model.lm_head.weight"].dtype == torch.uint8
    assert "lm_head" not in cfg["quantization"]["exclude_modules"]


@pytest.mark.parametrize("algo", ALGOS)
def test_export_twice_gives_identical_tensors(algo):
    m, amax = model_and_amax()
    a, ca = export_quantized(m, algo, amax)
    b, cb = export_quantized(m, algo, amax)
    assert ca == cb and set(a) == set(b) and all(same(a[k], b[k]) for k in a)


def test_layouts_per_algo():
    m, amax = model_and_amax()
    shapes = {}
    for algo in ALGOS:
        sd, _ = export_quantized(m, algo, amax)
        shapes[algo] = {k.rsplit(".", 1)[1]: (v.dtype, tuple(v.shape)) for k, v in sd.items() if k.startswith(IN_PROJ)}
    f32, e4m3 = torch.float32, torch.float8_e4m3fn
    assert shapes["NVFP4"] == {"weight": (torch.uint8, (256, 64)), "weight_scale": (e4m3, (256, 8)),
                               "weight_scale_2": (f32, ()), "input_scale": (f32, ())}
    assert shapes["FP8"] == {"weight": (e4m3, (256, 128)), "weight_scale": (f32, ()), "input_scale": (f32, ())}
    assert shapes["FP8_PER_CHANNEL_PER_TOKEN"] == {"weight": (e4m3, (256, 128)), "weight_scale": (f32, (256,))}
    assert shapes["FP8_PB_WO"] == {"weight": (e4m3, (256, 128)), "weight_scale": (f32, (2, 1, 1, 1))}
    assert "input_scale" not in shapes["W4A16_NVFP4"]


def test_input_scale_follows_the_calibration_amax():
    m, amax = model_and_amax()
    fp8, _ = export_quantized(m, "FP8", amax)
    nv, _ = export_quantized(m, "NVFP4", amax)
    assert float(fp8[f"{IN_PROJ}.input_scale"]) == pytest.approx(amax[IN_PROJ] / 448, rel=1e-6)
    assert float(nv[f"{IN_PROJ}.input_scale"]) == pytest.approx(amax[IN_PROJ] / 2688, rel=1e-6)
    w = m.get_submodule(IN_PROJ).weight.detach()
    assert float(nv[f"{IN_PROJ}.weight_scale_2"]) == pytest.approx(float(w.abs().max()) / 2688, rel=1e-6)


def test_missing_amax_is_an_error_naming_the_layer():
    m, amax = model_and_amax()
    del amax[OUT_PROJ]
    with pytest.raises(QuantFormatError, match=f"{OUT_PROJ}.input_scale: no calibration amax"):
        export_quantized(m, "NVFP4", amax)
    export_quantized(m, "W4A16_NVFP4", amax)  # weight-only needs none


def test_quantize_state_dict_checks_its_inputs():
    m, amax = model_and_amax()
    with pytest.raises(QuantFormatError, match="expected the weight of Linear"):
        quantize_state_dict(m.state_dict(), ["language_model.nope"], "FP8", amax)
    sd = m.state_dict()
    sd[f"{IN_PROJ}.weight"] = sd[f"{IN_PROJ}.weight"].clone()
    sd[f"{IN_PROJ}.weight"][0, 0] = float("inf")
    with pytest.raises(QuantFormatError, match=f"{IN_PROJ}.weight: .*NaN or Inf"):
        quantize_state_dict(sd, [IN_PROJ], "NVFP4", amax)


def test_quantizable_linear_names_skip_never_quantized_modules():
    m = toy()
    assert quantizable_linear_names(m, ["lm_head"]) == [IN_PROJ, OUT_PROJ]
    assert "language_model.lm_head" in quantizable_linear_names(m)


def test_collect_input_amax_records_max_abs_input_and_removes_hooks():
    lin = nn.Linear(4, 3)
    seq = nn.Sequential(lin)
    a = torch.tensor([[1.0, -5.0, 2.0, 0.0]])
    b = torch.tensor([[3.0, 0.5, -4.0, 1.0]])
    amax = collect_input_amax(seq, lambda: (seq(a), seq(b)))
    assert amax == {"0": 5.0}
    assert not lin._forward_pre_hooks
    with pytest.raises(RuntimeError):
        collect_input_amax(seq, lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert not lin._forward_pre_hooks  # removed even when the calibration run fails


def test_block_2d_export_keeps_the_plain_layout_and_loads():
    m, amax = model_and_amax()
    sd, _ = export_quantized(m, "NVFP4", amax, block_2d=True)
    s = sd[f"{IN_PROJ}.weight_scale"].float()
    assert s.shape == (256, 8) and torch.equal(s[:16], s[:1].expand(16, -1))
    q = toy(d=128)
    swap_quantized_linears(q, sd, "weight-only")
    x = torch.randn(2, 32)
    assert torch.isfinite(run(q, x)).all()
