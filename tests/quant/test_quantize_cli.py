"""`vl quantize`: the output directory is a complete ModelOpt checkpoint, the export loaded back equals what the
exporter computed, exclusions hold, calibration uses the given prompts (or synthetic documents and clips), and
the options (--block-2d, --hadamard, --no-exclude-lm-head) do what they say."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from data_recipes.calibration import SYNTHETIC
import vl
import vl.directory
from vl.errors import ConfigError
from vl.quantize.cli import main
from vl.quant.config import read_quant_config
from vl.quant.linear import QuantizedLinear
from vl.quantize.ptq import quantize_checkpoint

from tiny_quant import quantized, rel_err, tiny_vl

REPO = Path(__file__).resolve().parents[2]
LAYER_NAMES = ("in_proj", "out_proj", "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return tiny_vl(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return {fmt: quantized(tmp_path_factory, fmt) for fmt in ("fp8", "nvfp4")}


@pytest.fixture(scope="module")
def computed(src, tmp_path_factory):
    """An NVFP4 export made through the library call, so the test sees what the exporter computed."""
    return quantize_checkpoint(src, tmp_path_factory.mktemp("lib") / "nvfp4", "nvfp4", num_calib=2, progress=False,
                               calib_source=SYNTHETIC)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes (NaN-safe, dtype-agnostic comparison)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def lm_linears(tensors):
    return sorted({k[: -len(".weight")] for k in tensors if k.startswith("language_model.backbone.")
                   and k.endswith(".weight") and k.rsplit(".", 2)[-2] in LAYER_NAMES})


@pytest.mark.parametrize("fmt, algo", [("fp8", "FP8"), ("nvfp4", "NVFP4")])
def test_output_is_a_complete_modelopt_directory(fmt, algo, src, exported):
    out = exported[fmt]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (src / name).read_bytes()
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == algo
    assert cfg == json.loads((src / "config.json").read_text())  # nothing else changed
    hf = json.loads((out / "hf_quant_config.json").read_text())
    assert hf["producer"]["name"] == "modelopt" and hf["quantization"]["quant_algo"] == algo
    assert hf["quantization"].get("group_size") == (16 if fmt == "nvfp4" else None)
    assert {"vision_model*", "mlp1*", "language_model.lm_head"} <= set(hf["quantization"]["exclude_modules"])
    assert read_quant_config(out).quant_algo == algo  # both files parse and agree
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["vl_quantize"])["format"] == fmt


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_layout_per_format_and_everything_else_bit_identical(fmt, src, exported):
    before = load_file(str(src / "model.safetensors"))
    after = load_file(str(exported[fmt] / "model.safetensors"))
    names = lm_linears(before)
    assert len(names) == 12
    for n in names:
        w, out_f, in_f = after[f"{n}.weight"], *before[f"{n}.weight"].shape
        if fmt == "fp8":
            assert w.dtype == torch.float8_e4m3fn and w.shape == (out_f, in_f)
            assert after[f"{n}.weight_scale"].shape == () and f"{n}.weight_scale_2" not in after
        else:
            assert w.dtype == torch.uint8 and w.shape == (out_f, in_f // 2)
            assert after[f"{n}.weight_scale"].dtype == torch.float8_e4m3fn
            assert after[f"{n}.weight_scale"].shape == (out_f, in_f // 16)
            assert after[f"{n}.weight_scale_2"].dtype == torch.float32
        assert after[f"{n}.input_scale"].dtype == torch.float32
    packed = {f"{n}.weight" for n in names}
    for key, t in before.items():  # vision, mlp1, conv1d, norms, A_log, D, dt_bias, embeddings, lm_head
        if key not in packed:
            assert after[key].dtype == t.dtype and torch.equal(after[key], t), key
    scales = {k for k in after if k.rsplit(".", 1)[-1] in ("weight_scale", "weight_scale_2", "input_scale")}
    assert set(after) == set(before) | scales


def test_export_loaded_back_equals_what_the_exporter_computed(computed):
    on_disk = load_file(str(computed.out_dir / "model.safetensors"))
    assert set(on_disk) == set(computed.tensors)
    for k, t in computed.tensors.items():
        assert on_disk[k].dtype == t.dtype and torch.equal(bits(on_disk[k]), bits(t)), k
    model = vl.load_pretrained(computed.out_dir, quant_mode="weight-only")
    for name in computed.quantized:
        mod = model.get_submodule(name)
        assert isinstance(mod, QuantizedLinear)
        for s in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
            assert torch.equal(bits(getattr(mod, s)), bits(computed.tensors[f"{name}.{s}"]))
        amax = computed.input_amax[name]  # NVFP4 activation global scale = amax / (6 * 448)
        assert amax > 0 and float(mod.input_scale) == pytest.approx(amax / 2688, rel=1e-6)


def test_calibration_sees_every_position_of_the_stateless_tail(src, computed):
    """The input amax of every quantized Linear, the MLP after the last Mamba / attention layer included (prefill
    runs that tail at the kept position only), equals a full forward's over every position of the same inputs."""
    from vl.quant.export import collect_input_amax
    from vl.quantize.ptq import calibration_inputs

    model = vl.load_pretrained(src, dtype="float32")
    lm = model.language_model
    assert lm.stateless_tail < len(lm.config.pattern)  # the tiny model ends in an MLP
    tail = [n for n in computed.quantized if n.startswith(f"language_model.backbone.layers.{lm.stateless_tail}.")]
    assert tail
    calib = calibration_inputs(src, model, None, 2, 0, SYNTHETIC)
    full = collect_input_amax(model, lambda: [model(**c.kwargs) for c in calib], computed.quantized)
    for name in computed.quantized:
        assert computed.input_amax[name] == pytest.approx(full[name], rel=1e-6), name
    assert lm.stateless_tail < len(lm.config.pattern)  # calibration put the knob back


def test_synthetic_calibration_goes_through_documents_and_video(computed):
    kinds = [c.split()[1] for c in computed.calibration]
    assert kinds == ["document", "video"]
    assert set(computed.input_amax) == set(computed.quantized)


def test_calibration_prompts_from_a_file(src, computed, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("What is the total?\n\nThe red circle moves to the right.\nHow many stars are there?\n")
    out = tmp_path / "out"
    assert main(["--format", "nvfp4", "--model", str(src), "--out", str(out), "--calib-prompts", str(prompts),
                 "--no-progress"]) == 0
    mine = load_file(str(out / "model.safetensors"))
    name = computed.quantized[0]
    assert float(mine[f"{name}.input_scale"]) != float(computed.tensors[f"{name}.input_scale"])  # other data
    assert torch.equal(mine[f"{name}.weight"], computed.tensors[f"{name}.weight"])  # same weights
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    assert main(["--format", "fp8", "--model", str(src), "--out", str(tmp_path / "o2"), "--calib-prompts",
                 str(empty)]) == 2


def test_block_2d_shares_one_scale_per_16x16_tile(src, tmp_path):
    res = quantize_checkpoint(src, tmp_path / "b2d", "nvfp4", num_calib=1, block_2d=True, progress=False,
                              calib_source=SYNTHETIC)
    in_proj = [n for n in res.quantized if n.endswith("in_proj")]  # 328 rows: no 16x16 tiling, said so
    assert in_proj and res.options["block_2d_skipped"] == in_proj
    for name in res.quantized:
        if name in in_proj:
            continue
        s = res.tensors[f"{name}.weight_scale"].float()  # (out, in/16)
        tiles = s.view(s.shape[0] // 16, 16, s.shape[1])
        assert torch.equal(tiles, tiles[:, :1].expand_as(tiles)), name
    assert main(["--format", "fp8", "--block-2d", "--model", str(src), "--out", str(tmp_path / "x")]) == 2


def test_hadamard_export_is_a_plain_checkpoint_of_the_same_function(src, tmp_path):
    res = quantize_checkpoint(src, tmp_path / "rht", "fp8", num_calib=1, hadamard=True, progress=False,
                              calib_source=SYNTHETIC)
    t = load_file(str(res.out_dir / "model.safetensors"))
    before = load_file(str(src / "model.safetensors"))
    assert torch.equal(t["language_model.backbone.layers.0.norm.weight"], torch.ones(64))
    assert not torch.equal(t["language_model.backbone.embeddings.weight"],
                           before["language_model.backbone.embeddings.weight"])
    ids = torch.randint(10, 300, (1, 24), generator=torch.Generator().manual_seed(0))
    ref = vl.load_pretrained(src)(ids).logits
    got = vl.load_pretrained(res.out_dir, quant_mode="dequantize")(ids).logits
    assert rel_err(got, ref) < 0.15


def test_lm_head_quantized_on_request(tmp_path_factory):
    out = quantized(tmp_path_factory, "nvfp4", "--no-exclude-lm-head")
    hf = json.loads((out / "hf_quant_config.json").read_text())
    assert not any("lm_head" in p for p in hf["quantization"]["exclude_modules"])
    assert load_file(str(out / "model.safetensors"))["language_model.lm_head.weight"].dtype == torch.uint8


def test_refusals(src, exported, tmp_path):
    with pytest.raises(ConfigError, match="is the input directory"):
        quantize_checkpoint(src, src, "fp8", progress=False, calib_source=SYNTHETIC)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        quantize_checkpoint(src, busy, "fp8", progress=False, calib_source=SYNTHETIC)
    with pytest.raises(ConfigError, match="already a NVFP4 checkpoint"):
        quantize_checkpoint(exported["nvfp4"], tmp_path / "again", "fp8", progress=False, calib_source=SYNTHETIC)
    assert main(["--format", "int4", "--model", str(src), "--out", str(tmp_path / "x")]) == 2  # before any load
    assert not (tmp_path / "x").exists()


def test_moe_experts_are_packed_one_linear_each_and_the_router_stays(tmp_path, caplog):
    """The routed experts are quantized per expert under the hub's names (as the released FP8 / NVFP4 store them),
    experts no calibration token reached take their layer's largest input scale, the fp32 router stays; the copy
    loads packed without warnings and is close to the original."""
    from tiny_models import save_hf_nemotron
    from vl.quant.linear import QuantizedLinear

    d, _ = save_hf_nemotron(tmp_path, "moe")
    res = quantize_checkpoint(d, tmp_path / "nvfp4", "nvfp4", num_calib=1, progress=False, calib_source=SYNTHETIC)
    t = res.tensors
    for i in range(8):
        for proj in ("up_proj", "down_proj"):
            key = f"backbone.layers.1.mixer.experts.{i}.{proj}"
            assert t[f"{key}.weight"].dtype == torch.uint8 and float(t[f"{key}.input_scale"]) > 0
    assert t["backbone.layers.1.mixer.gate.weight"].dtype == torch.float32
    assert t["backbone.layers.1.mixer.shared_experts.up_proj.weight"].dtype == torch.uint8
    assert not any(".mixer.experts.up_proj" in k for k in t)  # no fused or split names reach the file
    assert all(n in res.input_amax for n in res.quantized)  # every expert has a scale, calibrated or filled
    assert 0 <= res.options["experts_uncalibrated"] < 16
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vl.quant"):
        model = vl.load_pretrained(res.out_dir, quant_mode="weight-only")
    assert not [r for r in caplog.records if r.name.startswith("vl.quant")]
    assert all(isinstance(m, QuantizedLinear) for m in model.backbone.layers[1].mixer.experts.up_proj)
    expanded = vl.load_pretrained(res.out_dir, quant_mode="dequantize")
    original = vl.load_pretrained(d).backbone.layers[1].mixer.experts.up_proj
    assert rel_err(expanded.backbone.layers[1].mixer.experts.up_proj, original) < 0.2  # NVFP4's rounding only
    ids = torch.randint(3, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(model(ids).logits, expanded(ids).logits, atol=1e-5, rtol=1e-5)


def test_the_quantizer_needs_calibration_data_given_to_it(src, tmp_path):
    """The library knows no data set: without prompts or a calibration source it says what to pass."""
    with pytest.raises(ConfigError, match="no calibration data"):
        quantize_checkpoint(src, tmp_path / "none", "fp8", progress=False)


DEMO = Path(vl.directory.default_model())


def _vl(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "vl.cli", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="the demo model (vl/demo) is not trained yet")
def test_a_quantized_copy_of_the_demo_model_keeps_its_warning(src, tmp_path):
    """The demo warning follows a config.json key, which the quantizer carries into the copy; a folder path (the
    old test) and the copied model card would not tell the copy from a real checkpoint."""
    from PIL import Image

    from ui.app import _is_demo
    from vl.cli.chat import DEMO_WARNING
    from vl.config import vl_config_from_hf
    from vl.directory import SYNTHETIC_ONLY_KEY, synthetic_only

    copy = tmp_path / "demo_fp8"
    made = _vl("quantize", "--format", "fp8", "--model", str(DEMO), "--out", str(copy), "--num-calib", "2",
               "--no-progress")
    assert made.returncode == 0, made.stderr[-2000:]
    assert json.loads((copy / "config.json").read_text())[SYNTHETIC_ONLY_KEY] is True
    page = tmp_path / "page.png"
    Image.new("RGB", (96, 96), "white").save(page)
    for model in (copy, copy):  # asked twice: the same warning each time
        chat = _vl("chat", "--model", str(model), "--image", str(page), "--prompt", "What is the total?")
        assert chat.returncode in (0, 3) and DEMO_WARNING in chat.stderr, chat.stderr[-2000:]
    assert _is_demo(copy) and _is_demo(DEMO) and not _is_demo(src)  # the app's header warning: the same test
    assert synthetic_only(DEMO) and not synthetic_only(src) and not synthetic_only(tmp_path / "missing")
    notes: list = []
    vl_config_from_hf(json.loads((copy / "config.json").read_text()), notes=notes)  # accepted and named
    assert any("bookkeeping" in n and SYNTHETIC_ONLY_KEY in n for n in notes), notes
