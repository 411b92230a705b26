"""The transformers config classes for `model_type: NemotronH_Nano_VL_V2` and for the Nemotron 3 Nano Omni hub
directories' `model_type: NemotronH_Nano_Omni_Reasoning_V3` (registered by vl/hf/__init__.py).

Each carries the checkpoint's config.json as is (nested `llm_config` / `vision_config` / `sound_config` stay plain
dicts), so that transformers' loaders can read the directory without remote code. Neither is what our model is
built from: the model side reads config.json strictly through `vl.config` (`vl_config_from_hf`,
`omni_config_from_hf`), the one adapter per format. Registering them also silences transformers' "You are using a
model of type ... to instantiate a model of type ``" warning, printed whenever `AutoTokenizer` had to fall back to
the generic config class.
"""

from __future__ import annotations

from transformers.configuration_utils import PreTrainedConfig

from vl.hf.names import MODEL_TYPE, OMNI_HUB_MODEL_TYPE


class NemotronNanoVLV2Config(PreTrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def checkpoint_dict(self) -> dict:
        """The config.json fields (without the generic ones transformers adds to every config)."""
        return self.to_diff_dict()


class NemotronOmniHubConfig(NemotronNanoVLV2Config):
    """A Nemotron 3 Nano Omni hub directory's config.json, as is (the wrapper model builds transformers' own
    `NemotronH_Omni_Reasoning_V3_Config` from the same file for `model.config`)."""

    model_type = OMNI_HUB_MODEL_TYPE
