"""How a foreign `config.json` key is read: honoured, accepted-and-named, or refused. One policy for every section.

The policy and the source of each list are written down in docs/config_policy.md. In short, every key of a
section (`llm_config` / `text_config`, a text-only `nemotron_h` config.json, the `NemotronH_Nano_VL_V2` top level,
`vision_config` and its RADIO `args`) goes through `KeyReader.sort`, in this order:

1. mapped: the adapter in vl/config/__init__.py reads it into a dataclass field (it is honoured);
2. a maths key with a value check: accepted when its value is what this code implements (`min_num_patches: null`,
   `pruned_heads: {}`), refused otherwise with a message naming the key and what it would change;
3. a key the section's adapter names with its own reason (initialisation-only, derived, duplicate, ...);
4. a key of a generic class that cannot change inference: `_`-prefixed bookkeeping, generation defaults stored in
   the config, attention-implementation hints, dtype hints, token ids (read from the tokenizer or
   generation_config.json), transformers' generic `PretrainedConfig` attributes of 4.x and 5.x;
5. anything else is unknown: accepted, not read, and named in a warning, since refusing a file for a key this code
   cannot judge would only block the user (a release may carry fields we have not seen); the warning says that
   outputs may differ if the key does change the model.

Accepted keys are collected per class in `notes` (the loaded model's `config_notes`, logged once by the loader).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vl.errors import ConfigError

DOC = "docs/config_policy.md"
log = logging.getLogger("vl.config")

# transformers 4.x `PretrainedConfig.__init__` attributes as `to_dict()` writes them (4.40-4.57), minus the
# generation parameters (GENERATION_KEYS), token ids (TOKEN_ID_KEYS), dtype and attention hints (below), and the
# maths-changing ones that get a value check (COMMON_CHECKS).
GENERIC_4X = frozenset({
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "tf_legacy_loss",
    "tie_encoder_decoder", "is_decoder", "chunk_size_feed_forward", "architectures", "finetuning_task",
    "id2label", "label2id", "tokenizer_class", "prefix", "task_specific_params", "problem_type", "model_type",
    "transformers_version", "gradient_checkpointing", "use_return_dict", "num_labels",
})
# transformers 5.x `PreTrainedConfig.__init__` / `to_dict()` (checked against the installed 5.24 by a test).
GENERIC_5X = frozenset({
    "return_dict", "output_hidden_states", "output_attentions", "chunk_size_feed_forward", "architectures",
    "id2label", "label2id", "problem_type", "model_type", "transformers_version",
})
# Generation defaults stored in a config: 4.x `PretrainedConfig` generation parameters and every field of 5.x
# `GenerationConfig` (checked against the installed one by a test). Decoding options come from the call and
# generation_config.json, never from config.json.
GENERATION_KEYS = frozenset({
    # 4.x PretrainedConfig
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    # 5.x GenerationConfig (the rest)
    "assistant_confidence_threshold", "assistant_early_exit", "assistant_ensemble_weight", "assistant_lookbehind",
    "cache_config", "cache_implementation", "compile_config", "constraints", "continuous_batching_config",
    "disable_compile", "dola_layers", "encoder_repetition_penalty", "epsilon_cutoff", "eta_cutoff",
    "force_words_ids", "guidance_scale", "is_assistant", "low_memory", "max_cache_len", "max_matching_ngram_size",
    "max_new_tokens", "max_time", "min_new_tokens", "min_p", "num_assistant_tokens",
    "num_assistant_tokens_schedule", "output_logits", "penalty_alpha", "prefill_chunk_size",
    "prompt_lookup_num_tokens", "renormalize_logits", "sequence_bias", "speculation_type", "stop_strings",
    "target_lookbehind", "token_healing", "top_h", "use_cache", "use_mtp", "watermarking_config",
    "generation_config",
})
ATTENTION_HINTS = frozenset({
    "attn_implementation", "use_flash_attention_2", "use_flash_attn", "attn_impl", "use_sdpa",
})
DTYPE_HINTS = frozenset({"torch_dtype", "dtype", "use_bfloat16", "use_fp16", "params_dtype", "fp16", "bf16"})
TOKEN_ID_KEYS = frozenset({
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "unk_token_id",
    "img_start_token_id", "img_end_token_id", "image_start_token_id", "image_end_token_id",
})


@dataclass(frozen=True)
class Check:
    """A maths key: `allowed` are the values this code implements; `changes` says what another value would do."""

    allowed: tuple
    changes: str


# Generic transformers attributes that would change the maths when set; every section checks them.
COMMON_CHECKS = {
    "pruned_heads": Check(({}, None), "remove attention heads from some layers"),
    "add_cross_attention": Check((False, None), "add cross-attention layers to an encoder-decoder model"),
    "cross_attention_hidden_size": Check((None,), "size cross-attention layers of an encoder-decoder model"),
    "is_encoder_decoder": Check((False, None), "make this an encoder-decoder model"),
}

CLASS_NAMES = {  # class -> how the note names it (docs/config_policy.md lists the same classes)
    "checked": "maths keys at the implemented value",
    "bookkeeping": "`_`-prefixed bookkeeping",
    "generation": "generation defaults stored in the config (decoding options come from the call and "
                  "generation_config.json)",
    "attention": "attention-implementation hints (attention is always PyTorch SDPA)",
    "dtype": "dtype hints (the storage dtype is read from the tensors, the compute dtype from the caller)",
    "token_ids": "token ids (read from the tokenizer and generation_config.json)",
    "generic": "transformers' generic PretrainedConfig attributes (4.x/5.x)",
}


def of_generic_class(key: str) -> bool:
    """True for a key of a class that cannot change inference in any section (bookkeeping, generation defaults,
    attention and dtype hints, transformers' generic attributes); token ids are not included (a text config
    honours them)."""
    return (key.startswith("_") or key in GENERATION_KEYS or key in ATTENTION_HINTS or key in DTYPE_HINTS
            or key in GENERIC_4X or key in GENERIC_5X)


def _same(value, allowed) -> bool:
    # exact type for bools (True == 1 in Python) and containers compared by value
    return any(type(value) is type(a) and value == a if isinstance(a, bool) or isinstance(value, bool)
               else value == a for a in allowed)


class KeyReader:
    """Sorts the keys of one config section; collects what was accepted, refused and unknown.

    `notes` (shared by the sections of one file) receives one line per class of accepted keys when
    `finish()` runs; `finish()` raises one `ConfigError` naming every refused key and warns once about unknown
    ones."""

    def __init__(self, where: str, section: str, notes: list | None = None):
        self.where, self.section = where, section
        self.label = where if section == "config.json" or f"({section})" in where else f"{where} ({section})"
        self.notes = notes if notes is not None else []
        self.accepted: dict[str, list[str]] = {}
        self.refused: list[str] = []
        self.unknown: list[str] = []

    def sort(self, raw: Mapping, *, mapped: Iterable[str] = (), specific: Mapping[str, str] | None = None,
             checks: Mapping[str, Check] | None = None) -> dict:
        """-> the mapped keys with their values; everything else is classified (see the module docstring)."""
        mapped, specific = set(mapped), dict(specific or {})
        checks = {**COMMON_CHECKS, **(checks or {})}
        taken = {}
        for key, value in raw.items():
            if key in mapped:
                taken[key] = value
            elif key in checks:
                check = checks[key]
                if _same(value, check.allowed):
                    self._accept("checked", key)
                else:
                    shown = " or ".join("null" if a is None else repr(a) for a in check.allowed)
                    self.refused.append(f"{self._name(key)}={value!r} would {check.changes}; this code implements "
                                        f"{shown}")
            elif key in specific:
                self._accept(specific[key], key)
            elif key.startswith("_"):
                self._accept("bookkeeping", key)
            elif key in GENERATION_KEYS:
                self._accept("generation", key)
            elif key in ATTENTION_HINTS:
                self._accept("attention", key)
            elif key in DTYPE_HINTS:
                self._accept("dtype", key)
            elif key in TOKEN_ID_KEYS:
                self._accept("token_ids", key)
            elif key in GENERIC_4X or key in GENERIC_5X:
                self._accept("generic", key)
            else:
                self.unknown.append(key)
        return taken

    def refuse(self, key: str, value, changes: str, implemented: str):
        """For checks an adapter does itself (values that depend on other keys)."""
        self.refused.append(f"{self._name(key)}={value!r} would {changes}; this code implements {implemented}")

    def finish(self, kind: str) -> list:
        problems = []
        if self.refused:
            problems.append("unsupported values: " + "; ".join(self.refused))
        if problems:
            raise ConfigError(f"{self.label}: " + ". ".join(problems))
        if self.unknown:
            note = (f"{self.label}: unknown {kind} config keys {sorted(self.unknown)} accepted and not read: they are "
                    f"neither mapped nor of an accepted class ({DOC}); if one changes the model, its outputs may differ")
            log.warning(note)
            self.notes.append(note)
        for cls, keys in self.accepted.items():
            self.notes.append(f"{self.label}: accepted and ignored, {CLASS_NAMES.get(cls, cls)}: {', '.join(keys)}")
        return self.notes

    def _accept(self, cls: str, key: str):
        self.accepted.setdefault(cls, []).append(key)

    def _name(self, key: str) -> str:
        return f"{self.section}.{key}" if self.section not in ("config.json", "top level") else key
