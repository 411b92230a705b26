"""`vl bench --geometry G --media`: the end-to-end request bench assembled at tiny widths (a streamed random LLM
checkpoint, random towers, the real processors and `vl.Engine.chat`): every item answers, its stages are reported
and add up to its time to first token, the peak RSS is given per stage, pruning and EVS act, the Omni video is heard;
the released configs it builds; the flags. The released-width figures are `vl bench`'s (docs/benchmarks.md)."""

import json

import pytest
import torch

from vl.bench import media
from vl.bench.run import main as bench_main
from vl.config import LMConfig, VisionConfig, tiny_vl
from vl.config.omni import OmniConfig, OmniVisionConfig
from vl.config.parakeet import tiny_parakeet
from vl.errors import ConfigError
from vl.modeling.omni import NemotronOmni
from vl.modeling.vlm import NemotronVL

TINY_LM = dict(vocab_size=640, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16, chunk_size=16)


def tiny_vl_config():
    return tiny_vl(lm=LMConfig(pattern="M*-M", **TINY_LM), vision=VisionConfig(model="vit_tiny_patch16_224",
                                                                               num_prefix_tokens=4))


def tiny_omni_config():
    lm = LMConfig(pattern="ME*E", n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                  moe_shared_expert_intermediate_size=48, **TINY_LM)
    vision = OmniVisionConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, max_img_size=2048,
                              num_cls_tokens=2, num_registers=2)
    return OmniConfig(lm=lm, vision=vision, vision_hidden_size=32, projector_hidden_size=64, lm_mtp_layers=1,
                      audio=tiny_parakeet())


def check_item(x, new_tokens=1):
    stages = x["stages_s"]
    assert x["ttft_s"] > 0 and x["new_tokens"] == new_tokens
    # the stages before the first token make up its time: what they leave out is small and never negative
    assert sum(stages.values()) == pytest.approx(x["stages_sum_s"])
    assert -1e-3 < x["unaccounted_s"] < max(0.05, 0.1 * x["ttft_s"]), x
    assert set(x["peak_rss_by_stage"]) == set(stages)
    assert all(v >= x["rss_before_bytes"] for v in x["peak_rss_by_stage"].values())
    assert x["peak_rss_bytes"] == pytest.approx(max(x["peak_rss_by_stage"].values()), rel=0.05)


def test_nano_vl_items_end_to_end(tmp_path):
    r = media.run("nano-12b-v2-vl", "nvfp4", work_dir=tmp_path, model_config=tiny_vl_config(),
                  page_size=(256, 192), video_frames=8, video_size=(96, 64), log=lambda m: None)
    assert list(r["items"]) == ["page", "page-pruned", "video"]
    page, pruned, video = (r["items"][k] for k in ("page", "page-pruned", "video"))
    for x in (page, pruned, video):
        check_item(x)
        assert set(x["stages_s"]) == {"media", "vision", "prefill"} and x["audio_tokens"] == 0
    tpt = tiny_vl_config().tokens_per_tile
    assert page["vision_tokens_before"] == page["vision_tokens_after"] == 13 * tpt  # 12 tiles + thumbnail
    assert pruned["vision_tokens_before"] == 13 * tpt and pruned["vision_tokens_after"] < 0.6 * 13 * tpt
    assert pruned["prompt_tokens"] < page["prompt_tokens"]
    assert video["vision_tokens_before"] == 8 * tpt and video["vision_tokens_after"] < 0.5 * 8 * tpt  # EVS 0.75
    assert r["parts_bytes"].keys() == {"vision", "projector"} and r["llm_layers"] == "4 of 62" and r["warm_up_s"] > 0
    assert list(tmp_path.iterdir()) == []  # the checkpoint and the media were removed
    text = media.format_result(r)
    assert "token pruning at 0.5: page TTFT" in text and "video" in text
    a, b = page["ttft_s"], pruned["ttft_s"]
    for first, second, says in ((a, a / 2, "= 50% less"), (a, a * 1.25, "= 25% more")):  # a noisy run says more
        page["ttft_s"], pruned["ttft_s"] = first, second
        assert says in media.format_result(r)


def test_omni_video_with_its_sound_in_one_request(tmp_path):
    r = media.run("nano-omni-30b-a3b", "nvfp4", work_dir=tmp_path, model_config=tiny_omni_config(),
                  speech_seconds=6.0, video_size=(64, 48), decode_tokens=5, log=lambda m: None)
    x = r["items"]["video-speech"]
    check_item(x, new_tokens=6)
    assert x["decode_tokens_per_s"] > 0 and "decode after the prompt: 5 tokens at" in media.format_result(r)
    assert set(x["stages_s"]) == {"media", "vision", "audio", "prefill"}
    # 6 s at 2 fps = 12 frames = 6 tubelets; 6 s of sound = 601 mel frames -> 76 audio tokens after x8
    assert x["audio_tokens"] == 76 and x["vision_tokens_before"] % 6 == 0 and x["vision_tokens_before"] > 0
    assert x["prompt_tokens"] > x["vision_tokens_after"] + x["audio_tokens"]
    assert r["parts_bytes"].keys() == {"vision", "vision_final_layernorm", "projector", "audio_encoder",
                                       "audio_projector"}
    assert "audio" in media.format_result(r)
    short = r["items"]["video-speech-16k"]  # the same clip here (the item's 5 minutes cut to the 6 s asked for)
    check_item(short, new_tokens=6)
    assert short["audio_tokens"] == 76 and short["options"] == {"max_frames": media.SPEECH_16K[1]}


def test_checkpoint_kept_and_reused(tmp_path):
    logs = []
    kw = dict(work_dir=tmp_path, keep=True, model_config=tiny_vl_config(), page_size=(256, 192),
              log=logs.append)
    first = media.run("nano-12b-v2-vl", "fp8", ["page"], **kw)
    second = media.run("nano-12b-v2-vl", "fp8", ["page"], **kw)
    assert not first["checkpoint_reused"] and second["checkpoint_reused"]
    assert any("reusing" in m for m in logs)
    assert second["items"]["page"]["prompt_tokens"] == first["items"]["page"]["prompt_tokens"]
    assert [p.name for p in tmp_path.iterdir()] == ["nano-12b-v2-vl-fp8"]  # the media went with the run


def test_released_configs():
    vl_cfg = media.released_config("nano-12b-v2-vl", media.bench_geometry.geometry_config("nano-12b-v2-vl"))
    with torch.device("meta"):
        vl_model = NemotronVL(vl_cfg)
        omni = NemotronOmni(media.released_config("nano-omni-30b-a3b",
                                                  media.bench_geometry.geometry_config("nano-omni-30b-a3b", 4)))
    tower = sum(p.numel() for p in vl_model.vision.parameters())
    assert 0.6e9 < tower < 0.7e9 and vl_cfg.tokens_per_tile == 256 and vl_cfg.lm.hidden_size == 5120
    blk = vl_model.vision.blocks[0]
    assert (blk.attn.qkv.in_features, blk.mlp.fc1.out_features, len(vl_model.vision.blocks)) == (1280, 5120, 32)
    assert omni.audio_encoder.config.hidden_size == 1024 and len(omni.audio_encoder.layers) == 24
    assert omni.config.audio.num_mel_bins == 128 and omni.config.vision_final_norm
    assert omni.config.lm.pattern == "MEME"


def test_unknown_item_and_geometry_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="page-pruned"):
        media.run("nano-12b-v2-vl", items=["video-speech"], work_dir=tmp_path, model_config=tiny_vl_config())
    with pytest.raises(ConfigError, match="--geometry"):
        media.run("180m", work_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_vl_bench_media_flag(tmp_path, capsys, monkeypatch):
    """`vl bench --geometry G --media ITEMS` reaches the bench with its flags, prints the table and the JSON; a
    wrong use is a usage error before anything is written."""
    seen, real = {}, media.run

    def fake_run(geometry, fmt, items, **kw):  # the real run at tiny widths
        seen.update(geometry=geometry, fmt=fmt, items=items, **kw)
        return real(geometry, fmt, items, model_config=tiny_vl_config(), page_size=(256, 192),
                    work_dir=kw["work_dir"], log=kw["log"])

    monkeypatch.setattr(media, "run", fake_run)
    out = tmp_path / "r.json"
    assert bench_main(["--geometry", "nano-12b-v2-vl", "--media", "page", "--format", "fp8", "--work-dir",
                       str(tmp_path / "w"), "--json", str(out)]) == 0
    assert seen["geometry"] == "nano-12b-v2-vl" and seen["fmt"] == "fp8" and seen["items"] == ("page",)
    text = capsys.readouterr().out
    assert "end to end through vl.Engine.chat" in text and "CPU:" in text
    assert json.loads(out.read_text())["items"]["page"]["new_tokens"] == 1
    with pytest.raises(SystemExit):
        bench_main(["--media", "page"])  # no --geometry
    with pytest.raises(SystemExit):
        bench_main(["--geometry", "nano-12b-v2-vl", "--media", "video-speech"])
    assert "video-speech" in capsys.readouterr().err


@pytest.mark.parametrize("pages", ["keep", "release"])
def test_towers_written_and_loaded_back_are_the_random_towers(tmp_path, monkeypatch, pages):
    """`write_towers` + `assemble(towers=...)` (read, or mapped in `release` mode) give the same model as the
    in-memory random towers, seed for seed; an Omni image + sound request answers the same, and in `release` mode
    the towers hold no page of the process after it (vl/runtime/cpu/encoder_pages.py)."""
    from vl.runtime.cpu import encoder_pages

    monkeypatch.setenv("VL_ENCODER_PAGES", pages)
    monkeypatch.setattr(media, "MAPPED_MIN_BYTES", 0)  # the tiny towers' tensors are all small
    cfg = tiny_omni_config()
    torch.manual_seed(0)
    with torch.device("meta"):
        lm_meta = NemotronOmni(cfg).language_model
    lm = lm_meta.to_empty(device="cpu")
    media.randomize_(lm, 1)
    lm.eval().requires_grad_(False)
    want = media.engine_for(cfg, lm, dtype=torch.float32)
    written = media.write_towers(cfg, tmp_path / "towers", dtype=torch.float32)
    got = media.engine_for(cfg, lm, dtype=torch.float32, towers=tmp_path / "towers")
    assert written == sum(p.numel() * p.element_size() for n, part in want.model.named_children()
                          if n != "language_model" for p in [*part.parameters(), *part.buffers()])
    assert got.model.encoder_pages == pages and (got.model.mapped_encoder_bytes > 0) == (pages == "release")
    for (n, a), (m, b) in zip(want.model.state_dict().items(), got.model.state_dict().items()):
        assert n == m and torch.equal(a, b), n
    msgs = media.requests(media.omni_geometry.NAME, ["video-speech"], tmp_path, speech_seconds=2.0,
                          video_size=(96, 64))["video-speech"][0]
    assert got.chat(msgs, max_new_tokens=3).token_ids == want.chat(msgs, max_new_tokens=3).token_ids
    mapped = [p for p in got.model.parameters() if encoder_pages.file_backed(p)
              and p is not got.model.language_model.backbone.embeddings.weight]
    assert bool(mapped) == (pages == "release")
