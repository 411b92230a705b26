"""The names transformers knows our classes by, and the from_pretrained keywords each side takes (shared by the
registration in vl/hf/__init__.py and the classes it registers)."""

from vl.directory import NANO_VL_V2_CLASS as MODEL_TYPE
# Nemotron 3 Nano Omni's hub directories name their remote code's class as model_type (transformers' own Omni
# classes are registered under `nemotron_h_omni`, which is left to them)
from vl.directory import OMNI_HUB_CLASS as OMNI_HUB_MODEL_TYPE
# ... and their preprocessor_config.json's `processor_class`, their remote processor's name: a registered class of
# that name is what transformers' AutoProcessor resolves it to instead of offering to run the remote one
OMNI_HUB_PROCESSOR_CLASS = "NemotronH_Nano_Omni_Reasoning_V3Processor"
MODEL_CLASS = "NemotronNanoVLV2ForImageTextToText"
# The processor class name written by the reference checkpoints (preprocessor_config.json `processor_class`):
# transformers resolves that name among registered classes, so ours is found instead of the remote one.
PROCESSOR_CLASS = "NemotronNanoVLV2Processor"

# from_pretrained keywords. `pipeline(model_kwargs=...)` hands the same dict to the model and to the processor,
# so each side knows the other's options and leaves them alone; hub keywords have nothing to do locally.
LOADER_KEYS = ("_from_pipeline", "_from_auto", "_commit_hash", "trust_remote_code", "code_revision", "token",
               "local_files_only", "cache_dir", "force_download", "proxies", "subfolder", "user_agent", "use_fast")
MODEL_KEYS = ("dtype", "torch_dtype", "device_map", "video_pruning_rate", "attn_implementation", "max_memory",
              "scan_nan", "quant_mode", "adapter_kwargs")
PROCESSOR_KEYS = ("allowed_roots", "allow_remote_media", "limits", "isolate", "video_backend",
                  "timestamp_convention")

# generate options of our own (vl.Engine.chat's names), accepted by generate and routed there by the pipeline
OUR_GENERATE_OPTIONS = ("reasoning_budget", "cancel")
