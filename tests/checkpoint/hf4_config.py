"""A config.json written the way transformers 4.x `save_pretrained` writes a remote-code composite config (the way
the Nano V2 VL releases were written): nested `llm_config` and `vision_config` as full `PretrainedConfig.to_dict()`
dumps (generic attributes, generation defaults, bookkeeping), remote-code Nemotron-H names and fields, a RADIO
`args` training namespace, and the top-level extras of the release. Values come from transformers 4.x
`PretrainedConfig.__init__` defaults; the model-defining values come from the config it is built from."""

from __future__ import annotations

import copy

HF4_GENERIC = {
    "return_dict": True, "output_hidden_states": False, "output_attentions": False, "torchscript": False,
    "use_bfloat16": False, "tf_legacy_loss": False, "pruned_heads": {}, "chunk_size_feed_forward": 0,
    "is_encoder_decoder": False, "is_decoder": False, "cross_attention_hidden_size": None, "add_cross_attention": False,
    "tie_encoder_decoder": False, "max_length": 20, "min_length": 0, "do_sample": False, "early_stopping": False,
    "num_beams": 1, "num_beam_groups": 1, "diversity_penalty": 0.0, "temperature": 1.0, "top_k": 50, "top_p": 1.0,
    "typical_p": 1.0, "repetition_penalty": 1.0, "length_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "num_return_sequences": 1, "output_scores": False,
    "return_dict_in_generate": False, "forced_bos_token_id": None, "forced_eos_token_id": None,
    "remove_invalid_values": False, "exponential_decay_length_penalty": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "finetuning_task": None, "id2label": {"0": "LABEL_0", "1": "LABEL_1"},
    "label2id": {"LABEL_0": 0, "LABEL_1": 1}, "tokenizer_class": None, "prefix": None, "sep_token_id": None,
    "decoder_start_token_id": None, "task_specific_params": None, "problem_type": None, "_name_or_path": "",
    "_attn_implementation_autoset": True, "transformers_version": "4.53.1",
}
REMOTE_NAMES = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "chunk_size": "mamba_chunk_size",
                "time_step_limit": "mamba_dt_limit", "use_conv_bias": "mamba_conv_bias"}
REMOTE_LM_EXTRAS = {
    "mamba_expand": 2, "mamba_dt_min": 0.001, "mamba_dt_max": 0.1, "mamba_dt_init_floor": 1e-4,
    "mamba_proj_bias": False, "time_step_rank": 256, "rescale_prenorm_residual": True, "use_mamba_kernels": True,
    "num_logits_to_keep": 1, "attention_dropout": 0.0, "hidden_dropout": 0.0, "initializer_range": 0.02,
    "sliding_window": None, "use_cache": True, "attn_implementation": "flash_attention_2",
    "auto_map": {"AutoConfig": "configuration_nemotron_h.NemotronHConfig"},
}
RADIO_ARGS = {  # RADIO's training namespace: data, optimiser, logging, teachers, and the few that build the net
    "aa": None, "amp": True, "amp_dtype": "bfloat16", "batch_size": 32, "cls_token_per_teacher": True,
    "color_jitter": 0.4, "cpe_max_size": 2048, "crop_pct": None, "device": "cuda:0", "distributed": True,
    "drop": 0.0, "drop_path": None, "dtype": "bfloat16", "epoch_repeats": 0.0, "eval_metric": "knn_top1",
    "feature_normalization": "SHIP_NORM", "grad_accum_steps": 1, "hflip": 0.5, "img_size": None, "in_chans": None,
    "input_size": None, "local_rank": 0, "log_wandb": True, "lr_base": 0.1, "mean": None, "min_lr": 0,
    "mixup": 0.0, "model": "vit_huge_patch16_224", "model_kwargs": {}, "model_norm": False, "momentum": 0.9,
    "pretrained": False, "rank": 0, "ratio": [0.75, 1.3333333333333333], "register_multiple": 8, "resume": "",
    "scale": [0.5, 1.0], "sched": "cosine", "seed": 42, "smoothing": 0.1, "spectral_reparam": False, "std": None,
    "teachers": [{"name": "clip", "model": "ViT-H-14-378-quickgelu"}, {"name": "siglip"}],
    "torchcompile": None, "torchscript": False, "vitdet_version": 1, "wandb_project": "", "warmup_lr": 1e-05,
    "workers": 8, "world_size": 256,
}


def hf4_composite(ours: dict) -> dict:
    """Our saved Nano V2 VL config.json (vl_config_to_hf) rewritten as a transformers 4.x remote-code dump."""
    ours = copy.deepcopy(ours)
    lm = {REMOTE_NAMES.get(k, k): v for k, v in ours.pop("llm_config").items()}
    llm_config = {**HF4_GENERIC, **REMOTE_LM_EXTRAS, **lm, "_name_or_path": "nvidia/NVIDIA-Nemotron-Nano-12B-v2"}
    vc = ours.pop("vision_config")
    args = {**RADIO_ARGS, **vc["args"]}
    vision_config = {**HF4_GENERIC, "args": args, "version": "radio_v2.5-h", "patch_size": vc["patch_size"],
                     "max_resolution": 2048, "preferred_resolution": [512, 512], "adaptor_names": None,
                     "adaptor_configs": {}, "vitdet_window_size": None, "feature_normalizer_config": None,
                     "inter_feature_normalizer_config": None, "model_type": "radio", "architectures": ["RADIOModel"],
                     "auto_map": {"AutoConfig": "hf_model.RADIOConfig", "AutoModel": "hf_model.RADIOModel"}}
    top = {**HF4_GENERIC, **ours, "llm_config": llm_config, "vision_config": vision_config,
           "use_bfloat16": True, "img_start_token_id": 100, "img_end_token_id": 101, "min_num_patches": None,
           "max_sequence_length": 16384, "template": "nemotron_h_5p5_reasoning",
           "auto_map": {"AutoConfig": "configuration.NemotronH_Nano_VL_V2_Config",
                        "AutoModel": "modeling.NemotronH_Nano_VL_V2"}}
    return top
