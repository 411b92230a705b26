"""The model picker between a model that does not hear and one that hears, in headless Chromium.

The app in-process over a folder of two tiny random checkpoints (`hearing_picker_served`, conftest: `vl`, Nano V2 VL,
served first; `omni`, Nemotron 3 Nano Omni with audio), driven by Playwright over Debian's chromium as
tests/ui/test_ui_browser.py does. What the tabs offer is built for the first model; after each switch it must follow
the model served: the chat's upload filter (audio, PDF), the Document tab's filter and tiling controls, the sound
switches of the Video and Chat tabs. An audio file is accepted and answered for the model that hears; for the one
that does not, the page's own filter refuses it, and a page opened before the switch (its filter still the old
model's) gets the server's typed refusal as a chat message, then answers the next question. The Chat tab's sound
switch reaches the request: a video's sound track is heard (audio tokens in the stats) only while it is on.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))
from media_fixtures import write_video  # noqa: E402

from ui_helpers import chromium, needs_chromium  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.browser, needs_chromium]
# what each model's page shows (`_view`)
DEAF = dict(chat_audio=False, chat_pdf=True, chat_hear=False, chat_tiling=True, doc_pdf=True, doc_pages=True,
            doc_tiling=True, video_hear=False)
HEARS = dict(chat_audio=True, chat_pdf=False, chat_hear=True, chat_tiling=False, doc_pdf=False, doc_pages=False,
             doc_tiling=False, video_hear=True)


@pytest.fixture(scope="module")
def browser():
    with chromium() as (b, _):
        yield b


@pytest.fixture(scope="module")
def media(tmp_path_factory, examples):
    """Sounds and clips, each attached once (`Page.attach` says why): `wav(i)`, a 1 s tone; `clip`, `clip2`, a 1.5 s
    video with a sound track; `png`, a bundled page."""
    d = tmp_path_factory.mktemp("switch_media")
    t = np.arange(16000) / 16000
    with wave.open(str(d / "speech.wav"), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16000)
        f.writeframes((0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes())
    png = next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".png"))
    clip = write_video(d / "with_sound.mp4", seconds=1.5)
    return SimpleNamespace(wav=lambda i: shutil.copyfile(d / "speech.wav", d / f"speech_{i}.wav"), clip=clip,
                           clip2=shutil.copyfile(clip, d / "with_sound_2.mp4"), png=png)


def _serve(served, name: str) -> None:
    """Serve `name`, picked through the API (the page under test is opened after)."""
    from gradio_client import Client

    Client(served.url, verbose=False, download_files=False).predict(name, api_name="/model")
    assert served.models.current == name


def _wait_until(check, what, timeout: float = 30) -> None:
    t0 = time.perf_counter()
    while not check():
        assert time.perf_counter() - t0 < timeout, f"{what() if callable(what) else what} (waited {timeout} s)"
        time.sleep(0.05)


class Page:
    """One browser page of the app, with short answers (8 new tokens) and the chat's media settings open."""

    def __init__(self, browser, url: str):
        self.page = p = browser.new_page(viewport={"width": 1400, "height": 1000})
        p.goto(url, wait_until="load")
        p.locator("#doc-ask").wait_for(timeout=60_000)  # the Gradio front end is mounted
        p.locator("#settings").get_by_text("Generation settings").click()
        numbers = p.locator("#max-new-tokens input[type=number]")
        numbers.fill("8")  # the test is about what reaches the model, not about its random text
        numbers.press("Enter")
        self.tab("Chat")
        p.locator("#chat-media-settings").get_by_text("Media settings for chat").click()
        self.box, self.chat = p.locator("#chat-input"), p.locator("#chat-box")
        self.answers = self.chat.get_by_text("Stats", exact=True)  # each answer's collapsed stats bubble

    def tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name).click()

    def accept(self) -> str:
        return self.box.locator("input[type=file]").get_attribute("accept") or ""

    def view(self) -> dict:
        """What the page offers now, tab by tab (it ends on the Chat tab)."""
        p, shown = self.page, lambda sel: self.page.locator(sel).is_visible()
        self.tab("Document QA")
        doc = dict(doc_pdf="or one PDF" in p.locator("#doc-files").inner_text(), doc_pages=shown("#doc-pages"),
                   doc_tiling=shown("#doc-tiling"))
        self.tab("Video QA")
        video_hear = shown("#video-hear")
        self.tab("Chat")
        accept = self.accept()
        return dict(chat_audio=".wav" in accept, chat_pdf=".pdf" in accept, chat_hear=shown("#chat-hear"),
                    chat_tiling=shown("#chat-skip-blank"), **doc, video_hear=video_hear)

    def pick(self, name: str, hears: bool) -> None:
        """Pick `name` in the page's model picker; returns once the page's filter shows what it can do."""
        self.page.locator("#model-picker input").click()
        self.page.get_by_role("option", name=name, exact=True).click()
        _wait_until(lambda: f"Model: {name}" in self.page.locator("#header").inner_text(),
                    f"the header does not name {name}", timeout=90)
        _wait_until(lambda: (".wav" in self.accept()) == hears, lambda: f"the chat filter after the switch to {name}: "
                    f"{self.accept()!r}")

    def attach(self, path: str, shown: bool = False) -> None:
        """Attach `path` (with `shown`, wait for its thumbnail). Not the file the box held last: the file input
        keeps it, and setting it again sends no change to the page (a user's file dialog empties the input first)."""
        _wait_until(self.box.locator("textarea").is_enabled, "the chat input stayed disabled")
        self.box.locator("input[type=file]").set_input_files(path)
        if shown:
            self.box.locator('[aria-label="File thumbnail"]').first.wait_for(timeout=45_000)

    def refused_by_filter(self, path: str) -> None:
        """`path` attached, and refused by the page's upload filter: an error toast names it, nothing is attached."""
        toasts = self.page.locator(".toast-body")
        for close in self.page.locator(".toast-close").all():  # an earlier toast would hide whether a new one came
            close.click()
        _wait_until(lambda: toasts.count() == 0, "an earlier toast stayed")
        self.attach(path)
        toasts.filter(has_text=f"Invalid file type: {Path(path).name}").wait_for(timeout=15_000)
        assert self.box.locator('[aria-label="File thumbnail"]').count() == 0

    def ask(self, question: str, path: str | None = None) -> str:
        """Send `question` (with `path` attached); the text of its answer's stats bubble."""
        n = self.answers.count() + 1
        if path:
            self.attach(path, shown=True)
        _wait_until(self.box.locator("textarea").is_enabled, "the chat input stayed disabled")
        self.box.locator("textarea").fill(question)
        self.box.locator("textarea").press("Enter")
        _wait_until(lambda: self.answers.count() == n,
                    lambda: f"no answer to {question!r}: {self.chat.inner_text()[-400:]!r}", timeout=120)
        self.answers.nth(n - 1).click()  # open it
        shown = self.chat.locator(".bot").filter(has_text="time per stage")
        _wait_until(lambda: shown.count() == n, "the stats bubble did not open", timeout=10)
        return shown.nth(n - 1).inner_text()

    def close(self) -> None:
        self.page.close()


def _audio_tokens(stats: str) -> int:
    """The stats' audio tokens (the row is left out when there are none)."""
    found = re.search(r"audio tokens\s+(\d+)", stats)
    return int(found.group(1)) if found else 0


def test_browser_switching_models_moves_what_the_tabs_offer(hearing_picker_served, browser, media):
    """Deaf -> hearing -> deaf -> hearing, an audio file after each switch: answered / refused (by the page's filter;
    by the server, with the typed message, in a page opened before the switch) / answered."""
    served = hearing_picker_served
    _serve(served, "vl")
    a = Page(browser, served.url)
    stale = None
    try:
        assert a.view() == DEAF
        a.refused_by_filter(media.wav(1))

        a.pick("omni", hears=True)
        assert a.view() == HEARS
        assert _audio_tokens(a.ask("What is said?", media.wav(2))) > 0

        stale = Page(browser, served.url)  # opened while the model that hears is served
        assert stale.view() == HEARS
        a.pick("vl", hears=False)
        assert a.view() == DEAF
        a.refused_by_filter(media.wav(3))

        # the stale page still offers audio: the server asks the model now served and refuses by name
        stale.attach(media.wav(4), shown=True)
        stale.box.locator("textarea").fill("And this one?")
        stale.box.locator("textarea").press("Enter")
        stale.chat.get_by_text("[no_audio]").wait_for(timeout=60_000)
        assert "'speech_4.wav' is an audio file, and this model does not hear" in stale.chat.inner_text()
        assert stale.page.locator(".toast-body").count() == 0  # a message in the chat, not an error overlay
        assert "vision tokens" in stale.ask("What is the total?", media.png)  # and the chat goes on

        a.pick("omni", hears=True)
        assert a.view() == HEARS
        assert _audio_tokens(a.ask("And now?", media.wav(5))) > 0
    finally:
        a.close()
        if stale is not None:
            stale.close()


def test_browser_chat_sound_switch_reaches_the_request(hearing_picker_served, browser, media):
    """A page opened after a switch to the model that hears (built for the first, brought up to date at load): the
    Chat tab's sound switch shows, on by default; a video sent with it off has no audio tokens, on it has some, and
    a follow-up with it off again hears none of the conversation's videos."""
    served = hearing_picker_served
    _serve(served, "omni")
    page = Page(browser, served.url)
    try:
        _wait_until(lambda: page.view() == HEARS, lambda: f"the page opened after the switch shows {page.view()}")
        hear = page.page.locator("#chat-hear input[type=checkbox]")
        assert hear.is_checked()
        hear.uncheck()
        assert _audio_tokens(page.ask("What happens?", media.clip)) == 0
        hear.check()
        assert _audio_tokens(page.ask("And with its sound?", media.clip2)) > 0
        hear.uncheck()
        assert _audio_tokens(page.ask("Once more, without.")) == 0
        assert page.page.locator(".toast-body").count() == 0
    finally:
        page.close()
