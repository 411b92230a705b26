"""What one app instance admits, and how a refusal reads in the browser.

The serving checklist of docs/reliability_policy.md §3.2 in one place: an upload size cap (Gradio answers 413
before our code runs), media caps checked before decoding (vl/processing/limits.py `MediaLimits`, enforced by
the processor), generation caps, a per-request time limit, and a bounded queue with one model slot (the
engine serves one generation at a time). Errors follow docs/reliability_policy.md §6 "Clear error": the user sees the typed
error's message, never a traceback or a server path; anything unexpected is logged with a request id and
reported by that id.
"""

from __future__ import annotations

import html
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from vl.cli.flags import INTERACTIVE_PDF_PAGES
from vl.options import spec
from vl.errors import GenerationOptionError, InputError, RemoteMediaError, VLError
from vl.processing.limits import MediaLimits

MiB = 1 << 20
log = logging.getLogger("ui")

# a shared server admits less than the library defaults: fewer pages (the cap `vl chat` uses too) and a shorter
# video or audio clip per request
APP_MEDIA_LIMITS = MediaLimits(max_pdf_pages=INTERACTIVE_PDF_PAGES, max_video_duration_s=1800.0,
                               max_video_bytes=512 * MiB,
                               max_pdf_bytes=128 * MiB, max_audio_duration_s=1800.0, max_audio_bytes=512 * MiB)


@dataclass(frozen=True)
class AppLimits:
    max_upload_mb: int = 512  # Gradio `max_file_size`: larger uploads get HTTP 413, nothing is written
    media: MediaLimits = field(default_factory=lambda: APP_MEDIA_LIMITS)
    max_new_tokens: int = 2048  # slider maximum and server-side cap
    max_reasoning_budget: int = 4096
    max_frames: int = 128  # video frames per request (reference sampling: 2 fps x 128)
    max_fps: float = 8.0
    max_tiles: int = 12  # tiles per image (the models were trained with <= 12)
    request_timeout_s: float = 180.0  # generation stops here (engine.chat timeout_s); prefill is not split
    queue_size: int = 16  # waiting requests beyond the running one; more get "Queue is full" (HTTP 503)
    concurrency: int = 1  # running model requests; the engine itself serves one at a time
    max_gallery: int = 48  # tile / frame previews shown per answer

    def __post_init__(self):
        for name in ("max_upload_mb", "max_new_tokens", "max_frames", "max_tiles", "queue_size", "concurrency",
                     "max_gallery"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise GenerationOptionError(f"AppLimits.{name} must be a positive int, found {value!r}")
        if not self.request_timeout_s > 0 or not self.max_fps > 0:
            raise GenerationOptionError("AppLimits.request_timeout_s and max_fps must be positive")


def check_int(name: str, value, low: int, high: int) -> int:
    """A slider value from the client, re-checked on the server (the API accepts any JSON)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise GenerationOptionError(f"{name} must be a number between {low} and {high}, found {value!r}") from None
    if number != int(number) or not low <= number <= high:
        raise GenerationOptionError(f"{name} must be a whole number between {low} and {high}, found {value!r}")
    return int(number)


def check_float(name: str, value, low: float, high: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise GenerationOptionError(f"{name} must be a number between {low} and {high}, found {value!r}") from None
    if not low <= number <= high:
        raise GenerationOptionError(f"{name} must be between {low} and {high}, found {value!r}")
    return number


def check_option(label: str, name: str, value, cap: float | None = None):
    """A control's value for the request option `name`, re-checked on the server (the API accepts any JSON) by
    the option's one validator (vl/options.py), then against this app's own cap when it has one (`AppLimits`).
    Sliders send numbers as floats: a whole float is read as the integer it is."""
    s = spec(name)
    if s.kind in (int, float) and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass  # the validator names what it found
    if s.kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    value = s.check(value, label)
    if cap is not None and value is not None and value > cap:
        raise GenerationOptionError(f"{label} must be at most {cap:g} in this app, found {value!r}")
    return value


def slider_max(name: str, step: float) -> float:
    """The largest slider value the option accepts (one step below an open upper bound)."""
    s = spec(name)
    return round(s.hi - step, 10) if s.hi_open else s.hi


def check_upload(path, roots: list[Path], max_bytes: int) -> str:
    """An uploaded file's path, confined to the upload folder or the bundled examples, and within the size cap.

    The processor confines paths too (`allowed_roots`); checking here gives the message before any work.
    """
    if isinstance(path, dict):  # FileData as a dict (gradio_client, chat history)
        path = path.get("path")
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InputError(f"expected an uploaded file, found {type(path).__name__}")
    p = Path(path).resolve()
    if not any(p.is_relative_to(r) for r in roots):
        raise RemoteMediaError("only files uploaded to this app or its bundled examples can be used")
    if not p.is_file():
        raise InputError(f"the uploaded file {p.name!r} is gone; upload it again")
    size = p.stat().st_size
    if size > max_bytes:
        raise InputError(f"{p.name!r} is {size / MiB:.1f} MiB; uploads are capped at {max_bytes / MiB:.0f} MiB")
    return str(p)


# Advice written for library callers, rewritten to what a user of the app can do where the message is shown.
# Keys: a phrase of a vl error message; values: {tab or "*": replacement}.
APP_ADVICE = {
    "pass a page range such as '1-20'": {
        "document": "type a page range such as 1-20 in the PDF pages box",
        "*": f"ask about it in the Document QA tab, whose PDF pages box picks up to {INTERACTIVE_PDF_PAGES} pages",
    },
    "split the request or raise MediaLimits.max_images.": {"*": "send fewer images per message."},
    "split the request or raise MediaLimits.max_videos.": {"*": "send one video per message."},
    "split the request or raise MediaLimits.max_documents.": {"*": "send one PDF per message."},
    "split the request or raise MediaLimits.max_audios.": {"*": "send fewer audio files per message."},
    " or raise MediaLimits.worker_memory_mb.": {"*": " (decoders here have a fixed memory cap)."},
    "pass fewer pages.": {"document": "type a shorter page range in the PDF pages box.",
                          "*": "use the Document QA tab and its PDF pages box."},
    ": pass a page range.": {"document": ": type a shorter page range in the PDF pages box.",
                             "*": ": use the Document QA tab and its PDF pages box."},
}


def app_advice(message: str, where: str = "*") -> str:
    """`message` with library advice (Python classes, arguments) replaced by what the app's user can do."""
    for phrase, by_tab in APP_ADVICE.items():
        if phrase in message:
            message = message.replace(phrase, by_tab.get(where, by_tab["*"]))
    return message


def error_text(exc: BaseException, where: str = "*") -> tuple[str, str]:
    """(title, message) safe to show for any failure: the typed message for ours, a request id otherwise.
    Not escaped (see `user_error`)."""
    if isinstance(exc, VLError):
        kind = "Input refused" if isinstance(exc, InputError) else "Could not process the request"
        log.info("request refused [%s]: %s", exc.code, exc)
        return kind, f"{app_advice(str(exc), where)} [{exc.code}]"
    request_id = uuid.uuid4().hex[:12]
    log.exception("internal error, request id %s", request_id)
    return "Internal error", f"Internal error (request id {request_id}); it was logged and the app keeps serving."


def user_error(exc: BaseException, where: str = "*"):
    """Any failure -> a `gr.Error` that is safe to show (`error_text`), `where` = the tab, for the advice.

    Messages are HTML-escaped: Gradio renders them as HTML, and they can quote user-chosen file names.
    """
    import gradio as gr

    if isinstance(exc, gr.Error):
        return exc
    title, message = error_text(exc, where)
    return gr.Error(html.escape(message), title=title, print_exception=False)
