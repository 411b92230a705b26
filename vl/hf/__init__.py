"""transformers integration: `AutoConfig`, `AutoModelForImageTextToText`, `AutoProcessor` and
`pipeline("image-text-to-text")` for `NemotronH_Nano_VL_V2` directories and the Nemotron 3 Nano Omni hub directories
(`NemotronH_Nano_Omni_Reasoning_V3`, their remote code's name), with no `trust_remote_code`.

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
- `transformers.pipelines`                      -> the `image-text-to-text` task's registry entry names our pipeline
  class (vl/hf/pipeline.py) by its dotted path, as transformers' own entries do. transformers picks a pipeline
  class by task only, so every model's pipeline is asked of that class; for any processor but ours it builds
  transformers' own `ImageTextToTextPipeline`, unchanged. Our checkpoints get the subclass: the S12 guard (plain
  inputs never reach transformers' `load_images`, which would fetch a URL or open a path;
  docs/reliability_policy.md §1.2) and the answer/reasoning split. No transformers class is modified.
Modules already imported when `vl` is imported are handled at once. The checkpoint's `auto_map` is never used:
transformers prefers registered local classes over remote code (`explicit_local_code`).

Text-only `nemotron_h` directories are left to transformers' own, native `NemotronHForCausalLM` registration
(overriding it would change what every other user of transformers gets); use `vl.load_pretrained` / `vl.Engine`
for our implementation of them.
"""

from __future__ import annotations

import sys
import warnings

from vl.hf.names import (  # noqa: F401 - re-exported
    OUR_GENERATE_OPTIONS,
    LOADER_KEYS,
    MODEL_CLASS,
    MODEL_KEYS,
    MODEL_TYPE,
    PROCESSOR_CLASS,
    PROCESSOR_KEYS,
)

__all__ = ["MODEL_TYPE", "NemotronNanoVLV2Config", "NemotronNanoVLV2ForImageTextToText", "NemotronNanoVLV2Pipeline",
           "NemotronNanoVLV2Processor", "registered"]

PIPELINE_TASK = "image-text-to-text"
PIPELINE_IMPL = "vl.hf.pipeline.NemotronNanoVLV2Pipeline"
_TRANSFORMERS_PIPELINE_IMPL = "transformers.pipelines.image_text_to_text.ImageTextToTextPipeline"

_done: set[str] = set()


# --- the registrations (one per hooked module) ------------------------------------------------------------------------
def _config_classes():
    from vl.hf.config import NemotronNanoVLV2Config, NemotronOmniHubConfig

    return NemotronNanoVLV2Config, NemotronOmniHubConfig


def _register_config(module) -> None:
    for config_class in _config_classes():
        module.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)


def _register_processor(module) -> None:
    from vl.hf.config import NemotronNanoVLV2Config, NemotronOmniHubConfig
    from vl.hf.processor import NemotronNanoVLV2Processor, NemotronOmniHubProcessor

    module.AutoProcessor.register(NemotronNanoVLV2Config, NemotronNanoVLV2Processor, exist_ok=True)
    module.AutoProcessor.register(NemotronOmniHubConfig, NemotronOmniHubProcessor, exist_ok=True)


def _register_model(module) -> None:
    if _model_module_ready():
        _real_model_class()
        return
    for config_class in _config_classes():
        module.AutoModelForImageTextToText.register(config_class, _ModelStandIn, exist_ok=True)


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
    """The real model class; registered in place of the stand-in when transformers' model registry is loaded
    (with its subclass for the Omni hub config: transformers pairs each model class with one config class)."""
    from vl.hf.model import NemotronNanoVLV2ForImageTextToText, NemotronOmniHubForImageTextToText

    auto = sys.modules.get("transformers.models.auto.modeling_auto")
    if register and auto is not None and hasattr(auto, "AutoModelForImageTextToText"):
        for cls in (NemotronNanoVLV2ForImageTextToText, NemotronOmniHubForImageTextToText):
            auto.AutoModelForImageTextToText.register(cls.config_class, cls, exist_ok=True)
    return NemotronNanoVLV2ForImageTextToText


def _register_pipeline(module) -> None:
    tasks = module.PIPELINE_REGISTRY.supported_tasks
    entry = tasks[PIPELINE_TASK]
    impl = entry["impl"]
    name = impl if isinstance(impl, str) else f"{impl.__module__}.{impl.__qualname__}"
    if name == PIPELINE_IMPL:
        return
    if name != _TRANSFORMERS_PIPELINE_IMPL:  # someone else's pipeline: theirs stays
        raise RuntimeError(f"the {PIPELINE_TASK!r} task is registered to {name}, not to transformers' own class; "
                           f"left as it is (pass pipeline_class=vl.hf.NemotronNanoVLV2Pipeline to pipeline())")
    tasks[PIPELINE_TASK] = {**entry, "impl": PIPELINE_IMPL}  # resolved (imported) only when a pipeline is built


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
    "transformers.pipelines": _register_pipeline,
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
    if name == "NemotronNanoVLV2Pipeline":
        from vl.hf.pipeline import NemotronNanoVLV2Pipeline

        return NemotronNanoVLV2Pipeline
    if name == "route_generation_args":
        warnings.warn("vl.hf.route_generation_args moved to vl.hf.pipeline.route_generation_args; the old name goes "
                      "in the next release", DeprecationWarning, stacklevel=2)
        from vl.hf.pipeline import route_generation_args

        return route_generation_args
    raise AttributeError(f"module 'vl.hf' has no attribute {name!r}")


_install()
