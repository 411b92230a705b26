"""`vl bench --geometry`: the streamed random checkpoint loads as a user's FP8 / NVFP4 checkpoint, runs, and the
temporary folder is removed (the 12B figures themselves are measured by `vl bench`, not asserted here)."""

import dataclasses
import json
import sys

import pytest
import torch

from vl.bench import geometry as bench_geometry
from vl.config import nano_12b_lm
from vl.errors import ConfigError


def small():
    return nano_12b_lm(hidden_size=256, intermediate_size=512, mamba_num_heads=8, mamba_head_dim=32,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512, pattern="M-*-")


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_streamed_checkpoint_loads_quantized_and_runs(tmp_path, fmt):
    import vl
    from vl.quant.linear import QuantizedLinear

    path = bench_geometry.write_random_checkpoint(small(), fmt, tmp_path / "m")
    assert json.loads((path / "config.json").read_text())["quantization_config"]["quant_algo"] == fmt.upper()
    model = vl.load_pretrained(path, dtype=torch.bfloat16)
    assert model.quantization.mode == "weight-only"
    q = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    assert q and all(m.fmt == fmt for m in q)
    assert not isinstance(model.lm_head, QuantizedLinear)  # excluded as ModelOpt does
    with torch.no_grad():
        logits = model(torch.randint(3, 512, (1, 9))).logits
    assert torch.isfinite(logits).all()


def test_run_reports_every_figure_and_cleans_up(tmp_path):
    r = bench_geometry.run(small(), "nvfp4", work_dir=tmp_path, prefill=64, decode_ctx=16, new_tokens=2,
                           log=lambda m: None)
    for key in ("load_s", "peak_rss_bytes", "prefill_tok_s", "decode_tok_s", "copy_GBps", "decode_vs_copy"):
        assert r[key] > 0
    assert list(tmp_path.iterdir()) == []  # the streamed checkpoint is gone
    text = bench_geometry.format_result(r)
    assert "peak RSS" in text
    phases = r["peak_rss_by_phase"]  # where the peak was reached
    assert list(phases) == ["load", "prefill", "decode"] and max(phases.values()) <= r["peak_rss_bytes"]
    assert "peak RSS by phase     load" in text
    if sys.platform.startswith("linux"):  # where the weights lived, from /proc
        assert r["after_load"]["RssAnon"] > 0 and r["decode_major_faults"] >= 0
        assert "file-backed" in text and "major page faults" in text


@pytest.mark.parametrize("tie", [False, True])
def test_decode_bytes_reads_the_output_head_whole_and_one_embedding_row(tie):
    from vl.modeling.nemotron_h import NemotronHForCausalLM
    from vl.quant.linear import resident_weight_bytes

    model = NemotronHForCausalLM(dataclasses.replace(small(), tie_word_embeddings=tie))
    emb = model.backbone.embeddings.weight.nbytes
    assert (model.lm_head.weight.data_ptr() == model.backbone.embeddings.weight.data_ptr()) == tie
    # untied: the table is not read (one row), the head is; tied: the one table is the head, read whole
    assert bench_geometry.decode_bytes(model) == resident_weight_bytes(model) - (0 if tie else emb)


def test_layers_keep_the_released_widths():
    full = nano_12b_lm()
    cfg = bench_geometry.geometry_config("nano-12b-v2-vl", 9)
    assert cfg.pattern == full.pattern[:9] == "M-M-M-M*-" and cfg.hidden_size == full.hidden_size
    assert bench_geometry.geometry_config("nano-12b-v2-vl") == full
    for bad in (0, 63):
        with pytest.raises(ConfigError, match="layers"):
            bench_geometry.geometry_config("nano-12b-v2-vl", bad)


@pytest.mark.parametrize("flag", ["--prefill", "--decode-ctx"])
def test_a_length_that_is_not_a_number_is_a_usage_error(flag, capsys):
    """`--geometry` takes one length per flag: an empty or non-numeric one is argparse's usage error (exit 2) naming
    the flag, before anything is written or loaded, not a traceback."""
    from vl.bench.run import main

    with pytest.raises(SystemExit) as exit_:
        main(["--geometry", "nano-omni-30b-a3b", flag, ""])
    assert exit_.value.code == 2
    assert f"{flag}: --geometry takes one length" in capsys.readouterr().err
