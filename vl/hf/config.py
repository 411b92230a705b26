"""The transformers config class for `model_type: NemotronH_Nano_VL_V2` (registered by vl/hf/__init__.py).

It carries the checkpoint's config.json as is (nested `llm_config` / `vision_config` stay plain dicts), so that
transformers' loaders can read the directory without remote code. It is not what our model is built from: the
model side reads config.json strictly through `vl.config.vl_config_from_hf`, the one adapter for this format.
Registering it also silences transformers' "You are using a model of type NemotronH_Nano_VL_V2 to instantiate a
model of type ``" warning, printed whenever `AutoTokenizer` had to fall back to the generic config class.
"""

from __future__ import annotations

from transformers.configuration_utils import PreTrainedConfig

from vl.hf.names import MODEL_TYPE


class NemotronNanoVLV2Config(PreTrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def checkpoint_dict(self) -> dict:
        """The config.json fields (without the generic ones transformers adds to every config)."""
        return self.to_diff_dict()
