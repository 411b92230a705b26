"""Typed errors shared by every layer.

Each error carries a stable machine `code` (what a client or the eval runner records) and a message
that says what was expected, what was found and what to do. `InputError`s are the caller's fault
(HTTP 4xx); everything else is ours (5xx).
"""


class VLError(Exception):
    code = "error"
    http_status = 500


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
    http_status = 415


class MediaTooLargeError(MediaError):
    code = "too_large"
    http_status = 413


class CorruptMediaError(MediaError):
    code = "corrupt_media"


class EncryptedPDFError(MediaError):
    code = "encrypted_pdf"


class NoVideoStreamError(MediaError):
    code = "no_video_stream"


class MediaNotFoundError(InputError):
    """A named media file does not exist (checked before the model loads, so the user waits for nothing)."""

    code = "file_not_found"


class TooManyItemsError(InputError):
    code = "too_many_items"
    http_status = 413


class RemoteMediaError(InputError):
    """A URL or a path outside the allowed roots was given where media bytes were expected."""

    code = "remote_media_refused"
    http_status = 403


class ContextLengthError(InputError):
    code = "context_length"


class GenerationOptionError(InputError):
    code = "bad_generation_option"


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
