"""What follows the served model on the server side, under the browser tests of tests/ui/test_ui_browser_model_switch.py.

The Chat tab's sound switch reaches the request through `/chat` (off, on, left out by an older caller; nothing asked
of a model that does not hear), one bad request among good ones; the server-side file-type checks never refuse what
the page's filter offers after a model switch: the chat box's per-session copies (Gradio rebuilds them at every
message) check no file types, and the Document tab checks what any model takes, leaving the rest to the model served.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))
from media_fixtures import write_video  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def _audio_tokens(out) -> int:
    found = re.search(r"\| audio tokens \| (\d+) \|", str(out))
    return int(found.group(1)) if found else 0


def test_the_chat_sound_switch_reaches_the_request(hearing_picker_served, tmp_path, monkeypatch):
    from gradio_client import Client, handle_file

    from ui.runner import UIEngine

    seen = []
    chat = UIEngine.chat

    def spy(self, messages, options=None, **kwargs):
        seen.append(kwargs.get("use_audio_in_video", "absent"))
        return chat(self, messages, options, **kwargs)

    monkeypatch.setattr(UIEngine, "chat", spy)
    clip = write_video(tmp_path / "with_sound.mp4", seconds=1.5)
    client = Client(hearing_picker_served.url, verbose=False, download_files=False)
    client.predict("omni", api_name="/model")

    def ask(*hear, text="What happens?"):
        message = {"text": text, "files": [handle_file(clip)]}
        return client.predict(message, False, 0, 4, 0.0, 12, 2.0, 4, 0.0, False, 0.0, *hear, api_name="/chat")

    # the client's session keeps the conversation: each request sends every video so far, heard or not together
    heard = [_audio_tokens(ask(False)), _audio_tokens(ask(True)), _audio_tokens(ask())]  # (): an older caller
    assert seen == [False, True, True] and heard[0] == 0 and 0 < heard[1] < heard[2], (seen, heard)
    out = ask(True, text="")  # a bad request among good ones: files alone are no question
    assert "type a message" in str(out) and len(seen) == 3
    assert _audio_tokens(ask(False)) == 0 and seen[-1] is False

    client.predict("vl", api_name="/model")  # a model that does not hear is asked nothing, whatever was sent
    out = ask(True)
    assert seen[-1] is None and _audio_tokens(out) == 0 and "finished by" in str(out)


def test_the_chat_box_copies_check_no_file_types():
    """Gradio rebuilds a session's copy of the chat box from its constructor arguments at every message; the copy
    must take a file the first model's filter did not list (a WAV after a switch to a model that hears) and leave
    its refusal, if any, to the chat handler."""
    import gradio as gr
    from gradio.components.multimodal_textbox import MultimodalData
    from gradio.data_classes import FileData

    from ui.chat import accept_any_file_type

    with pytest.raises(ValueError, match="without file_types"):
        accept_any_file_type(gr.MultimodalTextbox(file_types=[".png"], render=False), [".png"])
    box = accept_any_file_type(gr.MultimodalTextbox(render=False), [".png", ".mp4"])
    assert box.get_config()["file_types"] == [".png", ".mp4"]  # what the page is sent
    payload = MultimodalData(text="What is said?", files=[FileData(path="/uploads/a.wav")])
    copy = type(box)(**{**box.constructor_args, "interactive": False, "render": False})  # as Gradio makes it
    for textbox in (box, copy):
        assert textbox.preprocess(payload) == {"text": "What is said?", "files": ["/uploads/a.wav"]}


def test_the_document_tab_checks_what_any_model_takes(tmp_path):
    """A PDF passes the server's check even where the tab was built for a model that takes none (the browser's filter
    follows the model served; that model refuses what it cannot read); a text file does not."""
    import gradio as gr
    from gradio.data_classes import FileData

    from ui.documents import DOCUMENT_TYPES, IMAGE_TYPES, without_stray_temp_files

    files = without_stray_temp_files(gr.File(file_count="multiple", file_types=IMAGE_TYPES, type="filepath",
                                             render=False), DOCUMENT_TYPES)
    for name in ("page.png", "paper.pdf"):
        assert str(files._process_single_file(FileData(path=str(tmp_path / name)))) == str(tmp_path / name)
    with pytest.raises(gr.Error, match="Invalid file type"):
        files._process_single_file(FileData(path=str(tmp_path / "notes.txt")))
    assert list(tmp_path.iterdir()) == []  # and no stray file anywhere near
