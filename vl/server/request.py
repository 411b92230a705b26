"""An OpenAI `/v1/chat/completions` body -> our messages, a `ChatRequest` and `SamplingParams`.

Follows OpenAI's Chat Completions request schema (`input_audio` parts among them), vLLM's extensions for
Nemotron Nano V2 VL and Nemotron 3 Nano Omni (`video_url` and `audio_url` parts, `top_k`, `min_p`,
`repetition_penalty`) and the per-request options where `RequestOptions` declares them (vl/options.py:
`mm_processor_kwargs` with `max_num_tiles`/`fps`/`max_frames`/`pages`/`use_audio_in_video`, `video_pruning_rate`,
`chat_template_kwargs` (`enable_thinking`, and the template's own variables), and ours: `token_pruning_rate`,
`skip_blank_tiles`, `reasoning_budget`).
Every knob that scales work is checked against a server ceiling before anything is decoded (docs/server.md,
"Security"), and every sampling field is checked here, at the edge, so that no value can fail inside a batch it
shares with other requests. Audio parts are refused here (`no_audio`) when the model does not hear.

Every top-level field is one of (docs/server.md, "What a request may say"): implemented; accepted and logged
because it cannot change the answer (`BOOKKEEPING`); refused by name with `unsupported_field` when it would
change the answer in a way we do not implement (`UNSUPPORTED`, unless it holds its neutral value); or unknown,
refused with `unknown_field` as OpenAI refuses an "Unrecognized request argument".
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass

from vl.errors import (
    GenerationOptionError,
    InputError,
    ModelNotFoundError,
    NoAudioError,
    UnknownFieldError,
    UnsupportedFieldError,
    UnsupportedFormatError,
    VLError,
)
from vl.options import RequestOptions, spec, specs
from vl.runtime.batch import ChatRequest
from vl.runtime.sampling import SamplingParams
from vl.server.ceilings import Ceilings
from vl.server.media import MediaPolicy, decode_base64, resolve
from vl.server.template_defaults import TemplateDefaults

log = logging.getLogger("vl.server")

IMPLEMENTED = {"messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
               "repetition_penalty", "seed", "stop", "stream", "stream_options", "n", "best_of", "logit_bias",
               "reasoning_effort", "frequency_penalty", "presence_penalty", "response_format", "tool_choice",
               "logprobs", "top_logprobs", "modalities"}
# fields that cannot change the answer (OpenAI's bookkeeping and routing; vLLM's request id, priority, cache salt;
# `prediction` only speeds OpenAI's decoding up): accepted, their names logged
BOOKKEEPING = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
               "safety_identifier", "prediction", "request_id", "priority", "cache_salt"}
# fields that would change the answer, with the neutral values that mean "not used" (anything else is refused)
UNSUPPORTED = {"tools": (None, []), "functions": (None, []), "function_call": (None, "none", "auto"),
               "audio": (None,), "web_search_options": (None,), "verbosity": (None,),
               "use_beam_search": (None, False), "length_penalty": (None, 1, 1.0), "stop_token_ids": (None, []),
               "include_stop_str_in_output": (None, False), "skip_special_tokens": (None, True),
               "spaces_between_special_tokens": (None, True), "truncate_prompt_tokens": (None,),
               "prompt_logprobs": (None,), "allowed_token_ids": (None,), "bad_words": (None, []),
               "echo": (None, False), "add_generation_prompt": (None, True), "continue_final_message": (None, False),
               "add_special_tokens": (None, False), "documents": (None,), "chat_template": (None,),
               "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
               "guided_decoding_backend": (None,), "guided_whitespace_pattern": (None,), "structural_tag": (None,),
               "structured_outputs": (None,), "logits_processors": (None,), "return_tokens_as_token_ids": (None, False),
               "vllm_xargs": (None,), "kv_transfer_params": (None,), "thinking_token_budget": (None,)}
# reasoning_effort (OpenAI's) -> reasoning on or off: the model has one reasoning mode, not levels
REASONING_EFFORT = {"none": False, "minimal": False, "low": True, "medium": True, "high": True, "xhigh": True}
MAX_JSON_DEPTH = 32  # a chat body nests about 6 deep; deeper bodies are refused before anything walks them
_SURROGATE = re.compile("[\ud800-\udfff]")


def _option_fields() -> set[str]:
    """The top-level keys where `RequestOptions` reads its options (vl/options.py)."""
    out = set()
    for s in specs():
        for path in s.openai_read or ((s.openai,) if s.openai else ()):
            out.add(path.split(".", 1)[0])
    return out


KNOWN = IMPLEMENTED | BOOKKEEPING | set(UNSUPPORTED) | _option_fields()


@dataclass
class ParsedRequest:
    chat: ChatRequest
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str


# --- the body as JSON ------------------------------------------------------------------------------------
def parse_json(raw: bytes):
    """Request body bytes -> JSON value, or InputError (400) for anything a client can send that is not a JSON
    body we can walk: invalid UTF-8 or JSON, nesting deeper than MAX_JSON_DEPTH, an integer longer than Python
    converts (4300 digits), a lone UTF-16 surrogate (`\\ud800`: no tokenizer can encode it)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise InputError(f"the request body nests JSON too deeply; at most {MAX_JSON_DEPTH} levels are "
                         "accepted") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, and the int-length limit are ValueErrors
        raise InputError(f"the request body is not valid JSON: {str(e)[:200]}") from None
    _check_tree(body)
    return body


def _check_tree(body) -> None:
    """Depth and surrogates, walked without recursion (the path of the first problem goes in the message)."""
    stack = [(body, "body", 1)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise InputError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels (at {where[:120]})")
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise InputError(f"{where[:120]} holds a lone UTF-16 surrogate (e.g. \\ud800), which is not text; "
                                 "send valid Unicode (encode surrogate pairs as one character)")
        elif isinstance(value, dict):
            for key, item in value.items():
                if _SURROGATE.search(key):
                    raise InputError(f"a key in {where[:120]} holds a lone UTF-16 surrogate; send valid Unicode")
                stack.append((item, f"{where}.{key}", depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))


# --- fields ------------------------------------------------------------------------------------------------
def _num(body, key, kind, lo=None, hi=None, default=None):
    """A sampling field (the request options are checked by `RequestOptions`)."""
    value = body.get(key, default)
    if value is None:
        return default
    ok_type = (isinstance(value, int) and not isinstance(value, bool)) if kind is int else (
        isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= 1e300
        and math.isfinite(value))  # a huge integer is no float (and math.isfinite would overflow on it)
    if not ok_type:
        raise GenerationOptionError(f"{key} must be {'an integer' if kind is int else 'a number'}, found "
                                    f"{_short(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise GenerationOptionError(f"{key}={_short(value)} is out of range: expected [{lo}, {hi}]")
    return kind(value)


def _short(value) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 80 else text[:77] + "..."


def _check_fields(body: dict) -> None:
    unknown = sorted(k for k in body if k not in KNOWN)
    if unknown:
        raise UnknownFieldError(f"Unrecognized request argument supplied: {', '.join(k[:60] for k in unknown[:5])}. "
                                "docs/server.md lists the fields this server takes")
    for key, neutral in UNSUPPORTED.items():
        if key in body and not any(body[key] == v and type(body[key]) is type(v) for v in neutral):
            raise UnsupportedFieldError(f"{key} is not supported by this server (it would change the answer); "
                                        f"remove it{'' if neutral == (None,) else f' or send {neutral[1]!r}'}")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0) or isinstance(body.get(key), bool):
            raise UnsupportedFieldError(f"{key} is not supported (only 0); use repetition_penalty instead")
    if body.get("logprobs") not in (None, False) or body.get("top_logprobs") not in (None, 0):
        raise UnsupportedFieldError("logprobs and top_logprobs are not supported by this server")
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise UnsupportedFieldError("tool_choice is not supported (this server does no tool calling)")
    if body.get("response_format") not in (None, {"type": "text"}):
        raise UnsupportedFieldError("response_format other than {\"type\": \"text\"} is not supported (no "
                                    "structured output)")
    if body.get("modalities") not in (None, ["text"]):
        raise UnsupportedFieldError(f"modalities must be [\"text\"] (this model answers in text), found "
                                    f"{_short(body.get('modalities'))}")
    extra = sorted(k for k in body if k in BOOKKEEPING)
    if extra:
        log.info("request fields accepted without effect on the answer: %s", ", ".join(extra))


def _logit_bias(body, vocab_size: int | None, ceilings: Ceilings) -> dict[int, float]:
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise GenerationOptionError(f"logit_bias must be an object mapping token ids to numbers in [-100, 100], "
                                    f"found {_short(bias)}")
    if len(bias) > ceilings.max_logit_bias:
        raise GenerationOptionError(f"logit_bias names {len(bias)} tokens; this server takes at most "
                                    f"{ceilings.max_logit_bias}")
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 12):
            raise GenerationOptionError(f"logit_bias keys are token ids (\"0\", \"42\", ...), found {key[:40]!r}")
        tid = int(key)
        if vocab_size is not None and tid >= vocab_size:
            raise GenerationOptionError(f"logit_bias names token id {tid}; this model's ids are 0..{vocab_size - 1}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise GenerationOptionError(f"logit_bias[{key!r}] must be a number in [-100, 100], found {_short(value)}")
        out[tid] = float(value)
    return out


def _thinking(body, options: RequestOptions) -> RequestOptions:
    """`reasoning_effort` -> the reasoning toggle; refused when it contradicts an explicit `enable_thinking`.
    With neither, the option stays unset and the processor decides as every front end does: a `/think` or
    `/no_think` in a system or user message (the model card's way, which a client written for vLLM relies on),
    else off (`vl.options.DEFAULT_THINKING`)."""
    effort = body.get("reasoning_effort")
    if effort is None:
        return options
    if not isinstance(effort, str) or effort not in REASONING_EFFORT:
        raise GenerationOptionError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORT)}, found "
                                    f"{_short(effort)}")
    on = REASONING_EFFORT[effort]
    kwargs = body.get("chat_template_kwargs")
    explicit = body.get("thinking") if "thinking" in body else (
        kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None)
    if explicit is not None and explicit != on:
        raise GenerationOptionError(f"reasoning_effort={effort!r} turns reasoning {'on' if on else 'off'} but "
                                    f"enable_thinking is {explicit!r}; send one of them")
    return options.replace(thinking=on)


def parse_chat_request(body, *, served_names: tuple[str, ...], policy: MediaPolicy, ceilings: Ceilings,
                       default_max_tokens: int = 256, vocab_size: int | None = None,
                       hears: bool = False, template_defaults: TemplateDefaults | None = None,
                       default_fps: float | None = None) -> ParsedRequest:
    """`vocab_size`: the model's logits size, for `logit_bias` ids (None: checked when the batch starts).
    `hears`: the model has an audio encoder (the processor's `has_audio`); audio parts are refused otherwise.
    `template_defaults`: the deployment's chat template defaults, under the request's own; `default_fps`: its video
    sampling rate for requests that set none (None: the option's default)."""
    if not isinstance(body, dict):
        raise InputError("expected a JSON object as the request body")
    model = body.get("model")
    if model is not None and model not in served_names:
        raise ModelNotFoundError(f"the model {_short(model)} does not exist here; this server serves "
                                 f"{', '.join(map(repr, served_names))} (GET /v1/models)")
    _check_fields(body)
    n = _num(body, "n", int, 1, None)
    if n is not None and n > 1:
        raise UnsupportedFieldError(f"n={n}: this server returns one choice per request (n=1); send n requests")
    best_of = _num(body, "best_of", int, 1, None)
    if best_of is not None and best_of > 1:
        raise UnsupportedFieldError(f"best_of={best_of}: this server returns the one sequence it decodes (best_of 1)")
    for key in ("max_tokens", "max_completion_tokens"):  # both, when both are sent
        _num(body, key, int, 1, ceilings.max_tokens)
    temperature = _num(body, "temperature", float, 0.0, 2.0, 1.0)  # OpenAI's default is 1
    top_p = _num(body, "top_p", float, 0.0, 1.0, 1.0)
    if top_p == 0:
        raise GenerationOptionError("top_p must be > 0 (use temperature 0 for greedy decoding)")
    top_k = _num(body, "top_k", int, -1, None, 0)
    min_p = _num(body, "min_p", float, 0.0, 1.0, 0.0)
    seed = _num(body, "seed", int, None, None, None)
    repetition_penalty = _num(body, "repetition_penalty", float, 0.0, None, 1.0)
    if repetition_penalty == 0:
        raise GenerationOptionError("repetition_penalty must be > 0 (1 = off), found 0")
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k, 0), min_p=min_p,
                            repetition_penalty=repetition_penalty, seed=seed,
                            logit_bias=_logit_bias(body, vocab_size, ceilings))
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)) or len(stop) > ceilings.max_stop:
        raise GenerationOptionError(f"stop must be a string or a list of at most {ceilings.max_stop} strings")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InputError(f"stream must be true or false, found {_short(stream)}")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise InputError("stream_options must be an object like {\"include_usage\": true}")
    base = RequestOptions(max_new_tokens=min(default_max_tokens, ceilings.max_tokens),
                          max_frames=min(ceilings.max_frames, int(spec("max_frames").hi)),
                          **({} if default_fps is None else {"fps": default_fps}))
    options = _thinking(body, RequestOptions.from_openai(body, base))
    if template_defaults is not None:
        options = template_defaults.apply(options, body.get("messages"))
    _check_ceilings(options, ceilings)
    chat = ChatRequest(convert_messages(body.get("messages"), policy, hears=hears), options, stop=stop,
                       timeout_s=ceilings.request_timeout_s)
    return ParsedRequest(chat, params, stream, bool(opts.get("include_usage", False)),
                         model if model is not None else served_names[0])


def _check_ceilings(options: RequestOptions, ceilings: Ceilings) -> None:
    """The deployment's caps on knobs that scale work, over the options' own ranges (vl/options.py)."""
    for name, cap in (("max_new_tokens", ceilings.max_tokens), ("max_num_tiles", ceilings.max_num_tiles),
                      ("max_frames", ceilings.max_frames), ("fps", ceilings.max_fps)):
        value = getattr(options, name)
        if value is not None and value > cap:
            raise GenerationOptionError(f"{spec(name).openai}={value!r} is above this server's limit of {cap}")


# --- messages ------------------------------------------------------------------------------------------
def convert_messages(messages, policy: MediaPolicy, *, hears: bool = False) -> list[dict]:
    """OpenAI messages -> the transformers/OpenAI shape the processor reads (vl/processing/chat.py), with media
    resolved to bytes (or an allowed local path). Roles and text are checked by the prompt builder. The media
    parts are counted against the per-request caps first (and audio refused for a model that does not hear), so
    that no URL is fetched and no base64 decoded for a request that is refused anyway."""
    if not isinstance(messages, list) or not messages:
        raise InputError("messages must be a non-empty list of {\"role\", \"content\"} objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InputError(f"messages[{i}] must be an object with role and content")
        if not (message.get("content") is None or isinstance(message.get("content"), (str, list))):
            raise InputError(f"messages[{i}].content must be a string or a list of parts")
    _check_counts(messages, policy, hears)
    out = []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if content is None or isinstance(content, str):
            out.append({"role": role, "content": content or ""})
            continue
        out.append({"role": role, "content": [_part(p, f"messages[{i}].content[{j}]", policy)
                                              for j, p in enumerate(content)]})
    return out


_PART_KINDS = {"image_url": "image", "video_url": "video", "file": "document", "input_audio": "audio",
               "audio_url": "audio"}
# `input_audio.format` values taken (OpenAI's SDK sends "wav" or "mp3"; vLLM passes any): the bytes are judged by
# their content (vl/processing/audio.py), so a format only has to name one of the containers that are decoded
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "m4a", "aac", "mp4", "webm", "mka")


def _check_counts(messages: list, policy: MediaPolicy, hears: bool) -> None:
    """Media parts by kind against the per-request item caps (vl/processing/limits.py), and audio parts against
    the model's ears, before any part is resolved."""
    counts = dict.fromkeys(_PART_KINDS.values(), 0)
    first_audio = None
    for i, message in enumerate(messages):
        for j, part in enumerate(message.get("content") if isinstance(message.get("content"), list) else ()):
            kind = _PART_KINDS.get(part.get("type")) if isinstance(part, dict) and isinstance(part.get("type"),
                                                                                                str) else None
            if kind:
                counts[kind] += 1
            if kind == "audio" and first_audio is None:
                first_audio = f"messages[{i}].content[{j}] ({part['type']})"
    if first_audio is not None and not hears:
        raise NoAudioError(f"{first_audio}: this model does not hear (it has no audio encoder); send text, images "
                           "or videos, or serve a model that hears (Nemotron 3 Nano Omni)")
    for kind, count in counts.items():
        policy.limits.check_count(kind, count)


def _url_of(part: dict, key: str, where: str):
    value = part.get(key)
    if isinstance(value, dict):
        value = value.get("url")
    if not isinstance(value, str):
        raise InputError(f"{where}: expected {{\"type\": \"{key}\", \"{key}\": {{\"url\": \"data:...\"}}}}")
    return value


def _part(part, where: str, policy: MediaPolicy) -> dict:
    if not isinstance(part, dict):
        raise InputError(f"{where} must be an object with a type")
    kind = part.get("type")
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise InputError(f"{where}: a text part needs a string \"text\"")
        return {"type": "text", "text": part["text"]}
    try:  # a media part's errors name the part, whatever decides them (source policy, base64, caps)
        return _media_part(part, kind, where, policy)
    except VLError as e:
        if str(e).startswith(where):
            raise
        raise type(e)(f"{where}: {e}") from None


def _media_part(part: dict, kind, where: str, policy: MediaPolicy) -> dict:
    if kind == "image_url":
        return {"type": "image", "image": resolve(_url_of(part, "image_url", where), "image", policy)}
    if kind == "video_url":
        return {"type": "video", "video": resolve(_url_of(part, "video_url", where), "video", policy)}
    if kind == "audio_url":  # vLLM's: a data: URI, an allowed file:// path or (with --allow-fetch) an http(s) URL
        return {"type": "audio", "audio": resolve(_url_of(part, "audio_url", where), "audio", policy)}
    if kind == "input_audio":
        return {"type": "audio", "audio": _input_audio(part.get("input_audio"), policy)}
    if kind == "file":
        f = part.get("file")
        if not isinstance(f, dict) or not isinstance(f.get("file_data"), str):
            raise InputError("a file part needs file.file_data (a base64 PDF, or a data: URI); uploaded file ids "
                             "are not supported")
        data = f["file_data"]
        if not data.startswith("data:"):
            data = "data:application/pdf;base64," + data
        name = str(f.get("filename") or "")
        if name and not name.lower().endswith(".pdf"):
            raise InputError(f"only PDF files are accepted as file parts, found {name[:60]!r}")
        return {"type": "pdf", "pdf": resolve(data, "pdf", policy)}
    raise InputError(f"unsupported part type {_short(kind)}; expected text, image_url, video_url, input_audio, "
                     "audio_url or file")


def _input_audio(value, policy: MediaPolicy) -> bytes:
    """OpenAI's `{"data": "<base64>", "format": "wav"}` -> the audio bytes. The format must name a container that
    is decoded; the bytes themselves are judged by their content when the request is prepared."""
    if not isinstance(value, dict) or not isinstance(value.get("data"), str) or not value["data"]:
        raise InputError("expected {\"type\": \"input_audio\", \"input_audio\": {\"data\": \"<base64>\", "
                         "\"format\": \"wav\"}}")
    fmt = value.get("format")
    if not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS:
        hint = " (raw PCM has no header: send it as WAV)" if str(fmt).lower().startswith("pcm") else ""
        raise UnsupportedFormatError(f"input_audio.format must be one of {', '.join(AUDIO_FORMATS)}, found "
                                     f"{_short(fmt)}{hint}")
    data = value["data"]
    if data.startswith("data:"):  # a data: URI where the bare base64 belongs: taken as the same bytes
        data = data.partition(",")[2]
    return decode_base64(data, "audio", policy.max_bytes("audio"), "input_audio.data")
