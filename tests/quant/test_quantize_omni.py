"""`vl quantize` on a Nemotron 3 Nano Omni directory: the calibration runs the synthetic pages and clips through the
Omni processor, only the LLM's Linears are packed (towers, projectors and the audio branch stay as they were, by
their released names), and the result loads and answers an audio question through the engine."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import vl
from data_recipes.calibration import SYNTHETIC
from tiny_models import make_tiny_omni_dir
from vl.quantize.ptq import quantize_checkpoint


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    return make_tiny_omni_dir(tmp_path_factory.mktemp("omni_src") / "omni")[0]


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_omni_quantizes_the_llm_only_and_answers(omni_dir, tmp_path, fmt):
    res = quantize_checkpoint(omni_dir, tmp_path / fmt, fmt, num_calib=2, progress=False, calib_source=SYNTHETIC)
    assert res.quantized and all(n.startswith("language_model.") for n in res.quantized)
    assert all(res.input_amax[n] > 0 for n in res.quantized)  # every packed Linear saw calibration inputs
    stored = load_file(tmp_path / fmt / "model.safetensors")
    src = load_file(omni_dir / "model.safetensors")
    for key, t in src.items():  # the towers, projectors and audio branch: the same tensors under the same names
        if not key.startswith("language_model."):
            assert torch.equal(stored[key], t), key
    cfg = json.loads((tmp_path / fmt / "config.json").read_text())
    assert cfg["model_type"] == "nemotron_h_omni" and cfg["quantization_config"]["quant_algo"] == fmt.upper()
    assert {"sound_encoder*", "sound_projection*"} <= set(cfg["quantization_config"]["exclude_modules"])
    engine = vl.Engine.from_pretrained(tmp_path / fmt)
    assert engine.model.quantization is not None
    assert set(engine.model.quantization.packed) == set(res.quantized)
    wave = (0.2 * np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)).astype(np.float32)
    r = engine.chat([{"role": "user", "content": [{"type": "audio", "audio": wave},
                                                  {"type": "text", "text": "What is said?"}]}], max_new_tokens=4)
    assert r.stats.audio_tokens > 0 and len(r.token_ids) >= 1
