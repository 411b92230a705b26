"""`vl app` as a user meets it: started as a command, driven by headless Chromium.

The app runs in a subprocess (the real `vl app` entry point) over a tiny random checkpoint; Playwright drives
Debian's chromium (`/usr/bin/chromium`; `playwright install` cannot download browsers here). The page opens,
a bundled example is uploaded through the file input, a question is asked, the streamed answer is waited for
and a screenshot is saved under the test's tmp directory.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.mark.browser
@pytest.mark.skipif(not shutil.which(CHROMIUM),
                    reason=f"needs Debian chromium at {CHROMIUM} (apt-get install chromium; make test's setup)")
def test_browser_document_question_streams_an_answer(cli_app, examples, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    url = cli_app.url
    print(f"vl app start -> page served: {cli_app.startup_s:.1f} s")
    ex = next(e for e in examples.tabs["document"] if e["path"].endswith(".png"))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, wait_until="load")
            page.locator("#doc-ask").wait_for(timeout=60_000)  # the Gradio front end is mounted
            for attempt in range(2):  # on a loaded machine the first upload can race the page's hydration
                page.locator("#doc-files input[type=file]").set_input_files(ex["path"])
                try:
                    page.locator("#doc-files").get_by_text(Path(ex["path"]).name).first.wait_for(timeout=45_000)
                    break
                except sync_api.TimeoutError:
                    if attempt:
                        raise
            page.locator("#doc-question textarea").fill(ex["question"])
            page.locator("#settings").get_by_text("Generation settings").click()
            tokens = page.locator("#max-new-tokens input[type=number]")
            tokens.fill("256")  # the app's model never stops early (conftest.endless_dir): ~1 s of streaming
            tokens.press("Enter")
            # The page records each value the answer box takes, every 5 ms: polling from this process costs a
            # round trip per read, and on a loaded machine the whole answer could arrive between two reads.
            page.evaluate("""() => {
                window.__seen = []; const t0 = performance.now();
                window.__rec = setInterval(() => {
                    const el = document.querySelector('#doc-answer textarea'), s = window.__seen;
                    const v = el ? el.value : '';
                    if (v && (!s.length || s[s.length - 1][1] !== v)) s.push([(performance.now() - t0) / 1000, v]);
                }, 5);
            }""")
            t0 = time.perf_counter()
            page.locator("#doc-ask").click()
            answer, stats = page.locator("#doc-answer textarea"), page.locator("#doc-stats")
            while "finished by" not in stats.inner_text():
                assert time.perf_counter() - t0 < 90, "no answer within 90 s"
                time.sleep(0.05)
            seen = page.evaluate("() => { clearInterval(window.__rec); return window.__seen; }")
            final = answer.input_value()
            values = [v for _, v in seen]
            assert final and values and final.startswith(values[-1]), (values, final)
            assert len(values) >= 2, f"the answer did not stream in the page: {values!r}"
            first_text_s = seen[0][0]
            page.locator("#doc-gallery img").first.wait_for(timeout=30_000)
            print(f"browser: first answer text after {first_text_s:.2f} s")
            assert "thumbnail" in page.locator("#doc-gallery").inner_text()
            shot = tmp_path / "document_qa.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            print(f"screenshot: {shot}")
        finally:
            browser.close()
