"""Helpers shared by the app tests: call an endpoint, collect every streamed output, compare with the engine."""

from __future__ import annotations

import shutil
import subprocess
import time
from contextlib import contextmanager

import pytest

# Debian's chromium, headless, for the browser tests (test tools' own browser downloads fail offline)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
needs_chromium = pytest.mark.skipif(not shutil.which(CHROMIUM), reason="needs Debian chromium at /usr/bin/chromium "
                                    "(apt-get install chromium; make browser)")



@contextmanager
def chromium():
    """Debian's chromium through Playwright, headless: yields (browser, Playwright's TimeoutError); skips the test
    when Playwright is not installed."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b, sync_api.TimeoutError
        finally:
            b.close()


DOC_ARGS = dict(pages="", max_tiles=12, token_budget=0, thinking=False, reasoning_budget=0, max_new_tokens=24,
                temperature=0.0)


def document_args(files, question, **over):
    a = {**DOC_ARGS, **over}
    return [files, a["pages"], question, a["max_tiles"], a["token_budget"], a["thinking"], a["reasoning_budget"],
            a["max_new_tokens"], a["temperature"]]


def video_args(video, question, *, fps=2.0, max_frames=8, rate=0.5, thinking=False, reasoning_budget=0,
               max_new_tokens=24, temperature=0.0):
    return [video, question, fps, max_frames, rate, thinking, reasoning_budget, max_new_tokens, temperature]


def run_streamed(client, api_name: str, args: list, timeout: float = 90.0):
    """(every intermediate output tuple, the final one, client-side seconds to first answer text, total seconds)."""
    t0 = time.perf_counter()
    job = client.submit(*args, api_name=api_name)
    seen, first_text = [], None
    for out in job:
        seen.append(out)
        if first_text is None and (out[0] or out[1]):
            first_text = time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            job.cancel()
            raise TimeoutError(f"{api_name} did not finish within {timeout} s")
    final = job.result(timeout=timeout)
    return seen, final, first_text, time.perf_counter() - t0


def assert_streamed(seen, final, field: int = 1):
    """More than one partial text, each a prefix of the next, the last equal to the final output."""
    texts = [s[field] for s in seen if isinstance(s[field], str)]
    grown = [t for i, t in enumerate(texts) if t and (i == 0 or t != texts[i - 1])]
    assert len(grown) >= 2, f"expected the text to arrive in several pieces, saw {len(grown)}: {grown!r}"
    for a, b in zip(grown, grown[1:]):
        assert b.startswith(a), (a, b)
    assert grown[-1] == final[field]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until `url` serves the Gradio page; fails with the app's stderr if it exits first."""
    from ui.measure import wait_served

    return wait_served(url, proc, timeout, describe_exit=lambda: proc.stderr.read() if proc.stderr else "")
