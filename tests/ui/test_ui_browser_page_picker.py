"""The Document tab's page thumbnails in a real browser: clicks in quick succession, while the server is slow to
answer each one, all reach the page range (none is dropped or overwritten by a click whose answer was still on its
way); a range typed into the box is what the next click builds on, even one a click wrote before; the same page
twice is one page."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from ui_helpers import chromium, needs_chromium  # noqa: E402

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def browser():
    with chromium() as (b, _):
        yield b


def _value(page) -> str:
    return page.locator("#doc-pages textarea, #doc-pages input").first.input_value()


def _wait_value(page, want: str, timeout: float = 30) -> None:
    t0 = time.perf_counter()
    while (got := _value(page)) != want:
        assert time.perf_counter() - t0 < timeout, f"page range {got!r}, expected {want!r} (waited {timeout} s)"
        time.sleep(0.05)


def test_quick_clicks_on_a_slow_server_all_reach_the_page_range(app, examples, browser, monkeypatch):
    from ui import page_picker

    real = page_picker.add_page

    def slow(spec, page):  # each click's answer takes 0.6 s: the next clicks are made before it arrives
        time.sleep(0.6)
        return real(spec, page)

    monkeypatch.setattr(page_picker, "add_page", slow)
    pdf = next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".pdf"))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(app.url, wait_until="load")
        page.locator("#doc-ask").wait_for(timeout=60_000)
        page.locator("#doc-files input[type=file]").set_input_files(pdf)
        thumbs = page.locator("#doc-page-picker .thumbnail-item")
        thumbs.first.wait_for(timeout=45_000)
        assert thumbs.count() == 4
        for i in (3, 1, 0):  # pages 4, 2, 1, clicked within a fraction of the first answer's time
            thumbs.nth(i).click()
        _wait_value(page, "1-2,4")
        box = page.locator("#doc-pages textarea, #doc-pages input").first
        box.fill("3")  # the user's own range: the next clicks build on it
        box.press("Tab")
        thumbs.nth(3).click()
        thumbs.nth(3).click()  # the same page again: still one page
        _wait_value(page, "3-4")
        time.sleep(1.5)  # and nothing arrives late to change it
        assert _value(page) == "3-4"
        box.fill("4")  # typed back to a value a click wrote before: still the user's range
        time.sleep(0.5)
        thumbs.nth(0).click()
        _wait_value(page, "1,4")
    finally:
        page.close()
