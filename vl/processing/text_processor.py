"""Messages -> model inputs for text-only Nemotron-H checkpoints (`model_type: nemotron_h`).

The same prompt format, reasoning toggle and think handling as the vision processor, from the one place they
live (vl/processing/chat.py); only the media path is absent. A media part is refused before anything is read or
decoded, with a typed `InputError`, so a text-only model never silently drops an image the user sent.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from vl.errors import InputError, NoVisionError
from vl.options import PROCESSOR, names
from vl.processing import chat
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.processing.processor import ProcessedInputs, check_prompt_size, max_chars_per_token, tokenizer_stop_ids

# The request options that act in the processor (vl/options.py) only concern media; accepted (the engine and the
# UI pass them to every processor) and without effect here, since a text-only prompt has no media to tile, sample
# or render.
MEDIA_OPTIONS = names(acts=PROCESSOR)


def media_kinds(messages) -> list[str]:
    """The media part types in `messages` (raw, before any validation), in order."""
    found = []
    for message in messages if isinstance(messages, (list, tuple)) else ():
        content = message.get("content") if isinstance(message, Mapping) else None
        for item in content if isinstance(content, (list, tuple)) else ():
            if isinstance(item, Mapping) and item.get("type") in ("image", "video", "pdf"):
                found.append(item["type"])
    return found


class TextProcessor:
    """Tokenizer + chat format; the text-only twin of `vl.processing.processor.Processor`."""

    has_vision = False

    def __init__(self, tokenizer, config=None, *, limits: MediaLimits = DEFAULT_LIMITS, **_ignored_media_policy):
        # media policy (limits, allowed_roots, isolate, ...) is accepted so that callers can build either
        # processor with the same keywords; there is no media to apply it to. `limits` is kept: the server counts
        # media parts against it before refusing them (`no_vision`), as for a model that sees.
        self.tokenizer, self.config, self.limits = tokenizer, config, limits
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.chars_per_token = max_chars_per_token(tokenizer)

    def __call__(self, messages, *, thinking: bool | None = None, add_generation_prompt: bool = True,
                 **media_options) -> ProcessedInputs:
        unknown = sorted(set(media_options) - set(MEDIA_OPTIONS))
        if unknown:
            raise InputError(f"unknown processor option(s) {unknown}; known: {', '.join(MEDIA_OPTIONS)}")
        kinds = media_kinds(messages)
        if kinds:
            raise NoVisionError(f"this is a text-only model (Nemotron-H without a vision tower); the messages hold "
                                f"{len(kinds)} media part(s) ({', '.join(sorted(set(kinds)))}). Send text only, or "
                                f"load a Nemotron Nano V2 VL checkpoint for images, documents and video")
        prompt = chat.render_prompt(messages, self.tokenizer, thinking=thinking,
                                    add_generation_prompt=add_generation_prompt,
                                    template_kwargs=media_options.get("template_kwargs"))
        check_prompt_size(prompt.text, self.tokenizer, self.chars_per_token, media_options.get("context_length"))
        ids = self.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
        return ProcessedInputs(torch.tensor([ids], dtype=torch.long), None, [], [], prompt, prompt.text,
                               list(prompt.notes))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def stop_token_ids(self) -> set[int]:
        return tokenizer_stop_ids(self.tokenizer)
