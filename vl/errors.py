"""Typed errors shared by every layer.

Each error carries a stable machine `code` (what a client or the eval runner records) and a message
that says what was expected, what was found and what to do. `InputError`s are the caller's fault
(HTTP 4xx); everything else is ours (5xx).
"""

import contextlib


class VLError(Exception):
    code = "error"
    http_status = 500


@contextlib.contextmanager
def naming(what: str | None):
    """Prefix the message of a `VLError` raised inside with `what: ` (the flag and file of a command, or which item of
    a request: "audio 2 of 3"), so that a request of several items says which one failed; type and code stay. The
    name and the message before it are kept as `exc.named` and `exc.unnamed` (a front end may rename the item)."""
    try:
        yield
    except VLError as exc:
        if what:
            exc.named, exc.unnamed = what, str(exc)
            exc.args = (f"{what}: {exc}",)
        raise


def item_names(kinds: list[str]) -> list[str | None]:
    """For each item of a request, by kind ("image", "video", "audio"), its name for `naming`: "video 2 of 3" when
    the request holds more than one of that kind, else None (a lone item needs no name)."""
    totals = {k: kinds.count(k) for k in kinds}
    seen: dict[str, int] = {}
    names = []
    for k in kinds:
        seen[k] = seen.get(k, 0) + 1
        names.append(f"{k} {seen[k]} of {totals[k]}" if totals[k] > 1 else None)
    return names


# --- configuration and checkpoints -------------------------------------------------------------
class ConfigError(VLError, ValueError):
    code = "bad_config"


class CheckpointError(VLError, ValueError):
    code = "bad_checkpoint"


class UnsafeCheckpointError(CheckpointError):
    """Pickle files, remote code: refused, never executed."""

    code = "unsafe_checkpoint"


# --- user input ----------------------------------------------------------------------------------
class InputError(VLError, ValueError):
    code = "bad_input"
    http_status = 400


class MediaError(InputError):
    code = "bad_media"


class UnsupportedFormatError(MediaError):
    code = "unsupported_format"


class MediaTooLargeError(MediaError):
    code = "too_large"


class CorruptMediaError(MediaError):
    code = "corrupt_media"


class EncryptedPDFError(MediaError):
    code = "encrypted_pdf"


class NoVideoStreamError(MediaError):
    code = "no_video_stream"


class EncryptedMediaError(MediaError):
    """A DRM-encrypted video (MP4 Common Encryption `encv`/`enca`, Matroska ContentEncryption): without the key
    a decoder returns garbage, so it is refused before decoding."""

    code = "encrypted_media"


class MediaNotFoundError(InputError):
    """A named media file does not exist (checked before the model loads, so the user waits for nothing)."""

    code = "file_not_found"


class TooManyItemsError(InputError):
    code = "too_many_items"


class RemoteMediaError(InputError):
    """A URL or a path outside the allowed roots was given where media bytes were expected."""

    code = "remote_media_refused"


class ContextLengthError(InputError):
    code = "context_length"


class NoVisionError(InputError):
    """An image, video or PDF was sent to a model without a vision tower (ours, or a remote server's)."""

    code = "no_vision"


class GenerationOptionError(InputError):
    code = "bad_generation_option"


class UnsupportedFieldError(GenerationOptionError):
    """A request field that would change the answer in a way this server does not implement: refused by name,
    never ignored."""

    code = "unsupported_field"


class UnknownFieldError(InputError):
    """A request field no API we follow defines (OpenAI refuses those too: "Unrecognized request argument")."""

    code = "unknown_field"


# --- runtime faults --------------------------------------------------------------------------------
class DecoderCrashedError(VLError):
    code = "decoder_crashed"


class StoppedError(VLError):
    """The user stopped the request (Stop button, Ctrl-C) while its media were read or encoded."""

    code = "stopped"
    http_status = 499


class DecodeTimeoutError(VLError):
    code = "decode_timeout"
    http_status = 504


class DecoderResourceError(VLError):
    """The decoder itself failed for want of a resource (a library that would not load, memory outside a cap):
    ours, not the file's; the same file may decode on a retry."""

    code = "decoder_resources"
    http_status = 503


# --- serving (vl/server, its client) ------------------------------------------------------------------
class MediaURLRefusedError(RemoteMediaError):
    """An http(s) media URL sent to a server started without --allow-fetch."""

    code = "media_url_refused"
    http_status = 400


class MediaFetchError(InputError):
    """A media URL the server was allowed to fetch could not be fetched (refused address, HTTP error, redirect,
    too slow)."""

    code = "media_fetch_failed"


class AuthenticationError(InputError):
    code = "invalid_api_key"
    http_status = 401


class ModelNotFoundError(InputError):
    code = "model_not_found"
    http_status = 404


class RequestTooLargeError(InputError):
    """The HTTP request body itself is over the server's cap (the one 413: media inside a body are 400)."""

    code = "request_too_large"
    http_status = 413


class RequestBodyTimeoutError(InputError):
    """The client sent its request body too slowly (a slow-client bound of the server)."""

    code = "request_timeout"
    http_status = 408


class QueueFullError(VLError):
    """Every queue slot is taken; the client should retry later (the server never makes it wait unboundedly)."""

    code = "queue_full"
    http_status = 429


class ServerUnavailableError(VLError, ConnectionError):
    """The server cannot take the request now (shutting down, or a remote server that does not answer);
    transient: retrying later may succeed."""

    code = "unavailable"
    http_status = 503


class ServerReplyError(VLError):
    """A remote server answered with something that is not the OpenAI protocol (an HTML or JSON page where an
    event stream belongs, a malformed event): a wrong URL or a proxy in the way; retrying gets the same."""

    code = "bad_server_reply"
    http_status = 502


class QuantFormatError(CheckpointError):
    """A quantized tensor or scale has the wrong dtype / shape / value, or a scale is missing."""

    code = "bad_quant_format"


class QuantUnavailableError(VLError, RuntimeError):
    """A requested execution path (e.g. native FP8 GEMM) does not exist on this device."""

    code = "quant_unavailable"


def error_class_for(code: str) -> type[VLError]:
    """The error class whose stable `code` this is (VLError for an unknown one): how a client of our server
    turns an error reply back into the same typed error a local engine would have raised."""
    stack, found = [VLError], {}
    while stack:
        cls = stack.pop()
        found.setdefault(cls.code, cls)
        stack.extend(cls.__subclasses__())
    return found.get(code, VLError)


# --- audio input (a file, or the sound track of a video) -------------------------------------------------
class NoAudioStreamError(MediaError):
    """A file sent as audio, or a video whose sound was asked for, holds no audio stream."""

    code = "no_audio_stream"


class AudioTooShortError(MediaError):
    """A clip too short for the mel features' per-clip normalisation (fewer than two feature frames: its
    standard deviation is undefined, NaN in transformers' extractor, refused in NeMo's)."""

    code = "audio_too_short"


class NoAudioError(InputError):
    """Audio was sent to a model without an audio encoder (Nano V2 VL, an Omni checkpoint without `audio_config`,
    or a remote server's model that does not hear)."""

    code = "no_audio"
