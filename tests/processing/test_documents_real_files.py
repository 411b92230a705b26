"""vl/processing/documents.py on what real PDF corpora hold: error codes that depend on the file alone (PDFium's
last-error value is process-global and stale), the page bomb (many large blank pages inside every per-page cap),
and page-by-page rendering and tiling. Peak memory is measured as the peak RSS of a child process."""

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from media_fixtures import make_pdf, red_square_page  # noqa: E402

import vl  # noqa: E402
from vl.errors import CorruptMediaError, EncryptedPDFError, MediaTooLargeError  # noqa: E402
from vl.processing.documents import open_pdf_pages, render_pdf, render_pdf_tiles  # noqa: E402
from vl.processing.images import preprocess_image  # noqa: E402
from vl.processing.limits import MediaLimits  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _failing_pdfs() -> dict[str, bytes]:
    good = make_pdf([red_square_page()])
    return {
        "encrypted": make_pdf([red_square_page()], user_password="s3cret"),
        "no_pages": make_pdf([]),  # opens, but has no pages: the case where pypdfium2 reported a stale code
        "garbage": b"%PDF-1.7\n" + np.random.default_rng(0).integers(0, 256, 1500, dtype=np.uint8).tobytes(),
        "truncated": good[: len(good) // 2],
        "header_only": b"%PDF-",
    }


EXPECTED = {"encrypted": "encrypted_pdf", "no_pages": "corrupt_media", "garbage": "corrupt_media",
            "truncated": "corrupt_media", "header_only": "corrupt_media"}


def _outcome(data: bytes) -> tuple[str, str]:
    try:
        render_pdf(data)
    except (EncryptedPDFError, CorruptMediaError) as e:
        return e.code, str(e)
    return "ok", ""


_CHILD = """
import json, sys
from vl.processing.documents import render_pdf
from vl.errors import VLError
try:
    render_pdf(open(sys.argv[1], "rb").read())
    print(json.dumps(["ok", ""]))
except VLError as e:
    print(json.dumps([e.code, str(e)]))
"""


def test_6_pdf_error_codes_depend_on_the_file_alone(tmp_path):
    files = _failing_pdfs()
    seen: dict[str, set] = {name: set() for name in files}
    good = make_pdf([red_square_page()])
    orders = [list(files), list(reversed(files))] + [list(p) for p in itertools.permutations(files)][::17]
    for order in orders:
        for name in order:
            seen[name].add(_outcome(files[name]))
            render_pdf(good)  # a successful open in between changes nothing either
    for name in files:  # and in fresh processes, each file the first thing PDFium opens
        path = tmp_path / f"{name}.pdf"
        path.write_bytes(files[name])
        run = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True,
                             cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, timeout=60)
        seen[name].add(tuple(json.loads(run.stdout.strip().splitlines()[-1])))
    for name, outcomes in seen.items():
        assert len(outcomes) == 1, (name, outcomes)  # same code and same message every time
        code, message = outcomes.pop()
        assert code == EXPECTED[name], (name, code, message)
        assert "Success" not in message
    with pytest.raises(EncryptedPDFError, match="wrong"):
        render_pdf(files["encrypted"], password="guess")


# --- 7. the page bomb ---------------------------------------------------------------------------------------

BOMB = [(2048, 2048, b"")] * 200  # 200 blank 2048-pt pages: each inside the per-page cap at scale 2


def test_7_page_bomb_refused_before_rendering(monkeypatch):
    import pypdfium2

    bomb = make_pdf(BOMB)
    assert len(bomb) < 40_000

    def refuse(*a, **k):
        raise AssertionError("a page was rendered before the total-pixel cap was checked")

    monkeypatch.setattr(pypdfium2.PdfPage, "render", refuse)
    for call in (lambda: render_pdf(bomb), lambda: open_pdf_pages(bomb), lambda: open_pdf_pages(bomb, isolate=True)):
        with pytest.raises(MediaTooLargeError, match="pixel cap per request"):
            call()
    # the boundary: the total is sum(ceil(w * scale) * ceil(h * scale)) over the selected pages
    exact = MediaLimits(max_pdf_total_pixels=3 * 4096 * 4096)
    with pytest.raises(MediaTooLargeError):
        open_pdf_pages(bomb, pages="1-4", limits=exact)
    assert open_pdf_pages(bomb, pages="1-3", limits=exact).pixel_sizes == [(4096, 4096)] * 3


_MEMORY_CHILD = """
import sys, json
sys.path.insert(0, "tests/processing")
from media_fixtures import make_pdf
from vl.processing import documents
from vl.processing.limits import MediaLimits
from vl.errors import MediaTooLargeError

def status_mb(key):  # VmHWM is this process's own peak (ru_maxrss would carry the parent's across exec)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass
    return status_mb("VmRSS")

def peak_mb():
    return status_mb("VmHWM")

mode = sys.argv[1]
unbounded = MediaLimits(max_pdf_total_pixels=10**12)
warm = make_pdf([(100, 100, b"")])
documents.render_pdf(warm)
documents.render_pdf_tiles(documents.open_pdf_pages(warm), [12], tile_size=64, use_thumbnail=True)
if mode == "bomb":  # the processor's first step (open_pdf_pages), then the public page renderer
    bomb = make_pdf([(2048, 2048, b"")] * 200)
    base = reset_peak()
    outcome = []
    for call in (documents.open_pdf_pages, documents.render_pdf):
        try:
            call(bomb)
            outcome.append("accepted")
        except MediaTooLargeError as e:
            outcome.append(e.code)
else:
    doc = make_pdf([(2048, 2048, b"")] * 8)
    base = reset_peak()
    if mode == "page_by_page":
        pages = documents.open_pdf_pages(doc, scale=1.0, limits=unbounded)
        out = documents.render_pdf_tiles(pages, [12] * 8, tile_size=64, use_thumbnail=True, limits=unbounded)
    else:
        out = documents.render_pdf(doc, scale=1.0, limits=unbounded).pages
    outcome = len(out)
print(json.dumps([outcome, peak_mb() - base]))
"""


def _child_peak(mode: str):
    run = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, mode], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_7_page_bomb_peak_memory():
    outcome, grown_mb = _child_peak("bomb")
    assert outcome == ["too_large", "too_large"]
    assert grown_mb < 32, f"peak RSS grew {grown_mb:.0f} MB on a refused page bomb"


def test_7_pages_are_rendered_and_tiled_one_at_a_time():
    """8 pages of 2048 x 2048 px: kept as pages they need 8 x 12.6 MB of RGB; rendered and tiled page by page
    the peak stays near one page (RGB copy + PDFium's BGRA bitmap, ~30 MB)."""
    pages, grown_page_by_page = _child_peak("page_by_page")
    assert pages == 8 and grown_page_by_page < 70, grown_page_by_page
    pages, grown_all = _child_peak("all_pages")  # the contrast: what keeping every page costs
    assert pages == 8 and grown_all > 100, grown_all


def test_7_processor_page_tiles_equal_tiling_the_rendered_page(tmp_path):
    """Page-by-page tiling in the processor gives the same tiles as rendering the page and tiling it; the
    total-pixel cap holds for the request, across documents."""
    from tiny_models import make_tiny_vl_dir

    proc = vl.load_processor(make_tiny_vl_dir(tmp_path))
    cfg = proc.config
    pdf = make_pdf([red_square_page(300, 200), red_square_page(100, 400)])
    out = proc([{"role": "user", "content": [{"type": "pdf", "pdf": pdf}, {"type": "text", "text": "?"}]}])
    pages = render_pdf(pdf).pages
    expected = [preprocess_image(p, norm_mean=cfg.norm_mean, norm_std=cfg.norm_std, tile_size=cfg.force_image_size,
                                 max_num_tiles=cfg.max_num_tiles, use_thumbnail=cfg.use_thumbnail) for p in pages]
    assert torch.equal(out.pixel_values, torch.cat([e.pixel_values for e in expected]))
    assert [i.grid for i in out.items] == [e.grid for e in expected]
    assert [i.page for i in out.items] == [0, 1]
    with pytest.raises(MediaTooLargeError, match="pixel cap per request"):  # the page bomb, through the processor
        proc([{"role": "user", "content": [{"type": "pdf", "pdf": make_pdf(BOMB)}, {"type": "text", "text": "?"}]}])
    two = MediaLimits(max_pdf_total_pixels=600 * 400 + 200 * 800 - 1, max_documents=2)  # the cap is per request
    proc.limits = two
    with pytest.raises(MediaTooLargeError, match="pixel cap per request"):
        proc([{"role": "user", "content": [{"type": "pdf", "pdf": make_pdf([red_square_page(300, 200)])},
                                           {"type": "pdf", "pdf": make_pdf([red_square_page(100, 400)])}]}])
    with pytest.raises(ValueError):
        render_pdf_tiles(open_pdf_pages(pdf), [12], tile_size=64, use_thumbnail=True)  # one cap per page
