"""PDF page thumbnails in the Document tab: see the pages before asking, click them to build the page range.

Thumbnails are rendered like the pages the model sees (vl/processing/documents.py: byte cap, `%PDF` check, page
count and size checks, a sandbox worker), at scale 0.2 (a Letter page is 123 px wide), and only the first pages up
to the app's page cap. A click adds the page to the "PDF pages" box, kept as sorted ranges ("1-3,7"); clicks made
faster than the server answers them all count (`wire_page_picker`).
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from ui.limits import check_upload, user_error
from vl.processing.documents import parse_page_range, render_pdf
from vl.processing.documents import read_bytes, render_pdf_bytes
from vl.processing.sandbox import run_isolated

THUMBNAIL_SCALE = 0.2
MAX_WRITTEN = 64  # box values of a session's clicks kept to recognise a lagging box (older ones: the user's range)


def pdf_thumbnails(path: str, limits, first_n: int) -> list[tuple]:
    """(picture, "p3") for the first `first_n` pages of the PDF at `path` (fewer when it is shorter)."""
    data = read_bytes(path, limits.max_pdf_bytes, what="PDF")
    plan = run_isolated(render_pdf_bytes, data, "1", THUMBNAIL_SCALE, None, limits, False,
                        timeout=limits.pdf_timeout_s, memory_mb=limits.worker_memory_mb)  # page count only
    n = min(plan.num_pages, first_n)
    doc = render_pdf(data, pages=f"1-{n}", scale=THUMBNAIL_SCALE, limits=limits, isolate=True)
    return [(page, f"p{number}") for page, number in zip(doc.pages, doc.page_numbers)]


def add_page(spec: str | None, page: int) -> str:
    """`spec` ("1-3,7") with `page` added, as sorted ranges."""
    chosen = set(parse_page_range(spec, 10**6)) if (spec or "").strip() else set()
    chosen.add(page - 1)
    runs, out = sorted(chosen), []
    start = prev = runs[0]
    for p in runs[1:] + [None]:
        if p is not None and p == prev + 1:
            prev = p
            continue
        out.append(f"{start + 1}" if start == prev else f"{start + 1}-{prev + 1}")
        if p is not None:
            start = prev = p
    return ",".join(out)


def wire_page_picker(ctx, files, pages, picker: gr.Gallery) -> None:
    """Upload of exactly one PDF -> its thumbnails in `picker`; a click on one adds its page to `pages`."""
    def show(files_value):
        paths = [f for f in (files_value or []) if str(f).lower().endswith(".pdf")]
        if len(paths) != 1:
            return gr.Gallery(value=None, visible=False)
        try:
            path = check_upload(paths[0], ctx.media_roots, ctx.limits.max_upload_mb << 20)
            shown = pdf_thumbnails(path, ctx.limits.media, ctx.limits.media.max_pdf_pages)
        except Exception as exc:  # noqa: BLE001 - the question's own request reports the file's problem
            user_error(exc, where="document")  # logged; the picker just stays hidden
            return gr.Gallery(value=None, visible=False)
        return gr.Gallery(value=shown, visible=True, label=f"Pages of {Path(path).name} (click to add to the "
                          "page range)")

    # Clicks in quick succession: each click's request carries the box as the browser shows it, which lags behind
    # clicks still being answered. So every click is sent (trigger_mode "multiple", not the default that drops a
    # click while one is pending), they are answered one at a time, and `written` (the session's server-side state,
    # read when a click is answered) keeps the box values the clicks wrote since the user last typed in it (typing
    # empties it): a box still showing one of them is behind, and the newest is built on; any other value is the
    # user's own range.
    written = gr.State([])

    def pick(spec, history, evt: gr.SelectData):
        spec = spec or ""
        base = history[-1] if spec in history else spec
        history = history[-MAX_WRITTEN:] if spec in history else [spec]
        new = add_page(base, int(evt.index) + 1)
        return new, history + [new]

    files.change(show, files, picker, api_visibility="private")
    pages.input(lambda: [], None, written, queue=False, api_visibility="private")  # typed by the user: theirs
    picker.select(pick, [pages, written], [pages, written], trigger_mode="multiple", concurrency_limit=1,
                  concurrency_id="page_picker", api_visibility="private")
