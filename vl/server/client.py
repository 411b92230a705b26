"""`RemoteEngine`: `vl.Engine`'s `chat` interface over any OpenAI-compatible server (`vl serve`, vLLM, SGLang, NIM).

Tools that take an engine (the eval runner, the Gradio app) can drive a model served elsewhere: messages in
our shape become an OpenAI Chat Completions request with every medium sent inline (images as `image_url`, videos
as vLLM's `video_url`, PDFs as OpenAI's `file` part, all as `data:` URIs; audio as OpenAI's `input_audio` when its
bytes are WAV or MP3, the two formats OpenAI's API takes, else as vLLM's `audio_url` data URI; an array of samples
as a float WAV, losslessly), the options become OpenAI fields
plus vLLM's and our extensions (only those that differ from their defaults are sent, so a server that does
not know an extension is not sent it needlessly), and the streamed reply becomes the same `Event`s and
`ChatResult`. Transient failures (refused or reset connections, 429, 502, 503, a gateway's 504) are retried with
exponential backoff before any text arrived, as lmms-eval's OpenAI backend does; a request the server has but
does not answer (nothing within the read timeout) is not sent twice. A reply is an answer only when it is one:
an event stream that ends with a `finish_reason` or `[DONE]`. A stream cut short, a broken connection or a
stall is `ServerUnavailableError` (code `unavailable`: retry later); a page or JSON body where the event stream
belongs, or a malformed event, is `ServerReplyError` (`bad_server_reply`: a wrong URL or a proxy in the way).
Statistics only a local engine knows (vision and audio tokens when the server does not report them, memory, cache
hits) are None, never made up.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from vl.errors import (
    GenerationOptionError,
    InputError,
    MediaTooLargeError,
    NoAudioError,
    NoVisionError,
    ServerReplyError,
    ServerUnavailableError,
    VLError,
    error_class_for,
)
from vl.options import DEFAULT_THINKING, RequestOptions, spec
from vl.processing.chat import THINK_CLOSE, toggle_in_messages
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.runtime.results import ChatResult, ChatStream, Event, Stats

RETRY_STATUS = {429, 502, 503, 504}  # a 504 only when it is a gateway's, not one of our typed errors
DONE = object()  # the `[DONE]` event
# What servers say when the model they serve reads no images: vLLM ("<model> is not a multimodal model", 400),
# llama.cpp without --mmproj ("image input is not supported - hint: ... provide the mmproj", 500).
NO_VISION = re.compile(r"not a multimodal model|(image|video) input is not supported|"
                       r"does not support (image|video|vision|multimodal)", re.IGNORECASE)
# ... and when it does not hear: vLLM's per-modality limit of 0 ("At most 0 audio(s) may be provided in one prompt.",
# "... passed 1 audio items in the same prompt"), llama.cpp without an audio mmproj ("audio input is not supported").
NO_AUDIO = re.compile(r"at most 0 audio|audio input is not supported|does not support audio|"
                      r"\{\"audio\": 0\}|unknown audio model type", re.IGNORECASE)
_SAMPLING = ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop")
# sniffed audio container (vl/processing/audio.py) -> the MIME type of an `audio_url` data URI; WAV and MP3 go as
# `input_audio` instead
AUDIO_MIME = {"flac": "audio/flac", "adts": "audio/aac", "ogg": "audio/ogg", "mp4": "audio/mp4",
              "matroska": "audio/webm", "avi": "video/x-msvideo", "mpegts": "video/mp2t", "mpeg-ps": "video/mpeg",
              "flv": "video/x-flv"}


@dataclass(frozen=True)
class RemoteConfig:
    """What the app's controls need to know about a remote model. Our server reports these in /v1/models;
    for other servers they are the released Nano V2 VL's processing defaults (12 tiles of 512 px, 256
    tokens each: docs/server.md), and the EVS rate is unknown (None)."""

    max_num_tiles: int = 12
    video_pruning_rate: float | None = None
    tokens_per_tile: int = 256
    norm_mean: tuple = (0.0, 0.0, 0.0)  # no tiles come back from a server; previews are not shown
    norm_std: tuple = (1.0, 1.0, 1.0)


class _RemoteModel:
    def __init__(self, config: RemoteConfig):
        self.config = config


def encode_media(kind: str, source, limits: MediaLimits = DEFAULT_LIMITS) -> dict:
    """One media part of our messages -> the OpenAI part carrying it inline."""
    from vl.processing.images import read_bytes, sniff_format

    if kind == "audio":
        return encode_audio(source, limits)
    if kind == "image" and hasattr(source, "save") and hasattr(source, "mode"):  # a PIL image
        buf = io.BytesIO()
        source.save(buf, format="PNG")
        data = buf.getvalue()
    else:
        cap = {"image": limits.max_image_bytes, "video": limits.max_video_bytes, "pdf": limits.max_pdf_bytes}[kind]
        data = read_bytes(source, cap, kind)
    b64 = base64.b64encode(data).decode("ascii")
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": f"data:image/{sniff_format(data).lower()};base64,{b64}"}}
    if kind == "video":
        return {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{b64}"}}
    name = Path(os.fspath(source)).name if isinstance(source, (str, os.PathLike)) else "document.pdf"
    return {"type": "file", "file": {"filename": name if name.lower().endswith(".pdf") else name + ".pdf",
                                     "file_data": f"data:application/pdf;base64,{b64}"}}


def encode_audio(source, limits: MediaLimits = DEFAULT_LIMITS) -> dict:
    """An audio part's source (a path, bytes, a file object, or float samples at 16 kHz as the engine takes them) ->
    `input_audio` (WAV, MP3) or an `audio_url` data URI (any other container), the container sniffed from the bytes,
    never from a name. Bytes that are no audio are refused here as the local engine refuses them."""
    from vl.processing.audio import _id3_size, sniff_audio
    from vl.processing.images import read_bytes

    if hasattr(source, "shape") and hasattr(source, "dtype"):  # a numpy array or a torch tensor of samples
        data = float_wav(source, limits)
    else:
        data = read_bytes(source, limits.max_audio_bytes, "audio")
    skip = _id3_size(data[:4096])  # MP3s (and some AAC or FLAC files) often start with an ID3 tag
    container = sniff_audio(data[skip:skip + 4096])
    b64 = base64.b64encode(data).decode("ascii")
    if container in ("wav", "mp3"):
        return {"type": "input_audio", "input_audio": {"data": b64, "format": container}}
    return {"type": "audio_url", "audio_url": {"url": f"data:{AUDIO_MIME.get(container, 'audio/mp4')};base64,{b64}"}}


def float_wav(samples, limits: MediaLimits = DEFAULT_LIMITS, rate: int = 16_000) -> bytes:
    """1-D float samples at `rate` Hz -> a mono 32-bit float WAV (WAVE_FORMAT_IEEE_FLOAT): the server decodes the
    very samples the local engine would have used. The engine's own checks on an array (shape, dtype, length)."""
    import numpy as np

    wave = samples.detach().cpu().numpy() if hasattr(samples, "detach") else np.asarray(samples)
    if wave.ndim == 2 and 1 in wave.shape:
        wave = wave.reshape(-1)
    if wave.ndim != 1 or wave.size == 0 or not np.issubdtype(wave.dtype, np.floating):
        raise InputError(f"an audio array must be 1-D float samples at {rate} Hz, found {wave.dtype} {wave.shape}")
    if wave.size > limits.max_audio_duration_s * rate:
        raise MediaTooLargeError(f"the audio array holds {wave.size / rate:.0f} s, the cap is "
                                 f"{limits.max_audio_duration_s:.0f} s; cut it")
    pcm = wave.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHHH", 3, 1, rate, rate * 4, 4, 32, 0)  # IEEE float, mono, 4-byte frames, cbSize 0
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"fact" + struct.pack("<II", 4, wave.size) + \
        b"data" + struct.pack("<I", len(pcm)) + pcm
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


def _has_video(messages) -> bool:
    return any(isinstance(part, dict) and part.get("type") == "video"
               for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list) for part in m["content"])


def to_openai_messages(messages, limits: MediaLimits = DEFAULT_LIMITS) -> list[dict]:
    out = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append({"role": message.get("role"), "content": content})
            continue
        parts = []
        for part in content:
            kind = part.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": part.get("text", "")})
            elif kind in ("image", "video", "pdf", "audio"):
                parts.append(encode_media(kind, part.get(kind), limits))
            else:
                raise InputError(f"cannot send a {kind!r} part to a remote server; expected text, image, video, "
                                 "audio or pdf")
        out.append({"role": message.get("role"), "content": parts})
    return out


class RemoteEngine:
    def __init__(self, base_url: str, *, api_key: str | None = None, model: str | None = None,
                 timeout_s: float = 600.0, max_retries: int = 3, backoff_s: float = 0.5,
                 limits: MediaLimits = DEFAULT_LIMITS):
        import httpx

        base = base_url.rstrip("/")
        self.base_url = base if base.endswith("/v1") else base + "/v1"
        self.root_url = self.base_url[:-3]  # llama.cpp's /props lives beside /v1
        self.api_key, self._model, self.timeout_s = api_key, model, timeout_s  # timeout_s: the longest silence
        self.max_retries, self.backoff_s, self.limits = max_retries, backoff_s, limits
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=10.0), trust_env=False)
        self._entry: dict | None = None
        self._props_cache: dict | None = None
        self._refused_media: bool = False  # the server refused an image as a text-only model
        self._refused_audio: bool = False  # the server refused audio as a model that does not hear
        self._lock = threading.Lock()

    # --- the served model ------------------------------------------------------------------------------
    def models(self) -> list[dict]:
        r = self._send("GET", "/models")
        try:
            return list(r.json().get("data") or [])
        except (ValueError, AttributeError):
            raise ServerReplyError(f"{self.base_url}/models answered HTTP {r.status_code} "
                                   f"{r.headers.get('content-type', 'without a content-type')}, expected the JSON "
                                   f"model list (first bytes: {r.text[:120]!r}); is the URL an OpenAI-compatible "
                                   "server's /v1?") from None

    def _props(self) -> dict:
        """llama.cpp's `GET /props` (the served context, the modalities); {} from a server without it. Read once."""
        import httpx

        if self._props_cache is None:
            props = {}
            try:
                r = self._client.get(self.root_url + "/props", timeout=10.0)
                if r.status_code == 200 and isinstance(r.json(), dict):
                    props = r.json()
            except (httpx.HTTPError, ValueError):
                pass  # not llama.cpp, or not now: the facts it would give stay unknown
            self._props_cache = props
        return self._props_cache

    def _model_entry(self) -> dict:
        with self._lock:
            if self._entry is None:
                listed = self.models()
                if self._model is None:
                    if len(listed) != 1:
                        raise InputError(f"{self.base_url} serves {len(listed)} models "
                                         f"({', '.join(m.get('id', '?') for m in listed)}); name one "
                                         "(--served-model)")
                    self._entry = listed[0]
                else:
                    self._entry = next((m for m in listed if m.get("id") == self._model), {"id": self._model})
            return self._entry

    @property
    def model_name(self) -> str:
        return self._model or self._model_entry()["id"]

    @property
    def context_length(self) -> int:
        """The server's context: `max_model_len` in its /v1/models entry (vLLM, SGLang, vl serve); llama.cpp's
        served `n_ctx` (/props), else the `n_ctx_train` its entry reports; else the released model's 131072 (the
        vLLM recipe's --max-model-len, docs/server.md)."""
        entry = self._model_entry()
        served = (entry.get("max_model_len")
                  or (self._props().get("default_generation_settings") or {}).get("n_ctx")
                  or (entry.get("meta") or {}).get("n_ctx_train"))
        return int(served or 131072)

    @property
    def has_vision(self) -> bool | None:
        """Whether the served model reads images, as far as the server says: vl serve's `vl.has_vision` in
        /v1/models, llama.cpp's `modalities.vision` in /props; False once it refused an image as a text-only
        model; None when it does not say (vLLM) or cannot be asked now."""
        if self._refused_media:
            return False
        try:
            said = (self._model_entry().get("vl") or {}).get("has_vision")
        except VLError:
            return None
        if said is None:
            said = (self._props().get("modalities") or {}).get("vision")
        return None if said is None else bool(said)

    @property
    def has_audio(self) -> bool | None:
        """Whether the served model hears, as far as the server says: vl serve's `vl.has_audio` in /v1/models,
        llama.cpp's `modalities.audio` in /props; False once it refused audio as a model that does not hear; None
        when it does not say (vLLM) or cannot be asked now."""
        if self._refused_audio:
            return False
        try:
            said = (self._model_entry().get("vl") or {}).get("has_audio")
        except VLError:
            return None
        if said is None:
            said = (self._props().get("modalities") or {}).get("audio")
        return None if said is None else bool(said)

    @property
    def model(self) -> _RemoteModel:
        facts = self._model_entry().get("vl") or {}
        return _RemoteModel(RemoteConfig(**{k: v for k, v in facts.items()
                                            if k in RemoteConfig.__dataclass_fields__ and v is not None}))

    def info(self) -> dict:
        return {"base_url": self.base_url, "model": self.model_name}

    # --- chat ------------------------------------------------------------------------------------------
    def request_body(self, messages, options: RequestOptions | None = None, *, temperature=0.0, top_p=1.0,
                     top_k=0, repetition_penalty=1.0, seed=None, stop=None, **option_kwargs) -> dict:
        """The OpenAI body: sampling fields, then the options where `RequestOptions` declares them
        (vl/options.py: `to_openai`). `context_length` is a local document budget: the server plans with its
        own context, so it is not sent."""
        options = RequestOptions.from_kwargs(options, **option_kwargs)
        unsent = sorted(k for k, v in options.processor_kwargs().items()
                        if spec(k).openai is None and k != "context_length")
        if unsent:
            raise GenerationOptionError(f"option(s) {unsent} cannot be sent to a remote server")
        body = {"model": self.model_name, "messages": to_openai_messages(messages, self.limits),
                "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}}
        optional = {"top_p": (top_p, 1.0), "top_k": (top_k, 0), "repetition_penalty": (repetition_penalty, 1.0),
                    "seed": (seed, None), "stop": (stop or None, None)}
        body.update({k: v for k, (v, default) in optional.items() if v != default})
        body.update(options.to_openai())
        if options.thinking is None and toggle_in_messages(messages) is None:
            # unset and no /think or /no_think in the messages: our default (off), said outright, since a foreign
            # server's own default differs (vLLM renders the card's template: on)
            body.setdefault("chat_template_kwargs", {})["enable_thinking"] = DEFAULT_THINKING
        if options.use_audio_in_video is None and _has_video(messages) and self.has_audio:
            # unset: hear a video's sound when the model hears, as the engine does; said outright, since vLLM's
            # default is off (a server that does not say whether it hears is left to its own default)
            body.setdefault("mm_processor_kwargs", {})["use_audio_in_video"] = True
        return body

    def chat(self, messages, options: RequestOptions | None = None, *, stream: bool = False,
             cancel: threading.Event | None = None, timeout_s: float | None = None, progress=None, **kwargs):
        """`vl.Engine.chat`'s interface. `progress` is accepted for it; the server reports no progress before its
        first token, so it is told once that the request went out."""
        sampling = {k: kwargs.pop(k) for k in _SAMPLING if k in kwargs}
        options = RequestOptions.from_kwargs(options, **kwargs)
        body = self.request_body(messages, options, **sampling)
        if progress is not None:
            progress("waiting for the server", 0, 0)
        s = ChatStream(self._chat_events(body, cancel, timeout_s, options.thinking))
        if stream:
            return s
        for _ in s:
            pass
        return s.result

    def _chat_events(self, body, cancel, timeout_s, thinking):
        import httpx

        t0 = time.perf_counter()
        silence = self.timeout_s if timeout_s is None else min(self.timeout_s, timeout_s)
        reasoning, answer, finish, usage, first, events, done = [], [], None, {}, None, 0, False
        try:
            with self._open_stream(body, silence) as response:
                _require_event_stream(response, self.base_url + "/chat/completions")
                for obj in _sse_objects(response):
                    if obj is DONE:
                        done = True
                        break
                    events += 1
                    if "error" in obj:
                        error = obj["error"]
                        raise _typed_error(error if isinstance(error, dict) else {"message": str(error)},
                                           response.status_code)
                    usage = obj.get("usage") or usage
                    for choice in obj.get("choices") or []:
                        delta = choice.get("delta") or {}
                        for key, kind, sink in (("reasoning_content", "reasoning", reasoning),
                                                ("reasoning", "reasoning", reasoning), ("content", "answer", answer)):
                            text = delta.get(key)
                            if text:
                                first = first or time.perf_counter()
                                sink.append(text)
                                yield Event(kind, text)
                        finish = choice.get("finish_reason") or finish
                    if cancel is not None and cancel.is_set():
                        finish = "cancelled"
                        break
                    if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                        finish = "timeout"
                        break
        except NoVisionError:
            self._refused_media = True
            raise
        except NoAudioError:
            self._refused_audio = True
            raise
        except (httpx.ReadTimeout, httpx.WriteTimeout) as e:
            if timeout_s is None or time.perf_counter() - t0 < timeout_s:
                raise ServerUnavailableError(
                    f"{self.base_url}/chat/completions: the server sent nothing for {silence:g} s (after "
                    f"{_events(events)}, {type(e).__name__}); it may be stuck or overloaded. Retry later, or allow a "
                    "longer silence (RemoteEngine(timeout_s=...), vl eval --read-timeout)") from None
            finish = "timeout"  # the caller's own deadline: the text so far, as a local engine gives it
        except httpx.TransportError as e:
            raise ServerUnavailableError(
                f"{self.base_url}/chat/completions: the connection broke after {_events(events)} "
                f"({type(e).__name__}: {e}); the answer is incomplete. Retry; if it recurs, see the server's "
                "log") from None
        if finish is None and not done:
            raise ServerUnavailableError(
                f"{self.base_url}/chat/completions: the stream ended after {_events(events)} without a "
                "finish_reason or [DONE]: it was cut short (a crashed server or a proxy's timeout) and the answer "
                "is incomplete. Retry")
        finish = finish or "stop"
        end = time.perf_counter()
        reasoning_text, answer_text = "".join(reasoning).strip(), "".join(answer).strip()
        if not reasoning_text and THINK_CLOSE in answer_text:  # a server without a reasoning parser
            reasoning_text, _, answer_text = (part.strip() for part in answer_text.partition(THINK_CLOSE))
        truncated = finish == "length" and bool(reasoning_text) and not answer_text
        text = answer_text if not reasoning_text else reasoning_text + ("" if truncated else THINK_CLOSE + answer_text)
        stats = Stats(prompt_tokens=usage.get("prompt_tokens"), new_tokens=usage.get("completion_tokens"),
                      vision_tokens_before=usage.get("vision_tokens_before"),
                      vision_tokens_after=usage.get("vision_tokens_after"), audio_tokens=usage.get("audio_tokens"),
                      time_to_first_token_s=(first or end) - t0, total_s=end - t0, peak_memory_bytes=None,
                      vision_cache_hits=None)
        n = stats.new_tokens
        if first and n and n > 1:
            stats.decode_tokens_per_s = (n - 1) / max(end - first, 1e-9)
        unreported = [name for name, value in (("vision", stats.vision_tokens_before), ("audio", stats.audio_tokens))
                      if value is None]
        stats.notes.append(f"remote model {self.model_name!r} at {self.base_url}: times measured by this client"
                           + (f"; {' and '.join(unreported)}-token counts are not reported by this server"
                              if unreported else ""))
        return ChatResult(text, reasoning_text, answer_text, [], stats, finish, truncated)

    # --- HTTP ------------------------------------------------------------------------------------------
    def _open_stream(self, body, silence: float):
        """The streamed response, opened with retries (nothing has been shown to the caller yet)."""
        @contextlib.contextmanager
        def opened():
            response = self._send("POST", "/chat/completions", json_body=body, stream=True, silence=silence)
            try:
                yield response
            finally:
                response.close()
        return opened()

    def _send(self, method: str, path: str, json_body=None, stream: bool = False, silence: float | None = None):
        """One request, retried while the server cannot be reached or a gateway says it is busy. A read timeout
        is not retried (the server has the request and may still be working on it): it propagates as httpx's,
        for the caller to tell a stall from its own deadline."""
        import httpx

        last = ""
        timeout = httpx.Timeout(silence or self.timeout_s, connect=10.0)
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                request = self._client.build_request(method, self.base_url + path, json=json_body, timeout=timeout)
                response = self._client.send(request, stream=stream)
            except (httpx.ReadTimeout, httpx.WriteTimeout):
                if stream:
                    raise
                raise ServerUnavailableError(f"{self.base_url}{path}: the server sent nothing for "
                                             f"{silence or self.timeout_s:g} s; is it stuck?") from None
            except (httpx.TransportError, OSError) as e:  # refused, reset, DNS, connect timeouts
                last = f"{type(e).__name__}: {e}"
                continue
            if response.status_code < 400:
                return response
            if stream:
                response.read()
            response.close()
            error = _error_object(response)
            if _retriable(response.status_code, error):
                last = f"HTTP {response.status_code}: {str(error.get('message'))[:200]}"
                continue
            raise _typed_error(error, response.status_code)
        raise ServerUnavailableError(f"{self.base_url}{path} did not answer after {self.max_retries + 1} attempts "
                                     f"(last: {last}); is the server up?")

    def close(self) -> None:
        self._client.close()


def _events(n: int) -> str:
    return f"{n} stream event" + "s" * (n != 1)


def _require_event_stream(response, url: str) -> None:
    """A streamed request is answered by `text/event-stream`; anything else (a proxy's HTML page, a JSON body from a
    server that ignored `"stream": true`) would read as an empty answer, so it is an error naming what came."""
    kind = response.headers.get("content-type", "")
    if kind.split(";")[0].strip().lower() == "text/event-stream":
        return
    head = b""
    for piece in response.iter_bytes():
        head += piece
        if len(head) >= 160:
            break
    hint = (" (a JSON body: the server ignored \"stream\": true)" if kind.startswith("application/json") else "")
    raise ServerReplyError(f"{url} answered a streamed request with HTTP {response.status_code} "
                           f"{kind or 'without a content-type'}{hint}, expected text/event-stream (first bytes: "
                           f"{head[:160]!r}); is the base URL an OpenAI-compatible server's /v1 "
                           "(e.g. http://host:8000/v1), not a web page or a proxy in the way?")


def _sse_objects(response):
    """The JSON objects of an event stream, then `DONE` if the server sent `[DONE]`."""
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            yield DONE
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            raise ServerReplyError(f"the server sent a malformed stream event: {data[:80]!r}; expected a JSON "
                                   "object per `data:` line (OpenAI's chat.completion.chunk)")
        yield obj


def _error_object(response) -> dict:
    """The error of a failed reply: OpenAI's `{"error": {...}}`, vLLM's older flat `{"object": "error",
    "message": ...}`, or the start of a non-JSON page as the message."""
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError):
        return {"message": response.text[:200]}
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            return error
        if error is not None:
            return {"message": str(error)}
        if "message" in data:
            return data
    return {"message": str(data)[:200]}


def _retriable(status: int, error: dict) -> bool:
    """Busy or a gateway in trouble: 429, 502, 503, and a 504 that is not one of our typed errors (our
    `decode_timeout` says the media took too long: the same request would again)."""
    if status not in RETRY_STATUS:
        return False
    return status != 504 or error_class_for(str(error.get("code") or "")) is VLError


def _typed_error(error: dict, status: int) -> VLError:
    """An OpenAI error object -> our typed error: the same class (by stable code) a local engine raises when
    the server is ours; a server's "this model does not hear" as `NoAudioError` and "this model has no vision" as
    `NoVisionError`; by HTTP status otherwise."""
    code, message = str(error.get("code") or ""), str(error.get("message") or "the server refused the request")
    cls = error_class_for(code)
    if cls is VLError and NO_AUDIO.search(message):
        return NoAudioError(f"the server's model does not hear ({message}); send no audio, or serve a model with "
                            "an audio encoder (Nemotron 3 Nano Omni)")
    if cls is VLError and NO_VISION.search(message):
        return NoVisionError(f"the server's model reads no images, videos or documents ({message}); send text "
                             "only, or serve a vision model (llama.cpp: --mmproj)")
    if cls is VLError:
        cls = InputError if 400 <= status < 500 else ServerUnavailableError if status in (502, 503, 504) else VLError
    exc = cls(message)
    if (cls is VLError or cls is InputError) and code and not code.isdigit():  # vLLM and llama.cpp put the status
        exc.code = code
    return exc
