"""`vl bench --geometry nano-omni-30b-a3b`: the released widths, the streamed MoE checkpoint (routed experts packed
per expert under the hub's names), the loader that keeps them packed, and the timing path with its MoE figures, on
tiny widths (the 30B figures themselves are measured by `vl bench`, docs/benchmarks.md)."""

import json

import pytest
import torch

import vl
from vl.bench import geometry as bench_geometry
from vl.bench import omni_geometry
from vl.bench.run import main as bench_main
from vl.config import nano3_30b_a3b_lm
from vl.config.omni import omni_30b_a3b
from vl.modeling.nemotron_h import NemotronHForCausalLM
from vl.quant.experts import routed_expert_bytes
from vl.quant.linear import QuantizedLinear, resident_weight_bytes
from vl.runtime.generate import generate_steps
from vl.runtime.sampling import SamplingParams


def small():
    return nano3_30b_a3b_lm(hidden_size=256, moe_intermediate_size=128, moe_shared_expert_intermediate_size=256,
                            n_routed_experts=16, num_experts_per_tok=4, mamba_num_heads=8, mamba_head_dim=32,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=512,
                            pattern="ME*E")


def test_released_widths():
    cfg = omni_30b_a3b()
    lm = cfg.lm
    counts = (lm.num_hidden_layers, lm.pattern.count("E"), lm.pattern.count("M"), lm.pattern.count("*"))
    assert counts == (52, 23, 23, 6)
    assert (lm.hidden_size, lm.n_routed_experts, lm.num_experts_per_tok, lm.moe_intermediate_size,
            lm.moe_shared_expert_intermediate_size) == (2688, 128, 6, 1856, 3712)
    with torch.device("meta"):
        model = NemotronHForCausalLM(lm)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters()
                  if n.endswith((".experts.up_proj", ".experts.down_proj")))
    active = total - experts + experts * 6 // 128 - model.backbone.embeddings.weight.numel()  # one row is read
    assert 31.5e9 < total < 31.7e9 and 3.1e9 < active < 3.3e9  # the published 31.6B total, 3.2B active
    assert (cfg.vision.hidden_size, cfg.vision.num_hidden_layers, cfg.projector_hidden_size) == (1280, 32, 20480)
    assert (cfg.audio.hidden_size, cfg.audio.num_mel_bins, cfg.audio.projection_hidden_size) == (1024, 128, 4096)
    towers = omni_geometry.tower_bytes(cfg)
    assert 1.2e9 < towers["vision tower (RADIO ViT-H/16)"] < 1.4e9 and len(towers) == 4
    assert bench_geometry.geometry_config("nano-omni-30b-a3b") == lm
    assert bench_geometry.geometry_config("nano-omni-30b-a3b", 6).pattern == "MEMEM*"


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_streamed_moe_checkpoint_loads_with_packed_experts(tmp_path, fmt):
    path = bench_geometry.write_random_checkpoint(small(), fmt, tmp_path / "m")
    header = json.loads(open(path / "model.safetensors", "rb").read()[8:][:200000].split(b"}}")[0] + b"}}")
    assert "backbone.layers.1.mixer.experts.15.down_proj.weight_scale" in header  # the hub's per-expert names
    assert header["backbone.layers.1.mixer.gate.weight"]["dtype"] == "F32"
    hf_quant = json.loads((path / "hf_quant_config.json").read_text())
    assert "*mixer.gate" in hf_quant["quantization"]["exclude_modules"]
    ours = vl.load_pretrained(path, dtype=torch.bfloat16)  # the packed experts stay packed, one Linear each
    ups = ours.backbone.layers[1].mixer.experts.up_proj
    assert len(ups) == 16 and all(isinstance(m, QuantizedLinear) and m.fmt == fmt for m in ups)
    assert not isinstance(ours.lm_head, QuantizedLinear)
    assert routed_expert_bytes(ours) < resident_weight_bytes(ours)
    # the same directory with every weight expanded: experts dequantized into the fused BF16 tensors
    lib = vl.load_pretrained(path, dtype=torch.bfloat16, quant_mode="dequantize")
    assert lib.backbone.layers[1].mixer.experts.up_proj.dtype == torch.bfloat16
    assert routed_expert_bytes(ours) < routed_expert_bytes(lib) / (1.7 if fmt == "fp8" else 3.3)
    ids = torch.randint(3, 512, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(ids).logits.float(), lib(ids).logits.float()
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b, rtol=0, atol=0.05 * b.abs().max().item())

    def greedy(model):  # prefill, then the one-token decode path of the MoE, twice (the second after the first)
        return [e.tokens[0] for e in generate_steps(model, input_ids=ids[:, :5], max_new_tokens=6,
                                                    params=SamplingParams())]

    first = greedy(ours)
    assert len(first) == 6 and first == greedy(ours) == greedy(lib)


def test_run_reports_moe_figures_at_two_thread_counts_and_cleans_up(tmp_path):
    r = bench_geometry.run(small(), "nvfp4", work_dir=tmp_path, prefill=40, decode_ctx=8, new_tokens=2,
                           cache_len=1024, decode_threads=(1, 2), log=lambda m: None)
    assert list(tmp_path.iterdir()) == []
    assert set(r["decode_by_threads"]) == {1, 2} and r["threads"] == torch.get_num_threads()
    for d in r["decode_by_threads"].values():
        assert d["decode_tok_s"] > 0 and d["copy_GBps"] > 0 and d["decode_vs_copy"] > 0
    assert r["decode_tok_s"] == r["decode_by_threads"][1]["decode_tok_s"]
    cfg = small()
    assert r["held_cache_bytes"] == bench_geometry.HybridCache(cfg, 1, 1024, dtype=torch.bfloat16,
                                                               device="meta").nbytes()
    split = r["resident_split"]
    assert 0 < split["routed_experts"] < split["packed"] and split["router"] == 2 * 16 * 256 * 4 + 2 * 16 * 4
    # a decode step reads 4 of the 16 experts of each MoE layer, every other weight once, one embedding row
    emb = split["embeddings"]
    assert r["decode_read_bytes"] == (r["resident_weight_bytes"] - emb - split["routed_experts"]
                                      + split["routed_experts"] * 4 // 16)
    text = bench_geometry.format_result(r)
    for line in ("decode, 1 thread(s)", "decode, 2 thread(s)", "held cache @1024", "resident by part",
                 "read per decode step"):
        assert line in text


def test_cli_flags_apply_to_geometry_runs_only(capsys):
    for argv in (["--cache-len", "16384"], ["--decode-threads", "1,2"]):
        with pytest.raises(SystemExit):
            bench_main(argv)
        assert "applies to --geometry runs" in capsys.readouterr().err
    for bad in ("1,x", "0,2"):
        with pytest.raises(SystemExit):
            bench_main(["--geometry", "nano-omni-30b-a3b", "--decode-threads", bad])
        assert "--decode-threads" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["--geometry", "nano-omni-30b-a4b"])
    assert "nano-omni-30b-a3b" in capsys.readouterr().err  # the choices are named
