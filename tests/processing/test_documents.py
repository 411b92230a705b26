"""vl/processing/documents.py: PDF rendering under one lock with caps checked first (docs/reliability_policy.md rows P1-P6),
page ranges, and the document token-budget planner. PDFs are written by hand in media_fixtures.py
(including a real RC4 encryption dictionary, verified below by rendering with the right password)."""

import hashlib
import json
import math
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(__file__))
from media_fixtures import (  # noqa: E402
    FORM_FIELD_BOX,
    encode,
    form_pdf,
    make_pdf,
    noise_image,
    red_square_page,
    text_pdf_without_font,
)

import vl.processing.documents as documents  # noqa: E402
from vl.errors import (  # noqa: E402
    ContextLengthError,
    CorruptMediaError,
    EncryptedPDFError,
    InputError,
    MediaTooLargeError,
    UnsupportedFormatError,
)
from vl.processing.documents import parse_page_range, plan_document_budget, render_pdf  # noqa: E402
from vl.processing.images import load_image, tile_uint8  # noqa: E402
from vl.processing.limits import MediaLimits  # noqa: E402


def _no_render(monkeypatch):
    import pypdfium2

    def refuse(*a, **k):
        raise AssertionError("a page was rendered before the caps were checked")

    monkeypatch.setattr(pypdfium2.PdfPage, "render", refuse)


def _digest(doc):
    return [hashlib.sha256(p.tobytes()).hexdigest() for p in doc.pages]


# --- rendering ------------------------------------------------------------------------------------------


def test_render_pages_sizes_and_golden_pixels():
    doc = render_pdf(make_pdf([red_square_page(200, 100), red_square_page(72.5, 30)]), scale=2.0)
    assert doc.num_pages == 2 and doc.page_numbers == [1, 2]
    assert doc.page_sizes_pt == [(200, 100), (72.5, 30)]
    assert doc.pixel_sizes == [(400, 200), (math.ceil(72.5 * 2), 60)]
    page = doc.pages[0]
    assert page.mode == "RGB"
    assert page.getpixel((5, page.height - 5)) == (255, 0, 0)  # red square: lower-left quarter
    assert page.getpixel((page.width - 5, 5)) == (255, 255, 255)  # white background elsewhere


def test_page_range_selection():
    pdf = make_pdf([red_square_page(100 + 10 * k, 100) for k in range(8)])
    doc = render_pdf(pdf, pages="1-3,7", scale=1.0)
    assert doc.page_numbers == [1, 2, 3, 7] and [s[0] for s in doc.page_sizes_pt] == [100, 110, 120, 160]


def test_parse_page_range():
    assert parse_page_range("1-3,7", 10) == [0, 1, 2, 6]
    assert parse_page_range(" 7 , 1-2, 2 ", 10) == [0, 1, 6]
    assert parse_page_range(None, 3) == [0, 1, 2] and parse_page_range("", 2) == [0, 1]
    for bad in ["0", "11", "3-1", "a-b", "1-", "1,,2"]:
        with pytest.raises(InputError):
            parse_page_range(bad, 10)
    with pytest.raises(InputError, match=r"outside 1\.\.1 \(or reversed\); the document has 1 page\.$"):
        parse_page_range("1-3", 1)  # the README's range on a one-page file: said in words a user can act on
    with pytest.raises(InputError, match=r"the document has 2 pages\.$"):
        parse_page_range("1-3", 2)


# --- P1-P6 -----------------------------------------------------------------------------------------------


def test_p1_encrypted_pdf():
    pdf = make_pdf([red_square_page()], user_password="s3cret")
    with pytest.raises(EncryptedPDFError, match="no password"):
        render_pdf(pdf)
    with pytest.raises(EncryptedPDFError, match="wrong"):
        render_pdf(pdf, password="guess")
    doc = render_pdf(pdf, password="s3cret", scale=1.0)  # the fixture is a valid encrypted file
    assert doc.pages[0].getpixel((5, 95)) == (255, 0, 0)


def test_p2_page_cap_before_rendering(monkeypatch):
    big = make_pdf([(100, 100, b"")] * 10_000)
    _no_render(monkeypatch)
    with pytest.raises(MediaTooLargeError, match="10000 pages selected, at most 200"):
        render_pdf(big)
    with pytest.raises(MediaTooLargeError):
        render_pdf(big, pages="1-201")
    monkeypatch.undo()
    assert render_pdf(big, pages="9999-10000", scale=0.5).page_numbers == [9999, 10000]


def test_p3_pixel_cap_from_page_size_before_rendering(monkeypatch):
    _no_render(monkeypatch)
    with pytest.raises(MediaTooLargeError, match="14400 x 14400 pt"):
        render_pdf(make_pdf([red_square_page(), (14400, 14400, b"")]))
    # exact boundary: ceil(w * scale) * ceil(h * scale) against the cap
    limits = MediaLimits(max_pdf_page_pixels=400 * 200)
    with pytest.raises(MediaTooLargeError):
        render_pdf(make_pdf([(200, 100.5, b"")]), scale=2.0, limits=limits)
    monkeypatch.undo()
    assert render_pdf(make_pdf([(200, 100, b"")]), scale=2.0, limits=limits).pixel_sizes == [(400, 200)]


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_p4_truncated_and_garbage(isolate):
    from vl.processing.sandbox import run_isolated
    from sandbox_targets import pid

    good = make_pdf([red_square_page()])
    worker = run_isolated(pid, timeout=30)
    for bad in [good[: len(good) // 2], good[:-40], b"%PDF-1.7\n" + os.urandom(2000), b"%PDF-"]:
        with pytest.raises(CorruptMediaError):
            render_pdf(bad, isolate=isolate)
    assert run_isolated(pid, timeout=30) == worker  # the worker survived
    assert render_pdf(good, isolate=isolate).page_numbers == [1]


def test_p5_two_threads_one_lock(monkeypatch):
    pdfs = [make_pdf([red_square_page(200, 100)] * 2), make_pdf([red_square_page(150, 150)])]
    expected = [_digest(render_pdf(p, scale=1.0)) for p in pdfs]

    class CheckedLock:
        def __init__(self):
            self.inner, self.guard, self.inside, self.max_inside, self.entries = threading.RLock(), threading.Lock(), 0, 0, 0

        def __enter__(self):
            self.inner.acquire()
            with self.guard:
                self.inside += 1
                self.entries += 1
                self.max_inside = max(self.max_inside, self.inside)

        def __exit__(self, *exc):
            with self.guard:
                self.inside -= 1
            self.inner.release()

    lock = CheckedLock()
    monkeypatch.setattr(documents, "PDFIUM_LOCK", lock)
    errors = []

    def worker(k):
        try:
            for _ in range(50):
                assert _digest(render_pdf(pdfs[k], scale=1.0)) == expected[k]
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors
    assert lock.entries == 100 and lock.max_inside == 1


def test_p6_pdf_to_image_endpoint_and_image_to_pdf_endpoint(monkeypatch):
    from PIL import PdfParser

    def pillow_pdf_parser(*a, **k):
        raise AssertionError("Pillow's PDF parser was invoked")

    monkeypatch.setattr(PdfParser.PdfParser, "__init__", pillow_pdf_parser)
    with pytest.raises(UnsupportedFormatError, match="PDF"):
        load_image(make_pdf([red_square_page()]))
    with pytest.raises(UnsupportedFormatError, match="expected a PDF"):
        render_pdf(encode(noise_image(8, 8), "PNG"))


def test_byte_cap_and_isolated_equals_in_process():
    pdf = make_pdf([red_square_page()] * 3)
    with pytest.raises(MediaTooLargeError):
        render_pdf(pdf, limits=MediaLimits(max_pdf_bytes=len(pdf) - 1))
    assert _digest(render_pdf(pdf, isolate=True)) == _digest(render_pdf(pdf))


# --- token budget planner --------------------------------------------------------------------------------

LETTER_144DPI = (1224, 1584)


def test_budget_fits_without_reduction():
    plan = plan_document_budget([LETTER_144DPI] * 3, context_length=131072, reserved_tokens=2048)
    assert not plan.reduced and plan.max_tiles_per_page == [12] * 3
    assert plan.tiles_per_page == [13] * 3  # 3 x 4 grid + thumbnail
    assert plan.total_tokens == 3 * 13 * 256 and plan.budget_tokens == 131072 - 2048


def test_budget_reduces_uniformly_then_spends_leftover():
    sizes = [LETTER_144DPI] * 20
    plan = plan_document_budget(sizes, context_length=32768, reserved_tokens=1000)
    assert plan.reduced and plan.total_tokens <= plan.budget_tokens
    m = min(plan.max_tiles_per_page)
    assert all(c in (m, m + 1) for c in plan.max_tiles_per_page)
    uniform_up = plan_document_budget(sizes, 10**9, 0, max_tiles=m + 1)  # everyone at m+1 must not fit
    assert uniform_up.total_tokens > plan.budget_tokens
    assert "capped at" in plan.reason and plan.tokens_per_page == [t * 256 for t in plan.tiles_per_page]


def test_budget_matches_the_tiler():
    sizes = [(300, 200), (100, 700), (640, 480), (64, 64), (2000, 90)]
    plan = plan_document_budget(sizes, context_length=40 * 16, reserved_tokens=0, tokens_per_tile=16,
                                tile_size=64)
    assert plan.reduced
    for size, cap, count in zip(sizes, plan.max_tiles_per_page, plan.tiles_per_page):
        tiles, _ = tile_uint8(noise_image(*size), 64, cap)
        assert tiles.shape[0] == count


def test_budget_too_small_even_at_one_tile():
    with pytest.raises(ContextLengthError, match="at most 3 pages fit"):
        plan_document_budget([LETTER_144DPI] * 10, context_length=1000, reserved_tokens=200)


# --- forms and fonts: pages as a viewer shows them, whatever was rendered before ---------------------------------


def _dark_pixels_in_field(page, scale: float) -> int:
    x0, y0, x1, y1 = FORM_FIELD_BOX  # points, y up from the bottom of a 100 pt page
    box = np.asarray(page.convert("L"))[round((100 - y1) * scale):round((100 - y0) * scale),
                                        round(x0 * scale):round(x1 * scale)]
    return int((box < 128).sum())


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_filled_form_fields_are_drawn(isolate):
    """A filled AcroForm text field shows its value on the rendered page (with the viewer's appearance stream, or
    built from /V when the form asks for it); an empty field shows nothing. Twice, and through the processor's
    page-by-page path too."""
    filled = {"appearance": form_pdf("Hello 42"), "need_appearances": form_pdf("Hello 42", appearance=False,
                                                                             need_appearances=True)}
    empty = {"blank value": form_pdf(""), "no value": form_pdf(None, appearance=False, need_appearances=True)}
    for _ in range(2):
        for name, pdf in filled.items():
            page = render_pdf(pdf, isolate=isolate).pages[0]
            assert _dark_pixels_in_field(page, 2.0) > 100, name
        for name, pdf in empty.items():
            assert _dark_pixels_in_field(render_pdf(pdf, isolate=isolate).pages[0], 2.0) == 0, name
    doc = documents.open_pdf_pages(filled["appearance"], isolate=isolate)
    (tiles, _, size), = documents.render_pdf_tiles(doc, [1], tile_size=64, use_thumbnail=False, isolate=isolate)
    blank = documents.open_pdf_pages(empty["blank value"], isolate=isolate)
    (blank_tiles, _, _), = documents.render_pdf_tiles(blank, [1], tile_size=64, use_thumbnail=False, isolate=isolate)
    assert size == (600, 200) and (tiles < 128).sum() > 0 and (blank_tiles < 128).sum() == 0


_FONT_CHILD = """
import hashlib, json, sys
sys.path.insert(0, "tests/processing")
from media_fixtures import form_pdf, make_pdf, red_square_page, text_pdf_without_font
from vl.processing.documents import render_pdf

def digest(pdf, isolate=False):
    return hashlib.sha256(render_pdf(pdf, isolate=isolate).pages[0].tobytes()).hexdigest()

page_a = text_pdf_without_font()
others = [text_pdf_without_font(widths=600), text_pdf_without_font("Garamond", widths=300), form_pdf("Hi"),
          text_pdf_without_font(), make_pdf([red_square_page()])]
seen = {"fresh": digest(page_a)}  # the first thing PDFium renders in this process
seen["again"] = digest(page_a)
for k, other in enumerate(others):
    digest(other)
    seen[f"after other {k}"] = digest(page_a)
for k, other in enumerate(others):  # one sandbox worker, several documents in a row
    digest(other, isolate=True)
    seen[f"worker after other {k}"] = digest(page_a, isolate=True)
print(json.dumps(seen))
"""


def test_pages_with_missing_fonts_render_independently_of_history():
    """A page whose font is not embedded gives the same pixels first in a fresh process, a second time, after
    other documents (with the same font name at other widths, other substitutes, a form), in-process and in one
    sandbox worker. PDFium used to give other pixels each time (its substitute faces are process-wide state)."""
    env = {**os.environ, "PYTHONPATH": REPO}
    run = subprocess.run([sys.executable, "-c", _FONT_CHILD], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    fresh = seen.pop("fresh")
    assert {k: v for k, v in seen.items() if v != fresh} == {}
    page = render_pdf(text_pdf_without_font()).pages[0]  # and the page does show its text
    assert (np.asarray(page.convert("L")) < 128).sum() > 500
