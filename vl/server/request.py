"""An OpenAI `/v1/chat/completions` body -> our messages, a `ChatRequest` and `SamplingParams`.

Follows OpenAI's Chat Completions request schema, vLLM's extensions for Nemotron Nano V2 VL
(`video_url` parts, `top_k`, `repetition_penalty`) and the per-request options where `RequestOptions` declares
them (vl/options.py: `mm_processor_kwargs` with `max_num_tiles`/`fps`/`max_frames`/`pages`, `video_pruning_rate`,
`chat_template_kwargs.enable_thinking`, and ours: `token_pruning_rate`, `skip_blank_tiles`, `reasoning_budget`).
Every knob that scales work is checked against a server ceiling before anything is decoded (docs/server.md,
"Security"). A field that would change the answer in a way we do not implement (`n` > 1, penalties, logprobs,
tools, structured output) is refused, never silently dropped; bookkeeping fields (`user`, `metadata`, `store`,
...) are accepted and ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vl.errors import GenerationOptionError, InputError, ModelNotFoundError
from vl.options import RequestOptions, spec
from vl.runtime.batch import ChatRequest
from vl.runtime.sampling import SamplingParams
from vl.server.ceilings import Ceilings
from vl.server.media import MediaPolicy, resolve

IGNORED_FIELDS = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "logit_bias",
                  "prompt_cache_key", "safety_identifier", "modalities", "reasoning_effort", "messages", "model"}
_ZERO_OK = {"frequency_penalty", "presence_penalty"}  # accepted when 0 (their OpenAI default)


@dataclass
class ParsedRequest:
    chat: ChatRequest
    params: SamplingParams
    stream: bool
    include_usage: bool
    model: str


def _num(body, key, kind, lo=None, hi=None, default=None):
    """A sampling field (the request options are checked by `RequestOptions`)."""
    value = body.get(key, default)
    if value is None:
        return default
    ok_type = (isinstance(value, int) and not isinstance(value, bool)) if kind is int else (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
    if not ok_type:
        raise GenerationOptionError(f"{key} must be {'an integer' if kind is int else 'a number'}, found {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise GenerationOptionError(f"{key}={value!r} is out of range: expected [{lo}, {hi}]")
    return kind(value)


def parse_chat_request(body, *, served_names: tuple[str, ...], policy: MediaPolicy, ceilings: Ceilings,
                       default_max_tokens: int = 256) -> ParsedRequest:
    if not isinstance(body, dict):
        raise InputError("expected a JSON object as the request body")
    model = body.get("model")
    if model is not None and model not in served_names:
        raise ModelNotFoundError(f"the model {model!r} does not exist here; this server serves "
                                 f"{', '.join(map(repr, served_names))} (GET /v1/models)")
    _refuse_unsupported(body)
    if body.get("n") not in (None, 1):
        raise GenerationOptionError(f"n={body.get('n')!r}: this server returns one choice per request (n=1)")
    for key in ("max_tokens", "max_completion_tokens"):  # both, when both are sent
        _num(body, key, int, 1, ceilings.max_tokens)
    temperature = _num(body, "temperature", float, 0.0, 2.0, 1.0)  # OpenAI's default is 1
    top_p = _num(body, "top_p", float, 0.0, 1.0, 1.0)
    if top_p == 0:
        raise GenerationOptionError("top_p must be > 0 (use temperature 0 for greedy decoding)")
    top_k = _num(body, "top_k", int, -1, None, 0)
    seed = _num(body, "seed", int, None, None, None)
    repetition_penalty = _num(body, "repetition_penalty", float, 0.0, None, 1.0)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=max(top_k, 0),
                            repetition_penalty=repetition_penalty, seed=seed)
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)) or len(stop) > ceilings.max_stop:
        raise GenerationOptionError(f"stop must be a string or a list of at most {ceilings.max_stop} strings")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InputError(f"stream must be true or false, found {stream!r}")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise InputError("stream_options must be an object like {\"include_usage\": true}")
    base = RequestOptions(max_new_tokens=min(default_max_tokens, ceilings.max_tokens),
                          max_frames=min(ceilings.max_frames, int(spec("max_frames").hi)))
    options = RequestOptions.from_openai(body, base)
    _check_ceilings(options, ceilings)
    chat = ChatRequest(convert_messages(body.get("messages"), policy), options, stop=stop,
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


def _refuse_unsupported(body: dict) -> None:
    for key in _ZERO_OK:
        if body.get(key) not in (None, 0, 0.0):
            raise GenerationOptionError(f"{key} is not supported (only 0); use repetition_penalty instead")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise GenerationOptionError("logprobs are not supported by this server")
    if body.get("tools") or body.get("tool_choice") not in (None, "none", "auto") or body.get("functions"):
        raise GenerationOptionError("tools and function calling are not supported by this server")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise GenerationOptionError("response_format other than {\"type\": \"text\"} is not supported")


# --- messages ------------------------------------------------------------------------------------------
def convert_messages(messages, policy: MediaPolicy) -> list[dict]:
    """OpenAI messages -> the transformers/OpenAI shape the processor reads (vl/processing/chat.py), with media
    resolved to bytes (or an allowed local path). Roles and text are checked by the prompt builder."""
    if not isinstance(messages, list) or not messages:
        raise InputError("messages must be a non-empty list of {\"role\", \"content\"} objects")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InputError(f"messages[{i}] must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if content is None or isinstance(content, str):
            out.append({"role": role, "content": content or ""})
            continue
        if not isinstance(content, list):
            raise InputError(f"messages[{i}].content must be a string or a list of parts")
        out.append({"role": role, "content": [_part(p, f"messages[{i}].content[{j}]", policy)
                                              for j, p in enumerate(content)]})
    return out


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
    if kind == "image_url":
        return {"type": "image", "image": resolve(_url_of(part, "image_url", where), "image", policy)}
    if kind == "video_url":
        return {"type": "video", "video": resolve(_url_of(part, "video_url", where), "video", policy)}
    if kind == "file":
        f = part.get("file")
        if not isinstance(f, dict) or not isinstance(f.get("file_data"), str):
            raise InputError(f"{where}: a file part needs file.file_data (a base64 PDF, or a data: URI); "
                             "uploaded file ids are not supported")
        data = f["file_data"]
        if not data.startswith("data:"):
            data = "data:application/pdf;base64," + data
        name = str(f.get("filename") or "")
        if name and not name.lower().endswith(".pdf"):
            raise InputError(f"{where}: only PDF files are accepted as file parts, found {name[:60]!r}")
        return {"type": "pdf", "pdf": resolve(data, "pdf", policy)}
    raise InputError(f"{where}: unsupported part type {kind!r}; expected text, image_url, video_url or file")
