"""Document QA tab: page images or one PDF (page range), a question, tile / token-budget control.

The answer streams; reasoning streams into a collapsible section; the gallery shows the tiles the vision tower
saw (thumbnail last, as the reference tiler orders them); stats show the token counts and speeds. Files are
classified by extension only to choose the message part; the processor sniffs the bytes (a `.png` holding a PDF
is refused) and decodes them in a sandbox worker.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import gradio_client.utils as client_utils
from gradio.utils import NamedString

from ui.controls import MODEL, AppContext, Controls, api_example, file_example, gen_options, shown_if_tiled
from ui.kept_tokens import draw_kept, keep_grids
from ui.limits import check_int, check_option, check_upload, slider_max
from ui.page_picker import wire_page_picker
from ui.runner import gradio_progress, previews, previews_note, stats_markdown, stream_chat
from ui.stop import STOPPED_TEXT, StopFlag, failed, run_with_stop, stop_state, wire_stop
from vl.errors import InputError
from vl.processing.documents import parse_page_range

# what the image decoder accepts (vl/processing/images.py ALLOWED_FORMATS; it checks the bytes, not the name)
IMAGE_TYPES = [".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".heic", ".heif", ".avif"]
MAX_QUESTION_CHARS = 4000
# what the tab takes from any model: the server's file-type check; the served model refuses the rest with its own
# typed error (Nemotron 3 Nano Omni's processor refuses a PDF)
DOCUMENT_TYPES = IMAGE_TYPES + [".pdf"]


def document_files_props(ctx: AppContext) -> dict:
    """The upload box's filter and label for the served model: page images, and one PDF for a model that reads
    tiles (Nano V2 VL)."""
    what = f"Page images (up to {ctx.limits.media.max_images})" + (" or one PDF" if ctx.tiled else "")
    return {"file_types": IMAGE_TYPES + ([".pdf"] if ctx.tiled else []), "label": what}


def without_stray_temp_files(files: gr.File, accepted: list[str]) -> gr.File:
    """`files` (a `gr.File(type="filepath")`) made to hand over upload paths without Gradio 6.31's stray file.

    Gradio's `File._process_single_file` opens `NamedTemporaryFile(delete=False)` in the upload folder, then
    returns the upload's own path and drops the temp file: one empty file per file per request, which
    `delete_cache` never removes (it is in no list of the app's files). The 10-minute soak counted the upload
    folder growing from 25 to 358 files. This instance's method returns the upload's path after Gradio's
    file-type check and creates nothing. The check is against `accepted`, not the component's `file_types`: the
    browser's filter is set for the model served now (ui/model_picker.py), while this instance keeps the one it
    was built with. (An instance attribute, not a subclass: Gradio's component metaclass writes a `.pyi` stub next
    to the module of every component subclass.)
    """
    if files.type != "filepath":
        raise ValueError(f"expected a gr.File with type='filepath', found type={files.type!r}")

    def process_single_file(f):
        if not client_utils.is_valid_file(f.path, accepted):
            raise gr.Error(f"Invalid file type. Please upload a file that is one of these formats: {accepted}")
        return NamedString(f.path)

    files._process_single_file = process_single_file
    return files


def _paths(files) -> list:
    if files is None:
        return []
    return list(files) if isinstance(files, (list, tuple)) else [files]


def document_messages(paths: list[str], question: str) -> list[dict]:
    """The engine messages for files already checked by `check_upload`: media parts first, then the question."""
    content = []
    for p in paths:
        kind = "pdf" if Path(p).suffix.lower() == ".pdf" else "image"
        content.append({"type": kind, kind: p})
    content.append({"type": "text", "text": question})
    return [{"role": "user", "content": content}]


def check_question(question) -> str:
    question = (question or "").strip()
    if not question:
        raise InputError("type a question about the document")
    if len(question) > MAX_QUESTION_CHARS:
        raise InputError(f"the question has {len(question)} characters; at most {MAX_QUESTION_CHARS} are accepted")
    return question


def document_request(ctx: AppContext, files, pages, question, max_tiles, token_budget, skip_blank=False,
                     prune_rate=0.0):
    """Checked inputs -> (messages, processor kwargs, page numbers for captions). For a model that reads images at
    their own resolution (Nemotron 3 Nano Omni) the tiling and reduction controls are not sent: they do not apply."""
    paths = [check_upload(f, ctx.media_roots, ctx.limits.max_upload_mb << 20) for f in _paths(files)]
    if not paths:
        raise InputError("upload page images or a PDF first")
    question = check_question(question)
    pages = (pages or "").strip() or None
    if pages and not any(Path(p).suffix.lower() == ".pdf" for p in paths):
        raise InputError("a page range applies to a PDF; no PDF was uploaded")
    proc = {"max_num_tiles": check_option("tiles per page", "max_num_tiles", max_tiles, ctx.limits.max_tiles),
            "pages": pages, "skip_blank_tiles": bool(skip_blank),
            "token_pruning_rate": check_option("redundant-token pruning rate", "token_pruning_rate", prune_rate or 0.0)}
    budget = check_int("vision token budget", token_budget or 0, 0, ctx.engine.context_length)
    if not ctx.tiled:  # the controls are still checked above: the API accepts any JSON
        proc = {}  # a PDF is refused by the Omni processor, with its own message
    elif budget:
        reserved = 1024  # the processor's default room for the question and the answer
        proc["context_length"] = min(ctx.engine.context_length, budget + reserved)
        proc["reserved_tokens"] = reserved
    page_numbers = None
    if pages:
        page_numbers = [i + 1 for i in parse_page_range(pages, 10**6)]
    return document_messages(paths, question), proc, page_numbers


def document_gallery(ctx: AppContext, stats, page_numbers) -> list[tuple]:
    """(picture, caption) per tile the model saw; with redundant-token pruning on, the dropped tokens' squares
    are washed out (ui/kept_tokens.py) and the caption says how many of the tile's tokens were kept."""
    shown = previews(stats, ctx.config, ctx.limits.max_gallery, page_numbers)
    if not shown:
        return []
    tpt = ctx.config.tokens_per_tile
    pixels = getattr(stats, "pixel_values", None)
    grids = keep_grids(getattr(stats, "vision_keep", None), 0 if pixels is None else int(pixels.shape[0]), tpt)
    if not grids:
        return [(p.image, p.caption) for p in shown]
    return [(draw_kept(p.image, g), f"{p.caption} · {int(g.sum())}/{tpt} kept") for p, g in zip(shown, grids)]


def answer_document(ctx: AppContext, files, pages, question, max_tiles, token_budget, thinking, reasoning_budget,
                    max_new_tokens, temperature, skip_blank=False, prune_rate=0.0, flag=None, progress=None):
    cancel = flag.event if isinstance(flag, StopFlag) else None  # cleared at the click (ui/stop.py)
    try:
        options = gen_options(ctx.limits, thinking, reasoning_budget, max_new_tokens, temperature)
        messages, proc, page_numbers = document_request(ctx, files, pages, question, max_tiles, token_budget,
                                                        skip_blank, prune_rate)
        yield "", "", [], "*reading the document…*"
        for snap in stream_chat(ctx.engine, messages, options, timeout_s=ctx.limits.request_timeout_s,
                                cancel=cancel, progress=gradio_progress(progress), **proc):
            if not snap.done:
                yield snap.reasoning, snap.answer, gr.skip(), "*generating…*"
                continue
            if snap.result.finish_reason == "cancelled" and not snap.result.token_ids:
                yield snap.reasoning, snap.answer, [], STOPPED_TEXT
                return
            gallery = document_gallery(ctx, snap.result.stats, page_numbers)
            stats = stats_markdown(snap.result, timeout_s=ctx.limits.request_timeout_s,
                                   extra=previews_note(snap.result.stats, "tiles"))
            yield snap.reasoning, snap.answer, gallery, stats
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message; the app keeps serving
        raise failed(flag, exc, where="document") from None


def build_document_tab(ctx: AppContext, controls: Controls, examples: list[dict]):
    """The tab for the served model: a model that reads images at their own resolution (Nemotron 3 Nano Omni) takes
    images only, so its PDF, tiling and token-reduction controls are hidden (they stay in the API, unused), and
    shown again when the model picker switches to one that reads tiles (`ctx.follow`)."""
    cfg, follow = ctx.config, ctx.follow
    tpt = getattr(cfg, "tokens_per_tile", 1)
    with gr.Row():
        with gr.Column(scale=1):
            files = follow(api_example(without_stray_temp_files(gr.File(
                file_count="multiple", type="filepath", elem_id="doc-files", **document_files_props(ctx)),
                DOCUMENT_TYPES), [file_example("page.png")]), document_files_props)
            pages = follow(api_example(gr.Textbox(label="PDF pages", placeholder="e.g. 1-3,7 (empty = every page, "
                                                  f"at most {ctx.limits.media.max_pdf_pages})", max_lines=1,
                                                  elem_id="doc-pages", **shown_if_tiled(ctx)), "1-3"), shown_if_tiled)
            picker = gr.Gallery(label="Pages (click to add to the page range)", elem_id="doc-page-picker",
                                columns=8, height=150, object_fit="contain", visible=False, allow_preview=False)
            question = api_example(gr.Textbox(label="Question", placeholder="What is the total?", lines=2,
                                              max_length=MAX_QUESTION_CHARS, elem_id="doc-question"),
                                   "What is the total?")
            with follow(gr.Row(elem_id="doc-tiling", **shown_if_tiled(ctx)), shown_if_tiled):
                max_tiles = gr.Slider(1, ctx.limits.max_tiles,
                                      value=min(getattr(cfg, "max_num_tiles", ctx.limits.max_tiles),
                                                ctx.limits.max_tiles), step=1, label="Tiles per page (max)")
                budget = gr.Slider(0, min(ctx.engine.context_length, 32 * 13 * tpt), value=0, step=tpt,
                                   label="Vision token budget for PDF pages",
                                   info="0 = fit the model's context; otherwise pages get fewer tiles to fit")
            with follow(gr.Row(elem_id="doc-reduction", **shown_if_tiled(ctx)), shown_if_tiled):
                skip_blank = gr.Checkbox(value=False, label="Skip blank tiles", elem_id="doc-skip-blank",
                                         info="whitespace tiles never reach the vision encoder")
                prune_rate = gr.Slider(0.0, slider_max("token_pruning_rate", 0.05), value=0.0, step=0.05,
                                       label="Redundant-token pruning rate",
                                       elem_id="doc-prune-rate",
                                       info="fraction of page tokens dropped as repeated background (0 = off)")
            with gr.Row():
                ask = gr.Button("Ask", variant="primary", elem_id="doc-ask")
                stop = gr.Button("Stop", variant="stop", elem_id="doc-stop", interactive=False)
            if examples:
                gr.Examples([[[e["path"]], e.get("pages", ""), e["question"]] for e in examples],
                            inputs=[files, pages, question], label="Bundled examples (click one, then Ask)")
        with gr.Column(scale=1):
            with gr.Accordion("Reasoning", open=False) as reasoning_box:
                reasoning = gr.Textbox(label="Reasoning (streams when /think is on)", lines=6, max_lines=20,
                                       interactive=False, autoscroll=True)
            answer = gr.Textbox(label="Answer", lines=4, max_lines=20, interactive=False, elem_id="doc-answer")
            stats = gr.Markdown(label="Stats", elem_id="doc-stats")
            gallery = gr.Gallery(label="Tiles the model saw", elem_id="doc-gallery", columns=5, height=260,
                                 object_fit="contain", format="png")

    wire_page_picker(ctx, files, pages, picker)
    flag = stop_state()

    def handler(files, pages, question, max_tiles, token_budget, thinking, reasoning_budget, max_new_tokens,
                temperature, skip_blank_tiles, token_pruning_rate, flag, progress=gr.Progress()):
        yield from answer_document(ctx, files, pages, question, max_tiles, token_budget, thinking,
                                   reasoning_budget, max_new_tokens, temperature, skip_blank_tiles,
                                   token_pruning_rate, flag, progress)

    # the reduction controls come after the shared ones, so API callers that predate them keep working
    inputs = [files, pages, question, max_tiles, budget] + controls.inputs + [skip_blank, prune_rate, flag]
    outputs = [reasoning, answer, gallery, stats]
    run = dict(scroll_to="doc-answer", status=stats, concurrency_id=MODEL,
               concurrency_limit=ctx.limits.concurrency)
    event = run_with_stop(ask.click, stop, flag, handler, inputs, outputs, api_name="document", **run)
    run_with_stop(question.submit, stop, flag, handler, inputs, outputs, api_visibility="private", **run)
    wire_stop(stop, flag, stats)
    # the reasoning section opens when /think is switched on, so the thinking is seen as it streams
    controls.thinking.change(lambda on: gr.Accordion(open=bool(on)), controls.thinking, reasoning_box, queue=False,
                             api_visibility="private")
    return event
