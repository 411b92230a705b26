"""Quantization config parsing, exclusion rules and per-module detection (docs/format.md §11.1-§11.2; docs/reliability_policy.md row C7)."""

import json
import logging

import pytest
import torch

from vl.errors import CheckpointError, ConfigError
from vl.quant.config import (
    QuantFormatError,
    cross_check,
    detect_quantized_linears,
    is_excluded,
    never_quantized,
    parse_hf_quant_config,
    parse_quantization_config,
    read_quant_config,
)
from vl.quant.fp8 import quantize_fp8_per_channel, quantize_fp8_per_tensor
from vl.quant.nvfp4 import quantize_nvfp4

HF = {
    "producer": {"name": "modelopt", "version": "0.37.0"},
    "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                     "exclude_modules": ["lm_head", "vision_model*", "mlp1*", "backbone.layers.7.mixer.*"]},
}
CFG = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head", "vision_model*"],
       "kv_cache_scheme": {"type": "float", "num_bits": 8, "dynamic": False}, "producer": {"name": "modelopt"}}

LIN = "language_model.backbone.layers.0.mixer.in_proj"


def test_parse_hf_quant_config():
    c = parse_hf_quant_config(HF)
    assert c.quant_algo == "NVFP4" and c.weight_format == "nvfp4" and c.group_size == 16
    assert c.exclude_modules[0] == "lm_head" and c.kv_cache_quant_algo is None
    assert c.producer["name"] == "modelopt"
    assert parse_hf_quant_config(c.to_hf_quant_config()) == c.__class__(**{**c.__dict__, "source": c.source})


def test_parse_config_json_quantization_config():
    c = parse_quantization_config(CFG)
    assert c.quant_algo == "FP8" and c.weight_format == "fp8"
    assert c.exclude_modules == ("lm_head", "vision_model*")
    assert c.kv_cache_quant_algo == "FP8"  # from kv_cache_scheme float/8


@pytest.mark.parametrize("bad,match", [
    ({**CFG, "quant_method": "awq"}, "only ModelOpt"),
    ({**CFG, "quant_algo": "INT4_AWQ"}, "not supported"),
    ({**CFG, "surprise": 1}, "unknown keys"),
    ({k: v for k, v in CFG.items() if k != "quant_algo"}, "quant_algo' is missing"),
])
def test_config_json_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        parse_quantization_config(bad)


def test_hf_quant_config_errors():
    with pytest.raises(ConfigError, match="group_size must be 16"):
        parse_hf_quant_config({"quantization": {**HF["quantization"], "group_size": 32}})
    with pytest.raises(ConfigError, match="unknown keys"):
        parse_hf_quant_config({"quantization": {**HF["quantization"], "new_thing": True}})
    with pytest.raises(ConfigError, match="'quantization' object"):
        parse_hf_quant_config({"producer": {}})


def test_read_quant_config_from_a_directory(tmp_path):
    assert read_quant_config(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "quantization_config": {**CFG,
                                                       "quant_algo": "NVFP4", "group_size": 16}}))
    assert read_quant_config(tmp_path).quant_algo == "NVFP4"
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(HF))
    c = read_quant_config(tmp_path)
    assert c.source.endswith("hf_quant_config.json")  # hf_quant_config.json wins when both agree
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({**HF, "quantization": {**HF["quantization"],
                                                                                       "quant_algo": "FP8"}}))
    with pytest.raises(ConfigError, match="expected them to agree"):
        read_quant_config(tmp_path)
    (tmp_path / "hf_quant_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="valid JSON"):
        read_quant_config(tmp_path)


@pytest.mark.parametrize("name,patterns,expected", [
    ("lm_head", ["lm_head"], True),
    ("language_model.lm_head", ["lm_head"], True),  # prefix stripped, as vLLM
    ("lm_head_extra", ["lm_head"], False),
    ("language_model.backbone.layers.7.mixer.in_proj", ["backbone.layers.7.mixer.*"], True),
    ("language_model.backbone.layers.17.mixer.in_proj", ["backbone.layers.7.mixer.*"], False),
    ("vision_model.radio_model.model.blocks.0.attn.qkv", ["vision_model*"], True),
    ("mlp1.1", ["mlp1"], True),  # a plain name also covers children
    ("language_model.backbone.layers.3.mixer.o_proj", ["*o_proj"], True),
    ("language_model.backbone.layers.3.mixer.q_proj", [], False),
])
def test_is_excluded(name, patterns, expected):
    assert is_excluded(name, patterns) is expected


@pytest.mark.parametrize("name,expected", [
    ("vision_model.radio_model.model.blocks.0.mlp.fc1", True),
    ("mlp1.1", True), ("mlp1.3", True),
    ("language_model.backbone.layers.0.mixer.conv1d", True),
    ("language_model.backbone.layers.0.norm", True),
    ("language_model.backbone.layers.0.mixer.norm", True),
    ("language_model.backbone.norm_f", True),
    ("language_model.backbone.embeddings", True),
    ("language_model.backbone.layers.0.mixer.in_proj", False),
    ("language_model.backbone.layers.7.mixer.o_proj", False),
    ("language_model.backbone.layers.1.mixer.down_proj", False),
    ("language_model.lm_head", False),
])
def test_never_quantized(name, expected):
    assert never_quantized(name) is expected


def nvfp4_entry(name, out_f=32, in_f=64, input_scale=True):
    packed, scale, ws2 = quantize_nvfp4(torch.randn(out_f, in_f))
    d = {f"{name}.weight": packed, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": ws2}
    if input_scale:
        d[f"{name}.input_scale"] = torch.tensor(0.01)
    return d


def fp8_entry(name, out_f=32, in_f=64, per_channel=False):
    w8, s = (quantize_fp8_per_channel if per_channel else quantize_fp8_per_tensor)(torch.randn(out_f, in_f))
    return {f"{name}.weight": w8, f"{name}.weight_scale": s, f"{name}.input_scale": torch.tensor(0.02)}


def test_detect_nvfp4_and_fp8_modules():
    sd = {**nvfp4_entry(LIN), **fp8_entry("language_model.backbone.layers.1.mixer.down_proj", per_channel=True),
          "language_model.backbone.layers.0.mixer.conv1d.weight": torch.randn(8, 1, 4),
          "language_model.backbone.layers.0.norm.weight": torch.ones(64),
          "mlp1.1.weight": torch.randn(64, 64)}
    specs = detect_quantized_linears(sd)
    assert set(specs) == {LIN, "language_model.backbone.layers.1.mixer.down_proj"}
    s = specs[LIN]
    assert (s.fmt, s.out_features, s.in_features, s.has_input_scale) == ("nvfp4", 32, 64, True)
    assert s.shapes == {"weight": (32, 32), "weight_scale": (32, 4), "weight_scale_2": (), "input_scale": ()}
    f = specs["language_model.backbone.layers.1.mixer.down_proj"]
    assert (f.fmt, f.fp8_granularity, f.weight_dtype) == ("fp8", "channel", torch.float8_e4m3fn)


def _without(sd, key):
    return {k: v for k, v in sd.items() if k != key}


@pytest.mark.parametrize("mutate,match", [
    (lambda sd: _without(sd, f"{LIN}.weight_scale"), f"{LIN}.weight_scale: missing"),
    (lambda sd: _without(sd, f"{LIN}.weight_scale_2"), f"{LIN}.weight_scale_2: missing"),
    (lambda sd: {**sd, f"{LIN}.weight_scale": sd[f"{LIN}.weight_scale"].float()}, "expected dtype float8_e4m3fn"),
    (lambda sd: {**sd, f"{LIN}.weight_scale": sd[f"{LIN}.weight_scale"][:, :2]}, r"expected shape \(32, 4\)"),
    (lambda sd: {**sd, f"{LIN}.weight_scale_2": torch.tensor(float("nan"))}, "finite positive"),
    (lambda sd: {**sd, f"{LIN}.weight_scale_2": torch.tensor([1.0, 2.0])}, "expected a scalar"),
    (lambda sd: {**sd, f"{LIN}.input_scale": torch.tensor(0.0)}, f"{LIN}.input_scale: expected a finite positive"),
    (lambda sd: {**sd, f"{LIN}.input_scale": torch.tensor(1.0, dtype=torch.bfloat16)}, "expected dtype float32"),
    (lambda sd: {**sd, f"{LIN}.weight_scale": torch.full((32, 4), float("nan")).to(torch.float8_e4m3fn)}, "NaN"),
])
def test_nvfp4_detection_errors_name_the_tensor(mutate, match):
    with pytest.raises(QuantFormatError, match=match) as e:
        detect_quantized_linears(mutate(nvfp4_entry(LIN)))
    assert isinstance(e.value, CheckpointError)


def test_fp8_weight_without_its_scale_is_an_error():
    sd = _without(fp8_entry(LIN), f"{LIN}.weight_scale")
    with pytest.raises(QuantFormatError, match=f"{LIN}.weight_scale: missing"):
        detect_quantized_linears(sd)
    sd = fp8_entry(LIN)
    sd[f"{LIN}.weight_scale"] = torch.tensor(0.0)
    with pytest.raises(QuantFormatError, match="finite positive"):
        detect_quantized_linears(sd)
    sd = fp8_entry(LIN)
    sd[f"{LIN}.weight_scale"] = torch.ones(5)
    with pytest.raises(QuantFormatError, match=f"{LIN}.weight_scale: FP8 weight_scale: expected a scalar"):
        detect_quantized_linears(sd)


def test_scale_next_to_an_unquantized_weight_is_an_error():
    sd = {f"{LIN}.weight": torch.randn(32, 64, dtype=torch.bfloat16), f"{LIN}.weight_scale": torch.tensor(1.0)}
    with pytest.raises(QuantFormatError, match="is torch.bfloat16"):
        detect_quantized_linears(sd)
    with pytest.raises(QuantFormatError, match="without its module's weight"):
        detect_quantized_linears({f"{LIN}.input_scale": torch.tensor(1.0)})


def test_quantized_vision_or_projector_weight_is_refused():
    for name in ("vision_model.radio_model.model.blocks.0.attn.qkv", "mlp1.1"):
        with pytest.raises(QuantFormatError, match="never quantizes"):
            detect_quantized_linears(nvfp4_entry(name))


def test_cross_check_reports_disagreements(caplog):
    cfg = parse_hf_quant_config(HF)
    sd = {**nvfp4_entry("language_model.backbone.layers.7.mixer.in_proj"),
          "language_model.backbone.layers.8.mixer.in_proj.weight": torch.randn(4, 16),
          "language_model.lm_head.weight": torch.randn(4, 16)}
    specs = detect_quantized_linears(sd)
    msgs = cross_check(specs, sd, cfg)
    assert any("layers.7.mixer.in_proj is quantized (nvfp4) but listed in exclude_modules" in m for m in msgs)
    assert any("layers.8.mixer.in_proj is unquantized" in m for m in msgs)
    assert not any("lm_head" in m for m in msgs)  # excluded and unquantized: consistent
    with caplog.at_level(logging.WARNING, logger="vl.quant.config"):
        detect_quantized_linears(sd, cfg)
    assert "tensors win" in caplog.text
