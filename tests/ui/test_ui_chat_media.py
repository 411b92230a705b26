"""Issue 52 item 10: the Chat tab's attachments are counted per message and processed once.

Through the chat handler (`ui.chat.respond`, what the Chat tab runs) on the app's engine over the tiny random
checkpoint, with Gradio-shaped histories: a second PDF two messages after the first is answered (it used to be
refused, "at most 1 document(s) per request ... found 2"), an encrypted second PDF is reported as encrypted, and a
text follow-up renders no page (counted at the renderer) while the PDF stays in the prompt. The assembled prompt
equals what the processor makes of the whole conversation when its per-request caps admit it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "processing"))
from media_fixtures import make_pdf, red_square_page  # noqa: E402

pytestmark = pytest.mark.timeout(240)


@pytest.fixture()
def ctx(ui_engine, examples, upload_dir, cold_media_cache):
    from ui.controls import AppContext
    from ui.limits import AppLimits

    return AppContext(ui_engine, AppLimits(), [upload_dir, examples.dir])


@pytest.fixture()
def renders(monkeypatch):
    """Pages rendered and PDFs opened by the processor, counted where it calls the renderer (the calls go on to the
    real functions)."""
    import vl.processing.processor as processor

    counts = {"pages": 0, "opened": 0}
    render, open_pages = processor.render_pdf_tiles, processor.open_pdf_pages

    def counted_render(*args, **kwargs):
        out = render(*args, **kwargs)
        counts["pages"] += len(out)
        return out

    def counted_open(*args, **kwargs):
        counts["opened"] += 1
        return open_pages(*args, **kwargs)

    monkeypatch.setattr(processor, "render_pdf_tiles", counted_render)
    monkeypatch.setattr(processor, "open_pdf_pages", counted_open)
    return counts


def _upload(upload_dir, src, name: str) -> str:
    """A copy in the upload folder, as Gradio keeps an uploaded file."""
    dst = upload_dir / "chat_media" / name
    dst.parent.mkdir(exist_ok=True)
    if isinstance(src, bytes):
        dst.write_bytes(src)
    else:
        shutil.copyfile(src, dst)
    return str(dst)


def _ask(ctx, message, history):
    """The chat handler's last messages (as dicts) for `message` after `history`; the history grown by both."""
    from ui.chat import respond

    last = []
    for last in respond(ctx, message, history, False, 0, 8, 0.0, 12, 2.0, 8, 0.0):
        pass
    out = [{"role": m.role, "content": m.content, "metadata": m.metadata or {}} for m in last]
    turn = [{"role": "user", "content": [{"type": "file", "file": {"path": f}}]} for f in message["files"]]
    turn.append({"role": "user", "content": [{"type": "text", "text": message["text"]}]})
    return out, history + turn + out


def _answered(out) -> bool:
    return any(m["metadata"].get("title") == "Stats" for m in out) and not out[0]["content"].startswith("⚠️")


def test_a_second_pdf_in_a_later_message_is_answered(ctx, examples, upload_dir):
    first = _upload(upload_dir, next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".pdf")),
                    "report.pdf")
    second = _upload(upload_dir, make_pdf([red_square_page()]), "second.pdf")
    out, history = _ask(ctx, {"text": "What is the total?", "files": [first]}, [])
    assert _answered(out), out
    out, history = _ask(ctx, {"text": "And in this one?", "files": [second]}, history)
    assert _answered(out), out
    stats = out[-1]["content"]
    before = int(stats.split("| vision tokens before → after reduction | ")[1].split(" ")[0])
    assert before > 4 * 4, stats  # the first PDF's 4 pages and the second's page are both in the prompt


def test_an_encrypted_pdf_in_a_later_message_shows_its_own_error(ctx, examples, upload_dir):
    first = _upload(upload_dir, next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".pdf")),
                    "report.pdf")
    locked = _upload(upload_dir, make_pdf([red_square_page()], user_password="secret"), "locked.pdf")
    out, history = _ask(ctx, {"text": "What is the total?", "files": [first]}, [])
    assert _answered(out), out
    out, history = _ask(ctx, {"text": "And in this one?", "files": [locked]}, history)
    assert out[-1]["content"].startswith("⚠️") and "[encrypted_pdf]" in out[-1]["content"], out
    out, _ = _ask(ctx, {"text": "What was the total of the first one?", "files": []}, history)
    assert _answered(out), out  # the failed turn is left out; the first PDF is still there


def test_a_text_follow_up_after_a_pdf_renders_no_page(ctx, examples, upload_dir, renders):
    pdf = _upload(upload_dir, next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".pdf")),
                  "report.pdf")
    out, history = _ask(ctx, {"text": "What is the total?", "files": [pdf]}, [])
    assert _answered(out) and renders == {"pages": 4, "opened": 1}, (renders, out)
    first_stats = out[-1]["content"]
    for question in ("And the tax?", "Which page has it?"):
        out, history = _ask(ctx, {"text": question, "files": []}, history)
        assert _answered(out), out
        assert renders == {"pages": 4, "opened": 1}, renders  # nothing rendered or opened again
        row = "| vision tokens before → after reduction |"
        assert out[-1]["content"].split(row)[1].split("|")[0] == first_stats.split(row)[1].split("|")[0]


def test_more_than_one_pdf_in_one_message_is_still_refused(ctx, examples, upload_dir):
    a = _upload(upload_dir, make_pdf([red_square_page()]), "a.pdf")
    b = _upload(upload_dir, make_pdf([red_square_page(), red_square_page()]), "b.pdf")
    out, _ = _ask(ctx, {"text": "Compare them.", "files": [a, b]}, [])
    assert "at most 1 document(s) per message are accepted, found 2" in out[-1]["content"], out
    assert "[too_many_items]" in out[-1]["content"]


def test_the_assembled_prompt_equals_the_processor_on_the_whole_conversation(ui_engine, tiny_dir, examples,
                                                                             cold_media_cache):
    """The cached, per-attachment path gives the very ids and tiles the processor gives for the whole conversation
    (with caps that admit it), so caching changes nothing the model sees."""
    from dataclasses import replace

    from vl.options import RequestOptions
    from vl.processing.load import load_processor

    pdf = next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".pdf"))
    png = next(e["path"] for e in examples.tabs["document"] if e["path"].endswith(".png"))
    clip = examples.tabs["video"][0]["path"]
    messages = [{"role": "user", "content": [{"type": "pdf", "pdf": pdf}, {"type": "text", "text": "Total?"}]},
                {"role": "assistant", "content": "12"},
                {"role": "user", "content": [{"type": "image", "image": png}, {"type": "video", "video": clip},
                                             {"type": "pdf", "pdf": pdf}, {"type": "text", "text": "And these?"}]}]
    options = RequestOptions(max_num_tiles=2, max_frames=4, skip_blank_tiles=True)
    got, _ = ui_engine.process(messages, options)
    assert len(cold_media_cache) == 3  # the PDF sent twice is one entry
    again, _ = ui_engine.process(messages, options)  # from the cache
    proc = options.processor_kwargs()
    proc.setdefault("context_length", ui_engine.context_length)
    wide = load_processor(tiny_dir, limits=replace(ui_engine.processor.limits, max_documents=2))
    want = wide(messages, thinking=options.thinking, **proc)
    for inputs in (got, again):
        assert inputs.text == want.text and inputs.input_ids.tolist() == want.input_ids.tolist()
        assert inputs.media == want.media and [i.num_tiles for i in inputs.items] == [i.num_tiles for i in want.items]
        assert inputs.pixel_values.equal(want.pixel_values)


def test_the_cache_is_bounded_and_least_recently_used_goes_first():
    import torch

    from ui.chat_media import MediaCache, Piece

    def piece(n):  # n float32 values of 4 bytes
        return Piece(torch.zeros(n), [], [])

    cache = MediaCache(max_bytes=100)
    cache.put(("a",), piece(10))
    cache.put(("b",), piece(10))
    assert cache.get(("a",)) is not None  # a is now the most recently used
    cache.put(("c",), piece(10))  # 120 bytes: b goes
    assert cache.get(("b",)) is None and cache.get(("a",)) and cache.get(("c",)) and cache.nbytes == 80
    cache.put(("huge",), piece(30))  # larger than the whole budget: not kept, nothing evicted
    assert cache.get(("huge",)) is None and len(cache) == 2
