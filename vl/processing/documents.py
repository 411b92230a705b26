"""Untrusted PDF -> rendered page images (pypdfium2), and a token-budget plan for long documents.

Safety follows reliability_matrix.md §1.4 and rows P1-P6:
- PDFium is not thread-safe at all, not even across documents (pypdfium2 docs), so every pypdfium2 call of this
  process, open and close included, runs under ONE process-wide lock (`PDFIUM_LOCK`); objects are closed
  explicitly inside the lock so that no finalizer calls PDFium from another thread later;
- byte cap and `%PDF` signature first (images never reach PDFium, PDFs never reach Pillow's own PDF parser);
- page count and rendered pixels (page size in points x render scale, as pypdfium2 computes the bitmap:
  `ceil(w * scale) x ceil(h * scale)`) are checked for every selected page before the first page is rendered;
- encrypted files without or with a wrong password -> `EncryptedPDFError` (from PdfiumError.err_code);
  unreadable files -> `CorruptMediaError`; `isolate=True` renders in a sandbox worker (segfault history).

Render scale: 2.0 (144 dpi) by default, so a Letter page becomes 1224 x 1584 px, which the image tiler maps to
a 3 x 4 grid of 512 px tiles (+ thumbnail), close to the model's 12-tile maximum.
"""

import math
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
from vl.processing.limits import DEFAULT_LIMITS, MediaLimits
from vl.processing.progress import Work

PDFIUM_LOCK = threading.RLock()
DEFAULT_SCALE = 2.0  # 144 dpi
_FPDF_ERR_PASSWORD, _FPDF_ERR_SECURITY = 4, 5


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
                f"page range {part!r} is outside 1..{num_pages} (or reversed); the document has {num_pages} pages."
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
        if isolate:
            from vl.processing.sandbox import run_isolated

            return run_isolated(render_pdf_bytes, data, page_spec, scale, password, limits, render,
                                timeout=limits.pdf_timeout_s, memory_mb=limits.worker_memory_mb)
        return render_pdf_bytes(data, page_spec, scale, password, limits, render)

    work = Work.current()
    if work.cancel is None and work.on_progress is None:
        return run(pages)
    # someone watches: check every selected page first (nothing rendered), then render a few pages per call,
    # reporting "page i/n" and stopping between calls. Each call sends the bytes again, so calls are fewer for
    # big files: at most ~256 MiB of bytes go to the renderer in all.
    plan = run(pages, render=False)
    numbers = plan.page_numbers
    calls = max(1, min(len(numbers), (256 << 20) // max(len(data), 1)))
    per_call = math.ceil(len(numbers) / calls)
    images = []
    work.report("rendering PDF page", 0, len(numbers))
    for k in range(0, len(numbers), per_call):
        chunk = numbers[k:k + per_call]
        images += run(",".join(str(n) for n in chunk)).pages
        work.report("rendering PDF page", len(images), len(numbers))
    return RenderedDocument(images, numbers, plan.page_sizes_pt, plan.num_pages, scale, plan.metadata)


def render_pdf_bytes(data: bytes, pages: str | None, scale: float, password: str | None,
                     limits: MediaLimits, render: bool = True) -> RenderedDocument:
    if b"%PDF-" not in data[:1024]:  # the spec allows junk before the header, within the first 1024 bytes
        raise UnsupportedFormatError("expected a PDF (no '%PDF-' header in the first 1024 bytes); send a PDF file.")
    import pypdfium2 as pdfium

    with PDFIUM_LOCK:
        try:
            pdf = pdfium.PdfDocument(data, password=password)
        except pdfium.PdfiumError as e:
            code = getattr(e, "err_code", None)
            if code == _FPDF_ERR_PASSWORD:
                what = "no password was given" if password is None else "the password is wrong"
                raise EncryptedPDFError(f"the PDF is encrypted and {what}; send an unencrypted copy.") from None
            if code == _FPDF_ERR_SECURITY:
                raise EncryptedPDFError("the PDF uses an unsupported security scheme; send an unencrypted copy.") from None
            raise CorruptMediaError(f"cannot open the PDF ({e}); the file is damaged; re-export it.") from None
        try:
            return _render_open_document(pdf, pages, scale, limits, render)
        except VLError:
            raise
        except (pdfium.PdfiumError, ValueError, OSError) as e:
            raise CorruptMediaError(f"cannot render the PDF ({e}); the file is damaged; re-export it.") from None
        finally:
            pdf.close()


def _render_open_document(pdf, pages, scale, limits, render: bool = True) -> RenderedDocument:
    """`render=False` runs every check and reads the page sizes, and renders nothing (`pages` stays empty)."""
    num_pages = len(pdf)
    if num_pages == 0:
        raise CorruptMediaError("the PDF has no pages.")
    selected = parse_page_range(pages, num_pages)
    if len(selected) > limits.max_pdf_pages:
        raise MediaTooLargeError(
            f"{len(selected)} pages selected, at most {limits.max_pdf_pages} are rendered per request; "
            "pass a page range such as '1-20'."
        )
    sizes = [pdf.get_page_size(i) for i in selected]  # from the page tree, nothing rendered yet
    for number, (w, h) in zip(selected, sizes):
        if not (w > 0 and h > 0 and math.isfinite(w) and math.isfinite(h)):
            raise CorruptMediaError(f"page {number + 1} has an invalid size {w} x {h} pt.")
        px_w, px_h = math.ceil(w * scale), math.ceil(h * scale)
        if px_w * px_h > limits.max_pdf_page_pixels:
            raise MediaTooLargeError(
                f"page {number + 1} is {w:.0f} x {h:.0f} pt, {px_w} x {px_h} px at scale {scale}, above the "
                f"{limits.max_pdf_page_pixels:,}-pixel cap; render it at a lower scale."
            )
    images = []
    for index in selected if render else ():
        page = pdf[index]
        try:
            bitmap = page.render(scale=scale, may_draw_forms=False)
            try:
                images.append(bitmap.to_pil().convert("RGB"))  # a copy: the bitmap buffer is freed below
            finally:
                bitmap.close()
        finally:
            page.close()
    meta = {}
    try:
        meta = {k: str(v)[:200] for k, v in pdf.get_metadata_dict(skip_empty=True).items()}
    except Exception:  # noqa: BLE001 - metadata is optional decoration, never a reason to fail
        meta = {}
    return RenderedDocument(images, [i + 1 for i in selected], sizes, num_pages, scale, meta)


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
