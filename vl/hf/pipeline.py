"""`pipeline("image-text-to-text")` for Nano V2 VL: transformers' `ImageTextToTextPipeline` with three methods of
our own, in a subclass that only our checkpoints get.

transformers picks a pipeline class by task, never by model (`PIPELINE_REGISTRY`; the one model-keyed route,
`config.custom_pipelines`, needs `trust_remote_code` and code in the checkpoint folder). So vl/hf/__init__.py
points the task's registry entry at this class, and `NemotronNanoVLV2Pipeline(...)` builds transformers' own
`ImageTextToTextPipeline` for any processor that is not ours: other models get exactly what they get without
`vl`, and transformers' class is never modified. `pipeline(..., pipeline_class=NemotronNanoVLV2Pipeline)` selects
it explicitly.

What the subclass changes, for our processor only:
- `preprocess`: plain (non-chat) inputs go through our processor's decoding instead of transformers'
  `load_images`, which would fetch a URL or open any path (docs/reliability_policy.md §1.2, row S12). Chats
  already go through our `apply_chat_template`.
- `_sanitize_parameters`: generation arguments given directly to the call reach `generate`.
- `postprocess`: the new assistant message carries the answer as `content` and the reasoning as
  `reasoning_content`, as the model card's reasoning parsers (vLLM's) return them.
"""

from __future__ import annotations

from transformers.generation import GenerationConfig
from transformers.pipelines.image_text_to_text import ImageTextToTextPipeline
from transformers.utils.chat_template_utils import Chat

from vl.errors import GenerationOptionError
from vl.hf.names import OUR_GENERATE_OPTIONS
from vl.hf.processor import HF_TEMPLATE_KEYS, OUR_KEYS, NemotronNanoVLV2Processor
from vl.processing.chat import opens_think
from vl.processing.reasoning_text import split_reasoning

__all__ = ["NemotronNanoVLV2Pipeline", "route_generation_args"]


class NemotronNanoVLV2Pipeline(ImageTextToTextPipeline):
    """The image-text-to-text pipeline for a `NemotronNanoVLV2Processor`; any other processor gets transformers'
    `ImageTextToTextPipeline` itself (see `__new__`)."""

    def __new__(cls, *args, **kwargs):
        # the registry entry for the task names this class, so it is asked to build every model's pipeline; a
        # call without arguments (copy, pickle) only allocates
        if cls is NemotronNanoVLV2Pipeline and (args or kwargs) and not _is_ours(kwargs.get("processor")):
            return ImageTextToTextPipeline(*args, **kwargs)  # not our instance: Python skips our __init__
        return super().__new__(cls)

    def _sanitize_parameters(self, *args, **kwargs):
        preprocess_params, forward_params, postprocess_params = super()._sanitize_parameters(*args, **kwargs)
        route_generation_args(preprocess_params, forward_params)
        return preprocess_params, forward_params, postprocess_params

    def preprocess(self, inputs=None, timeout=None, continue_final_message=None, **processing_kwargs):
        if isinstance(inputs, Chat):
            return super().preprocess(inputs, timeout=timeout, continue_final_message=continue_final_message,
                                      **processing_kwargs)
        # never reaches transformers' load_images
        return self.processor._vl_preprocess_plain(inputs, dtype=self.dtype, **processing_kwargs)

    def postprocess(self, model_outputs, *args, **kwargs):
        records = super().postprocess(model_outputs, *args, **kwargs)
        return [_split_reply(r, _prompt_opened_think(self.processor.tokenizer, model_outputs.get("input_ids")))
                for r in records]


def _is_ours(processor) -> bool:
    return isinstance(processor, NemotronNanoVLV2Processor)


def route_generation_args(preprocess_params: dict, forward_params: dict) -> None:
    """Generation arguments given directly to the pipeline call (`do_sample=False`, `temperature=...`) go to
    `generate`, as `generate_kwargs={...}` and `max_new_tokens` already do; transformers' image-text-to-text
    pipeline would hand them to the processor. A key is a generation argument when `GenerationConfig` has it and
    our processor does not take it; anything else stays with the processor, which refuses what it does not know."""
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
    row = input_ids[0] if getattr(input_ids, "ndim", 1) == 2 else input_ids
    return opens_think(tokenizer.decode(row, skip_special_tokens=False))  # the rule the engine's prompts follow


def _split_reply(record: dict, opened: bool) -> dict:
    """The default (chat) output's new assistant message carries the answer as `content` and the reasoning as
    `reasoning_content`, never a raw `</think>`. Plain-text outputs (`return_full_text=False`) and continued
    assistant messages stay as generated."""
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
