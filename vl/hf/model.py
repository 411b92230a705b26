"""`AutoModelForImageTextToText` for Nano V2 VL directories: a thin `PreTrainedModel` over our `NemotronVL`.

Loading is `vl.Engine.from_pretrained` (our strict loader, no remote code), so the wrapper holds exactly the model
and stop ids the engine uses. `generate` speaks transformers' interface (`max_new_tokens`, `max_length`,
`min_new_tokens`, `do_sample`, `temperature`, `top_k`, `top_p`, `repetition_penalty`, `eos_token_id`,
`pad_token_id`, `streamer`, `generation_config`, `return_dict_in_generate`, `stop_strings` with `tokenizer`,
`max_time`) plus ours (`reasoning_budget`, `cancel`), and collects what the engine's one generation loop
(vl/runtime/batch.py `run_batch`) produces: same vision encoding per media item, same prefill chunks, same sampling,
same stop strings, time limits and budgets, hence the same tokens as `vl.Engine.chat`. Options it cannot honour
(beam search, several return sequences, logits processors, ...) raise instead of being ignored. `save_pretrained` writes the Nano V2 VL layout
(`vl.checkpoint.nano_vl.save_pretrained`) plus generation_config.json.

A Nemotron 3 Nano Omni directory loads too, when this class is named explicitly (transformers keeps its own
`nemotron_h_omni` classes for the Auto route) or, for a hub directory (`NemotronH_Nano_Omni_Reasoning_V3`), through
the Auto classes as `NemotronOmniHubForImageTextToText`: the engine's Omni model under transformers' own config
object, `generate` taking the processor's `omni_inputs`; `forward` and `save_pretrained` refuse it
(docs/transformers.md).

Conventions kept from transformers: the returned sequences are prompt + new tokens, the stop token included,
finished rows padded with `pad_token_id`; a streamer first receives the prompt ids, then each step's tokens;
sampling draws from the global torch RNG, so `torch.manual_seed` makes a sampled call reproducible.
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path

import torch
from transformers import NemotronH_Omni_Reasoning_V3_Config
from transformers.generation import GenerationConfig
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.modeling_utils import PreTrainedModel

from vl.checkpoint.nano_vl import save_pretrained as save_nano_vl
from vl.config import vl_config_from_hf
from vl.config_policy import of_generic_class
from vl.directory import checkpoint_kind, read_config, resolve_dir
from vl.errors import CheckpointError, ConfigError, GenerationOptionError, InputError
from vl.hf.config import NemotronNanoVLV2Config, NemotronOmniHubConfig
from vl.hf.names import LOADER_KEYS, OUR_GENERATE_OPTIONS, PROCESSOR_KEYS
from vl.modeling.omni import NemotronOmni
from vl.modeling.vlm import MediaSpan, NemotronVL
from vl.processing.chat import opens_think
from vl.processing.omni_processor import OmniInputs
from vl.processing.processor import Processor
from vl.runtime.batch import ChatRequest, Processed, Tokenized, run_batch
from vl.runtime.engine import Engine
from vl.runtime.results import Stats
from vl.runtime.sampling import SamplingParams

DEFAULT_MAX_NEW_TOKENS = 256  # vl.Engine.chat's default, used when neither max_new_tokens nor max_length is set
# transformers' global defaults (GenerationConfig._get_default_generation_params) for what we implement
SAMPLING_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}
SUPPORTED = set(SAMPLING_DEFAULTS) | {"max_new_tokens", "min_new_tokens", "max_length", "eos_token_id",
                                      "pad_token_id", "stop_strings", "max_time", "bos_token_id",
                                      "decoder_start_token_id", "return_dict_in_generate",
                                      "use_cache", "num_beams", "num_return_sequences", "transformers_version",
                                      "_from_model_config", "min_length", "output_scores", "output_logits",
                                      "output_attentions", "output_hidden_states", "cache_implementation"}
NEUTRAL = {"num_beams": 1, "num_return_sequences": 1, "min_length": 0, "output_scores": False, "output_logits": False,
           "output_attentions": False, "output_hidden_states": False, "use_cache": True}
UNSUPPORTED_INPUTS = ("inputs_embeds", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn",
                      "assistant_model", "negative_prompt_ids")
MODEL_OPTIONS = ("dtype", "torch_dtype", "device_map", "video_pruning_rate")
REFUSED_OPTIONS = ("max_memory", "scan_nan", "quant_mode")  # vl.load_pretrained options the engine does not take
_CONFIG_METADATA = {"transformers_version", "torch_dtype", "dtype", "_name_or_path"}


def _transformers_omni_config(directory: Path) -> NemotronH_Omni_Reasoning_V3_Config:
    """transformers' own config object for an Omni directory, built from its config.json by the class itself (the
    model is ours; this object only carries the settings): a released directory names its remote-code class
    (`model_type: NemotronH_Nano_Omni_Reasoning_V3`), which AutoConfig does not know and would offer to run, and its
    `sound_config` says `model_type: parakeet`, which transformers 5.24's class keeps and then fails on.
    `get_config_dict` reads the file as transformers does (its `{"__float__": "Infinity"}` values decoded)."""
    raw, _ = NemotronH_Omni_Reasoning_V3_Config.get_config_dict(str(directory))
    for key in ("model_type", "auto_map"):
        raw.pop(key, None)
    for key in ("sound_config", "audio_config"):
        if isinstance(raw.get(key), dict) and raw[key].get("model_type") == "parakeet":
            raw[key].pop("model_type")
    return NemotronH_Omni_Reasoning_V3_Config(**raw)


class NemotronNanoVLV2ForImageTextToText(PreTrainedModel):
    config_class = NemotronNanoVLV2Config
    base_model_prefix = "model"
    main_input_name = "input_ids"
    input_modalities = ("image", "video", "text")
    output_modalities = ("text",)
    _supports_sdpa = True
    _no_split_modules = []

    def __init__(self, config: NemotronNanoVLV2Config, *, engine=None, model=None):
        super().__init__(config)
        if engine is not None:
            model = engine.model
        if model is None:  # from_config: a randomly initialised model of this shape
            model = NemotronVL(vl_config_from_hf(config.checkpoint_dict(), where="the config object"))
        self.model = model  # the registered submodule: .to(), .parameters(), .device follow it
        self._engine = engine
        stops = sorted(engine.stop_ids) if engine is not None else list(self.lm.config.eos_token_id)
        self.generation_config.eos_token_id = stops
        if self.generation_config.pad_token_id is None:
            self.generation_config.pad_token_id = self.lm.config.pad_token_id

    # --- loading / saving ----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, **kwargs):
        """Our loader (vl.Engine.from_pretrained) on a local directory. Accepts `dtype` (or `torch_dtype`,
        "auto" = the checkpoint's), `device_map`, `video_pruning_rate`; transformers' hub keywords are
        accepted and have nothing to do for a local directory."""
        if model_args:
            raise ConfigError(f"unexpected positional arguments {model_args}; pass options by keyword")
        revision = kwargs.pop("revision", None)
        if revision not in (None, "main"):
            raise ConfigError(f"revision={revision!r}: only local directories (or hub ids already cached) are "
                              f"loaded; check out that revision yourself and pass its directory")
        if kwargs.get("attn_implementation") not in (None, "sdpa"):
            raise ConfigError(f"attn_implementation={kwargs['attn_implementation']!r}: this model always uses "
                              f"PyTorch SDPA for its attention layers")
        kwargs.pop("attn_implementation", None)
        if "_adapter_model_path" in (kwargs.pop("adapter_kwargs", None) or {}):
            raise ConfigError("the directory holds a PEFT adapter; adapters are not supported by this loader")
        refused = sorted(k for k in REFUSED_OPTIONS if kwargs.get(k) is not None)
        if refused:
            raise ConfigError(f"{refused} are not available through transformers; use vl.load_pretrained")
        options = {k: kwargs.pop(k) for k in MODEL_OPTIONS if k in kwargs}
        unknown = sorted(k for k in kwargs if k not in LOADER_KEYS + PROCESSOR_KEYS + REFUSED_OPTIONS)
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown}; known: {', '.join(MODEL_OPTIONS)}")
        dtype = options.get("dtype", options.get("torch_dtype"))
        directory = resolve_dir(pretrained_model_name_or_path)
        raw = read_config(directory)
        if checkpoint_kind(raw, directory) == "nemotron_h_omni":
            if config is not None and not isinstance(config, NemotronOmniHubConfig):
                raise ConfigError("config= is not taken for a Nemotron 3 Nano Omni directory (its settings would not "
                                  "reach our loader); edit its config.json")
            if config is not None:  # AutoConfig's reading of a hub directory (the pipeline passes it on)
                _check_same_config(config, raw, directory)
            # transformers' own config class reads it (its nested text / vision / audio configs included); the model
            # is still built by our loader from config.json (docs/transformers.md, "Nemotron 3 Nano Omni")
            config = _transformers_omni_config(directory)
        elif config is None:
            config = NemotronNanoVLV2Config.from_pretrained(str(directory))
        else:
            _check_same_config(config, raw, directory)
        engine = Engine.from_pretrained(directory, dtype=None if dtype == "auto" else dtype,
                                        device_map=options.get("device_map"),
                                        video_pruning_rate=options.get("video_pruning_rate"))
        model = cls(config, engine=engine)
        generation_file = directory / "generation_config.json"
        if generation_file.exists():
            stops = model.generation_config.eos_token_id
            model.generation_config = GenerationConfig.from_pretrained(str(directory))
            model.generation_config.eos_token_id = stops  # the engine's set already includes the file's
        model.name_or_path = config._name_or_path = str(directory)
        return model.eval()

    @classmethod
    def _from_config(cls, config, **kwargs):
        dtype = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))
        if kwargs:
            raise ConfigError(f"unknown option(s) {sorted(kwargs)} for from_config; known: dtype")
        model = cls(config)
        return model.to(dtype) if isinstance(dtype, torch.dtype) else model

    def save_pretrained(self, save_directory, is_main_process: bool = True, state_dict=None,
                        push_to_hub: bool = False, max_shard_size="4GB", safe_serialization: bool = True, **kwargs):
        """The Nano V2 VL layout (config.json + safetensors, reloadable by vl and by this class) plus
        generation_config.json. The tokenizer is the processor's to save (`pipeline.save_pretrained` does both)."""
        if kwargs:
            raise ConfigError(f"unsupported save_pretrained option(s) {sorted(kwargs)}")
        if push_to_hub:
            raise ConfigError("push_to_hub is not supported here (no network); upload the directory yourself")
        if state_dict is not None or not safe_serialization:
            raise ConfigError("only the model's own weights are saved, as safetensors")
        if isinstance(self.model, NemotronOmni):
            raise ConfigError("save_pretrained writes the Nano V2 VL layout; a Nemotron 3 Nano Omni model is not "
                              "saved by this class (copy its checkpoint directory instead)")
        if not is_main_process:
            return None
        directory = save_nano_vl(self.model, save_directory, max_shard_bytes=_shard_bytes(max_shard_size))
        self.generation_config.save_pretrained(str(directory))
        return directory

    # --- properties --------------------------------------------------------------------------------------
    @property
    def lm(self):
        return getattr(self.model, "language_model", self.model)

    @property
    def engine(self):
        """The `vl.Engine` this model was loaded with (chat, streaming events, reasoning budget); None for a
        model built with from_config."""
        return self._engine

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.backbone.embeddings.weight.dtype

    def get_input_embeddings(self):
        return self.lm.backbone.embeddings

    # --- forward / generate ----------------------------------------------------------------------------
    def forward(self, input_ids=None, pixel_values=None, attention_mask=None, media=None, video_pruning_rate=None,
                token_pruning_rate=None, inputs_embeds=None, labels=None, **kwargs):
        """Logits for a batch of one row with its media (our model's forward; fp32 logits)."""
        if labels is not None:
            raise InputError("training through transformers is not supported; see data_recipes/ for training")
        if isinstance(self.model, NemotronOmni):
            raise InputError("forward is not offered for a Nemotron 3 Nano Omni model through this class: use "
                             "generate (the pipeline) or vl.Engine, or transformers' own class for logits")
        if kwargs:
            raise InputError(f"unsupported forward argument(s) {sorted(kwargs)}")
        if pixel_values is not None and pixel_values.shape[0] == 0:
            pixel_values = None
        if inputs_embeds is None and hasattr(self.model, "prepare_inputs"):
            inputs_embeds, attention_mask, _ = self.model.prepare_inputs(
                input_ids, pixel_values, media, attention_mask, video_pruning_rate=video_pruning_rate,
                token_pruning_rate=token_pruning_rate or 0.0)
        return self.model(input_ids=None if inputs_embeds is not None else input_ids, attention_mask=attention_mask,
                          inputs_embeds=inputs_embeds)

    @classmethod
    def can_generate(cls) -> bool:
        return True

    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask=None, pixel_values=None, media=None, video_pruning_rate=None,
                 token_pruning_rate=None, generation_config: GenerationConfig | None = None, streamer=None,
                 omni_inputs=None, **kwargs):
        """A thin collector of the engine's generation loop (vl/runtime/batch.py `run_batch`): each row is one
        request of a batch, so stop strings, `max_time` (transformers' time limit), `reasoning_budget` and
        `cancel` (a `threading.Event`; both ours) work as they do in `vl.Engine.chat`, and greedy answers equal
        its answers. `omni_inputs` (a Nemotron 3 Nano Omni directory: the processor's `OmniInputs` per row, see
        vl/hf/processor.py) go to the engine as media processed ahead, so its encoders read them as they read a
        chat's."""
        if input_ids is None:
            raise InputError("generate needs input_ids (build them with the processor)")
        unknown_inputs = sorted(k for k in UNSUPPORTED_INPUTS if kwargs.get(k) is not None)
        if unknown_inputs:
            raise GenerationOptionError(f"{unknown_inputs} are not supported by this model's generate")
        for k in UNSUPPORTED_INPUTS + ("synced_gpus",):
            kwargs.pop(k, None)
        engine = self._generation_engine(kwargs.pop("tokenizer", None))
        ours = {k: kwargs.pop(k) for k in OUR_GENERATE_OPTIONS if k in kwargs}
        gc = _resolve(generation_config or self.generation_config, kwargs)
        b = input_ids.shape[0]
        if streamer is not None and b != 1:
            raise GenerationOptionError(f"a streamer takes one sequence; found a batch of {b}")
        rows = _rows(input_ids, attention_mask)
        omni = _rows_omni(omni_inputs, b, rows)
        spans = _rows_media(media, b)
        tiles = _split_tiles(pixel_values, spans)
        longest = max(len(r) for r in rows)
        max_new = gc["max_new_tokens"]
        if max_new is None:
            max_new = DEFAULT_MAX_NEW_TOKENS if gc["max_length"] is None else gc["max_length"] - longest
            if max_new < 1:
                raise GenerationOptionError(f"max_length={gc['max_length']} leaves no room after the {longest}-token "
                                            f"prompt; set max_new_tokens")
        new: list[list[int]] = [[] for _ in range(b)]
        prompts = omni or [Tokenized(ids[None], row_tiles, row_spans,
                                     opens_think(engine.tokenizer.decode(ids, skip_special_tokens=False)))
                           for ids, row_tiles, row_spans in zip(rows, tiles, spans)]
        requests = [ChatRequest(prompt,
                                max_new_tokens=max_new, min_tokens=gc["min_new_tokens"],
                                reasoning_budget=ours.get("reasoning_budget"),
                                stop=gc["stop_strings"],
                                video_pruning_rate=vpr, token_pruning_rate=tpr, cancel=ours.get("cancel"),
                                timeout_s=gc["max_time"], on_token=new[i].append)
                    for i, (prompt, vpr, tpr)
                    in enumerate(zip(prompts, _per_row(video_pruning_rate, b, None),
                                     _per_row(token_pruning_rate, b, 0.0)))]
        # Omni prompts arrive processed (Engine.process's output), as a server's do: run_batch takes them as such
        ready = None if omni is None else (lambda req: Processed(req.messages, Stats(notes=list(req.messages.notes)),
                                                                 time.perf_counter()))
        if streamer is not None:
            streamer.put(input_ids.cpu())
            requests[0].on_token = lambda tok: (new[0].append(tok), streamer.put(torch.tensor([tok])))
        try:
            for _ in run_batch(engine, requests, gc["params"], stop_ids=gc["stop_ids"], processed=ready):
                pass
        finally:
            if streamer is not None:
                streamer.end()
        pad = gc["pad_token_id"]
        n = max(len(r) for r in new)
        out = torch.tensor([r + [pad] * (n - len(r)) for r in new], dtype=torch.long, device=input_ids.device)
        sequences = torch.cat([input_ids, out], dim=1)
        if gc["return_dict_in_generate"]:
            return GenerateDecoderOnlyOutput(sequences=sequences)
        return sequences

    def _generation_engine(self, tokenizer):
        """The engine this model was loaded with; a model built with from_config gets one over its own weights
        and the tokenizer the caller passes (the loop decodes text for stop strings and the reasoning budget)."""
        if self._engine is not None:
            return self._engine
        if tokenizer is None:
            raise GenerationOptionError("this model was built with from_config and has no tokenizer: pass "
                                        "tokenizer=processor.tokenizer to generate (or load it with from_pretrained)")
        return Engine(self.model, Processor(tokenizer, self.model.config), stop_ids=self.generation_config.eos_token_id)


# --- option and input plumbing ------------------------------------------------------------------------------
def _resolve(base: GenerationConfig, kwargs: dict) -> dict:
    """transformers' precedence (call kwargs over generation_config over global defaults) -> our SamplingParams.
    Anything set that we do not implement raises instead of being ignored."""
    gc = copy.deepcopy(base)
    unused = gc.update(**kwargs)
    if unused:
        raise GenerationOptionError(f"unknown generate option(s) {sorted(unused)}; supported: "
                                    f"{', '.join(sorted(SUPPORTED - {'transformers_version', '_from_model_config'}))}")
    defaults = _global_defaults()
    for key, value in gc.to_diff_dict().items():
        if key in SUPPORTED or value is None or defaults.get(key, object()) == value:
            continue
        raise GenerationOptionError(f"generate option {key}={value!r} is not supported by this model (supported: "
                                    f"sampling via do_sample/temperature/top_k/top_p/repetition_penalty, "
                                    f"max_new_tokens/max_length/max_time, eos/pad ids, stop_strings, streamer)")
    for key, neutral in NEUTRAL.items():
        value = getattr(gc, key, None)
        if value is not None and value != neutral:
            raise GenerationOptionError(f"{key}={value!r} is not supported (only {neutral!r}); this model decodes "
                                        f"one greedy or sampled sequence per prompt")
    get = {k: SAMPLING_DEFAULTS[k] if getattr(gc, k) is None else getattr(gc, k) for k in SAMPLING_DEFAULTS}
    if get["do_sample"]:
        if not get["temperature"] > 0:
            raise GenerationOptionError(f"do_sample=True needs temperature > 0, found {get['temperature']!r}; use "
                                        f"do_sample=False for greedy decoding")
        seed = int(torch.randint(0, 2**62, (1,)).item())  # from the global RNG, as transformers samples
        params = SamplingParams(temperature=float(get["temperature"]), top_k=int(get["top_k"] or 0),
                                top_p=float(get["top_p"]), repetition_penalty=float(get["repetition_penalty"]),
                                seed=seed)
    else:
        params = SamplingParams(repetition_penalty=float(get["repetition_penalty"]))
    eos = gc.eos_token_id
    stops = set() if eos is None else {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}
    pad = gc.pad_token_id if gc.pad_token_id is not None else (min(stops) if stops else 0)
    strings = gc.stop_strings
    strings = [] if strings is None else [strings] if isinstance(strings, str) else list(strings)
    if not all(isinstance(x, str) and x for x in strings):
        raise GenerationOptionError(f"stop_strings must be non-empty strings, found {gc.stop_strings!r}")
    return {"params": params, "stop_ids": stops, "pad_token_id": int(pad), "max_new_tokens": gc.max_new_tokens,
            "min_new_tokens": int(gc.min_new_tokens or 0),  # the eos ids are masked until then (our min_tokens)
            "max_length": gc.max_length, "return_dict_in_generate": bool(gc.return_dict_in_generate),
            "stop_strings": strings, "max_time": gc.max_time}


def _global_defaults() -> dict:
    get = getattr(GenerationConfig, "_get_default_generation_params", None)  # private in transformers 5
    return get() if callable(get) else {}


def _per_row(value, b: int, default):
    """A model-side option as our processor passes it: one float, or one per row after pipeline collation."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * b
    if len(values) != b:
        raise InputError(f"expected one value per row ({b}), found {len(values)}")
    return [default if v is None else float(v) for v in values]


def _rows(input_ids, attention_mask) -> list[torch.Tensor]:
    """(b, t) ids + mask (left or right padding) -> the real ids of each row."""
    if input_ids.ndim != 2:
        raise InputError(f"input_ids: expected (batch, length), found {tuple(input_ids.shape)}")
    if attention_mask is None:
        return [row.cpu() for row in input_ids]
    if attention_mask.shape != input_ids.shape:
        raise InputError(f"attention_mask {tuple(attention_mask.shape)} does not match input_ids "
                         f"{tuple(input_ids.shape)}")
    rows = [ids[m.bool()].cpu() for ids, m in zip(input_ids, attention_mask)]
    if any(len(r) == 0 for r in rows):
        raise InputError("a row of attention_mask is all zeros: that row has no prompt")
    return rows


def _rows_media(media, b: int) -> list[list]:
    """`media` as our processor writes it: a flat span list for one row, or one list per row (batches, and
    transformers' pipeline collation of single rows)."""
    if media is None:
        return [[] for _ in range(b)]
    media = list(media)
    if b == 1 and all(isinstance(m, MediaSpan) for m in media):
        return [media]
    if len(media) != b or not all(isinstance(r, (list, tuple)) and all(isinstance(m, MediaSpan) for m in r)
                                  for r in media):
        raise InputError(f"media: expected one list of MediaSpan per row ({b} rows); build inputs with the "
                         f"processor")
    return [list(r) for r in media]


def _rows_omni(omni_inputs, b: int, rows: list[torch.Tensor]) -> list | None:
    """`omni_inputs` as our processor writes them (one `OmniInputs` per row; nested one level by transformers'
    pipeline collation), checked against the rows' ids; None for a Nano V2 VL prompt."""
    if omni_inputs is None:
        return None
    flat = list(omni_inputs) if isinstance(omni_inputs, (list, tuple)) else [omni_inputs]
    flat = [x for item in flat for x in (item if isinstance(item, (list, tuple)) else [item])]
    if len(flat) != b or not all(isinstance(x, OmniInputs) for x in flat):
        raise InputError(f"omni_inputs: expected one OmniInputs per row ({b} rows); build inputs with the processor")
    for x, ids in zip(flat, rows):
        if not torch.equal(x.input_ids[0].cpu(), ids):
            raise InputError("omni_inputs do not match input_ids; build both with the processor in one call")
    return flat


def _split_tiles(pixel_values, spans: list[list]) -> list:
    need = [sum(s.num_tiles for s in row) for row in spans]
    have = 0 if pixel_values is None else pixel_values.shape[0]
    if have != sum(need):
        raise InputError(f"pixel_values has {have} tiles but the media spans describe {sum(need)}; build inputs "
                         f"with the processor")
    out, start = [], 0
    for n in need:
        out.append(None if n == 0 else pixel_values[start:start + n])
        start += n
    return out


class NemotronOmniHubForImageTextToText(NemotronNanoVLV2ForImageTextToText):
    """The same wrapper under the Omni hub directories' config class (`model_type: NemotronH_Nano_Omni_Reasoning_V3`),
    so that `AutoModelForImageTextToText` and `pipeline(model=OMNI_HUB_DIR)` reach it: transformers pairs each
    registered model class with one config class."""

    config_class = NemotronOmniHubConfig


def _check_same_config(config, raw: dict, directory: Path) -> None:
    """A config object handed in must describe this directory: overrides would not reach our loader."""
    if not isinstance(config, NemotronNanoVLV2Config):  # NemotronOmniHubConfig included
        raise ConfigError(f"config must be a NemotronNanoVLV2Config, found {type(config).__name__}")
    for key, value in raw.items():
        if key in _CONFIG_METADATA or of_generic_class(key):  # transformers may move or drop these (5.x moves
            continue  # generation defaults out of the config); they cannot change what the loader builds
        if json.loads(json.dumps(getattr(config, key, None))) != value:
            raise CheckpointError(f"config.{key} differs from {directory / 'config.json'}; changed settings are not "
                                  f"applied by this loader: edit config.json (or use vl.load_pretrained)")


def _shard_bytes(size) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B)\s*", str(size), re.IGNORECASE)
    if not m:
        raise ConfigError(f"max_shard_size={size!r}: expected bytes or a string like '4GB'")
    unit = m.group(2).upper()
    scale = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}[unit]
    return int(float(m.group(1)) * scale)
