"""transformers integration: `AutoConfig`, `AutoModelForImageTextToText`, `AutoProcessor` and
`pipeline("image-text-to-text")` for `NemotronH_Nano_VL_V2` directories, with no `trust_remote_code`.

Registration follows transformers' own recipe for out-of-tree models (docs "Custom models": `AutoConfig.register`,
`AutoModelFor*.register`, `AutoProcessor.register`). It must cost nothing at `import vl`: importing any transformers
Auto module imports torch and takes seconds, and most users of `vl` never touch transformers. So this module only
installs an import hook, and each registration runs the moment transformers loads the module it extends:

- `transformers.models.auto.configuration_auto` -> our config class (vl/hf/config.py);
- `transformers.models.auto.processing_auto`     -> our processor class (vl/hf/processor.py);
- `transformers.models.auto.modeling_auto`       -> our model class. Its base `PreTrainedModel` lives in
  `transformers.modeling_utils`, which the tokenizer path (`AutoTokenizer`, hence `vl.load_processor`) never
  imports; importing it there would double that path's start-up. So the mapping first holds a stand-in whose
  `from_pretrained`/`from_config` import the real class (vl/hf/model.py), and the real class replaces the
  stand-in as soon as `transformers.modeling_utils` is loaded by anyone;
- `transformers.pipelines.image_text_to_text`    -> the S12 guard: for *our* processor only, plain (non-chat)
  pipeline inputs go through our decoding instead of transformers' `load_images`, which would fetch a URL or
  open a path (docs/reliability_policy.md §1.2). Other models' pipelines are untouched.
Modules already imported when `vl` is imported are handled at once. The checkpoint's `auto_map` is never used:
transformers prefers registered local classes over remote code (`explicit_local_code`).

Text-only `nemotron_h` directories are left to transformers' own, native `NemotronHForCausalLM` registration
(overriding it would change what every other user of transformers gets); use `vl.load_pretrained` / `vl.Engine`
for our implementation of them.
"""

from __future__ import annotations

import sys
import warnings

from vl.errors import GenerationOptionError
from vl.hf.names import (  # noqa: F401 - re-exported
    OUR_GENERATE_OPTIONS,
    LOADER_KEYS,
    MODEL_CLASS,
    MODEL_KEYS,
    MODEL_TYPE,
    PROCESSOR_CLASS,
    PROCESSOR_KEYS,
)

__all__ = ["MODEL_TYPE", "NemotronNanoVLV2Config", "NemotronNanoVLV2ForImageTextToText", "NemotronNanoVLV2Processor",
           "registered"]

_done: set[str] = set()


# --- the registrations (one per hooked module) ------------------------------------------------------------------------
def _register_config(module) -> None:
    from vl.hf.config import NemotronNanoVLV2Config

    module.AutoConfig.register(MODEL_TYPE, NemotronNanoVLV2Config, exist_ok=True)


def _register_processor(module) -> None:
    from vl.hf.config import NemotronNanoVLV2Config
    from vl.hf.processor import NemotronNanoVLV2Processor

    module.AutoProcessor.register(NemotronNanoVLV2Config, NemotronNanoVLV2Processor, exist_ok=True)


def _register_model(module) -> None:
    from vl.hf.config import NemotronNanoVLV2Config

    cls = _real_model_class(register=False) if _model_module_ready() else _ModelStandIn
    module.AutoModelForImageTextToText.register(NemotronNanoVLV2Config, cls, exist_ok=True)


def _on_modeling_utils(_module) -> None:
    if _model_module_ready():
        _real_model_class()


def _model_module_ready() -> bool:
    """vl/hf/model.py can be imported now: transformers.modeling_utils is complete and vl/hf/model.py is not
    itself halfway through importing it (then whoever imports it registers it when done)."""
    utils = sys.modules.get("transformers.modeling_utils")
    pending = sys.modules.get("vl.hf.model")
    return (utils is not None and hasattr(utils, "PreTrainedModel")
            and (pending is None or hasattr(pending, MODEL_CLASS)))


def _real_model_class(register: bool = True):
    """The real model class; registered in place of the stand-in when transformers' model registry is loaded."""
    from vl.hf.model import NemotronNanoVLV2ForImageTextToText

    auto = sys.modules.get("transformers.models.auto.modeling_auto")
    if register and auto is not None and hasattr(auto, "AutoModelForImageTextToText"):
        from vl.hf.config import NemotronNanoVLV2Config

        auto.AutoModelForImageTextToText.register(NemotronNanoVLV2Config, NemotronNanoVLV2ForImageTextToText,
                                                  exist_ok=True)
    return NemotronNanoVLV2ForImageTextToText


def _guard_pipeline(module) -> None:
    from transformers.utils.chat_template_utils import Chat

    cls = module.ImageTextToTextPipeline
    if getattr(cls.preprocess, "_vl_guard", False):
        return
    original = cls.preprocess

    def preprocess(self, inputs=None, timeout=None, continue_final_message=None, **processing_kwargs):
        plain = getattr(self.processor, "_vl_preprocess_plain", None)
        if plain is None or isinstance(inputs, Chat):
            return original(self, inputs, timeout=timeout, continue_final_message=continue_final_message,
                            **processing_kwargs)
        return plain(inputs, dtype=self.dtype, **processing_kwargs)  # never reaches transformers' load_images

    preprocess._vl_guard = True
    preprocess.__wrapped__ = original
    preprocess.__doc__ = original.__doc__
    cls.preprocess = preprocess

    original_sanitize = cls._sanitize_parameters

    def _sanitize_parameters(self, *args, **kwargs):
        preprocess_params, forward_params, postprocess_params = original_sanitize(self, *args, **kwargs)
        if getattr(getattr(self, "processor", None), "_vl_preprocess_plain", None) is not None:
            route_generation_args(preprocess_params, forward_params)
        return preprocess_params, forward_params, postprocess_params

    _sanitize_parameters.__wrapped__ = original_sanitize
    _sanitize_parameters.__doc__ = original_sanitize.__doc__
    cls._sanitize_parameters = _sanitize_parameters

    original_post = cls.postprocess

    def postprocess(self, model_outputs, *args, **kwargs):
        records = original_post(self, model_outputs, *args, **kwargs)
        if getattr(self.processor, "_vl_preprocess_plain", None) is None:
            return records
        return [_split_reply(r, _prompt_opened_think(self.processor.tokenizer, model_outputs.get("input_ids")))
                for r in records]

    postprocess.__wrapped__ = original_post
    postprocess.__doc__ = original_post.__doc__
    cls.postprocess = postprocess


def route_generation_args(preprocess_params: dict, forward_params: dict) -> None:
    """Generation arguments given directly to the pipeline call (`do_sample=False`, `temperature=...`) go to
    `generate`, as `generate_kwargs={...}` and `max_new_tokens` already do; transformers' image-text-to-text
    pipeline would hand them to the processor. A key is a generation argument when `GenerationConfig` has it and
    our processor does not take it; anything else stays with the processor, which refuses what it does not know."""
    from transformers.generation import GenerationConfig

    from vl.hf.processor import HF_TEMPLATE_KEYS, OUR_KEYS

    generation = ((set(GenerationConfig().to_dict()) | set(OUR_GENERATE_OPTIONS)) - set(HF_TEMPLATE_KEYS)
                  - set(OUR_KEYS) - {"transformers_version"})
    moved = {k: preprocess_params.pop(k) for k in list(preprocess_params) if k in generation}
    if not moved:
        return
    given = dict(forward_params.get("generate_kwargs") or {})
    twice = sorted(set(moved) & set(given))
    if twice:
        raise GenerationOptionError(f"{twice} given both directly and in generate_kwargs; pass each once")
    forward_params["generate_kwargs"] = {**given, **moved}


def _prompt_opened_think(tokenizer, input_ids) -> bool:
    if input_ids is None:
        return False
    from vl.processing.chat import opens_think

    row = input_ids[0] if getattr(input_ids, "ndim", 1) == 2 else input_ids
    return opens_think(tokenizer.decode(row, skip_special_tokens=False))  # the rule the engine's prompts follow


def _split_reply(record: dict, opened: bool) -> dict:
    """The default (chat) output's new assistant message carries the answer as `content` and the reasoning as
    `reasoning_content`, as the model card's reasoning parsers (vLLM's) return them, never a raw `</think>`.
    Plain-text outputs (`return_full_text=False`) and continued assistant messages stay as generated."""
    from vl.processing.chat import split_reasoning

    messages, inputs = record.get("generated_text"), record.get("input_text")
    if not (isinstance(messages, list) and isinstance(inputs, (list, tuple)) and len(messages) == len(inputs) + 1):
        return record
    last = messages[-1]
    if not (isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str)):
        return record
    reasoning, answer, _ = split_reasoning(last["content"], opened)
    reply = {**last, "content": answer}
    if reasoning or opened:
        reply["reasoning_content"] = reasoning
    return {**record, "generated_text": messages[:-1] + [reply]}


class _ModelStandIn:
    """Holds our row in `AutoModelForImageTextToText` until the real class can be imported without slowing
    down processes that never load a model. Every entry point returns the real class's result. Its module is
    "vl.hf", not "transformers.*", so transformers treats it as explicit local code, as it does the real class."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        return _real_model_class().from_pretrained(*args, **kwargs)

    @classmethod
    def from_config(cls, *args, **kwargs):
        return _real_model_class().from_config(*args, **kwargs)

    @classmethod
    def _from_config(cls, *args, **kwargs):
        return _real_model_class()._from_config(*args, **kwargs)


_ModelStandIn.__name__ = _ModelStandIn.__qualname__ = MODEL_CLASS


# --- the import hook ---------------------------------------------------------------------------------
_HOOKS = {
    "transformers.models.auto.configuration_auto": _register_config,
    "transformers.models.auto.processing_auto": _register_processor,
    "transformers.models.auto.modeling_auto": _register_model,
    "transformers.modeling_utils": _on_modeling_utils,
    "transformers.pipelines.image_text_to_text": _guard_pipeline,
}


def _run(name: str, module) -> None:
    if name in _done:
        return
    _done.add(name)
    try:
        _HOOKS[name](module)
    except Exception as exc:  # noqa: BLE001 - never break the user's `import transformers...`; say what broke
        warnings.warn(f"vl: could not register {MODEL_TYPE} with {name} ({type(exc).__name__}: {exc}); "
                      f"transformers' Auto classes / pipeline will not know our checkpoints. Use vl.Engine.",
                      RuntimeWarning, stacklevel=2)
    if _done >= set(_HOOKS):
        _uninstall()


class _AfterImport:  # a meta path finder (importlib.abc is not imported: it costs ~60 ms)
    """Runs a registration right after transformers finishes executing one of the modules in `_HOOKS`.

    Finds the real spec with the other finders and wraps that loader's `exec_module` (the module keeps its real
    loader, so `inspect`/`importlib.resources` behave as usual)."""

    def find_spec(self, name, path=None, target=None):
        if name not in _HOOKS or name in _done:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_register(module):
            exec_module(module)
            _run(name, module)

        loader.exec_module = exec_then_register
        return spec


_finder = _AfterImport()


def _uninstall() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def _install() -> None:
    # modules that are already imported get registered now, in dependency order; the rest when they load
    for name in _HOOKS:
        module = sys.modules.get(name)
        if module is not None:
            _run(name, module)
    if not _done >= set(_HOOKS) and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def registered() -> dict[str, bool]:
    """Which registrations have run (for diagnostics and tests)."""
    return {name: name in _done for name in _HOOKS}


def __getattr__(name):
    if name == "NemotronNanoVLV2Config":
        from vl.hf.config import NemotronNanoVLV2Config

        return NemotronNanoVLV2Config
    if name == "NemotronNanoVLV2Processor":
        from vl.hf.processor import NemotronNanoVLV2Processor

        return NemotronNanoVLV2Processor
    if name == "NemotronNanoVLV2ForImageTextToText":
        return _real_model_class()
    raise AttributeError(f"module 'vl.hf' has no attribute {name!r}")


_install()
