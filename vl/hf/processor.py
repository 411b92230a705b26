"""`AutoProcessor` for Nano V2 VL directories: transformers' processor interface over `vl.processing.Processor`.

Everything the pipeline asks of a processor (`apply_chat_template(..., tokenize=True, return_dict=True)`,
`post_process_image_text_to_text`, `tokenizer`) is answered by our own processor, so the prompt format
(vl/processing/chat.py), tiling, frame sampling, media limits and placeholder expansion are the ones `vl.Engine`
uses, and the pipeline's inputs equal the engine's.

The boundary (docs/reliability_policy.md §1.2, row S12): media reach our decoders as PIL images, bytes, `data:`
URIs (decoded here, size-checked first) or local paths. A URL is refused before anything is fetched or opened,
also when the caller sets `allow_remote_media=True` (fetching is not implemented: download it with your own
SSRF policy and pass the bytes). Local paths are confined to `allowed_roots` when set (`Processor(allowed_roots=)`);
set it whenever messages come from untrusted users. transformers' own loaders never see a string: chats go
through `apply_chat_template` here, and plain pipeline inputs through `_vl_preprocess_plain` (see vl/hf/pipeline.py).

Model inputs carry two keys of our own besides `input_ids`, `attention_mask` and `pixel_values`
(`(N, 3, S, S)`, every tile of every row in row order, possibly N = 0): `media`, the `MediaSpan`s of each row
(a flat list for one conversation, one list per row for a batch), and, when given, `video_pruning_rate` and
`token_pruning_rate` (floats for the model's token reduction).

A Nemotron 3 Nano Omni directory (`vl.processing.OmniProcessor`: images at native resolution, video tubelets,
audio parts `{"type": "audio", "audio": path | bytes | float32 array at 16 kHz}` and a video's sound track,
`use_audio_in_video`) gives `input_ids`, `attention_mask` and `omni_inputs`: the processor's `OmniInputs` of each
row, which the model's `generate` hands to the engine as they are (its encoders read them; docs/transformers.md,
"Nemotron 3 Nano Omni").
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers.feature_extraction_utils import BatchFeature
from transformers.processing_utils import ProcessorMixin

from vl.errors import ConfigError, CorruptMediaError, InputError, MediaTooLargeError, RemoteMediaError
from vl.hf.names import LOADER_KEYS, MODEL_KEYS, OMNI_HUB_PROCESSOR_CLASS, PROCESSOR_CLASS, PROCESSOR_KEYS
from vl.options import REDUCTION, RequestOptions, canonical, option_aliases, spec
from vl.processing.chat import render_prompt
from vl.processing.load import load_processor
from vl.processing.omni_processor import OmniInputs
from vl.processing.template_vars import template_source, template_variables

PROCESSOR_FILE = "processor_config.json"
# apply_chat_template keywords: transformers' own, then ours (passed to vl.processing.Processor or the model)
HF_TEMPLATE_KEYS = ("tokenize", "return_dict", "return_tensors", "add_generation_prompt", "continue_final_message",
                    "padding", "processor_kwargs")
# our keywords: the request options the pipeline takes, by name or declared alias (vl/options.py)
OUR_KEYS = tuple(k for k, name in option_aliases().items() if spec(name).pipeline)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*://")


def looks_remote(text: str) -> bool:
    """`scheme://...`, `//host/...` or `www.`: anything transformers' `load_image` would fetch."""
    return bool(_SCHEME.match(text)) or text.startswith(("//", "www."))


class NemotronNanoVLV2Processor(ProcessorMixin):
    """transformers-facing processor. Build it with `from_pretrained(dir, allowed_roots=[...])` or from a
    `vl.processing.Processor` (`NemotronNanoVLV2Processor(vl_processor=p)`)."""

    def __init__(self, tokenizer=None, chat_template=None, *, vl_processor=None, allow_remote_media: bool = False):
        if vl_processor is None:
            raise ConfigError("NemotronNanoVLV2Processor needs vl_processor=vl.processing.Processor(...); load it "
                              "with NemotronNanoVLV2Processor.from_pretrained(checkpoint_dir)")
        tokenizer = vl_processor.tokenizer if tokenizer is None else tokenizer
        if tokenizer is not vl_processor.tokenizer:
            raise ConfigError("the tokenizer must be vl_processor.tokenizer (one tokenizer per processor)")
        super().__init__(tokenizer, chat_template=chat_template or getattr(tokenizer, "chat_template", None))
        self.vl_processor = vl_processor
        self.allow_remote_media = bool(allow_remote_media)

    # --- loading / saving ----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        revision = kwargs.pop("revision", None)
        if revision not in (None, "main"):
            raise ConfigError(f"revision={revision!r}: only local directories (or hub ids already cached) are "
                              f"loaded; check out that revision yourself and pass its directory")
        options = {k: kwargs.pop(k) for k in PROCESSOR_KEYS if k in kwargs}
        unknown = sorted(k for k in kwargs if k not in LOADER_KEYS + MODEL_KEYS)
        if unknown:
            raise ConfigError(f"unknown processor option(s) {unknown}; known: {', '.join(PROCESSOR_KEYS)}")
        allow_remote = options.pop("allow_remote_media", False)
        return cls(vl_processor=load_processor(pretrained_model_name_or_path, **options),
                   allow_remote_media=allow_remote)

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """Tokenizer files (with the chat template) and processor_config.json naming this class. Runtime policy
        (allowed_roots, limits) is not saved: it belongs to the deployment, not the checkpoint."""
        if push_to_hub:
            raise ConfigError("push_to_hub is not supported here (no network); upload the directory yourself")
        directory = Path(save_directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(directory)
        (directory / PROCESSOR_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return [str(directory / PROCESSOR_FILE)]

    def to_dict(self) -> dict:
        return {"processor_class": PROCESSOR_CLASS}

    @property
    def allowed_roots(self):
        return self.vl_processor.allowed_roots

    @allowed_roots.setter
    def allowed_roots(self, roots):
        self.vl_processor.allowed_roots = None if roots is None else [Path(r).resolve() for r in roots]

    @property
    def model_input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", "pixel_values", "media"]

    # --- chats -> model inputs -------------------------------------------------------------------------
    def apply_chat_template(self, conversation, chat_template=None, **kwargs):
        """One conversation (list of messages) or a batch of them -> prompt text(s), or with `tokenize=True`
        the model inputs. transformers' defaults apply (`tokenize=False`, `add_generation_prompt=False`);
        a trailing assistant message is continued when `continue_final_message=True` (pipeline prefill).
        Our options are the request options marked `pipeline` in vl/options.py (`thinking`, alias
        `enable_thinking`; media options such as `max_num_tiles`, `fps`, `max_frames`, `pages`, `skip_blank_tiles`
        for vl.processing.Processor; `video_pruning_rate` (EVS) and `token_pruning_rate` (documents), which ride
        along in the inputs to the model's token reduction), checked by `RequestOptions`. Other keywords are chat
        template variables, as in transformers (`truncate_history_thinking=False` for a Nemotron 3 template): taken
        when the model's template reads them, refused otherwise (a misspelt option would else vanish); a
        `template_kwargs` dict is taken as the server takes `chat_template_kwargs` (unread names logged)."""
        if chat_template is not None:
            raise InputError("a custom chat_template is not supported: the prompt format of these checkpoints "
                             "lives in vl/processing/chat.py and placeholders are expanded after rendering")
        extra = kwargs.pop("processor_kwargs", None) or {}
        kwargs = {**kwargs, **extra}
        for name, what in (("tools", "tool calling"), ("documents", "documents for retrieval-augmented prompts")):
            if kwargs.pop(name, None):  # transformers' own keywords; None or empty means "not used"
                raise InputError(f"{name}=...: {what} is not supported by this processor (the server refuses it as "
                                 "well); leave it out")
        loose = {k: v for k, v in kwargs.items() if k not in HF_TEMPLATE_KEYS + OUR_KEYS}
        source = template_source(self.tokenizer) if loose else None
        unknown = sorted(set(loose) - (template_variables(source) if source else frozenset()))
        if unknown:  # neither an option nor a variable of the template: most likely a misspelt option
            raise InputError(f"unknown apply_chat_template option(s) {unknown}; ours: {', '.join(OUR_KEYS)}; other "
                             "keywords are chat template variables, and this model's template does not read these")
        thinking = _thinking(kwargs.get("thinking"), kwargs.get("enable_thinking"))
        given = {k: v for k, v in kwargs.items() if k in OUR_KEYS and canonical(k) != "thinking" and v is not None}
        if loose:  # transformers hands other keywords to the template; so do we, checked as the option checks them
            if any(canonical(k) == "template_kwargs" for k in given):
                raise InputError(f"template variables {sorted(loose)} are given as keywords and in template_kwargs; "
                                 "pass them one way")
            given["template_kwargs"] = loose
        options = RequestOptions.from_kwargs(thinking=thinking, **given)
        model_side = {k: v for k, v in options.acting(REDUCTION).items() if k in {canonical(g) for g in given}}
        continue_final = bool(kwargs.get("continue_final_message", False))
        add_generation_prompt = bool(kwargs.get("add_generation_prompt", False))
        batched = _is_batch(conversation)
        conversations = [self._checked(c, continue_final, add_generation_prompt)
                         for c in (conversation if batched else [conversation])]
        # our renderer continues a trailing assistant message whenever it is asked for a generation prompt
        generation_prompt = continue_final or add_generation_prompt
        if not kwargs.get("tokenize", False):
            if any(isinstance(item, Mapping) and item.get("type") == "pdf" for c in conversations for m in c
                   for item in (m.get("content") if isinstance(m.get("content"), (list, tuple)) else ())):
                raise InputError("tokenize=False cannot render PDF parts: their pages become images only when the "
                                 "PDF is rendered; use tokenize=True")

            texts = [render_prompt(c, self.tokenizer, thinking=thinking, add_generation_prompt=generation_prompt,
                                   tokens=self.vl_processor.tokens, template_kwargs=options.template_kwargs).text
                     for c in conversations]
            return texts if batched else texts[0]
        if kwargs.get("padding", True) not in (True, False, None, "longest"):
            raise InputError(f"padding={kwargs['padding']!r}: batches are always left-padded to the longest row")
        if kwargs.get("return_tensors", "pt") not in ("pt", None):
            raise InputError(f"return_tensors={kwargs['return_tensors']!r}: only 'pt' (PyTorch) is supported")
        media_options = options.processor_kwargs()
        lm = getattr(self.vl_processor.config, "lm", None)  # Omni's processor does not know the context length
        if lm is not None:
            media_options.setdefault("context_length", lm.max_position_embeddings)  # as vl.Engine
        rows = [self.vl_processor(c, thinking=thinking, add_generation_prompt=generation_prompt, **media_options)
                for c in conversations]
        batch = self._omni_batch if isinstance(rows[0], OmniInputs) else self._batch
        features = batch(rows, batched, model_side)
        if kwargs.get("return_tensors", "pt") is None:
            features["input_ids"] = [r.input_ids[0].tolist() for r in rows]
            features["attention_mask"] = [[1] * r.input_ids.shape[1] for r in rows]
        if kwargs.get("return_dict", False):
            return features
        return features["input_ids"]

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        """Plain inputs, transformers style: each text becomes one user turn (its images or video first, then
        the text) with a generation prompt. Raw prompts with placeholders are not accepted: use chats."""
        conversations, batched = _plain_conversations(images, text, videos)
        kwargs.setdefault("add_generation_prompt", True)
        return self.apply_chat_template(conversations if batched else conversations[0], tokenize=True,
                                        return_dict=True, **kwargs)

    def _vl_preprocess_plain(self, inputs, dtype=None, **kwargs):
        """`NemotronNanoVLV2Pipeline.preprocess` for non-chat inputs (vl/hf/pipeline.py): the same
        work as transformers' version, except that image strings are ours to refuse or decode."""
        if isinstance(inputs, Mapping):
            images, text = inputs.get("images"), inputs.get("text")
        else:
            images, text = None, inputs
        features = self(images=images, text=text, **kwargs)
        if dtype is not None:
            features = features.to(dtype=dtype)
        features["text"] = text
        return features

    def post_process_image_text_to_text(self, generated_outputs, skip_special_tokens=True, **kwargs):
        ids = generated_outputs.tolist() if hasattr(generated_outputs, "tolist") else generated_outputs
        if ids and isinstance(ids[0], list):
            return [self.tokenizer.decode(row, skip_special_tokens=skip_special_tokens, **kwargs) for row in ids]
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, **kwargs)

    # --- helpers -------------------------------------------------------------------------------------------
    def _checked(self, messages, continue_final: bool, add_generation_prompt: bool):
        """A copy of one conversation with every media source made safe to hand to our decoders."""
        messages = getattr(messages, "messages", messages)  # transformers' `Chat` wrapper
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InputError("expected a conversation: a non-empty list of {'role', 'content'} messages")
        last_is_assistant = isinstance(messages[-1], Mapping) and messages[-1].get("role") == "assistant"
        if continue_final and not last_is_assistant:
            raise InputError("continue_final_message=True needs a trailing assistant message to continue")
        if last_is_assistant and add_generation_prompt and not continue_final:
            raise InputError("the chat ends with an assistant message: it can only be continued (prefill, the "
                             "pipeline's default), not followed by a new assistant turn; add a user message")
        out = []
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, (list, tuple)):
                message = {**message, "content": [self._checked_item(item) for item in content]}
            out.append(message)
        return out

    def _checked_item(self, item):
        if not isinstance(item, Mapping) or item.get("type") not in ("image", "video", "pdf", "audio"):
            return item
        kind = item["type"]
        key = next((k for k in (kind, "path", "url") if item.get(k) is not None), None)
        source = None if key is None else item[key]
        if isinstance(source, os.PathLike):
            source = os.fspath(source)
        if not isinstance(source, str):
            return item
        if source.startswith("data:"):
            return {**item, key: self._data_uri(source, kind)}
        if looks_remote(source):
            if self.allow_remote_media:
                raise RemoteMediaError(f"{source[:80]!r}: remote media is allowed by this processor, but fetching is "
                                       f"not implemented in nemotron-vl; download it yourself (with your own "
                                       f"host allowlist and size cap) and pass the bytes, a PIL image or a local path")
            raise RemoteMediaError(f"{source[:80]!r} is a URL; remote media is refused (nothing was fetched). "
                                   f"Download it yourself and pass the bytes, a PIL image or a local path")
        return item

    def _data_uri(self, uri: str, kind: str) -> bytes:
        head, comma, payload = uri.partition(",")
        if not comma or not head.endswith(";base64"):
            raise CorruptMediaError(f"a data: URI for a {kind} must be 'data:<type>;base64,<data>', found "
                                    f"{head[:60]!r}")
        limits = self.vl_processor.limits
        cap = {"image": limits.max_image_bytes, "video": limits.max_video_bytes, "pdf": limits.max_pdf_bytes,
               "audio": limits.max_audio_bytes}[kind]
        if len(payload) // 4 * 3 > cap + 3:
            raise MediaTooLargeError(f"the base64 {kind} decodes to about {len(payload) // 4 * 3} bytes; the cap "
                                     f"is {cap}")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise CorruptMediaError(f"the data: URI of a {kind} is not valid base64") from None

    def _batch(self, rows, batched: bool, model_side: dict) -> BatchFeature:
        pad = self.vl_processor.pad_id
        t = max(r.input_ids.shape[1] for r in rows)
        ids = torch.full((len(rows), t), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), t, dtype=torch.long)
        for i, r in enumerate(rows):  # left padding: Mamba states never see pad tokens (vl.runtime.generate)
            ids[i, t - r.input_ids.shape[1]:], mask[i, t - r.input_ids.shape[1]:] = r.input_ids[0], 1
        s = self.vl_processor.config.force_image_size
        tiles = [r.pixel_values for r in rows if r.pixel_values is not None]
        data = {"input_ids": ids, "attention_mask": mask,
                "pixel_values": torch.cat(tiles) if tiles else torch.zeros(0, 3, s, s),
                "media": [list(r.media) for r in rows] if batched else list(rows[0].media)}
        data.update({k: float(v) for k, v in model_side.items()})
        return BatchFeature(data)

    def _omni_batch(self, rows, batched: bool, model_side: dict) -> BatchFeature:
        """Omni rows: left-padded ids and mask for transformers' bookkeeping, and each row's `OmniInputs` (patches,
        tubelets, audio features, media order) for the model's `generate`, which hands them to the engine."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        t = max(r.input_ids.shape[1] for r in rows)
        ids = torch.full((len(rows), t), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), t, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, t - r.input_ids.shape[1]:], mask[i, t - r.input_ids.shape[1]:] = r.input_ids[0], 1
        data = {"input_ids": ids, "attention_mask": mask, "omni_inputs": list(rows)}
        data.update({k: float(v) for k, v in model_side.items()})
        return BatchFeature(data)


def _thinking(thinking, enable_thinking):
    if thinking is not None and enable_thinking is not None and bool(thinking) != bool(enable_thinking):
        raise InputError(f"thinking={thinking!r} and enable_thinking={enable_thinking!r} disagree; pass one")
    value = thinking if thinking is not None else enable_thinking
    return None if value is None else bool(value)  # not given: the messages' toggle, else off (render_prompt)


def _is_batch(conversation) -> bool:
    first = conversation[0] if isinstance(conversation, (list, tuple)) and conversation else None
    return isinstance(first, (list, tuple)) or hasattr(first, "messages")


def _as_list(x):
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def _plain_conversations(images, text, videos):
    """(images, text, videos) as transformers' plain processor call takes them -> (conversations, batched)."""
    if text is None:
        raise InputError("a text prompt is needed (images alone are not a question)")
    texts = [text] if isinstance(text, str) else list(text)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise InputError(f"text must be a string or a list of strings, found {type(text).__name__}")
    if len(texts) == 1:
        per_row = [(_as_list(images), _as_list(videos))]
    else:
        imgs = _as_list(images)
        if videos is not None or (imgs and len(imgs) != len(texts)):
            raise InputError(f"{len(texts)} texts need one image (or list of images) each, found {len(imgs)} "
                             f"images; videos are only taken with a single text")
        per_row = [(_as_list(im), []) for im in imgs] if imgs else [([], [])] * len(texts)
    conversations = []
    for t, (imgs, vids) in zip(texts, per_row):
        parts = [{"type": "image", "image": im} for im in imgs] + [{"type": "video", "video": v} for v in vids]
        conversations.append([{"role": "user", "content": parts + [{"type": "text", "text": t}]}])
    return conversations, not isinstance(text, str)


class NemotronOmniHubProcessor(NemotronNanoVLV2Processor):
    """The same processor under the name a Nemotron 3 Nano Omni hub directory's preprocessor_config.json gives
    (`OMNI_HUB_PROCESSOR_CLASS`, its remote processor's), registered for its config class, so that AutoProcessor
    finds this one instead of the remote code."""


NemotronOmniHubProcessor.__name__ = NemotronOmniHubProcessor.__qualname__ = OMNI_HUB_PROCESSOR_CLASS
