"""vl/bench/evs_flops.py: forward FLOPs to the first token at each EVS rate, counted on the meta device."""

from __future__ import annotations

import json
from pathlib import Path

import vl.bench.evs_flops as evs_flops
from vl.config import vl_config_from_hf

REPO = Path(__file__).resolve().parents[2]


def test_released_geometry_tower_equals_its_closed_form_and_only_the_llm_shrinks():
    cfg = evs_flops.released_config()
    rows = evs_flops.count(cfg, frames=4, rates=[0.0, 0.75], text_tokens=961)  # 64 frames: minutes of SSD calls
    # C-RADIOv2-H: 32 blocks of width 1280 (qkv, proj, fc1 5120, fc2) on 8 prefix + 32 x 32 patch tokens a frame,
    # the 16 x 16 x 3 -> 1280 patch embedding, and attention's two n x n x 1280 products per block
    n, d, frames = 8 + 32 * 32, 1280, 4
    block = d * 3 * d + d * d + 2 * d * 4 * d
    tower = frames * (2 * n * 32 * block + 2 * 1024 * 768 * d + 32 * 4 * n * n * d)
    assert rows[0]["tower"] == rows[1]["tower"] == tower
    # projector: pixel shuffle to 256 tokens of 4 x 1280, then 5120 -> 20480 -> 5120 on each
    assert rows[0]["projector"] == frames * 256 * 2 * (5120 * 20480 + 20480 * 5120)
    assert [(r["vision_tokens"], r["prompt_tokens"]) for r in rows] == [(1024, 1985), (256, 1217)]
    # the LLM's matmuls at least: every layer's weights once per prompt token, but the MLPs after the last mixing
    # layer (they hold no state) and lm_head on the one kept position only
    llm_cfg = cfg.lm
    d_model = llm_cfg.hidden_size
    mamba = d_model * llm_cfg.mamba_in_proj_dim + llm_cfg.mamba_d_inner * d_model
    attention = d_model * (llm_cfg.num_attention_heads + 2 * llm_cfg.num_key_value_heads) * llm_cfg.head_dim \
        + llm_cfg.num_attention_heads * llm_cfg.head_dim * d_model
    mlp = 2 * d_model * llm_cfg.intermediate_size
    trailing = len(llm_cfg.pattern) - len(llm_cfg.pattern.rstrip("-"))
    per_token = sum({"M": mamba, "*": attention, "-": mlp}[c] for c in llm_cfg.pattern.rstrip("-"))
    once = trailing * mlp + d_model * llm_cfg.vocab_size
    for r in rows:
        matmuls = 2 * (r["prompt_tokens"] * per_token + once)
        assert matmuls < r["llm"] < 1.1 * matmuls  # + attention scores and the SSD's chunk products
    assert rows[0]["total"] / rows[1]["total"] < rows[0]["prompt_tokens"] / rows[1]["prompt_tokens"]


def test_a_row_per_rate_for_a_checkpoint_config(capsys):
    """`--model DIR` counts that checkpoint's geometry (the demo model: 9 tokens a frame)."""
    cfg = vl_config_from_hf(json.loads((REPO / "vl/demo/config.json").read_text()))
    out = evs_flops.table(evs_flops.count(cfg, frames=8, rates=[0.0, 0.75], text_tokens=100))
    assert cfg.tokens_per_tile == 9
    assert "| 0 | 72 | 172 |" in out and "| 0.75 | 18 | 118 |" in out and "| 1.00x |" in out
    evs_flops.main(["--model", str(REPO / "vl/demo"), "--frames", "8", "--rates", "0,0.75", "--text-tokens", "100"])
    printed = capsys.readouterr().out
    assert "8 frames, 9 tokens a frame, 100 text tokens" in printed and out in printed
