"""The app hears: audio in the Chat tab, the Video tab's sound switch, the stats, on a tiny random Nemotron 3 Nano Omni.

Through the chat handler (`ui.chat.respond`, what the Chat tab runs) and through gradio_client against the app served
in-process, as `vl app --model` builds it: an audio question, a follow-up served from the encoder cache, a bad file
among good ones, the per-message caps; a model that does not hear offers no audio and says so when sent some; the
switch reaches the request (`use_audio_in_video`); the stats rows. The browser's view of the same is
tests/ui/test_ui_browser_audio.py.
"""

from __future__ import annotations

import shutil
import sys
import wave
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))
from media_fixtures import write_video  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def write_wav(path, seconds: float = 1.0, freq: float = 440.0, rate: int = 16000) -> str:
    t = np.arange(int(rate * seconds)) / rate
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2").tobytes())
    return str(path)


def _upload(upload_dir, src, name: str) -> str:
    """A copy in the upload folder, as Gradio keeps an uploaded file."""
    dst = upload_dir / "audio_chat" / name
    dst.parent.mkdir(exist_ok=True)
    if isinstance(src, bytes):
        dst.write_bytes(src)
    else:
        shutil.copyfile(src, dst)
    return str(dst)


@pytest.fixture()
def omni_ctx(omni_engine, examples, upload_dir):
    from ui.chat_media import MediaCache
    from ui.controls import AppContext
    from ui.limits import AppLimits

    omni_engine.media_cache = MediaCache(omni_engine.media_cache.max_bytes)  # nothing from an earlier test
    return AppContext(omni_engine, AppLimits(), [upload_dir, examples.dir])


@pytest.fixture(scope="module")
def sounds(upload_dir):
    d = upload_dir / "audio_files"
    d.mkdir(exist_ok=True)
    return SimpleNamespace(a=write_wav(d / "a.wav", 1.0, 440.0), b=write_wav(d / "b.wav", 0.6, 880.0),
                           clip=write_video(d / "with_sound.mp4", seconds=1.5),
                           junk=_upload(upload_dir, b"this is a text file with a sound's name\n" * 20, "junk.wav"))


def _ask(ctx, message, history):
    """The chat handler's last messages (as dicts) for `message` after `history`; the history grown by both."""
    from ui.chat import respond

    last = []
    for last in respond(ctx, message, history, False, 0, 4, 0.0, 12, 2.0, 4, 0.0):
        pass
    out = [{"role": m.role, "content": m.content, "metadata": m.metadata or {}} for m in last]
    turn = [{"role": "user", "content": [{"type": "file", "file": {"path": f}}]} for f in message["files"]]
    turn.append({"role": "user", "content": [{"type": "text", "text": message["text"]}]})
    return out, history + turn + out


def _stats(out) -> str:
    assert not out[0]["content"].startswith("⚠️"), out
    (stats,) = [m["content"] for m in out if m["metadata"].get("title") == "Stats"]
    return stats


def _row(stats: str, name: str) -> str | None:
    for line in stats.splitlines():
        if line.startswith(f"| {name} |"):
            return line.split("|")[2].strip()
    return None


def test_an_audio_question_a_follow_up_and_a_bad_file_among_good_ones(omni_ctx, sounds):
    """The follow-up sends the audio again (it stays in the conversation) and its encoding comes from the engine's
    cache; a file that is not audio is a typed message, the turn after it answers and the conversation keeps its
    audio; a second clip in a later message joins the first."""
    out, history = _ask(omni_ctx, {"text": "What is said?", "files": [sounds.a]}, [])
    first = _stats(out)
    tokens = int(_row(first, "audio tokens"))
    assert tokens > 0 and _row(first, "vision encoder cache hits") is None
    assert "audio" in _row(first, "time per stage") and len(omni_ctx.engine.media_cache) == 1
    out, history = _ask(omni_ctx, {"text": "Say it again.", "files": []}, history)
    again = _stats(out)
    assert int(_row(again, "audio tokens")) == tokens and _row(again, "vision encoder cache hits") == "1"
    assert len(omni_ctx.engine.media_cache) == 1  # decoded once
    out, history = _ask(omni_ctx, {"text": "And this one?", "files": [sounds.junk]}, history)
    assert out[-1]["content"].startswith("⚠️") and "[unsupported_format]" in out[-1]["content"], out
    out, history = _ask(omni_ctx, {"text": "And this one?", "files": [sounds.b]}, history)
    both = int(_row(_stats(out), "audio tokens"))
    assert both > tokens  # the first clip and the new one; the junk turn is left out


def test_the_caps_apply_per_message(omni_ctx, upload_dir, sounds):
    """Four clips in one message (the request cap) and a fifth two messages later are answered; five in one message
    are refused as too many, with advice for the app's user."""
    four = [_upload(upload_dir, sounds.a, f"clip{i}.wav") for i in range(4)]
    out, history = _ask(omni_ctx, {"text": "What is said?", "files": four}, [])
    _stats(out)
    out, _ = _ask(omni_ctx, {"text": "And here?", "files": [sounds.b]}, history)
    _stats(out)
    out, _ = _ask(omni_ctx, {"text": "What is said?", "files": four + [sounds.b]}, [])
    assert "at most 4 audio(s) per message are accepted, found 5" in out[-1]["content"], out
    assert "[too_many_items]" in out[-1]["content"]


def test_the_assembled_prompt_equals_the_processor_on_the_whole_conversation(omni_engine, sounds, examples):
    """The per-attachment path gives the very ids, patches, tubelets and mel features the Omni processor gives for
    the whole conversation, the video's sound track included, first from the processor and then from the cache."""
    from ui.chat_media import MediaCache
    from vl.options import RequestOptions

    png = next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".png"))
    messages = [{"role": "user", "content": [{"type": "audio", "audio": sounds.a}, {"type": "text", "text": "Said?"}]},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": [{"type": "image", "image": png}, {"type": "video", "video": sounds.clip},
                                             {"type": "audio", "audio": sounds.b}, {"type": "text", "text": "And?"}]}]
    options = RequestOptions(max_frames=4)
    omni_engine.media_cache = MediaCache(omni_engine.media_cache.max_bytes)
    got, _ = omni_engine.process(messages, options)
    assert len(omni_engine.media_cache) == 4
    again, _ = omni_engine.process(messages, options)
    proc = options.processor_kwargs()
    proc.setdefault("context_length", omni_engine.context_length)
    want = omni_engine.processor(messages, thinking=options.thinking, **proc)
    assert [i.kind for i in want.items] == ["audio", "image", "video", "audio", "audio"]
    for inputs in (got, again):
        assert inputs.text == want.text and inputs.input_ids.tolist() == want.input_ids.tolist()
        assert inputs.items == want.items and inputs.audio_num_tokens == want.audio_num_tokens
        assert inputs.pixel_values.equal(want.pixel_values) and inputs.image_grid_hw.equal(want.image_grid_hw)
        assert inputs.pixel_values_videos.equal(want.pixel_values_videos)
        assert inputs.input_features.equal(want.input_features)


def test_a_model_that_does_not_hear_says_so_and_the_next_question_answers(ui_engine, examples, upload_dir, sounds):
    """Nano V2 VL: an audio file sent anyway (the filter does not offer it) is refused by name before any work."""
    from ui.controls import AppContext
    from ui.limits import AppLimits

    ctx = AppContext(ui_engine, AppLimits(), [upload_dir, examples.dir])
    png = next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".png"))
    out, history = _ask(ctx, {"text": "What is said?", "files": [sounds.a]}, [])
    text = out[-1]["content"]
    assert text.startswith("⚠️") and "'a.wav' is an audio file, and this model does not hear" in text, text
    assert "[no_audio]" in text
    out, _ = _ask(ctx, {"text": "What is the total?", "files": [png]}, history)
    assert _row(_stats(out), "audio tokens") is None


def test_the_upload_filters_and_the_switch_follow_the_model(omni_engine, ui_engine):
    """Audio is offered where the model is known to hear, PDFs where it reads tiles; a remote engine says
    `has_audio` (None: unknown, not offered)."""
    from ui.chat import chat_file_types
    from ui.controls import AppContext
    from ui.hearing import AUDIO_TYPES, hears
    from ui.limits import AppLimits

    def types(engine):
        return set(chat_file_types(AppContext(engine, AppLimits(), [])))

    assert set(AUDIO_TYPES) <= types(omni_engine) and ".pdf" not in types(omni_engine)
    assert not set(AUDIO_TYPES) & types(ui_engine) and ".pdf" in types(ui_engine)
    deaf = SimpleNamespace(processor=SimpleNamespace(has_audio=False), model=omni_engine.model)
    assert not set(AUDIO_TYPES) & types(deaf) and ".pdf" not in types(deaf)
    assert [hears(SimpleNamespace(has_audio=v)) for v in (True, False, None)] == [True, False, False]


def test_the_stats_show_audio_tokens_stages_and_peak_memory():
    from ui.runner import UNREPORTED, stats_markdown
    from vl.runtime.results import ChatResult, Stats

    stats = Stats(prompt_tokens=80, audio_tokens=26, peak_memory_bytes=3 << 29,
                  stages_s={"decode": 0.5, "media": 0.21, "audio": 0.05, "prefill": 0.04})
    text = stats_markdown(ChatResult("a", "", "a", [1], stats, "stop"))
    assert "| audio tokens | 26 |" in text and "| peak memory | 1.50 GiB |" in text
    assert "| time per stage | media 0.21 s · audio 0.05 s · prefill 0.04 s · decode 0.50 s |" in text
    remote = Stats(peak_memory_bytes=None)  # what RemoteEngine reports: no stages, no memory
    text = stats_markdown(ChatResult("a", "", "a", [1], remote, "stop"))
    assert f"| time per stage | {UNREPORTED} |" in text and f"| peak memory | {UNREPORTED} |" in text
    assert "audio tokens" not in text


@pytest.fixture(scope="module")
def omni_served(omni_engine, examples, tiny_omni_dir):
    """The app in-process over the tiny Omni model, as `vl app --model` builds it."""
    from ui.app import build_app, launch_app
    from ui.limits import AppLimits
    from ui.measure import free_port

    demo = build_app(omni_engine, limits=AppLimits(), examples_dir=examples.dir, examples=examples.records,
                     model_name="omni")
    launch_app(demo, port=free_port(), model_dir=tiny_omni_dir, examples_dir=examples.dir, prevent_thread_lock=True,
               quiet=True)
    yield SimpleNamespace(url=demo.local_url, demo=demo)
    demo.close()


def _component(demo, elem_id: str) -> dict:
    return next(c["props"] for c in demo.config["components"] if c["props"].get("elem_id") == elem_id)


def test_the_video_switch_reaches_the_request(omni_served, omni_engine, sounds, monkeypatch):
    """Through /video: the switch on hears the clip's sound (audio tokens in the stats), off does not; the
    request the engine gets carries `use_audio_in_video` as set."""
    from gradio_client import Client, handle_file

    seen = []
    chat = type(omni_engine).chat

    def spy(self, messages, options=None, **kwargs):
        seen.append(kwargs.get("use_audio_in_video", "absent"))
        return chat(self, messages, options, **kwargs)

    monkeypatch.setattr(type(omni_engine), "chat", spy)
    assert _component(omni_served.demo, "video-hear")["visible"] is True
    client = Client(omni_served.url, verbose=False, download_files=False)
    texts = {}
    for hear in (True, False):
        out = client.predict(handle_file(sounds.clip), "What is heard?", 2.0, 4, 0.0, False, 0, 4, 0.0, hear,
                             api_name="/video")
        texts[hear] = out[4]
    assert seen == [True, False]
    assert int(_row(texts[True], "audio tokens")) > 0 and _row(texts[False], "audio tokens") is None
    assert "the frames the model saw are not drawn for this model" in texts[False]
    out = client.predict(handle_file(sounds.clip), "And now?", 2.0, 4, 0.0, False, 0, 4, 0.0, api_name="/video")
    assert seen[-1] is True and int(_row(out[4], "audio tokens")) > 0  # an API caller that predates the switch


def test_the_app_over_omni_offers_audio_and_hides_what_does_not_apply(omni_served, app, sounds):
    """The Omni app's chat offers audio and no PDF, its document tab hides the PDF and tiling controls and its PDF
    examples; the Nano V2 VL app offers no audio and hides the switch, and refuses a WAV sent through /chat with a
    message (Gradio's own file-type check would raise and leave the chat box disabled)."""
    from gradio_client import Client, handle_file

    chat = _component(omni_served.demo, "chat-input")
    assert ".wav" in chat["file_types"] and ".pdf" not in chat["file_types"]
    assert "audio file" in chat["placeholder"] and _component(omni_served.demo, "doc-pages")["visible"] is False
    assert ".pdf" not in _component(omni_served.demo, "doc-files")["file_types"]
    samples = [str(c["props"].get("samples")) for c in omni_served.demo.config["components"]
               if c.get("type") == "dataset"]  # the bundled examples' tables
    assert samples and not any(".pdf" in s for s in samples), samples
    assert "up to 4 audio clips" in _component(omni_served.demo, "header")["value"]
    v2 = app.demo
    assert ".wav" not in _component(v2, "chat-input")["file_types"]
    assert _component(v2, "video-hear")["visible"] is False and "audio" not in _component(v2, "header")["value"]
    assert any(".pdf" in str(c["props"].get("samples")) for c in v2.config["components"] if c.get("type") == "dataset")
    client = Client(app.url, verbose=False, download_files=False)
    out = client.predict({"text": "What is said?", "files": [handle_file(sounds.a)]}, False, 0, 4, 0.0, 12, 2.0, 4,
                         0.0, api_name="/chat")
    assert "this model does not hear" in str(out) and "[no_audio]" in str(out), out
