"""vl/bench/quant.py: the rows `vl bench` will print, on the tiny model with the smallest settings (the figures
themselves come from `python -m vl.bench.quant`, not from tests)."""

import torch

from data_recipes.calibration import SYNTHETIC
from vl.bench.quant import format_table, quant_table

from tiny_quant import tiny_vl


def test_quant_table_rows(tmp_path_factory, tmp_path):
    threads = torch.get_num_threads()
    rows = quant_table(tiny_vl(tmp_path_factory), formats=("nvfp4",), modes=("weight-only", "native"),
                       hadamard=(False,), block_2d=False, prompt_tokens=8, new_tokens=3, rounds=1, num_calib=1,
                       num_eval=1, work_dir=tmp_path, calib_source=SYNTHETIC)
    assert torch.get_num_threads() == threads  # restored
    speed = {(r["format"], r["mode"]): r for r in rows if r["kind"] == "speed"}
    assert set(speed) == {("bf16", "-"), ("nvfp4", "weight-only"), ("nvfp4", "native")}
    packed = speed[("nvfp4", "weight-only")]
    assert packed["status"] == "ok" and packed["resolved_mode"] == "weight-only"
    assert 0 < packed["quantized_linear_bytes"] <= 0.3 * packed["packable_bytes_bf16"]
    assert packed["lm_bytes"] < speed[("bf16", "-")]["lm_bytes"] and packed["decode_tokens_per_s"] > 0
    assert speed[("nvfp4", "native")]["status"].startswith("unavailable: ")
    (acc,) = [r for r in rows if r["kind"] == "accuracy"]
    assert 0 < acc["logit_rel_err"] < 1 and 0 <= acc["top1_agreement"] <= 1 and 0 <= acc["greedy_prefix"] <= 3
    assert acc["act_logit_rel_err"] > 0
    table = format_table(rows)
    assert "nvfp4   weight-only" in table and "unavailable" in table
