"""Untrusted PDF -> rendered page images (pypdfium2), and a token-budget plan for long documents.

Safety follows docs/reliability_policy.md §1.4 and rows P1-P6:
- PDFium is not thread-safe at all, not even across documents (pypdfium2 docs), so every pypdfium2 call of this
  process, open and close included, runs under ONE process-wide lock (`PDFIUM_LOCK`), held from a document's
  open to its close; objects are closed explicitly inside the lock so that no finalizer calls PDFium from another
  thread later;
- a page renders the same whatever the process rendered before: PDFium's process-wide font state (the faces it
  substitutes for fonts a PDF does not embed, which it adjusts per document and caches glyphs of) is dropped by
  restarting the library before every open (`_restart_pdfium`, ~0.05 ms; docs/pdf.md, "Fonts a PDF does not embed");
- forms are drawn as viewers draw them: the form environment is set up before any page is loaded and pages render
  with `may_draw_forms=True`, so a filled form's values reach the model;
- byte cap and `%PDF` signature first (images never reach PDFium, PDFs never reach Pillow's own PDF parser);
- page count and rendered pixels (page size in points x render scale, as pypdfium2 computes the bitmap:
  `ceil(w * scale) x ceil(h * scale)`) are checked for every selected page before the first page is rendered;
- the sum of rendered pixels over the selected pages is capped too (`max_pdf_total_pixels`): 200 blank
  2048-pt pages are a 25 KB file that would render to ~10 GB;
- pages are rendered one at a time; `render_pdf_tiles` (the processor's path) tiles each page as soon as it is
  rendered and drops its bitmap, so a document never exists as full-resolution pages all at once;
- the error for a file PDFium cannot open is decided by this file alone (docs/pdf.md, "Error codes"): PDFium's
  last-error value is process-global and only written on some failure paths (a document that opens with no
  pages leaves the previous document's code in place, and pypdfium2 reports it), so it is reset before every
  open and read only when the open itself failed; `EncryptedPDFError` needs the file to declare encryption
  (an `/Encrypt` entry) as well as PDFium's password/security code; everything else is `CorruptMediaError`;
  `isolate=True` renders in a sandbox worker (segfault history).

Render scale: 2.0 (144 dpi) by default, so a Letter page becomes 1224 x 1584 px, which the image tiler maps to
a 3 x 4 grid of 512 px tiles (+ thumbnail), close to the model's 12-tile maximum.
"""

import math
import re
import threading
from dataclasses import dataclass, field

from PIL import Image

from vl.errors import (
    ContextLengthError,
    CorruptMediaError,
    EncryptedPDFError,
    InputError,
    MediaTooLargeError,
    UnsupportedFormatError,
    VLError,
)
from vl.processing.images import find_grid, read_bytes
from vl.processing.images import tile_uint8
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.processing.progress import Work
from vl.processing.sandbox import run_isolated

PDFIUM_LOCK = threading.RLock()
DEFAULT_SCALE = 2.0  # 144 dpi
_FPDF_ERR_FILE, _FPDF_ERR_FORMAT, _FPDF_ERR_PASSWORD, _FPDF_ERR_SECURITY = 2, 3, 4, 5
_OPEN_FAILURE = {_FPDF_ERR_FILE: "PDFium cannot read it", _FPDF_ERR_FORMAT: "it is not in PDF format or is corrupted"}
_ENCRYPT_KEY = re.compile(rb"/Encrypt(?![A-Za-z0-9])")  # the trailer's (or xref stream's) /Encrypt entry


@dataclass
class RenderedDocument:
    pages: list[Image.Image]  # RGB, white background, in page_numbers order
    page_numbers: list[int]  # 1-based numbers of the rendered pages
    page_sizes_pt: list[tuple[float, float]]  # (width, height) in PDF points of the rendered pages
    num_pages: int  # pages in the whole document
    scale: float
    metadata: dict[str, str] = field(default_factory=dict)  # title/author/...: attacker text, 200 chars max

    @property
    def pixel_sizes(self) -> list[tuple[int, int]]:
        return [p.size for p in self.pages]


def parse_page_range(spec: str | None, num_pages: int) -> list[int]:
    """"1-3,7" -> [0, 1, 2, 6] (0-based, sorted, unique). None or "" selects every page. 1-based, inclusive."""
    if spec is None or not str(spec).strip():
        return list(range(num_pages))
    chosen: set[int] = set()
    for part in str(spec).split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise InputError(f"page range must look like '1-3,7', found {spec!r}") from None
        if not 1 <= first <= last <= num_pages:
            raise InputError(
                f"page range {part!r} is outside 1..{num_pages} (or reversed); the document has {num_pages} "
                f"page{'' if num_pages == 1 else 's'}."
            )
        chosen.update(range(first - 1, last))
    return sorted(chosen)


def render_pdf(
    source,
    *,
    pages: str | None = None,
    scale: float = DEFAULT_SCALE,
    password: str | None = None,
    limits: MediaLimits = DEFAULT_LIMITS,
    isolate: bool = False,
) -> RenderedDocument:
    """Untrusted PDF (bytes, local path or file object) -> `RenderedDocument` of the pages in `pages`."""
    if not 0 < scale <= 16:
        raise ValueError(f"scale must be in (0, 16], found {scale}")
    data = read_bytes(source, limits.max_pdf_bytes, what="PDF")

    def run(page_spec, render=True):
        return _pdfium_call(render_pdf_bytes, (data, page_spec, scale, password, limits, render), isolate, limits)

    work = Work.current()
    if not work.watched:
        return run(pages)
    # someone watches: check every selected page first (nothing rendered), then render a few pages per call,
    # reporting "page i/n" and stopping between calls
    plan = run(pages, render=False)
    numbers = plan.page_numbers
    images = []
    work.report("rendering PDF page", 0, len(numbers))
    for chunk in _page_chunks(numbers, len(data)):
        images += run(",".join(str(n) for n in chunk)).pages
        work.report("rendering PDF page", len(images), len(numbers))
    return RenderedDocument(images, numbers, plan.page_sizes_pt, plan.num_pages, scale, plan.metadata)


def _pdfium_call(fn, args: tuple, isolate: bool, limits: MediaLimits):
    """`fn(*args)` here, or in a killable sandbox worker with the PDF time and memory limits."""
    if isolate:
        return run_isolated(fn, *args, timeout=limits.pdf_timeout_s, memory_mb=limits.worker_memory_mb)
    return fn(*args)


def _page_chunks(numbers: list[int], nbytes: int) -> list[list[int]]:
    """Pages per renderer call when progress is watched: each call sends the bytes again (to a worker), so calls are
    fewer for big files, at most ~256 MiB of bytes to the renderer in all."""
    calls = max(1, min(len(numbers), (256 << 20) // max(nbytes, 1)))
    per_call = math.ceil(len(numbers) / calls) if numbers else 1
    return [numbers[k:k + per_call] for k in range(0, len(numbers), per_call)]


def render_pdf_bytes(data: bytes, pages: str | None, scale: float, password: str | None,
                     limits: MediaLimits, render: bool = True) -> RenderedDocument:
    """`render=False` runs every check and reads the page sizes, and renders nothing (`pages` stays empty)."""
    with PDFIUM_LOCK:
        pdf = _open_document(data, password)
        try:
            selected, sizes = _select_pages(pdf, pages, scale, limits)
            images = list(_rendered_pages(pdf, selected, scale)) if render else []
            return RenderedDocument(images, [i + 1 for i in selected], sizes, len(pdf), scale, _metadata(pdf))
        except VLError:
            raise
        except (_pdfium().PdfiumError, ValueError, OSError) as e:
            raise CorruptMediaError(f"cannot render the PDF ({e}); the file is damaged; re-export it.") from None
        finally:
            pdf.close()


def _pdfium():
    import pypdfium2

    return pypdfium2


def _open_document(data: bytes, password: str | None):
    """PdfDocument for `data` with its form environment, or the typed error this file alone deserves (module
    docstring). Caller holds PDFIUM_LOCK until it closes the document (the last-error value and the font state
    are shared by the whole process)."""
    if b"%PDF-" not in data[:1024]:  # the spec allows junk before the header, within the first 1024 bytes
        raise UnsupportedFormatError("expected a PDF (no '%PDF-' header in the first 1024 bytes); send a PDF file.")
    pdfium = _pdfium()
    import pypdfium2.raw as pdfium_c

    _restart_pdfium()
    reset = pdfium_c.FPDF_LoadMemDocument64(b"\0", 1, None)  # fails -> sets the last error to a known value
    if reset:
        pdfium_c.FPDF_CloseDocument(reset)
    secret = None if password is None else (password + "\x00").encode("utf-8")
    raw = pdfium_c.FPDF_LoadMemDocument64(data, len(data), secret)
    if not raw:
        raise _open_error(pdfium_c.FPDF_GetLastError(), data, password)
    pdf = pdfium.PdfDocument(raw)  # PDFium reads `data` lazily: callers keep it alive until pdf.close()
    try:
        pdf.init_forms()  # before any page is loaded, or PDFium draws no form field
        if len(pdf) < 1:
            raise CorruptMediaError("the PDF has no pages (or its page tree is damaged); re-export it.")
    except BaseException:
        pdf.close()
        raise
    return pdf


def _restart_pdfium() -> None:
    """Restart PDFium so that the next document renders as in a fresh process. The faces PDFium substitutes for
    fonts a PDF does not embed are shared by the whole process and changed as it renders (multiple-master weight and
    width, cached glyphs), so the same page gave other pixels after another document, or on its second rendering.
    Skipped while some pypdfium2 object is open in this process (not one of ours: they live and die under
    PDFIUM_LOCK), which the restart would close. Caller holds PDFIUM_LOCK."""
    from pypdfium2 import _library_scope  # pypdfium2 is pinned: its init/destroy pair with its own bookkeeping
    from pypdfium2.internal import bases

    if any(bases.ObjectTracker.values()):
        return
    _library_scope.destroy_lib()
    _library_scope.init_lib()


def _open_error(code: int, data: bytes, password: str | None) -> Exception:
    encrypted = _ENCRYPT_KEY.search(data) is not None
    if encrypted and code == _FPDF_ERR_PASSWORD:
        what = "no password was given" if password is None else "the password is wrong"
        return EncryptedPDFError(f"the PDF is encrypted and {what}; send an unencrypted copy.")
    if encrypted and code == _FPDF_ERR_SECURITY:
        return EncryptedPDFError("the PDF uses an unsupported security scheme; send an unencrypted copy.")
    why = _OPEN_FAILURE.get(code, "PDFium cannot parse it")
    return CorruptMediaError(f"cannot open the PDF: {why}; the file is damaged; re-export it.")


def _select_pages(pdf, pages, scale, limits) -> tuple[list[int], list[tuple[float, float]]]:
    """0-based selected pages and their sizes in points, every cap checked from the page tree: nothing rendered."""
    num_pages = len(pdf)
    selected = parse_page_range(pages, num_pages)
    if len(selected) > limits.max_pdf_pages:
        raise MediaTooLargeError(
            f"{len(selected)} pages selected, at most {limits.max_pdf_pages} are rendered per request; "
            "pass a page range such as '1-20'."
        )
    sizes = [pdf.get_page_size(i) for i in selected]  # from the page tree, nothing rendered yet
    total = 0
    for number, (w, h) in zip(selected, sizes):
        if not (w > 0 and h > 0 and math.isfinite(w) and math.isfinite(h)):
            raise CorruptMediaError(f"page {number + 1} has an invalid size {w} x {h} pt.")
        px_w, px_h = rendered_size((w, h), scale)
        if px_w * px_h > limits.max_pdf_page_pixels:
            raise MediaTooLargeError(
                f"page {number + 1} is {w:.0f} x {h:.0f} pt, {px_w} x {px_h} px at scale {scale}, above the "
                f"{limits.max_pdf_page_pixels:,}-pixel cap; render it at a lower scale."
            )
        total += px_w * px_h
    check_total_pixels(total, len(selected), scale, limits)
    return selected, sizes


def rendered_size(size_pt: tuple[float, float], scale: float) -> tuple[int, int]:
    """Bitmap size of a page as pypdfium2 renders it: ceil(w * scale) x ceil(h * scale)."""
    return math.ceil(size_pt[0] * scale), math.ceil(size_pt[1] * scale)


def check_total_pixels(total: int, pages: int, scale: float, limits: MediaLimits) -> None:
    if total > limits.max_pdf_total_pixels:
        raise MediaTooLargeError(
            f"{pages} pages render to {total:,} pixels at scale {scale}, above the {limits.max_pdf_total_pixels:,}"
            "-pixel cap per request; pass a page range or a lower render scale."
        )


def _rendered_pages(pdf, selected, scale):
    """RGB PIL page images, one at a time; each PDFium page and bitmap is closed before the next is made.
    Caller holds PDFIUM_LOCK."""
    for index in selected:
        yield _render_page(pdf, index, scale)


def _render_page(pdf, index: int, scale: float) -> Image.Image:
    """One page as an RGB image. Caller holds PDFIUM_LOCK."""
    page = pdf[index]
    try:
        bitmap = page.render(scale=scale, may_draw_forms=True)  # form fields as viewers draw them
        try:
            return bitmap.to_pil().convert("RGB")  # a copy: the bitmap buffer is freed below
        finally:
            bitmap.close()
    finally:
        page.close()


def _metadata(pdf) -> dict[str, str]:
    try:
        return {k: str(v)[:200] for k, v in pdf.get_metadata_dict(skip_empty=True).items()}
    except Exception:  # noqa: BLE001 - metadata is optional decoration, never a reason to fail
        return {}


# --- page by page: plan from the page tree, then render and tile one page at a time -------------------------


@dataclass(frozen=True)
class PdfPages:
    """A checked PDF before anything is rendered: the selected pages and their rendered pixel sizes."""

    data: bytes
    password: str | None
    scale: float
    page_numbers: list[int]  # 1-based
    pixel_sizes: list[tuple[int, int]]
    num_pages: int


@dataclass(frozen=True)
class PdfPage:
    """One page of a `PdfPages`, as a media item: `size` is what the budget planner needs; pixels come later."""

    document: PdfPages
    position: int  # index into document.page_numbers

    @property
    def size(self) -> tuple[int, int]:
        return self.document.pixel_sizes[self.position]

    @property
    def number(self) -> int:
        return self.document.page_numbers[self.position]


def open_pdf_pages(source, *, pages: str | None = None, scale: float = DEFAULT_SCALE, password: str | None = None,
                   limits: MediaLimits = DEFAULT_LIMITS, isolate: bool = False) -> PdfPages:
    """Read and check an untrusted PDF (every cap, from the page tree) without rendering a page."""
    if not 0 < scale <= 16:
        raise ValueError(f"scale must be in (0, 16], found {scale}")
    data = read_bytes(source, limits.max_pdf_bytes, what="PDF")
    numbers, sizes, count = _pdfium_call(_page_plan, (data, pages, scale, password, limits), isolate, limits)
    return PdfPages(data, password, scale, numbers, sizes, count)


def _page_plan(data, pages, scale, password, limits):
    with PDFIUM_LOCK:
        pdf = _open_document(data, password)
        try:
            selected, sizes = _select_pages(pdf, pages, scale, limits)
            return [i + 1 for i in selected], [rendered_size(s, scale) for s in sizes], len(pdf)
        except VLError:
            raise
        except (_pdfium().PdfiumError, ValueError, OSError) as e:
            raise CorruptMediaError(f"cannot read the PDF's pages ({e}); the file is damaged; re-export it.") from None
        finally:
            pdf.close()


def render_pdf_tiles(doc: PdfPages, max_tiles: list[int], *, tile_size: int, use_thumbnail: bool,
                     limits: MediaLimits = DEFAULT_LIMITS, isolate: bool = False):
    """Render the pages of `doc` one at a time and tile each at once (images.tile_uint8, `max_tiles[k]` for
    page k): peak memory is one page bitmap plus the tiles, whatever the page count.

    Returns one (uint8 tiles (N, S, S, 3), (cols, rows), (width, height)) per page, in page order.
    """
    if len(max_tiles) != len(doc.page_numbers):
        raise ValueError(f"need one tile cap per page ({len(doc.page_numbers)}), found {len(max_tiles)}")

    def run(numbers, caps):
        args = (doc.data, doc.password, doc.scale, numbers, caps, tile_size, use_thumbnail, limits)
        return _pdfium_call(_render_tiles_bytes, args, isolate, limits)

    work = Work.current()
    if not work.watched:
        return run(list(doc.page_numbers), list(max_tiles))
    # someone watches: a few pages per call, "page i/n" after each, a stop between calls renders no further page
    cap_of = dict(zip(doc.page_numbers, max_tiles))
    out = []
    work.report("rendering PDF page", 0, len(doc.page_numbers))
    for chunk in _page_chunks(list(doc.page_numbers), len(doc.data)):
        out += run(chunk, [cap_of[n] for n in chunk])
        work.report("rendering PDF page", len(out), len(doc.page_numbers))
    return out


def _render_tiles_bytes(data, password, scale, page_numbers, max_tiles, tile_size, use_thumbnail, limits):
    out = []
    with PDFIUM_LOCK:  # open to close: the next open restarts PDFium, which needs no document open
        pdf = _open_document(data, password)
        try:
            selected = [n - 1 for n in page_numbers]
            sizes = [rendered_size(pdf.get_page_size(i), scale) for i in selected]
            check_total_pixels(sum(w * h for w, h in sizes), len(selected), scale, limits)  # checked where it renders
            for index, cap in zip(selected, max_tiles):
                image = _render_page(pdf, index, scale)
                tiles, grid = tile_uint8(image, tile_size, cap, use_thumbnail)
                out.append((tiles, grid, image.size))
                del image
        except VLError:
            raise
        except (_pdfium().PdfiumError, ValueError, OSError, IndexError) as e:
            raise CorruptMediaError(f"cannot render the PDF ({e}); the file is damaged; re-export it.") from None
        finally:
            pdf.close()
    return out


# --- token budget ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DocumentBudget:
    max_tiles_per_page: list[int]  # pass as max_num_tiles when tiling each page
    tiles_per_page: list[int]  # tiles the tiler will produce, thumbnail included
    tokens_per_page: list[int]
    total_tokens: int
    budget_tokens: int  # context_length - reserved_tokens
    reduced: bool
    reason: str  # what was reduced and why, for logs and the UI


def plan_document_budget(
    page_sizes,
    context_length: int,
    reserved_tokens: int,
    tokens_per_tile: int = 256,
    max_tiles: int = 12,
    *,
    tile_size: int = 512,
    use_thumbnail: bool = True,
) -> DocumentBudget:
    """Choose `max_num_tiles` per page so the whole document fits `context_length - reserved_tokens`.

    `page_sizes` are (width, height) in pixels as the pages will be tiled (`RenderedDocument.pixel_sizes`).
    Every page gets the same, largest tile cap m <= max_tiles that fits (pages stay comparable); left-over
    budget then raises the cap to m + 1 for pages in reading order while it still fits. Tile counts come from
    images.find_grid, so the plan matches what the tiler produces (a thumbnail is added above one tile).
    Raises ContextLengthError when even one tile per page does not fit: pass fewer pages.
    """
    sizes = [(int(w), int(h)) for w, h in page_sizes]
    budget = context_length - reserved_tokens
    if not sizes:
        return DocumentBudget([], [], [], 0, budget, False, "no pages")

    def tiles(size, cap):
        cols, rows = find_grid(size[0], size[1], cap, tile_size)
        return cols * rows + (1 if use_thumbnail and cols * rows > 1 else 0)

    def total(caps):
        return sum(tiles(s, c) for s, c in zip(sizes, caps)) * tokens_per_tile

    natural = [max_tiles] * len(sizes)
    if total(natural) <= budget:
        caps, reduced, reason = natural, False, "fits at full resolution"
    else:
        fitting = [m for m in range(max_tiles, 0, -1) if total([m] * len(sizes)) <= budget]
        if not fitting:
            fit_pages = max(budget, 0) // tokens_per_tile
            raise ContextLengthError(
                f"{len(sizes)} pages need at least {len(sizes) * tokens_per_tile} tokens at one tile per page, "
                f"the budget is {budget} ({context_length} context - {reserved_tokens} reserved); "
                f"at most {fit_pages} pages fit: pass a page range."
            )
        m = fitting[0]
        caps = [m] * len(sizes)
        for k in range(len(sizes)):
            if m < max_tiles:
                trial = caps[:k] + [m + 1] + caps[k + 1 :]
                if total(trial) <= budget:
                    caps = trial
        raised = sum(c > m for c in caps)
        reason = (
            f"{len(sizes)} pages need {total(natural)} tokens at up to {max_tiles} tiles per page, the budget is "
            f"{budget}; tiles per page capped at {m}" + (f" ({raised} pages at {m + 1})" if raised else "")
        )
        reduced = True
    per_page = [tiles(s, c) for s, c in zip(sizes, caps)]
    tokens = [t * tokens_per_tile for t in per_page]
    return DocumentBudget(caps, per_page, tokens, sum(tokens), budget, reduced, reason)
