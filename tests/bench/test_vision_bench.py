"""vl/bench/vision.py on a tiny tower: the rows, the accuracy checks and the FLOP count it reports."""

import torch

from vl.bench import vision


def test_tower_flops_counts_every_product_and_attention():
    dims = (64, 2, 4, 256)  # dim, depth, heads, mlp
    rows, n = 4 + 8, 4  # a 32-px tile of 16-px patches: 4 patches, 8 prefix rows
    embed = 2 * n * 3 * 16 * 16 * 64
    block = 2 * rows * 64 * (3 * 64 + 64 + 2 * 256) + 4 * rows * rows * 64
    projector = 2 * (n // 4) * (4 * 64 * 32 + 32 * 16)
    assert vision.tower_flops(dims, 3, tile=32, prefix=8, proj_hidden=32, llm_dim=16) == 3 * (embed + 2 * block
                                                                                               + projector)
    # the released size: ~1.3 TFLOP of tower products, ~0.18 of attention, ~0.11 of projector per 512-px tile
    assert 1.55e12 < vision.tower_flops((1280, 32, 16, 5120), 1) < 1.62e12


def test_tiny_run_reports_every_row_and_agrees_with_transformers():
    r = vision.run(torch.bfloat16, threads=1, rounds=1, page_tiles=2, micro_batch=1, tower="vit_tiny_patch16_224",
                   tile=64, proj_hidden=64, llm_dim=32)
    assert set(r["rows"]) == {"ours", "ours_packed", "ours_plain", "transformers"}
    for row in r["rows"].values():
        assert row["median_s"] > 0 and row["ratio_vs_transformers"] > 0 and 0 < row["pct_of_gemm_peak"]
    assert r["rows"]["transformers"]["ratio_vs_transformers"] == 1.0
    assert r["gemm_peak_tflops"] > 0 and len(r["gemm_tflops"]) == 4
    scale = r["output_scale"]
    assert r["max_abs_diff"]["ours_plain_vs_transformers"] <= 0.02 * scale  # the same maths, the same bf16 steps
    assert r["max_abs_diff"]["ours_vs_transformers"] <= 0.05 * scale
    assert r["max_abs_diff"]["ours_vs_ours_packed"] == 0.0  # packing keeps the weights' values
    assert set(r["max_abs_diff_vs_fp32"]) == {"ours", "ours_packed", "ours_plain", "transformers"}
    assert set(r["page"]) == {"micro_batch_1", "micro_batch_2"}
    text = vision.format_result(r)
    assert "| ours |" in text and "GEMM peak" in text and r["fused_path"] in text and r["attention"] in text


def test_fp32_run_keeps_the_modules_and_transformers_bits():
    r = vision.run(torch.float32, threads=1, rounds=1, page_tiles=0, tower="vit_tiny_patch16_224", tile=32,
                   proj_hidden=64, llm_dim=32)
    assert "float32" in r["fused_path"]  # the fused path serves bf16 only
    assert r["max_abs_diff"]["ours_vs_transformers"] == 0.0
    assert "page" not in r and "max_abs_diff_vs_fp32" not in r
