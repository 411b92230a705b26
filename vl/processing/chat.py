"""The Nemotron Nano V2 VL prompt format: turns, reasoning toggle, media placeholders (reading the reasoning and the
answer back out of a completion: vl/processing/reasoning_text.py).

This is the only place the prompt format lives (docs/design.md §1): training data, eval, the UI and the runtime
all render and parse through it. References (docs/format.md §8, §9.3):
- Turns and toggle: the chat template printed on the NVIDIA-Nemotron-Nano-9B-v2 model card and Megatron-LM
  `nemotron_h_5p5_reasoning_inference_template`. The system turn is always emitted, even when empty
  (`<SPECIAL_10>System\\n\\n`). Past assistant turns keep only the text after `</think>`. The generation
  prompt either pre-opens `<think>\\n` or closes `<think></think>`. A trailing assistant message is a prefill.
- The parts of one message are joined with "\\n" in their order, as vLLM joins them
  (`multimodal_content_part_separator`). No "Image N: " labels: §8.1 marks them unverified, and neither
  vLLM nor the card template writes them.
- Video text: "This is a video:\\n" (TRT-LLM, the Megatron-Energon training encoder), then the frame
  headers of §9.3, with frames separated by "\\n".
Where this code differs from the card template (only on odd inputs):
- When one message holds both toggles, the rightmost one wins. The card lets `/think` win.
- A `</think>` typed in a system or user message is not read as `/think` and is not mangled.
- A past answer is everything after the first `</think>`. The card keeps the text between the first
  and second `</think>`.
- A system message that is not first raises an error. The card drops it silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jinja2

from vl.errors import ConfigError, GenerationOptionError, InputError, NoAudioError, VLError
from vl.options import DEFAULT_THINKING, canonical, spec
from vl.processing.template_vars import variables_for

SYSTEM_HEADER, USER_HEADER = "<SPECIAL_10>System\n", "<SPECIAL_11>User\n"
ASSISTANT_HEADER, END_OF_TURN = "<SPECIAL_11>Assistant\n", "<SPECIAL_12>"
TURN_TOKENS = ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THINK_ON_PROMPT, THINK_OFF_PROMPT = THINK_OPEN + "\n", THINK_OPEN + THINK_CLOSE
TOGGLE_ON, TOGGLE_OFF = "/think", "/no_think"
PART_SEPARATOR = "\n"  # between the text and media parts of one message (vLLM)
VIDEO_PREFIX = "This is a video:\n"
FRAME_SEPARATOR = "\n"  # between the frames of one video (docs/format.md §9.3)
_MASKED_CLOSE = "<_think>"  # stands in for "</think>" while looking for "/think"


class PromptFormatError(InputError):
    """The messages cannot be rendered (wrong shape, unknown role or content type, stray placeholder)."""
    code = "bad_messages"


class PlaceholderMismatchError(VLError, ValueError):
    """The placeholders in a prompt do not match the media handed to the expander: our bug, not the caller's."""
    code = "placeholder_mismatch"


@dataclass(frozen=True)
class MediaTokens:
    """Placeholder strings. Build them from the checkpoint config with `from_config`; never hard-code them."""
    img_start: str = "<img>"
    img_end: str = "</img>"
    img_context: str = "<image>"
    video_context: str = "<video>"
    # Nemotron 3 Nano Omni's audio run `<so_start>` + `<so_embedding>` x n + `<so_end>` (OMNI_TOKENS); None: audio
    # parts are refused, as for Nano V2 VL, which has no audio
    audio_start: str | None = None
    audio_context: str | None = None
    audio_end: str | None = None

    def __post_init__(self):
        values = [self.img_start, self.img_end, self.img_context, self.video_context]
        if not all(isinstance(v, str) and v for v in values) or len(set(values)) != 4:
            raise ConfigError(f"media tokens must be 4 distinct non-empty strings, found {values}; fix config.json")
        audio = [self.audio_start, self.audio_context, self.audio_end]
        if audio != [None] * 3 and (not all(isinstance(v, str) and v for v in audio)
                                    or len(set(values + audio)) != 7):
            raise ConfigError(f"audio tokens must be 3 non-empty strings distinct from each other and from the image "
                              f"tokens {values}, or all None; found {audio}")

    @property
    def has_audio(self) -> bool:
        return self.audio_context is not None

    @classmethod
    def from_config(cls, config: Mapping | Any) -> MediaTokens:
        """Reads `img_start_token`, `img_end_token`, `img_context_token`, `video_context_token` (docs/format.md §2.1)."""
        keys = {"img_start": "img_start_token", "img_end": "img_end_token",
                "img_context": "img_context_token", "video_context": "video_context_token"}
        get = config.get if isinstance(config, Mapping) else (lambda k: getattr(config, k, None))
        return cls(**{name: get(key) for name, key in keys.items() if get(key) is not None})


DEFAULT_TOKENS = MediaTokens()
OMNI_TOKENS = MediaTokens(audio_start="<so_start>", audio_context="<so_embedding>", audio_end="<so_end>")


@dataclass(frozen=True)
class MediaItem:
    """One image or video in prompt order. `source` is whatever the caller gave (PIL image, path, ...)."""
    kind: str  # "image" | "video" | "audio"
    source: Any
    options: Mapping = field(default_factory=dict)  # the part's own options by canonical name, checked (PART_OPTIONS)
    document: Any = None  # for PDF pages: the PDF they came from
    page: int | None = None


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    media: tuple[MediaItem, ...]
    thinking: bool  # the reasoning mode that was chosen
    prompt_opened_think: bool  # the completion starts inside <think>: pass this to reasoning_text.ThinkSplitter
    notes: tuple[str, ...] = ()  # what the rendering left out (chat template variables the template does not read)


@dataclass(frozen=True)
class _Turn:
    role: str
    text: str  # parts joined by PART_SEPARATOR, media as placeholders
    parts: tuple  # ("text", str) | ("image"|"video", MediaItem)
    media: tuple[MediaItem, ...]


# --- messages ---------------------------------------------------------------------------------------
# Options a media part may carry for itself ({"type": "video", "video": p, "fps": 1}): they override the request's
# value for that item only. Each key is an option name or alias of vl/options.py and is checked by that option's
# one range; any other key is refused by name, as an unknown request option is. A PDF part takes none (its pages
# follow the request's pages, max_pages and max_num_tiles).
PART_OPTIONS = {"image": ("max_num_tiles",), "video": ("fps", "max_frames"), "pdf": (), "audio": ()}


def _part_options(item: Mapping, kind: str, at: str) -> dict:
    given: dict = {}
    for key, value in item.items():
        if key in ("type", kind, "path", "url"):
            continue
        name = canonical(key) if isinstance(key, str) else None
        if name not in PART_OPTIONS[kind]:
            allowed = ", ".join(PART_OPTIONS[kind]) or "none"
            article = "an" if kind == "image" else "a"
            raise GenerationOptionError(f"{at}: {key!r} is not an option of {article} {kind} item (per-item "
                                        f"options: {allowed}); pass request options with the request instead")
        if name in given:
            raise GenerationOptionError(f"{at}: {name} is given twice (as {key!r} too); pass it once")
        label = f"{at}: {key}" if key == name else f"{at}: {key} ({name})"
        given[name] = spec(name).check(value, label)
    return {name: value for name, value in given.items() if value is not None}  # None: the request's value


def _parts(message: Mapping, where: str, pdf_pages, tokens: MediaTokens) -> list[tuple[str, Any]]:
    content = message.get("content")
    content = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(content, (list, tuple)):
        raise PromptFormatError(f"{where}: content must be a string or a list of items, found {type(content).__name__}")
    parts = []
    for j, item in enumerate(content):
        at = f"{where} item {j}"
        if not isinstance(item, Mapping):
            raise PromptFormatError(f"{at}: expected a {{'type': ...}} dict, found {type(item).__name__}")
        kind = item.get("type")
        is_media = kind in ("image", "video", "pdf") or (kind == "audio" and tokens.has_audio)
        source = next((item[k] for k in (kind, "path", "url") if item.get(k) is not None), None) if is_media else None
        if is_media and source is None:
            raise PromptFormatError(f"{at}: a {kind} item needs its data under '{kind}', 'path' or 'url'")
        if kind == "text":
            if not isinstance(text := item.get("text"), str):
                raise PromptFormatError(f"{at}: 'text' must be a string, found {type(text).__name__}")
            if message.get("role") == "assistant":  # an earlier answer sent back: a model can emit its placeholder
                for p in (tokens.img_context, tokens.video_context, tokens.audio_context):  # tokens; they carry
                    text = text.replace(p, "") if p else text  # no media there, so they are left out
            if bad := [p for p in (tokens.img_context, tokens.video_context, tokens.audio_context) if p and p in text]:
                kinds = "'image'|'video'|'audio'" if tokens.has_audio else "'image'|'video'"
                raise PromptFormatError(f"{at}: the text contains the placeholder {bad[0]!r}; pass media as "
                                        f"{{'type': {kinds}, ...}} items instead")
            parts.append(("text", text))
        elif kind in ("image", "video") or (kind == "audio" and is_media):
            parts.append((kind, MediaItem(kind, source, _part_options(item, kind, at))))
        elif kind == "pdf":
            _part_options(item, kind, at)
            if pdf_pages is None:
                raise PromptFormatError(f"{at}: PDF items need a page loader; pass pdf_pages=callable(path) -> images")
            parts += [("image", MediaItem("image", img, {}, source, n)) for n, img in enumerate(pdf_pages(source))]
        elif kind == "audio":
            raise NoAudioError(f"{at}: this model does not hear (it has no audio encoder); send text, images or "
                               "videos, or use a model that hears (Nemotron 3 Nano Omni)")
        else:
            kinds = "text, image, video, audio or pdf" if tokens.has_audio else "text, image, video or pdf"
            raise PromptFormatError(f"{at}: expected type {kinds}, found {kind!r}")
    return parts


def normalize_messages(messages: Sequence[Mapping], *, pdf_pages: Callable | None = None,
                       tokens: MediaTokens = DEFAULT_TOKENS) -> list[_Turn]:
    """Validates messages and turns PDFs into page images. Media is accepted in user messages only."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise PromptFormatError("expected a non-empty list of {'role', 'content'} messages")
    turns = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in ("system", "user", "assistant"):
            raise PromptFormatError(f"message {i}: role must be system, user or assistant, found {role!r}")
        if role == "system" and i != 0:
            raise PromptFormatError(f"message {i}: a system message must come first; merge it into message 0")
        parts = _parts(message, f"message {i} ({role})", pdf_pages, tokens)
        placeholders = {"text": None, "image": tokens.img_context, "video": tokens.video_context,
                        "audio": tokens.audio_context}
        media = tuple(p for k, p in parts if k != "text")
        turns.append(_Turn(role, PART_SEPARATOR.join(placeholders[k] or p for k, p in parts), tuple(parts), media))
        if media and role != "user":
            raise PromptFormatError(f"message {i}: media is accepted in user messages only, found it in {role}")
    return turns


# --- turn text ----------------------------------------------------------------------------------------
def find_toggle(text: str) -> bool | None:
    """Reasoning toggle in one message: True for /think, False for /no_think, the rightmost one wins."""
    masked = text.replace(THINK_CLOSE, _MASKED_CLOSE)
    on, off = masked.rfind(TOGGLE_ON), masked.rfind(TOGGLE_OFF)
    return None if on == off else on > off


def toggle_in_messages(messages) -> bool | None:
    """The reasoning toggle that raw OpenAI-shaped messages carry (the last /think or /no_think in a system,
    developer or user message's text), or None; for front ends that pass messages on without rendering them."""
    mode = None
    for message in messages if isinstance(messages, (list, tuple)) else ():
        if not isinstance(message, Mapping) or message.get("role") not in ("system", "developer", "user"):
            continue
        content = message.get("content")
        texts = [content] if isinstance(content, str) else [
            p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        ] if isinstance(content, (list, tuple)) else []
        for text in texts:
            found = find_toggle(text) if isinstance(text, str) else None
            mode = mode if found is None else found
    return mode


def remove_toggles(text: str) -> str:
    return THINK_CLOSE.join(p.replace(TOGGLE_ON, "").replace(TOGGLE_OFF, "") for p in text.split(THINK_CLOSE))


def resolve_thinking(turns: Sequence[_Turn], thinking: bool | None = None, default: bool = True) -> bool:
    """An explicit argument wins; else the last toggle seen in system/user messages; else `default` (on, as the
    model card's template has it; `render_prompt`, what the product sends, passes `DEFAULT_THINKING`)."""
    if thinking not in (None, True, False):
        raise PromptFormatError(f"thinking must be None, True or False, found {thinking!r}")
    mode = default
    for turn in turns:
        found = find_toggle(turn.text) if turn.role != "assistant" else None
        mode = mode if found is None else found
    return mode if thinking is None else thinking


def past_answer(text: str) -> str:
    """What a past assistant turn keeps: the answer after `</think>`, never the reasoning."""
    _, closed, after = text.partition(THINK_CLOSE)
    return (after if closed else text).strip()


def opens_think(text: str) -> bool:
    """Whether a rendered prompt leaves the completion inside `<think>` (its last assistant header is followed by
    an unclosed think tag); also decides it for prompts that arrive as ids (decode them first)."""
    tail = text[max(text.rfind(ASSISTANT_HEADER), 0):]  # a foreign template may not write our header
    return tail.rfind(THINK_OPEN) > tail.rfind(THINK_CLOSE)


def render_messages(messages: Sequence[Mapping], *, thinking: bool | None = None, add_generation_prompt: bool = True,
                    pdf_pages: Callable | None = None, tokens: MediaTokens = DEFAULT_TOKENS,
                    thinking_default: bool = True) -> RenderedPrompt:
    """Messages -> prompt text with one placeholder per media item, plus the media in prompt order.
    A trailing assistant message is a prefill when `add_generation_prompt` (continued, no end of turn),
    and a complete final turn, reasoning kept, when not (training targets)."""
    turns = normalize_messages(messages, pdf_pages=pdf_pages, tokens=tokens)
    mode = resolve_thinking(turns, thinking, thinking_default)
    system = turns[0].text if turns[0].role == "system" else ""
    body = turns[1:] if turns[0].role == "system" else turns
    final = body[-1] if body and body[-1].role == "assistant" else None
    out = [SYSTEM_HEADER, remove_toggles(system).strip(), "\n"]
    for turn in body[:-1] if final else body:
        if turn.role == "user":
            out += [USER_HEADER, remove_toggles(turn.text).strip(), "\n"]
        else:
            out += [ASSISTANT_HEADER, past_answer(turn.text), "\n", END_OF_TURN, "\n"]
    opening = THINK_ON_PROMPT if mode else THINK_OFF_PROMPT
    if final is not None:
        out += [ASSISTANT_HEADER, opening, final.text.strip()] + ([] if add_generation_prompt else
                                                                  ["\n", END_OF_TURN, "\n"])
    elif add_generation_prompt:
        out += [ASSISTANT_HEADER, opening]
    text = "".join(out)
    media = tuple(m for turn in turns for m in turn.media)
    return RenderedPrompt(text, media, mode, add_generation_prompt and opens_think(text))


def render_prompt(messages: Sequence[Mapping], tokenizer: Any = None, *, thinking: bool | None = None,
                  add_generation_prompt: bool = True, pdf_pages: Callable | None = None,
                  tokens: MediaTokens = DEFAULT_TOKENS, template_kwargs: Mapping | None = None) -> RenderedPrompt:
    """Renders through the tokenizer's own `chat_template` when it has one, else through `render_messages`.
    We resolve the reasoning mode here (`thinking`, else the messages' toggle, else `DEFAULT_THINKING`: the one
    default of every front end) and hand it to any template as the `enable_thinking` variable, which the Nemotron 3
    templates (Nano 30B-A3B, Omni: ChatML turns) read and which decides their generation prompt; a template that
    ignores it (`template_reads_switch`: the Nano V2 card templates read `/think` / `/no_think` in the messages)
    gets the toggle appended to the system message instead.
    Toggles are removed from user messages first; templates strip them anyway, so the text is unchanged.
    A foreign template therefore cannot choose a mode other than the one we report. Media messages reach the
    template as typed content lists when it renders them (`template_takes_lists`), else as strings with the
    placeholders in place, so string-only templates (Nemotron Nano 9B v2's) work on media prompts too.
    `template_kwargs`: a request's extra template variables (the `template_kwargs` option, checked there); those
    the template reads are passed to it, the others logged and dropped (vl/processing/template_vars.py)."""
    given, note = variables_for(tokenizer, template_kwargs)
    notes = (note,) if note else ()
    if not getattr(tokenizer, "chat_template", None):
        return replace(render_messages(
            messages, thinking=thinking, add_generation_prompt=add_generation_prompt, pdf_pages=pdf_pages,
            tokens=tokens, thinking_default=DEFAULT_THINKING), notes=notes)
    turns = normalize_messages(messages, pdf_pages=pdf_pages, tokens=tokens)
    mode = resolve_thinking(turns, thinking, DEFAULT_THINKING)
    kinds = tuple(sorted({m.kind for t in turns for m in t.media}))
    lists = bool(kinds) and template_takes_lists(tokenizer, tokens, kinds)
    placeholder = {"image": tokens.img_context, "video": tokens.video_context, "audio": tokens.audio_context}
    plain = [] if turns[0].role == "system" else [{"role": "system", "content": ""}]
    for turn in turns:
        parts = [{"type": k, "text": p if turn.role == "assistant" else _drop_toggles(p)} if k == "text"
                 else {"type": k} for k, p in turn.parts]
        if turn.role != "assistant" and any(p["type"] == "text" and p["text"] != t for p, (_, t) in
                                            zip(parts, turn.parts)):
            _trim_ends(parts)  # a removed toggle leaves no space at either end of the message
        if lists and not all(p["type"] == "text" for p in parts):
            plain.append({"role": turn.role, "content": parts})
        else:  # a string, media flattened to their placeholders: what a string-only template can take
            plain.append({"role": turn.role, "content": PART_SEPARATOR.join(
                p["text"] if p["type"] == "text" else placeholder[p["type"]] for p in parts)})
    if not template_reads_switch(tokenizer):
        plain[0]["content"] += "\n" + (TOGGLE_ON if mode else TOGGLE_OFF)  # system: text only, so a string
    prefill = add_generation_prompt and turns[-1].role == "assistant"
    if prefill and not plain[-1]["content"].strip():  # nothing to continue: a plain generation prompt
        plain, prefill = plain[:-1], False
    try:
        text = tokenizer.apply_chat_template(plain, tokenize=False, continue_final_message=prefill,
                                             add_generation_prompt=add_generation_prompt and not prefill,
                                             enable_thinking=mode, **given)
    except (jinja2.TemplateError, TypeError, ValueError) as e:
        if not given:
            raise
        raise GenerationOptionError(f"the model's chat template could not render with chat_template_kwargs "
                                    f"{given!r}: {type(e).__name__}: {str(e)[:300]}") from None
    kind_of = {v: k for k, v in placeholder.items() if v is not None}
    found = [kind_of[p] for p in _placeholder_re(tokens).findall(text)]
    queues = {k: [m for t in turns for m in t.media if m.kind == k] for k in ("image", "video", "audio")}
    if any(found.count(k) != len(q) for k, q in queues.items()):
        audio = f" and {len(queues['audio'])} audio clips" if tokens.has_audio else ""
        raise ConfigError(f"the tokenizer's chat_template wrote placeholders {found} for {len(queues['image'])} "
                          f"images{',' if audio else ''} {len(queues['video'])} videos{audio}; fix that template "
                          "or remove it to use ours")
    return RenderedPrompt(text, tuple(queues[k].pop(0) for k in found), mode,
                          add_generation_prompt and opens_think(text), notes)


_TAKES_LISTS: dict[tuple, bool] = {}
_READS_SWITCH: dict[str, bool] = {}


def template_reads_switch(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat_template takes the reasoning mode as the `enable_thinking` variable (the
    Nemotron 3 templates: `<think>\\n` or `<think></think>` after the assistant header, by that variable alone).
    Probed once per template by rendering one user turn both ways: a template whose text does not change ignores
    the variable (the Nano V2 card templates, which read the toggles in the messages)."""
    template = tokenizer.chat_template
    key = template if isinstance(template, str) else repr(template)
    if key not in _READS_SWITCH:
        probe = [{"role": "system", "content": ""}, {"role": "user", "content": "vl-probe"}]
        try:
            on, off = (tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True,
                                                     enable_thinking=flag) for flag in (True, False))
            _READS_SWITCH[key] = on != off
        except Exception:  # noqa: BLE001 - a template that fails on the probe is told the mode by the toggles
            _READS_SWITCH[key] = False
    return _READS_SWITCH[key]


def template_takes_lists(tokenizer: Any, tokens: MediaTokens = DEFAULT_TOKENS,
                         kinds: tuple[str, ...] = ("image",)) -> bool:
    """Whether the tokenizer's chat_template renders typed content lists (`[{"type": "image"}, {"type": "text",
    ...}]`) into our placeholder text, for every media kind in `kinds` (a template may know images and not audio).
    Probed once per template and set of kinds: a string-only template (the published Nemotron Nano 9B v2 one calls
    `.replace` on the content) raises or prints the list's repr; then media messages are handed to it as strings
    with the placeholders already in place, which is the same text."""
    template = tokenizer.chat_template
    placeholder = {"image": tokens.img_context, "video": tokens.video_context, "audio": tokens.audio_context}
    key = (template if isinstance(template, str) else repr(template), *(placeholder[k] for k in kinds), *kinds)
    if key not in _TAKES_LISTS:
        probe = [{"role": "system", "content": ""},
                 {"role": "user", "content": [*({"type": k} for k in kinds), {"type": "text", "text": "vl-probe"}]}]
        try:
            text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
            _TAKES_LISTS[key] = (isinstance(text, str) and "vl-probe" in text and "type" not in text  # no repr
                                 and all(placeholder[k] is not None and text.count(placeholder[k]) == 1
                                         for k in kinds))
        except Exception:  # noqa: BLE001 - any template failure on a list means "takes strings only"
            _TAKES_LISTS[key] = False
    return _TAKES_LISTS[key]


def _drop_toggles(text: str) -> str:  # to a fixed point: one pass can form a new toggle ("/no_/thinkthink")
    return text if (cleaner := remove_toggles(text)) == text else _drop_toggles(cleaner)


def _trim_ends(parts: list[dict]) -> None:
    """Strip the message's two ends, as `render_messages` strips a message's text: a template that writes content
    as it is (the Nemotron 3 ones) would otherwise keep "Hi " for "Hi /think"; spaces inside stay as there."""
    if parts and parts[0]["type"] == "text":
        parts[0]["text"] = parts[0]["text"].lstrip()
    if parts and parts[-1]["type"] == "text":
        parts[-1]["text"] = parts[-1]["text"].rstrip()


def _placeholder_re(tokens: MediaTokens) -> re.Pattern:
    audio = f"|{re.escape(tokens.audio_context)}" if tokens.has_audio else ""
    return re.compile(f"{re.escape(tokens.img_context)}|{re.escape(tokens.video_context)}{audio}")


# The jinja twin of render_messages, shipped as `chat_template` with our tokenizers; a test renders both
# on every golden case and requires identical bytes. Unlike the card template, it takes typed content lists.
CHAT_TEMPLATE = r"""
{%- macro content_text(content) -%}
  {%- if content is string -%}{{- content -}}
  {%- else -%}{%- for part in content -%}
    {%- if not loop.first -%}{{- '\n' -}}{%- endif -%}
    {%- if part['type'] == 'text' -%}{{- part['text'] -}}
    {%- elif part['type'] in ['image', 'video'] -%}{{- '<' + part['type'] + '>' -}}
    {%- else -%}{{- raise_exception('content type ' + part['type']|string
                                     + ' is not supported; turn PDFs into page images first (vl.processing.chat)') -}}
    {%- endif -%}
  {%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- macro without_toggles(text) -%}
  {%- for piece in text.split('</think>') -%}
    {{- ('' if loop.first else '</think>') + piece.replace('/think', '').replace('/no_think', '') -}}
  {%- endfor -%}
{%- endmacro -%}
{%- set ns = namespace(thinking=true) -%}
{%- for message in messages if message['role'] != 'assistant' -%}
  {%- set masked = content_text(message['content']).replace('</think>', '<_think>') -%}
  {%- set on = masked.rfind('/think') -%}{%- set off = masked.rfind('/no_think') -%}
  {%- if on > off -%}{%- set ns.thinking = true -%}{%- elif off > on -%}{%- set ns.thinking = false -%}{%- endif -%}
{%- endfor -%}
{%- if enable_thinking is defined and enable_thinking is not none -%}{%- set ns.thinking = enable_thinking -%}{%- endif -%}
{{- '<SPECIAL_10>System\n' -}}
{%- if messages[0]['role'] == 'system' -%}{{- without_toggles(content_text(messages[0]['content'])).strip() -}}{%- endif -%}
{{- '\n' -}}
{%- set body = messages[1:] if messages[0]['role'] == 'system' else messages -%}
{%- set final = none -%}
{%- if body and body[-1]['role'] == 'assistant' -%}{%- set final = body[-1] -%}{%- set body = body[:-1] -%}{%- endif -%}
{%- for message in body -%}
  {%- set text = content_text(message['content']) -%}
  {%- if message['role'] == 'user' -%}{{- '<SPECIAL_11>User\n' + without_toggles(text).strip() + '\n' -}}
  {%- elif message['role'] == 'assistant' -%}
    {%- set answer = text.split('</think>', 1)[1] if '</think>' in text else text -%}
    {{- '<SPECIAL_11>Assistant\n' + answer.strip() + '\n<SPECIAL_12>\n' -}}
  {%- else -%}{{- raise_exception('role ' + message['role']|string + ' is not supported here') -}}
  {%- endif -%}
{%- endfor -%}
{%- set opening = '<think>\n' if ns.thinking else '<think></think>' -%}
{%- if final is not none -%}
  {{- '<SPECIAL_11>Assistant\n' + opening + content_text(final['content']).strip() -}}
  {%- if not add_generation_prompt -%}{{- '\n<SPECIAL_12>\n' -}}{%- endif -%}
{%- elif add_generation_prompt -%}{{- '<SPECIAL_11>Assistant\n' + opening -}}
{%- endif -%}
"""


# --- placeholder expansion (after tiling / frame sampling) ------------------------------------------------
def image_placeholder(num_tiles: int, tokens_per_tile: int = 256, tokens: MediaTokens = DEFAULT_TOKENS) -> str:
    """`<img>` + `<image>` x (tokens_per_tile * num_tiles) + `</img>`, no separators (docs/format.md §8.1)."""
    if not all(isinstance(n, int) and n >= 1 for n in (num_tiles, tokens_per_tile)):
        raise PlaceholderMismatchError(f"expected num_tiles, tokens_per_tile >= 1, found {num_tiles}, {tokens_per_tile}")
    return tokens.img_start + tokens.img_context * (num_tiles * tokens_per_tile) + tokens.img_end


def video_placeholder(frame_tokens: Sequence[int], timestamps: Sequence[float] | None = None,
                      tokens: MediaTokens = DEFAULT_TOKENS) -> str:
    """"This is a video:\\n" then "Frame i sampled at t.tt seconds: <img>...</img>" joined by FRAME_SEPARATOR."""
    if not frame_tokens or any(not isinstance(n, int) or n < 0 for n in frame_tokens):
        raise PlaceholderMismatchError(f"expected >= 1 frame with token counts >= 0, found {list(frame_tokens)}")
    if timestamps is not None and len(timestamps) != len(frame_tokens):
        raise PlaceholderMismatchError(f"expected one timestamp per frame ({len(frame_tokens)}), "
                                       f"found {len(timestamps)}")
    heads = [f"Frame {i}: " if timestamps is None else f"Frame {i} sampled at {timestamps[i - 1]:.2f} seconds: "
             for i in range(1, len(frame_tokens) + 1)]
    return VIDEO_PREFIX + FRAME_SEPARATOR.join(head + tokens.img_start + tokens.img_context * n + tokens.img_end
                                               for head, n in zip(heads, frame_tokens))


def tubelet_video_placeholder(num_frames: int, tokens_per_tubelet: int, temporal_patch_size: int,
                              timestamps: Sequence[float] | None = None, tokens: MediaTokens = DEFAULT_TOKENS) -> str:
    """Nemotron 3 Nano Omni's video run (transformers' `nemotron_h_omni` processor; no "This is a video:" line):
    one `<img>...</img>` per tubelet of `temporal_patch_size` frames, headed by the real frames it packs joined by
    " and " ("Frame 1 sampled at 0.00 seconds and frame 2 sampled at 0.50 seconds: "), tubelets joined by "\n"."""
    if not all(isinstance(n, int) and n >= 1 for n in (num_frames, tokens_per_tubelet, temporal_patch_size)):
        raise PlaceholderMismatchError(f"expected num_frames, tokens_per_tubelet, temporal_patch_size >= 1, found "
                                       f"{num_frames}, {tokens_per_tubelet}, {temporal_patch_size}")
    if timestamps is not None and len(timestamps) != num_frames:
        raise PlaceholderMismatchError(f"expected one timestamp per frame ({num_frames}), found {len(timestamps)}")
    run = tokens.img_start + tokens.img_context * tokens_per_tubelet + tokens.img_end
    heads = []
    for first in range(0, num_frames, temporal_patch_size):
        names = [("Frame" if i == first else "frame") + f" {i + 1}"
                 + ("" if timestamps is None else f" sampled at {timestamps[i]:.2f} seconds")
                 for i in range(first, min(first + temporal_patch_size, num_frames))]
        heads.append(" and ".join(names) + ": ")
    return FRAME_SEPARATOR.join(head + run for head in heads)


TUBELET_VIDEO_PREFIX = "Frame 1"  # how every `tubelet_video_placeholder` run starts


def audio_placeholder(num_tokens: int, tokens: MediaTokens = OMNI_TOKENS) -> str:
    """`<so_start>` + `<so_embedding>` x num_tokens + `<so_end>`: one clip's run, one placeholder per embedding the
    audio encoder emits for it."""
    if not tokens.has_audio:
        raise PlaceholderMismatchError("these media tokens have no audio tokens; audio needs an Omni checkpoint")
    if not isinstance(num_tokens, int) or num_tokens < 1:
        raise PlaceholderMismatchError(f"expected num_tokens >= 1, found {num_tokens!r}")
    return tokens.audio_start + tokens.audio_context * num_tokens + tokens.audio_end


def expand_placeholders(text: str, replacements: Sequence[str], tokens: MediaTokens = DEFAULT_TOKENS, *,
                        video_prefix: str = VIDEO_PREFIX) -> str:
    """Replaces each `<image>` / `<video>` (/ `<so_embedding>` with audio tokens) placeholder, in order, by its
    `image_placeholder` / `video_placeholder` (Omni: `tubelet_video_placeholder`, `video_prefix=TUBELET_VIDEO_PREFIX`)
    / `audio_placeholder` run. Each run is checked against its placeholder kind."""
    pieces, found = _placeholder_re(tokens).split(text), _placeholder_re(tokens).findall(text)
    if len(found) != len(replacements):
        raise PlaceholderMismatchError(f"the prompt has {len(found)} media placeholders but {len(replacements)} "
                                       "replacements were given; render and expand the same media list")
    out = [pieces[0]]
    for k, (placeholder, run) in enumerate(zip(found, replacements)):
        expected = video_prefix if placeholder == tokens.video_context else tokens.img_start
        end = tokens.img_end
        if tokens.has_audio and placeholder == tokens.audio_context:
            expected, end = tokens.audio_start, tokens.audio_end
        elif tokens.has_audio and placeholder == tokens.video_context and isinstance(run, str) and run.endswith(
                tokens.audio_end):
            end = tokens.audio_end  # the video's frames, then its sound track (use_audio_in_video)
        if not isinstance(run, str) or not run.startswith(expected) or not run.endswith(end):
            raise PlaceholderMismatchError(f"placeholder {k} is {placeholder!r}, so its replacement must start with "
                                           f"{expected!r} and end with {end!r}; found {str(run)[:40]!r}")
        out += [run, pieces[k + 1]]
    return "".join(out)
