"""`vl app --model <a tiny Nemotron 3 Nano Omni directory>` in headless Chromium: the app starts on a model that
hears, and its Chat tab answers questions about an uploaded WAV.

The real command in a subprocess (start-up, model loading and the bundled examples as a user meets them), driven by
Playwright over Debian's chromium, as tests/ui/test_ui_browser.py: a WAV is uploaded and asked about, the answer and
its stats (audio tokens) appear; a follow-up question about the same audio answers again, its encoding from the
engine's cache; a text file renamed .wav is a visible error in the chat; then a good WAV answers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from ui_helpers import CHROMIUM, CHROMIUM_ARGS, needs_chromium  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.browser, needs_chromium]
REPO = Path(__file__).resolve().parents[2]


def _wav(path, seconds: float, freq: float) -> str:
    t = np.arange(int(16000 * seconds)) / 16000
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes((0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2").tobytes())
    return str(path)


@pytest.fixture(scope="module")
def omni_cli_app(tiny_omni_dir, examples, tmp_path_factory):
    """`vl app --model DIR` on the tiny Omni directory, in a subprocess, from the repository folder."""
    from ui.measure import free_port, vl_command
    from ui_helpers import wait_ready

    port = free_port()
    env = {**os.environ, "GRADIO_TEMP_DIR": str(tmp_path_factory.mktemp("omni_uploads")),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.Popen(vl_command() + ["app", "--model", str(tiny_omni_dir), "--port", str(port),
                                            "--examples-dir", str(examples.dir)],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        startup_s = wait_ready(url, proc, timeout=180)
        print(f"vl app on the tiny Omni model served its page after {startup_s:.1f} s", file=sys.stderr)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def page(omni_cli_app):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(omni_cli_app, wait_until="load")
            page.locator("#doc-ask").wait_for(timeout=60_000)  # the Gradio front end is mounted
            yield page
        finally:
            browser.close()


def _wait_until(check, what, timeout: float = 60) -> None:
    t0 = time.perf_counter()
    while not check():
        assert time.perf_counter() - t0 < timeout, f"{what() if callable(what) else what} (waited {timeout} s)"
        time.sleep(0.05)


def test_browser_omni_app_answers_about_audio(page, tmp_path):
    good, other = _wav(tmp_path / "speech.wav", 1.0, 440.0), _wav(tmp_path / "tone.wav", 0.6, 880.0)
    fake = tmp_path / "notes.wav"
    fake.write_text("this is a text file with a sound's name\n" * 20)
    assert "up to 4 audio clips" in page.locator("#header").inner_text()
    page.get_by_role("tab", name="Video QA").click()
    assert page.locator("#video-hear input[type=checkbox]").is_checked()  # on by default for a model that hears
    page.locator("#settings").get_by_text("Generation settings").click()
    numbers = page.locator("#max-new-tokens input[type=number]")
    numbers.fill("8")  # short answers: the test is about what reaches the model, not about its random text
    numbers.press("Enter")
    page.get_by_role("tab", name="Chat").click()
    box, chat = page.locator("#chat-input"), page.locator("#chat-box")
    assert ".wav" in box.locator("input[type=file]").get_attribute("accept")
    thumb = page.locator('#chat-input [aria-label="File thumbnail"]').first
    titles = chat.get_by_text("Stats", exact=True)  # each answer's collapsed stats bubble

    def ask(question: str, path: str | None, answered: int) -> str:
        _wait_until(box.locator("textarea").is_enabled, "the chat input stayed disabled")
        if path:
            box.locator("input[type=file]").set_input_files(path)
            thumb.wait_for(timeout=45_000)
        box.locator("textarea").fill(question)
        box.locator("textarea").press("Enter")
        if not answered:
            return ""
        _wait_until(lambda: titles.count() == answered,
                    lambda: f"no stats for {question!r}: {chat.inner_text()[-400:]!r}", timeout=90)
        titles.nth(answered - 1).click()  # open it
        shown = chat.locator(".bot").filter(has_text="time per stage")
        _wait_until(lambda: shown.count() == answered, "the stats bubble did not open", timeout=10)
        return shown.nth(answered - 1).inner_text()

    first = ask("What is said?", good, 1)
    assert "audio tokens" in first and "vision encoder cache hits" not in first, first
    again = ask("Say it once more.", None, 2)  # the audio is sent again with the conversation, encoded from the cache
    assert "audio tokens" in again and "vision encoder cache hits\t1" in again, again
    ask("And this one?", str(fake), 0)
    chat.get_by_text("Input refused").wait_for(timeout=60_000)
    assert "[unsupported_format]" in chat.inner_text()
    assert page.locator(".toast-body").count() == 0  # a message in the chat, not an error overlay
    last = ask("And this one?", other, 3)
    assert "audio tokens" in last, last
