"""The config-reading policy (vl/config_policy.py, docs/config_policy.md): real release files load as they are
written; a key that would change the maths is refused by name unless it holds the implemented value."""

import json
import logging
import re
import shutil

import pytest
import torch

import vl
from hf4_config import HF4_GENERIC, hf4_composite
from tiny_models import make_tiny_vl_dir, save_hf_nemotron
from vl.config import lm_config_from_hf
from vl.config_policy import (ATTENTION_HINTS, DTYPE_HINTS, GENERATION_KEYS, GENERIC_4X, GENERIC_5X,
                              TOKEN_ID_KEYS, COMMON_CHECKS)
from vl.errors import CheckpointError, ConfigError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_vl_dir(tmp_path_factory.mktemp("policy") / "tiny")


@pytest.fixture(scope="module")
def hf4_dir(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("policy_hf4") / "tiny"
    shutil.copytree(tiny, out)
    cfg = hf4_composite(json.loads((tiny / "config.json").read_text()))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def _write(directory, cfg):
    (directory / "config.json").write_text(json.dumps(cfg))


def test_transformers_4x_composite_loads_with_the_same_maths(tiny, hf4_dir, caplog):
    with caplog.at_level(logging.DEBUG, logger="vl.checkpoint.load"):
        model = vl.load_pretrained(hf4_dir)
    ref = vl.load_pretrained(tiny)
    assert model.config.replace(template=None) == ref.config
    ids = torch.randint(0, ref.config.lm.vocab_size, (1, 11))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref(input_ids=ids).logits)
    notes = "\n".join(model.config_notes)
    for key in ("do_sample", "num_beams", "torchscript", "tie_encoder_decoder", "_attn_implementation_autoset",
                "attn_implementation", "use_bfloat16", "time_step_rank", "img_start_token_id", "min_num_patches",
                "max_sequence_length", "pruned_heads", "amp_dtype", "teachers", "adaptor_names"):
        assert key in notes, key
    assert "generation defaults" in notes and "llm_config" in notes and "vision_config.args" in notes
    logged = [r for r in caplog.records if "accepted and ignored" in r.getMessage()]
    assert len(logged) == 1 and "do_sample" in logged[0].getMessage()  # named once per load
    processor = vl.load_processor(hf4_dir)
    assert processor.config.norm_mean == ref.config.norm_mean


@pytest.mark.parametrize("section,key,value", [
    (None, "min_num_patches", 256),
    (None, "select_layer", -4),
    ("llm_config", "pruned_heads", {"3": [0]}),
    ("llm_config", "sliding_window", 4096),
    ("llm_config", "add_cross_attention", True),
    ("vision_config", "vitdet_window_size", 8),
    ("args", "model_norm", True),
    ("args", "model_kwargs", {"qk_norm": True}),
])
def test_one_maths_key_changed_is_refused_by_name(hf4_dir, tmp_path, section, key, value):
    d = tmp_path / "m"
    shutil.copytree(hf4_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    target = {None: cfg, "llm_config": cfg["llm_config"], "vision_config": cfg["vision_config"],
              "args": cfg["vision_config"]["args"]}[section]
    target[key] = value
    _write(d, cfg)
    with pytest.raises(ConfigError, match=rf"{re.escape(f'{key}={value!r}')} would .*; this code implements"):
        vl.load_pretrained(d)
    with pytest.raises(ConfigError, match=key):  # the processor reads the same policy
        vl.load_processor(d)


def test_unknown_key_is_accepted_with_a_warning_naming_the_docs(hf4_dir, tmp_path, caplog):
    d = tmp_path / "u"
    shutil.copytree(hf4_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["llm_config"]["mystery_knob"] = 3
    _write(d, cfg)
    with caplog.at_level("WARNING", logger="vl.config"):
        model = vl.load_pretrained(d)
    pattern = r"unknown Nemotron-H config keys \['mystery_knob'\] accepted and not read.*config_policy.md"
    assert any(re.search(pattern, r.getMessage()) for r in caplog.records if r.levelname == "WARNING")
    assert any(re.search(pattern, n) for n in model.config_notes)


def test_text_only_config_json_under_the_same_policy(tmp_path):
    path, ref = save_hf_nemotron(tmp_path, "hybrid")
    cfg = json.loads((path / "config.json").read_text())
    cfg.update({k: v for k, v in HF4_GENERIC.items() if k not in cfg})
    cfg.update({"time_step_rank": 4, "_attn_implementation_autoset": True, "attn_implementation": "sdpa"})
    _write(path, cfg)
    model = vl.load_pretrained(path)
    assert any("generation defaults" in n and "num_beams" in n for n in model.config_notes)
    ids = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        assert (model(ids).logits - ref(ids).logits).abs().max() <= 1e-4
    cfg["pruned_heads"] = {"1": [0, 1]}
    _write(path, cfg)
    with pytest.raises(ConfigError, match="pruned_heads=.* would remove attention heads"):
        vl.load_pretrained(path)


def test_lists_cover_the_installed_transformers():
    """The 5.x lists are checked against the installed transformers: every generic attribute and every
    GenerationConfig field is of an accepted class (a new transformers release that adds one fails here)."""
    import transformers

    accepted = (GENERIC_4X | GENERIC_5X | GENERATION_KEYS | TOKEN_ID_KEYS | DTYPE_HINTS | ATTENTION_HINTS
                | set(COMMON_CHECKS))
    generic = set(transformers.PretrainedConfig().to_dict())
    assert {k for k in generic if not k.startswith("_")} <= accepted
    generation = set(transformers.GenerationConfig().to_dict()) - {"transformers_version"}
    assert {k for k in generation if not k.startswith("_")} <= accepted
    assert set(HF4_GENERIC) <= accepted | {"_name_or_path", "_attn_implementation_autoset"}
    lm_config_from_hf(transformers.NemotronHConfig().to_dict())  # a full 5.x dump of the text config


def test_hub_id_not_cached_gives_the_fetch_commands(capsys):
    repo = "nvidia/NVIDIA-Nemotron-Nano-12B-v2-VL-BF16"
    with pytest.raises(CheckpointError) as info:
        vl.load_pretrained(repo)
    msg = str(info.value)
    assert f"hf download {repo} --local-dir ./NVIDIA-Nemotron-Nano-12B-v2-VL-BF16" in msg
    assert "from huggingface_hub import snapshot_download" in msg and f"snapshot_download('{repo}'" in msg
    assert "--model ./NVIDIA-Nemotron-Nano-12B-v2-VL-BF16" in msg
    from vl.cli import main

    assert main(["chat", "--model", repo, "--prompt", "hi"]) == 2
    assert f"hf download {repo}" in capsys.readouterr().err


def test_pipeline_loads_the_4x_composite_too(tiny, hf4_dir):
    """transformers builds its own config object from the file (5.x moves generation defaults out of it); the
    model wrapper's same-config check compares only what could change the model."""
    from PIL import Image
    from transformers import pipeline

    msgs = [{"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (64, 64), "red")},
                                         {"type": "text", "text": "What is the total?"}]}]
    outs = [pipeline("image-text-to-text", model=str(d), device="cpu")(
        text=msgs, max_new_tokens=4, do_sample=False, return_full_text=False, skip_special_tokens=False)
        for d in (hf4_dir, tiny)]
    assert outs[0][0]["generated_text"] == outs[1][0]["generated_text"]


def test_load_processor_reads_no_weights(tiny, tmp_path):
    """config.json, preprocessor_config.json and the tokenizer only; the normalisation it picks is the loader's."""
    d = tmp_path / "no_weights"
    shutil.copytree(tiny, d, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = json.loads((d / "config.json").read_text())
    del cfg["norm_mean"], cfg["norm_std"]
    _write(d, cfg)
    assert vl.load_processor(d).config.norm_mean == vl.load_pretrained(tiny).config.norm_mean  # RADIO default
    (d / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5] * 3}))
    assert vl.load_processor(d).config.norm_mean == (0.5, 0.5, 0.5)
    shutil.copy(tiny / "model.safetensors", d)  # the weights' own buffers hold the default: the loader refuses
    with pytest.raises(CheckpointError, match="input_conditioner.norm_mean"):
        vl.load_pretrained(d)
