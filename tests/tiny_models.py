"""Tiny random reference models built in-test (nothing is downloaded)."""

from __future__ import annotations

import torch

from vl.modeling.random_init import randomize_  # noqa: F401 - re-exported for the tests

LM_VARIANTS = {
    # every layer kind; chunk 16 so lengths cross chunk boundaries cheaply
    "hybrid": dict(hybrid_override_pattern="M*-M-*M-", chunk_size=16),
    "moe": dict(hybrid_override_pattern="ME*EM-", chunk_size=16, n_routed_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32, moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1,
                routed_scaling_factor=2.5),
    "moe_latent": dict(hybrid_override_pattern="MEM*E", chunk_size=16, n_routed_experts=6, num_experts_per_tok=2,
                       moe_intermediate_size=24, moe_shared_expert_intermediate_size=40, moe_latent_size=32),
}


def hf_nemotron_config(**overrides):
    import transformers

    base = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16,
                conv_kernel=4, eos_token_id=2, pad_token_id=0, bos_token_id=1)
    base.update(overrides)
    return transformers.NemotronHConfig(**base)


def save_hf_nemotron(tmp_path, variant="hybrid", seed=0, dtype=torch.float32, **overrides):
    """Build a random transformers NemotronHForCausalLM, save_pretrained it; return (dir, model)."""
    import transformers

    cfg = hf_nemotron_config(**{**LM_VARIANTS[variant], **overrides})
    torch.manual_seed(seed)
    model = randomize_(transformers.NemotronHForCausalLM(cfg), seed).eval().to(dtype)
    out = tmp_path / f"nh_{variant}_{seed}"
    model.save_pretrained(out)
    return out, model


TINY_CORPUS = [
    "What is the total? The total is 47.", "Describe the image.", "The red circle moves to the right.",
    "Which field is at the top? NAME", "How many stars are there? 3", "This is a video:\nFrame 1 sampled at 0.50 seconds: ",
    "The answer is yes. The answer is no.", "left right up down red green blue yellow",
] * 20


def make_tiny_vl_dir(path, seed=0, vocab_size=320, **vl_changes):
    """A complete tiny Nano-V2-VL checkpoint directory (weights, config, tokenizer with chat template)."""
    from data_recipes.tokenizer import train_tokenizer
    from vl.checkpoint.nano_vl import save_pretrained
    from vl.config import LMConfig, MediaTokenConfig, tiny_vl
    from vl.modeling.vlm import NemotronVL

    tok = train_tokenizer(TINY_CORPUS, vocab_size, path)
    ids = MediaTokenConfig(img_context_id=tok.convert_tokens_to_ids("<image>"),
                           video_context_id=tok.convert_tokens_to_ids("<video>"))
    lm = LMConfig(vocab_size=len(tok), eos_token_id=(tok.convert_tokens_to_ids("<SPECIAL_12>"),))
    torch.manual_seed(seed)
    model = NemotronVL(tiny_vl(lm=lm, tokens=ids, **vl_changes)).eval()
    randomize_(model.language_model, seed)
    save_pretrained(model, path, tokenizer=tok)
    return path


def make_tiny_text_dir(path, seed=0, **overrides):
    """A text-only `nemotron_h` directory as transformers saves it (config.json, generation_config.json,
    model.safetensors) plus a tokenizer (the demo model's, with its chat template); returns (dir, hf_model)."""
    from pathlib import Path

    import transformers

    demo = Path(__file__).resolve().parents[1] / "vl" / "demo"
    tok = transformers.AutoTokenizer.from_pretrained(str(demo))
    eos = tok.convert_tokens_to_ids("<SPECIAL_12>")
    cfg = hf_nemotron_config(**{**LM_VARIANTS["hybrid"], "vocab_size": len(tok), "eos_token_id": eos,
                                "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, **overrides})
    torch.manual_seed(seed)
    model = randomize_(transformers.NemotronHForCausalLM(cfg), seed).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, model


OMNI_CORPUS = TINY_CORPUS + ["What is said while the dog runs? Describe the image and the sound."] * 8


def make_tiny_omni_dir(path, seed=0, audio: bool = True, context: int = 4096, **top):
    """A complete tiny Nemotron 3 Nano Omni directory as transformers saves it: a random `NemotronH_Omni_Reasoning_V3`
    (tests/omni_adapter.py `hf_omni`, its ids matched to the tokenizer), its processor files (image, video, audio
    feature extractor) and a tokenizer with the audio tokens; `context`: the LM's max_position_embeddings. Returns
    (dir, hf_model)."""
    from transformers import ParakeetFeatureExtractor
    from transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3ImageProcessor as RefImageProcessor,
    )
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3Processor as RefProcessor,
    )
    from transformers.models.nemotron_h_omni.video_processing_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3VideoProcessor as RefVideoProcessor,
    )

    from data_recipes.tokenizer import build_tokenizer
    from omni_adapter import TINY_AUDIO, TINY_TEXT, hf_omni
    from vl.processing.chat import OMNI_TOKENS

    tok = build_tokenizer(OMNI_CORPUS, 320)
    tok.add_special_tokens({"additional_special_tokens": [OMNI_TOKENS.audio_start, OMNI_TOKENS.audio_context,
                                                          OMNI_TOKENS.audio_end]})
    tok.chat_template = None  # the one prompt format (vl/processing/chat.py) renders; the demo template knows no audio
    eos = tok.convert_tokens_to_ids("<SPECIAL_12>")
    text = dict(TINY_TEXT, vocab_size=len(tok), eos_token_id=eos, pad_token_id=tok.pad_token_id,
                bos_token_id=tok.bos_token_id, max_position_embeddings=context)
    ids = dict(image_token_id=tok.convert_tokens_to_ids("<image>"),
               video_token_id=tok.convert_tokens_to_ids("<image>"),
               audio_token_id=tok.convert_tokens_to_ids(OMNI_TOKENS.audio_context))
    model = hf_omni(text=text, audio=TINY_AUDIO if audio else None, seed=seed, **{**ids, **top})
    model.save_pretrained(path)
    mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    ref = RefProcessor(image_processor=RefImageProcessor(image_mean=mean, image_std=std, min_num_patches=16,
                                                         max_num_patches=64, max_model_len=2048),
                       video_processor=RefVideoProcessor(norm_mean=mean, norm_std=std, video_target_num_patches=16),
                       tokenizer=tok, feature_extractor=ParakeetFeatureExtractor(feature_size=TINY_AUDIO["num_mel_bins"]))
    ref.save_pretrained(path)
    return path, model


def make_released_omni_dir(src, dst):
    """A copy of a `make_tiny_omni_dir` directory in the shape the hub's Nemotron 3 Nano Omni directories have
    (written for their remote code, which vLLM and SGLang read): config.json names the remote class
    (`NemotronH_Nano_Omni_Reasoning_V3` as model_type and architecture, with `auto_map`), keeps the older key
    names (`llm_config` in the 4.x Nemotron-H spelling, `sound_config` with `model_type: parakeet` and no
    `attention_bias` / `scale_input`, `img_context_token_id`, ...), and a RADIO `vision_config` with the remote
    config's `args`, version and processor keys; `preprocessor_config.json` is the remote processor's (norm_mean /
    norm_std, patch budget, `auto_map`, V2 tiling keys); there is no transformers-5 `processor_config.json`, so no
    feature-extractor file (the mel bins come from the audio config). The weights and tokenizer are the source's.
    Returns dst."""
    import json
    import shutil
    from pathlib import Path

    from vl.config import lm_config_from_hf, lm_config_to_hf

    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    image = json.loads((dst / "processor_config.json").read_text())["image_processor"]
    (dst / "processor_config.json").unlink()
    text = dict(lm_config_to_hf(lm_config_from_hf(cfg["text_config"])),
                num_nextn_predict_layers=cfg["text_config"]["num_nextn_predict_layers"])
    skip = ("model_type", "attention_bias", "scale_input", "dropout", "dropout_positions", "activation_dropout",
            "attention_dropout", "layerdrop", "initializer_range", "max_position_embeddings", "num_key_value_heads")
    sound = {**{k: v for k, v in cfg["audio_config"].items() if k not in skip}, "model_type": "parakeet",
             "sampling_rate": 16000}
    vision = {**{k: v for k, v in cfg["vision_config"].items() if k != "model_type"},
              "architectures": ["RADIOModel"], "auto_map": {"AutoModel": "hf_model.RADIOModel"},
              "args": {"model": "vit_huge_patch16_224", "register_multiple": 8, "teachers": [{}]},
              "preferred_resolution": [512, 512], "version": "c-radio_v4-h", "separate_video_embedder": True,
              "min_num_patches": image["min_num_patches"], "max_num_patches": image["max_num_patches"],
              "video_target_num_patches": 1024, "video_maintain_aspect_ratio": True}
    remote = "NemotronH_Nano_Omni_Reasoning_V3"
    released = {
        "architectures": [remote], "model_type": remote, "torch_dtype": "float32",
        "auto_map": {"AutoConfig": f"configuration.{remote}_Config", "AutoModel": f"modeling.{remote}",
                     "AutoModelForCausalLM": f"modeling.{remote}"},
        "img_context_token_id": cfg["image_token_id"], "video_context_token_id": cfg["video_token_id"],
        "sound_context_token_id": cfg["audio_token_id"], "downsample_ratio": cfg["downsample_ratio"],
        "projector_hidden_size": cfg["projector_hidden_size"], "vit_hidden_size": cfg["vision_hidden_size"],
        "video_pruning_rate": cfg.get("video_pruning_rate", 0.0), "video_temporal_patch_size": 2,
        "force_image_size": 512, "patch_size": 16, "ps_version": "v2", "template": "nemotron-h-omni",
        "image_tag_type": "internvl", "img_context_token": "<image>", "video_context_token": "<video>",
        "sound_context_token": "<so_embedding>", "norm_mean": image["image_mean"], "norm_std": image["image_std"],
        "use_thumbnail": True, "max_sequence_length": text["max_position_embeddings"],
        "vision_config": vision, "sound_config": sound, "llm_config": text}
    (dst / "config.json").write_text(json.dumps(released, indent=1))
    preprocessor = {"processor_class": f"{remote}Processor",
                    "auto_map": {"AutoProcessor": f"processing.{remote}Processor"},
                    "image_processor_type": f"{remote}ImageProcessor", "patch_size": 16, "downsample_ratio": 0.5,
                    "norm_mean": image["image_mean"], "norm_std": image["image_std"],
                    "min_num_patches": image["min_num_patches"], "max_num_patches": image["max_num_patches"],
                    "max_model_len": image["max_model_len"], "max_num_tiles": 12, "use_thumbnail": True}
    (dst / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=1))
    return dst
